package io.pymq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;

/**
 * spec/vectors/topic_patterns.json (spec/routing.md §5), the vectors the broker's compiled matcher and its
 * pure twin run (tests/routing/test_topics.py): the JVM source's destinationPattern matcher gives the same
 * answers ('covers', the grants' relation, is the broker's alone).
 */
class TopicPatternVectorsTest {
    @Test
    void normalize() throws Exception {
        for (JsonNode c : VectorFiles.load("topic_patterns.json").get("normalize")) {
            assertEquals(c.get("normal").asText(), TopicPattern.normalize(c.get("pattern").asText()), c.toString());
        }
    }

    @Test
    void isPattern() throws Exception {
        for (JsonNode c : VectorFiles.load("topic_patterns.json").get("is_pattern")) {
            assertEquals(c.get("pattern").asBoolean(), TopicPattern.isPattern(c.get("name").asText()), c.toString());
        }
    }

    @Test
    void matches() throws Exception {
        JsonNode cases = VectorFiles.load("topic_patterns.json").get("matches");
        for (JsonNode c : cases) {
            assertEquals(c.get("match").asBoolean(),
                    new TopicPattern(c.get("pattern").asText()).matches(c.get("topic").asText()), c.toString());
        }
        assertEquals(true, cases.size() > 100);
    }

    @Test
    void index() throws Exception {
        JsonNode v = VectorFiles.load("topic_patterns.json").get("index");
        for (JsonNode c : v.get("cases")) {
            List<String> got = new ArrayList<>();
            for (JsonNode p : v.get("patterns")) {
                if (new TopicPattern(p.asText()).matches(c.get("topic").asText())) {
                    got.add(p.asText());
                }
            }
            List<String> want = new ArrayList<>();
            c.get("matches").forEach(m -> want.add(m.asText()));
            // the index answers with each held pattern once, in normal form; here each pattern as written
            assertEquals(normalized(want), normalized(got), c.toString());
        }
    }

    private static List<String> normalized(List<String> patterns) {
        java.util.TreeSet<String> out = new java.util.TreeSet<>();
        patterns.forEach(p -> out.add(TopicPattern.normalize(p)));
        return new ArrayList<>(out);
    }
}
