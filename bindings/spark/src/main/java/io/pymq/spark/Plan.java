package io.pymq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * Offsets and read plans (spec/spark.md §1–§2; the Python twin is {@code pyspark_pymq/_plan.py}, both run
 * spec/vectors/spark.json): which sequence numbers of which destination a batch or micro-batch reads.
 * Pure functions on plain values: no Spark, no broker.
 */
final class Plan {
    private Plan() {
    }

    static final String PARTITION = "0";

    /** {@code start <= seq < end} of one destination. */
    record Span(String destination, long start, long end) implements java.io.Serializable {
        long width() {
            return Math.max(0, end - start);
        }
    }

    /** The offset JSON Spark checkpoints: {"dest": {"0": next_seq}}, destinations sorted. */
    static String toJson(Map<String, Long> positions) {
        ObjectNode root = Options.JSON.createObjectNode();
        for (Map.Entry<String, Long> e : new TreeMap<>(positions).entrySet()) {
            root.putObject(e.getKey()).put(PARTITION, e.getValue());
        }
        return root.toString();
    }

    /** The positions an offset holds; refuses what no pymq connector wrote. */
    static TreeMap<String, Long> fromJson(String json) {
        JsonNode node;
        try {
            node = Options.JSON.readTree(json);
        } catch (Exception e) {
            throw PymqException.config("not a pymq offset: " + json);
        }
        return fromNode(node);
    }

    static TreeMap<String, Long> fromNode(JsonNode node) {
        if (node == null || !node.isObject()) {
            throw PymqException.config("not a pymq offset: " + node);
        }
        TreeMap<String, Long> out = new TreeMap<>();
        Iterator<Map.Entry<String, JsonNode>> it = node.fields();
        while (it.hasNext()) {
            Map.Entry<String, JsonNode> e = it.next();
            JsonNode parts = e.getValue();
            JsonNode seq = parts == null ? null : parts.get(PARTITION);
            if (parts == null || !parts.isObject() || seq == null || !seq.isIntegralNumber() || !seq.canConvertToLong()) {
                throw PymqException.config("not a pymq offset for '" + e.getKey() + "': " + parts
                        + " (expected {\"0\": <sequence>})");
            }
            out.put(e.getKey(), seq.asLong());
        }
        return out;
    }

    /** Kafka's maxOffsetsPerTrigger rule (spec/spark.md §2 "cap"). */
    static TreeMap<String, Long> cap(Map<String, Long> start, Map<String, Long> end, long max) {
        TreeMap<String, Long> avail = new TreeMap<>();
        long total = 0;
        for (Map.Entry<String, Long> e : end.entrySet()) {
            long s = start.getOrDefault(e.getKey(), e.getValue());
            long a = Math.max(0, e.getValue() - s);
            avail.put(e.getKey(), a);
            total += a;
        }
        if (total <= max) {
            return new TreeMap<>(end);
        }
        final long t = total;
        TreeMap<String, Long> shares = new TreeMap<>();
        long given = 0;
        for (Map.Entry<String, Long> e : avail.entrySet()) {
            long share = mulDiv(max, e.getValue(), t);
            shares.put(e.getKey(), share);
            given += share;
        }
        long left = max - given;
        List<String> order = new ArrayList<>(avail.keySet());
        order.sort(Comparator.<String>comparingLong(d -> -mulMod(max, avail.get(d), t)).thenComparing(d -> d));
        for (String d : order) {
            if (left <= 0) {
                break;
            }
            if (shares.get(d) < avail.get(d)) {
                shares.put(d, shares.get(d) + 1);
                left--;
            }
        }
        TreeMap<String, Long> out = new TreeMap<>();
        for (Map.Entry<String, Long> e : end.entrySet()) {
            String d = e.getKey();
            out.put(d, avail.get(d) > 0 ? start.getOrDefault(d, e.getValue()) + shares.get(d) : e.getValue());
        }
        return out;
    }

    private static long mulDiv(long a, long b, long c) {
        return java.math.BigInteger.valueOf(a).multiply(java.math.BigInteger.valueOf(b))
                .divide(java.math.BigInteger.valueOf(c)).longValueExact();
    }

    private static long mulMod(long a, long b, long c) {
        return java.math.BigInteger.valueOf(a).multiply(java.math.BigInteger.valueOf(b))
                .mod(java.math.BigInteger.valueOf(c)).longValueExact();
    }

    /** Pieces of at least {@code minPartitions} in proportion to width, none wider than
     * {@code maxPerPartition} (spec/spark.md §2 "split"). */
    static List<Span> split(List<Span> spans, long minPartitions, Long maxPerPartition) {
        List<Span> live = new ArrayList<>();
        long total = 0;
        for (Span s : spans) {
            if (s.width() > 0) {
                live.add(s);
                total += s.width();
            }
        }
        List<Span> out = new ArrayList<>();
        for (Span s : live) {
            long w = s.width();
            long parts = Math.max(1, ceilDiv(java.math.BigInteger.valueOf(minPartitions)
                    .multiply(java.math.BigInteger.valueOf(w)), total));
            if (maxPerPartition != null) {
                parts = Math.max(parts, (w + maxPerPartition - 1) / maxPerPartition);
            }
            parts = Math.min(parts, w);
            long step = w / parts;
            long extra = w % parts;
            long lo = s.start();
            for (long i = 0; i < parts; i++) {
                long hi = lo + step + (i < extra ? 1 : 0);
                out.add(new Span(s.destination(), lo, hi));
                lo = hi;
            }
        }
        return out;
    }

    private static long ceilDiv(java.math.BigInteger a, long b) {
        java.math.BigInteger[] qr = a.divideAndRemainder(java.math.BigInteger.valueOf(b));
        return qr[0].longValueExact() + (qr[1].signum() > 0 ? 1 : 0);
    }

    /**
     * One probe of a destination's byte layout (spec/spark.md §2, split by bytes): the range
     * {@code start <= seq < end} holds the messages {@code seqs} (in order), whose bodies total {@code bytes}.
     */
    record Chunk(long start, long end, long[] seqs, long bytes) {
    }

    /**
     * Spans of about {@code target} body bytes from one destination's probes (in sequence order, covering
     * its span): a piece ends at a probe's end when the next probe would take it past the target; a probe of
     * at least twice the target is cut into floor(bytes / target) pieces of equal message counts, at message
     * sequence numbers (a probe stops after the message that crosses its budget, so one probed at the
     * target holds a little more than it and stays whole).
     */
    static List<Span> splitByBytes(String destination, List<Chunk> chunks, long target) {
        List<Span> out = new ArrayList<>();
        long lo = -1;
        long hi = -1;
        long acc = 0;
        for (Chunk c : chunks) {
            if (c.end() <= c.start()) {
                continue;
            }
            int n = c.seqs().length;
            if (c.bytes() >= 2 * target && n > 1) {
                if (lo >= 0) {
                    out.add(new Span(destination, lo, hi));
                    lo = -1;
                    acc = 0;
                }
                int pieces = (int) Math.min(n, c.bytes() / target);
                long from = c.start();
                for (int i = 1; i < pieces; i++) {
                    long cut = c.seqs()[(int) ((long) n * i / pieces)];
                    out.add(new Span(destination, from, cut));
                    from = cut;
                }
                out.add(new Span(destination, from, c.end()));
                continue;
            }
            if (lo >= 0 && acc + c.bytes() > target) {
                out.add(new Span(destination, lo, hi));
                lo = -1;
                acc = 0;
            }
            if (lo < 0) {
                lo = c.start();
            }
            acc += c.bytes();
            hi = c.end();
        }
        if (lo >= 0) {
            out.add(new Span(destination, lo, hi));
        }
        return out;
    }

    static String streamDedupBase(String queryId, long batchId, int partition) {
        return queryId + ":" + batchId + ":" + partition;
    }

    static String batchDedupBase(String prefix, int partition) {
        return prefix + ":" + partition;
    }
}
