package io.pymq.spark;

import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadAllAvailable;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxBytes;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.PartitionOffset;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.connector.read.streaming.SupportsRealTimeMode;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.types.StructType;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * {@code spark.readStream.format("pymq")}: micro-batches of sequence ranges, with the offsets, read limits,
 * commit-time acknowledgement and failOnDataLoss rules of the Python data source ({@code pyspark_pymq/
 * source.py} StreamReader; spec/spark.md §1–§2; pyspark_pymq/README.md).  Runs on the driver, in Spark's
 * stream execution thread, over one broker connection.
 *
 * <p>Consume mode acknowledges (ACK {@code pymq-ack-upto}) in {@link #commit} and when Spark asks for the
 * batch after a committed one ({@link #latestOffset}): never in a task, which a retry or a speculative copy
 * could run for a batch that is never committed.
 */
final class Streams {
    private Streams() {
    }

    /** A pymq offset: {"dest": {"0": next_seq}} (spec/spark.md §1). */
    static final class PymqOffset extends Offset {
        final TreeMap<String, Long> positions;

        PymqOffset(Map<String, Long> positions) {
            this.positions = new TreeMap<>(positions);
        }

        @Override
        public String json() {
            return Plan.toJson(positions);
        }
    }

    /** Where a real-time task stopped in its destination (the next sequence number to read). */
    record Position(String destination, long next) implements PartitionOffset {
    }

    static final class Micro implements MicroBatchStream, SupportsAdmissionControl, SupportsTriggerAvailableNow,
            SupportsRealTimeMode {
        final Options.Read opts;
        private final StructType required;
        private final Planner planner;
        private Map<String, Long> target;                        // Trigger.AvailableNow stops here
        private final Map<String, Long> latest = new TreeMap<>(); // last seen, for reportLatestOffset
        private final Map<String, Long> earliest = new HashMap<>(); // failOnDataLoss=false: where messages restart
        private final Map<String, Long> acked = new HashMap<>();  // consume mode: acknowledged below this
        private Long lastTrigger;                                 // minOffsetsPerTrigger: when a batch last fired
        private boolean realTime;                                 // Trigger.RealTime: tasks read as messages come

        Micro(Options.Read opts, StructType required) {
            this.opts = opts;
            this.required = required;
            this.planner = new Planner(opts);
        }

        // -- offsets ---------------------------------------------------------------------------------

        @Override
        public Offset initialOffset() {
            return planner.retrying(() -> {
                Map<String, Long> positions = new TreeMap<>();
                for (Map.Entry<String, long[]> e : planner.readable(planner.resolve()).entrySet()) {
                    // consume: the broker's cursor, the first message not acknowledged (a lost checkpoint
                    // starts again after the last committed batch: at-least-once)
                    positions.put(e.getKey(), opts.consume() ? e.getValue()[0]
                            : planner.start(e.getKey(), "latest", e.getValue()));
                }
                return new PymqOffset(positions);
            }, "finding the initial offset");
        }

        @Override
        public Offset deserializeOffset(String json) {
            return new PymqOffset(Plan.fromJson(json));
        }

        @Override
        public Offset latestOffset() {
            throw new UnsupportedOperationException("latestOffset(start, limit) is used");
        }

        @Override
        public ReadLimit getDefaultReadLimit() {
            if (opts.maxMessagesPerTrigger() != null) {
                return ReadLimit.maxRows(opts.maxMessagesPerTrigger());
            }
            if (opts.maxBytesPerTrigger() != null) {
                return ReadLimit.maxBytes(opts.maxBytesPerTrigger());
            }
            return ReadLimit.allAvailable();
        }

        @Override
        public void prepareForTriggerAvailableNow() {
            target = planner.retrying(() -> {
                Map<String, Long> t = new TreeMap<>();
                for (Map.Entry<String, long[]> e : planner.readable(planner.resolve()).entrySet()) {
                    t.put(e.getKey(), e.getValue()[1] + 1);
                }
                return t;
            }, "finding where Trigger.AvailableNow stops");
        }

        @Override
        public Offset latestOffset(Offset start, ReadLimit limit) {
            return planner.retrying(() -> plan(((PymqOffset) start).positions, limit), "planning the next micro-batch");
        }

        private Offset plan(Map<String, Long> pos, ReadLimit limit) {
            if (opts.consume()) {
                acknowledge(pos);
            }
            TreeMap<String, Long> end = new TreeMap<>();
            Map<String, Long> skip = new HashMap<>();
            // a pattern is resolved again at every trigger, so destinations created later join the query
            TreeSet<String> dests = new TreeSet<>(planner.resolve());
            dests.addAll(pos.keySet());
            for (Map.Entry<String, long[]> e : planner.readable(new ArrayList<>(dests)).entrySet()) {
                String dest = e.getKey();
                long first = e.getValue()[0];
                long last = e.getValue()[1];
                latest.put(dest, last + 1);
                if (!pos.containsKey(dest)) {
                    // joins at its earliest message; this batch only records the position, so every batch's
                    // range is fixed by its two offsets and a replay reads the same messages
                    end.put(dest, first);
                    continue;
                }
                long at = pos.get(dest);
                if (first > at) {
                    if (!opts.consume() && opts.failOnDataLoss()) {
                        throw PymqException.dataLoss(dest + ": the query is at offset " + at + " but the broker's "
                                + "earliest available message is " + first + ": messages " + at + ".." + (first - 1)
                                + " were removed (retention, or other consumers of a queue) before the query read "
                                + "them. Set failOnDataLoss=false to go on", dest, at, first);
                    }
                    // the gap holds nothing: read limits count from where the messages start again
                    earliest.put(dest, first);
                    skip.put(dest, first);
                }
                long stop = last + 1;
                if (target != null) {
                    stop = Math.min(stop, target.getOrDefault(dest, at));
                }
                end.put(dest, Math.max(at, stop));
            }
            Long maxRows = limit instanceof ReadMaxRows r ? Long.valueOf(r.maxRows()) : null;
            Long maxBytes = limit instanceof ReadMaxBytes b ? Long.valueOf(b.maxBytes()) : null;
            if (limit instanceof ReadMaxRows && opts.maxBytesPerTrigger() != null) {
                maxBytes = opts.maxBytesPerTrigger();                     // both options: both caps
            }
            Map<String, Long> counted = new HashMap<>(pos);
            counted.putAll(skip);
            if (opts.minMessagesPerTrigger() != null && target == null
                    && heldBack(counted, end, opts.minMessagesPerTrigger())) {
                return new PymqOffset(pos);
            }
            Map<String, Long> capped = end;
            if (maxRows != null) {
                capped = Plan.cap(counted, end, maxRows);
            }
            if (maxBytes != null) {
                capped = capBytes(counted, capped, maxBytes);
            }
            return new PymqOffset(capped);
        }

        /** minOffsetsPerTrigger (Kafka's rule), counted as sequence widths. */
        private boolean heldBack(Map<String, Long> counted, Map<String, Long> end, long minimum) {
            long now = System.nanoTime();
            if (lastTrigger != null && (now - lastTrigger) / 1_000_000 < opts.maxTriggerDelayMs()) {
                long waiting = 0;
                for (Map.Entry<String, Long> e : end.entrySet()) {
                    Long c = counted.get(e.getKey());
                    if (c != null) {
                        waiting += Math.max(0, e.getValue() - c);
                    }
                }
                if (waiting < minimum) {
                    return true;
                }
            }
            lastTrigger = now;
            return false;
        }

        /** maxBytesPerTrigger: the broker has no size-only query, so the candidates are read to find where
         * the budget ends (sequence numbers only, the byte limit still counts bodies). */
        private Map<String, Long> capBytes(Map<String, Long> pos, Map<String, Long> end, long budget) {
            Map<String, Long> widths = new TreeMap<>();
            long total = 0;
            for (Map.Entry<String, Long> e : end.entrySet()) {
                Long p = pos.get(e.getKey());
                if (p != null && e.getValue() > p) {
                    widths.put(e.getKey(), e.getValue() - p);
                    total += e.getValue() - p;
                }
            }
            Map<String, Long> out = new TreeMap<>(end);
            for (Map.Entry<String, Long> e : widths.entrySet()) {
                String dest = e.getKey();
                long share = Math.max(1, budget * e.getValue() / total);
                StompClient.Range r = planner.broker().await(planner.broker().range(dest, StompClient.rangeHeaders(
                        pos.get(dest), end.get(dest), null, share, null, opts.selector(), opts.subscriptionOf(dest),
                        opts.source(), true, "seq")));
                out.put(dest, Math.min(end.get(dest), Math.max(pos.get(dest), r.next())));
            }
            return out;
        }

        @Override
        public Offset reportLatestOffset() {
            return latest.isEmpty() ? null : new PymqOffset(latest);
        }

        @Override
        public InputPartition[] planInputPartitions(Offset start, Offset end) {
            Map<String, Long> pos = ((PymqOffset) start).positions;
            Map<String, Long> stop = ((PymqOffset) end).positions;
            List<Plan.Span> spans = new ArrayList<>();
            long width = 0;
            for (Map.Entry<String, Long> e : stop.entrySet()) {
                String d = e.getKey();
                long s = Math.min(e.getValue(), Math.max(pos.getOrDefault(d, e.getValue()), earliest.getOrDefault(d, 0L)));
                spans.add(new Plan.Span(d, s, e.getValue()));
                width += Math.max(0, e.getValue() - s);
            }
            // a small micro-batch is one task per destination (no probe: the fastest way through a trigger)
            boolean small = width <= opts.fetchSize() && opts.minPartitions() == null;
            long parallelism = small ? 1 : BatchScan.parallelism(opts);
            return planner.retrying(() -> planner.partitions(spans, parallelism, !small),
                    "planning the micro-batch's partitions").toArray(new InputPartition[0]);
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            Reads.Factory columnar = BatchScan.factory(opts, required, List.of());
            return realTime ? new RealTime.Factory(columnar) : columnar;
        }

        // -- real-time mode (Spark 4.1+: trigger(realTime="5 minutes")) ---------------------------------------
        //
        // A batch lasts the trigger's duration; one task per destination reads from the batch's start as
        // messages arrive (RealTime.Reader) and reports where it stopped; those positions are the batch's end
        // offset, committed (and, in consume mode, acknowledged) as any micro-batch's. Read limits do not apply.

        @Override
        public void prepareForRealTimeMode() {
            realTime = true;
        }

        @Override
        public InputPartition[] planInputPartitions(Offset start) {
            Map<String, Long> pos = ((PymqOffset) start).positions;
            return planner.retrying(() -> {
                List<InputPartition> out = new ArrayList<>();
                TreeSet<String> dests = new TreeSet<>(planner.resolve());
                dests.addAll(pos.keySet());
                for (Map.Entry<String, long[]> e : planner.readable(new ArrayList<>(dests)).entrySet()) {
                    String dest = e.getKey();
                    long from = pos.getOrDefault(dest, e.getValue()[0]);
                    if (e.getValue()[0] > from && !(!opts.consume() && opts.failOnDataLoss())) {
                        from = e.getValue()[0];                       // failOnDataLoss=false: past the gap
                    }
                    out.add(planner.task(new Plan.Span(dest, from, Long.MAX_VALUE)));   // unbounded: never split
                }
                return out;
            }, "planning a real-time batch").toArray(new InputPartition[0]);
        }

        @Override
        public Offset mergeOffsets(PartitionOffset[] offsets) {
            Map<String, Long> merged = new TreeMap<>();
            for (PartitionOffset o : offsets) {
                Position p = (Position) o;
                merged.merge(p.destination(), p.next(), Math::max);
            }
            return new PymqOffset(merged);
        }

        @Override
        public void commit(Offset end) {
            if (opts.consume()) {
                planner.retrying(() -> {
                    acknowledge(((PymqOffset) end).positions);
                    return null;
                }, "acknowledging a committed batch");
            }
        }

        /** ack_upto each destination below its position, once per position: from commit, and from
         * latestOffset (Spark asks for the next batch only from a committed one, but calls commit lazily). */
        void acknowledge(Map<String, Long> upto) {
            for (Map.Entry<String, Long> e : upto.entrySet()) {
                if (e.getValue().equals(acked.get(e.getKey()))) {
                    continue;
                }
                planner.broker().ackUpto(e.getKey(), e.getValue(), opts.subscriptionOf(e.getKey()));
                acked.put(e.getKey(), e.getValue());
            }
        }

        @Override
        public void stop() {
            planner.close();
        }
    }
}
