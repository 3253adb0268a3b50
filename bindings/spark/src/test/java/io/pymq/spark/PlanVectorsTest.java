package io.pymq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** spec/vectors/spark.json (offsets, read-limit sharing, splits, dedup ids): the Python twin runs the same. */
class PlanVectorsTest {
    private static Map<String, Long> positions(JsonNode node) {
        Map<String, Long> out = new TreeMap<>();
        node.fields().forEachRemaining(e -> out.put(e.getKey(), e.getValue().asLong()));
        return out;
    }

    @Test
    void offsets() throws Exception {
        JsonNode v = VectorFiles.load("spark.json").get("offsets");
        for (JsonNode c : v.get("valid")) {
            assertEquals(positions(c.get("positions")), Plan.fromNode(c.get("offset")));
            assertEquals(Options.JSON.readTree(Plan.toJson(positions(c.get("positions")))), c.get("offset"));
        }
        for (JsonNode bad : v.get("invalid")) {
            PymqException e = assertThrows(PymqException.class, () -> Plan.fromNode(bad));
            assertEquals(PymqException.CONFIG, e.code());
        }
    }

    @Test
    void cap() throws Exception {
        for (JsonNode c : VectorFiles.load("spark.json").get("cap")) {
            assertEquals(positions(c.get("result")), Plan.cap(positions(c.get("start")), positions(c.get("end")),
                    c.get("max_messages").asLong()), c.toString());
        }
    }

    @Test
    void split() throws Exception {
        for (JsonNode c : VectorFiles.load("spark.json").get("split")) {
            List<Plan.Span> spans = new ArrayList<>();
            for (JsonNode s : c.get("spans")) {
                spans.add(new Plan.Span(s.get(0).asText(), s.get(1).asLong(), s.get(2).asLong()));
            }
            Long max = c.get("max_per_partition").isNull() ? null : c.get("max_per_partition").asLong();
            List<List<Object>> got = new ArrayList<>();
            for (Plan.Span s : Plan.split(spans, c.get("min_partitions").asLong(), max)) {
                got.add(List.of(s.destination(), s.start(), s.end()));
            }
            List<List<Object>> want = new ArrayList<>();
            for (JsonNode s : c.get("result")) {
                want.add(List.of(s.get(0).asText(), s.get(1).asLong(), s.get(2).asLong()));
            }
            assertEquals(want, got, c.toString());
        }
    }

    @Test
    void splitByBytes() throws Exception {
        JsonNode cases = VectorFiles.load("spark.json").get("split_by_bytes");
        assertTrue(cases != null && cases.size() > 0, "spark.json has split_by_bytes vectors");
        for (JsonNode c : cases) {
            List<Plan.Chunk> chunks = new ArrayList<>();
            for (JsonNode ch : c.get("chunks")) {
                long[] seqs = new long[ch.get("seqs").size()];
                for (int i = 0; i < seqs.length; i++) {
                    seqs[i] = ch.get("seqs").get(i).asLong();
                }
                chunks.add(new Plan.Chunk(ch.get("start").asLong(), ch.get("end").asLong(), seqs,
                        ch.get("bytes").asLong()));
            }
            List<List<Long>> got = new ArrayList<>();
            for (Plan.Span s : Plan.splitByBytes(c.get("destination").asText(), chunks, c.get("target").asLong())) {
                got.add(List.of(s.start(), s.end()));
            }
            List<List<Long>> want = new ArrayList<>();
            for (JsonNode s : c.get("result")) {
                want.add(List.of(s.get(0).asLong(), s.get(1).asLong()));
            }
            assertEquals(want, got, c.toString());
        }
    }

    @Test
    void dedupIds() throws Exception {
        for (JsonNode c : VectorFiles.load("spark.json").get("dedup_ids")) {
            String base = c.get("kind").asText().equals("stream")
                    ? Plan.streamDedupBase(c.get("query_id").asText(), c.get("batch_id").asLong(), c.get("partition").asInt())
                    : Plan.batchDedupBase(c.get("prefix").asText(), c.get("partition").asInt());
            assertEquals(c.get("id").asText(), base + ":" + c.get("row").asLong());
        }
    }

    @Test
    void destinationPatterns() throws Exception {
        JsonNode v = VectorFiles.load("spark.json").get("destination_patterns");
        for (JsonNode c : v.get("cases")) {
            DestinationPattern p = new DestinationPattern(c.get("pattern").asText());
            List<String> got = new ArrayList<>();
            for (JsonNode n : v.get("names")) {
                if (p.matches(n.asText())) {
                    got.add(n.asText());
                }
            }
            java.util.Collections.sort(got);
            List<String> want = new ArrayList<>();
            c.get("matches").forEach(n -> want.add(n.asText()));
            assertEquals(want, got, c.toString());
        }
        for (JsonNode c : v.get("refused")) {
            PymqException e = assertThrows(PymqException.class, () -> new DestinationPattern(c.get("pattern").asText()),
                    c.toString());
            assertEquals(PymqException.CONFIG, e.code());
            assertTrue(e.getMessage().contains(c.get("error").asText()), e.getMessage() + " / " + c);
        }
    }

    /** topic_patterns.json through destinationPattern, topics and queues alike: the broker's answer, or refused. */
    @Test
    void destinationPatternsFollowTopicPatternVectors() throws Exception {
        int checked = 0;
        for (JsonNode c : VectorFiles.load("topic_patterns.json").get("matches")) {
            String pattern = c.get("pattern").asText();
            String topic = c.get("topic").asText();
            boolean globLike = false;
            for (String w : TopicPattern.split(pattern)) {
                boolean wildcard = w.equals("*") || w.equals("#") || w.equals(">");
                globLike |= !wildcard && (w.contains("*") || w.contains("?") || w.contains("["));
            }
            for (String kind : List.of(Options.TOPIC, Options.QUEUE)) {
                if (globLike || pattern.isEmpty()) {
                    assertThrows(PymqException.class, () -> new DestinationPattern(kind + pattern), c.toString());
                    continue;
                }
                DestinationPattern p = new DestinationPattern(kind + pattern);
                assertEquals(c.get("match").asBoolean(), p.matches(kind + topic), c.toString());
                assertTrue(!p.matches((kind.equals(Options.TOPIC) ? Options.QUEUE : Options.TOPIC) + topic));
                checked++;
            }
        }
        assertTrue(checked > 1000, "checked " + checked);
    }
}
