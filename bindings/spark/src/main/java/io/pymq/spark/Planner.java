package io.pymq.spark;

import io.pymq.routing.GroupRouter;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.function.Supplier;

/**
 * The driver side of a read: which destinations a query reads, their bounds, where a read starts and ends,
 * and the partitions it is cut into (spec/spark.md §1–§2; the Python twin is {@code pyspark_pymq/source.py}).
 * One connection, reopened when it failed; each call is safe to repeat whole (it reads bounds), so a call
 * whose connection fails is retried ({@code fetchRetries}).
 */
final class Planner implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger("io.pymq.spark");
    /** Probes of a destination's byte layout ask for this many body bytes (the broker's cap per answer). */
    static final long PROBE_BYTES = 16L * 1024 * 1024;
    /** The owner rules a broker's CONNECTED names in {@code pymq-placement} (spec/cores.md §2). */
    static final String NUMBERED = "numbered";
    static final String HASH = "hash";

    final Options.Read opts;
    private StompClient client;

    Planner(Options.Read opts) {
        this.opts = opts;
    }

    StompClient broker() {
        if (client == null || !client.usable()) {
            close();
            client = StompClient.connect(opts.connection());
        }
        return client;
    }

    @Override
    public void close() {
        if (client != null) {
            Connections.closeQuietly(client);
            client = null;
        }
    }

    /** {@code fn}, called again (after the retry interval) when the connection fails. */
    <T> T retrying(Supplier<T> fn, String what) {
        int failures = 0;
        while (true) {
            try {
                return fn.get();
            } catch (PymqException e) {
                if (!e.retryable()) {
                    throw e;
                }
                close();
                failures++;
                if (failures > opts.fetchRetries()) {
                    throw e;
                }
                LOG.warn("{} failed ({}); retry {} of {} in {} ms", what, e.getMessage(), failures, opts.fetchRetries(),
                        opts.fetchRetryIntervalMs());
                Reads.sleep(opts.fetchRetryIntervalMs());
            }
        }
    }

    // -- destinations and bounds ---------------------------------------------------------------------------

    /** The destinations named, or those the broker lists that match the pattern. */
    List<String> resolve() {
        if (opts.pattern() == null) {
            return opts.destinations();
        }
        Map<String, List<String>> listing;
        try {
            listing = broker().listDestinations();
        } catch (PymqException e) {
            if (e.retryable() || e.code().equals(PymqException.CONFIG)) {
                throw e;
            }
            throw PymqException.config("option 'destinationPattern' needs the broker's destination listing (admin "
                    + "operation list-destinations), which failed: " + e.getMessage());
        }
        TreeSet<String> names = new TreeSet<>();
        listing.values().forEach(names::addAll);
        DestinationPattern pattern = new DestinationPattern(opts.pattern());
        List<String> out = new ArrayList<>();
        for (String n : names) {
            if (pattern.matches(n)) {
                out.add(n);
            }
        }
        return out;
    }

    /** (earliest available, latest assigned) of {@code dest}, or null when nothing can ever be read there. */
    long[] bounds(String dest) {
        StompClient.Range r = broker().await(broker().range(dest, StompClient.rangeHeaders(null, null, 0L, null,
                null, null, opts.subscriptionOf(dest), opts.source(), false, null)));
        if ("none".equals(r.source())) {
            return null;
        }
        return new long[] {r.earliest(), r.latest()};
    }

    /** Bounds of each destination the query can read; a named topic without a log is refused with why. */
    Map<String, long[]> readable(List<String> dests) {
        Map<String, long[]> out = new LinkedHashMap<>();
        for (String dest : dests) {
            long[] b = bounds(dest);
            if (b != null) {
                out.put(dest, b);
            } else if (opts.pattern() == null || opts.destinations().contains(dest)) {
                throw PymqException.config(dest + " keeps no retained log on the broker and the query reads it "
                        + "without a subscription, so there is nothing it could ever read: give it retention in the "
                        + "broker's configuration (retention: {\"" + dest + "\": {ms: ...}}), or read a durable "
                        + "subscription of it with option 'subscription'");
            } else {
                LOG.warn("{} matches destinationPattern but keeps no retained log: nothing to read there", dest);
            }
        }
        return out;
    }

    /** The sequence number of the first message stamped at or after {@code timestamp} (or the next one's). */
    long firstAt(String dest, long timestamp) {
        StompClient.Range r = broker().await(broker().range(dest, StompClient.rangeHeaders(null, null, 1L, null,
                timestamp, null, opts.subscriptionOf(dest), opts.source(), true, "seq")));
        if (r.arrow() != null && r.count() > 0) {
            long[] seqs = seqs(r.arrow(), dest);
            if (seqs.length > 0) {
                return seqs[0];
            }
        }
        if (!r.messages().isEmpty()) {
            return Long.parseLong(r.messages().get(0).get("pymq-seq"));
        }
        return r.next();
    }

    long start(String dest, String fallback, long[] bounds) {
        if (opts.startingTimestamp() != null) {
            return firstAt(dest, opts.startingTimestamp());
        }
        if (opts.startingByTimestamp() != null) {
            Long at = opts.startingByTimestamp().get(dest);
            return at == null ? bounds[0] : firstAt(dest, at);
        }
        Object spec = opts.starting() != null ? opts.starting() : fallback;
        if (spec instanceof Map<?, ?> m) {
            Object v = m.get(dest);
            spec = v == null ? Options.EARLIEST : v;
        }
        if ("earliest".equals(spec) || Long.valueOf(Options.EARLIEST).equals(spec)) {
            return bounds[0];
        }
        if ("latest".equals(spec) || Long.valueOf(Options.LATEST).equals(spec)) {
            return bounds[1] + 1;
        }
        return (Long) spec;
    }

    long end(String dest, long[] bounds) {
        Long at = opts.endingTimestamp();
        if (opts.endingByTimestamp() != null) {
            at = opts.endingByTimestamp().get(dest);
        }
        if (at != null) {
            return firstAt(dest, at);
        }
        Object spec = opts.ending() instanceof Map<?, ?> m ? (m.get(dest) == null ? Options.LATEST : m.get(dest))
                : opts.ending();
        return "latest".equals(spec) || Long.valueOf(Options.LATEST).equals(spec) ? bounds[1] + 1 : (Long) spec;
    }

    // -- partitions ------------------------------------------------------------------------------------------

    /**
     * The tasks of a read of {@code spans}: split by bytes (spec/spark.md §2) when the broker reports them,
     * by width otherwise; each task connects to the worker that owns its destination.
     * {@code parallelism}: the pieces wanted at least (minPartitions, else Spark's default parallelism).
     */
    List<RangePartition> partitions(List<Plan.Span> spans, long parallelism, boolean probe) {
        List<Plan.Span> live = new ArrayList<>();
        for (Plan.Span s : spans) {
            if (s.width() > 0) {
                live.add(s);
            }
        }
        List<Plan.Span> pieces = null;
        if (probe && !live.isEmpty()) {
            pieces = bySize(live, parallelism);
        }
        if (pieces == null) {
            pieces = Plan.split(live, parallelism, opts.maxMessagesPerPartition());
        } else if (opts.maxMessagesPerPartition() != null) {
            pieces = Plan.split(pieces, 1, opts.maxMessagesPerPartition());
        }
        List<RangePartition> out = new ArrayList<>();
        for (Plan.Span s : pieces) {
            out.add(task(s));
        }
        return out;
    }

    /** The task of one piece, connecting to the worker that owns its destination (spec/spark.md §2). */
    RangePartition task(Plan.Span s) {
        StompClient broker = broker();
        int workers = broker.workers;
        int owner = workers > 1 ? owner(s.destination(), workers, broker.placement) : -1;
        boolean check = !opts.consume() && opts.failOnDataLoss();
        return new RangePartition(opts.connection(), s.destination(), s.start(), s.end(), opts.selector(),
                opts.subscriptionOf(s.destination()), opts.fetchSize(), check, opts.source(), opts.fetchRetries(),
                opts.fetchRetryIntervalMs(), owner, workers);
    }

    /**
     * The worker of {@code workers} that owns {@code destination} under the broker's {@code placement}
     * (spec/cores.md §2, vectors spec/vectors/worker_owners.json): with {@link #NUMBERED} a numbered name
     * {@code <stem>.<n>} (n: 1-18 ASCII digits) is {@code (rendezvous(stem) + n) mod W}; with {@link #HASH} (a
     * data directory written before the numbered rule) and for any other name, {@code rendezvous(destination)},
     * the rendezvous hash over {@code w0 .. w<W-1>}. -1 for a rule this reader does not know: its task then
     * connects once, to any worker, which forwards (served, only slower).
     */
    static int owner(String destination, int workers, String placement) {
        if (!NUMBERED.equals(placement) && !HASH.equals(placement)) {
            return -1;
        }
        List<String> names = new ArrayList<>();
        for (int k = 0; k < workers; k++) {
            names.add("w" + k);
        }
        GroupRouter router = new GroupRouter(names);
        if (HASH.equals(placement)) {
            return Integer.parseInt(router.route(destination).substring(1));
        }
        int dot = destination.lastIndexOf('.');
        String number = dot < 0 ? "" : destination.substring(dot + 1);
        boolean numbered = !number.isEmpty() && number.length() <= 18;
        for (int i = 0; numbered && i < number.length(); i++) {
            char ch = number.charAt(i);
            numbered = ch >= '0' && ch <= '9';
        }
        if (numbered) {
            int first = Integer.parseInt(router.route(destination.substring(0, dot)).substring(1));
            return (int) ((first + Long.parseLong(number) % workers) % workers);
        }
        return Integer.parseInt(router.route(destination).substring(1));
    }

    /**
     * Probes each span (ranges asking only {@code seq}, {@link #PROBE_BYTES} of bodies each, which the broker
     * answers with the rows' sequence numbers and {@code pymq-bytes}) and cuts it into pieces of about
     * {@code min(maxBytesPerPartition, total / parallelism)} bytes.  Null when the broker does not report
     * bytes (then the width rule applies).
     */
    private List<Plan.Span> bySize(List<Plan.Span> spans, long parallelism) {
        long budget = Math.min(PROBE_BYTES, opts.maxBytesPerPartition());
        Map<Plan.Span, List<Plan.Chunk>> layout = probe(spans, budget);
        if (layout == null) {
            return null;
        }
        long total = 0;
        for (List<Plan.Chunk> chunks : layout.values()) {
            for (Plan.Chunk c : chunks) {
                total += c.bytes();
            }
        }
        long target = Math.max(1, Math.min(opts.maxBytesPerPartition(), (total + parallelism - 1) / parallelism));
        if (target < budget) {
            // pieces smaller than a probe: probe again at the target, so each piece ends at the message
            // whose bytes reach it (cutting a probe by message counts would assume every message weighs the
            // same); finer probes would cut pieces under the target, and more of them than minPartitions
            layout = probe(spans, target);
            if (layout == null) {
                return null;
            }
        }
        List<Plan.Span> out = new ArrayList<>();
        for (Map.Entry<Plan.Span, List<Plan.Chunk>> e : layout.entrySet()) {
            List<Plan.Chunk> chunks = e.getValue();
            if (chunks.isEmpty()) {
                continue;
            }
            // the last probe ends where the broker had nothing more: the span still ends where it was planned
            Plan.Chunk last = chunks.get(chunks.size() - 1);
            chunks.set(chunks.size() - 1, new Plan.Chunk(last.start(), e.getKey().end(), last.seqs(), last.bytes()));
            out.addAll(Plan.splitByBytes(e.getKey().destination(), chunks, target));
        }
        return out;
    }

    /** Each span read in probes of at most {@code budget} body bytes (sequence numbers only); null when the
     * broker does not say an answer's bytes. */
    private Map<Plan.Span, List<Plan.Chunk>> probe(List<Plan.Span> spans, long budget) {
        Map<Plan.Span, List<Plan.Chunk>> layout = new LinkedHashMap<>();
        for (Plan.Span s : spans) {
            List<Plan.Chunk> chunks = new ArrayList<>();
            long cursor = s.start();
            while (cursor < s.end()) {
                StompClient.Range r = broker().await(broker().range(s.destination(), StompClient.rangeHeaders(cursor,
                        s.end(), null, budget, null, opts.selector(), opts.subscriptionOf(s.destination()),
                        opts.source(), true, "seq")));
                Long bytes = r.bytes();
                if (r.arrow() == null || bytes == null) {
                    return null;
                }
                long next = Math.min(s.end(), Math.max(r.next(), cursor + 1));
                chunks.add(new Plan.Chunk(cursor, next, seqs(r.arrow(), s.destination()), bytes));
                if (r.next() <= cursor) {
                    break;
                }
                cursor = next;
            }
            layout.put(s, chunks);
        }
        return layout;
    }

    /** The {@code seq} column of an Arrow answer. */
    static long[] seqs(byte[] ipc, String dest) {
        BufferAllocator allocator = Reads.ROOT.newChildAllocator("pymq probe", 0, Reads.TASK_MEMORY);
        Wire.Shape shape = new Wire.Shape(dest, Options.kind(dest), new org.apache.spark.sql.types.StructType(),
                List.of("seq"), null);
        try (allocator; Wire.Batches answer = new Wire.Batches(allocator, ipc, shape)) {
            List<long[]> parts = new ArrayList<>();
            int n = 0;
            VectorSchemaRoot root;
            while ((root = answer.nextRoot()) != null) {
                if (!(root.getVector("seq") instanceof BigIntVector seq)) {
                    throw PymqException.format("the broker's Arrow answer for " + dest + " has no int64 seq column");
                }
                long[] part = new long[seq.getValueCount()];
                for (int i = 0; i < part.length; i++) {
                    part[i] = seq.get(i);
                }
                parts.add(part);
                n += part.length;
            }
            long[] out = new long[n];
            int at = 0;
            for (long[] p : parts) {
                System.arraycopy(p, 0, out, at, p.length);
                at += p.length;
            }
            return out;
        }
    }
}
