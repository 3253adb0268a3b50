package io.pymq.spark;

import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * The source's driver and task steps called one at a time, without a Spark job: the entry point the shared
 * behaviour tests (tests/spark) use through py4j, so that a test that removes messages between two named
 * steps (a fetch, a trigger's planning) runs the same body against this implementation and the Python one.
 * Also handy for diagnosing a broker from a Spark shell.  Nothing here is used by Spark itself.
 */
public final class Probe {
    private Probe() {
    }

    /** Range requests a task keeps in flight (2; a test sets 1 to put a removal between two fetches). */
    public static void fetchesInFlight(int n) {
        Reads.FETCHES_IN_FLIGHT = Math.max(1, n);
    }

    public static int fetchesInFlight() {
        return Reads.FETCHES_IN_FLIGHT;
    }

    /** A stream's driver side, as Spark would make it for {@code spark.readStream.format("pymq")}. */
    public static Stream stream(Map<String, String> options) {
        Options.Read opts = Options.read(options, true);
        return new Stream(new Streams.Micro(opts, Wire.readSchema(opts.includeProperties())));
    }

    /** A batch read's partitions, as Spark would plan them. */
    public static List<Partition> batch(Map<String, String> options) {
        Options.Read opts = Options.read(options, false);
        BatchScan scan = new BatchScan(opts, options);
        List<Partition> out = new ArrayList<>();
        for (InputPartition p : ((BatchScan.PymqScan) scan.build()).planInputPartitions()) {
            out.add(new Partition((RangePartition) p, opts.includeProperties()));
        }
        return out;
    }

    /** One task's partition made by hand. */
    public static Partition partition(String url, String destination, long start, long end, int fetchSize,
                                      boolean checkLoss, int retries, long retryIntervalMs) {
        Options.Connection c = Options.connection(Map.of("url", url));
        return new Partition(new RangePartition(c, destination, start, end, null, null, fetchSize, checkLoss, null,
                retries, retryIntervalMs, -1, 0), false);
    }

    public static final class Stream {
        private final Streams.Micro micro;

        Stream(Streams.Micro micro) {
            this.micro = micro;
        }

        public String initialOffset() {
            return micro.initialOffset().json();
        }

        /** {@code maxRows} 0: ReadAllAvailable; negative: the stream's default read limit. */
        public String latestOffset(String start, long maxRows) {
            ReadLimit limit = maxRows > 0 ? ReadLimit.maxRows(maxRows) : maxRows == 0 ? ReadLimit.allAvailable()
                    : micro.getDefaultReadLimit();
            Offset end = micro.latestOffset(micro.deserializeOffset(start), limit);
            return end.json();
        }

        public List<Partition> partitions(String start, String end) {
            List<Partition> out = new ArrayList<>();
            for (InputPartition p : micro.planInputPartitions(micro.deserializeOffset(start),
                    micro.deserializeOffset(end))) {
                out.add(new Partition((RangePartition) p, micro.opts.includeProperties()));
            }
            return out;
        }

        public void commit(String end) {
            micro.commit(micro.deserializeOffset(end));
        }

        public void prepareForTriggerAvailableNow() {
            micro.prepareForTriggerAvailableNow();
        }

        public String reportLatestOffset() {
            Offset o = micro.reportLatestOffset();
            return o == null ? null : o.json();
        }

        public void stop() {
            micro.stop();
        }
    }

    public static final class Partition {
        final RangePartition p;
        final boolean includeProperties;

        Partition(RangePartition p, boolean includeProperties) {
            this.p = p;
            this.includeProperties = includeProperties;
        }

        public String destination() {
            return p.destination();
        }

        public long start() {
            return p.start();
        }

        public long end() {
            return p.end();
        }

        public int retries() {
            return p.retries();
        }

        public int worker() {
            return p.worker();
        }

        /** A task's reader over this partition: {@link Reader#next} gives each batch's values. */
        public Reader open() {
            StructType schema = Wire.readSchema(includeProperties);
            Reads.Factory f = BatchScan.factory(Options.read(Map.of("url", "stomp://x:1", "queue", "x",
                    "includeProperties", String.valueOf(includeProperties)), false), schema, List.of());
            return new Reader(f.createColumnarReader(p), schema.fieldIndex("value"));
        }
    }

    public static final class Reader implements AutoCloseable {
        private final PartitionReader<ColumnarBatch> reader;
        private final int value;

        Reader(PartitionReader<ColumnarBatch> reader, int value) {
            this.reader = reader;
            this.value = value;
        }

        /** The next batch's {@code value} column as text, or null at the end. */
        public List<String> next() throws java.io.IOException {
            if (!reader.next()) {
                return null;
            }
            ColumnarBatch b = reader.get();
            List<String> out = new ArrayList<>(b.numRows());
            for (int i = 0; i < b.numRows(); i++) {
                out.add(new String(b.column(value).getBinary(i), StandardCharsets.UTF_8));
            }
            return out;
        }

        /** The worker (of a broker running several) the task's connection lived in; -1 when not told. */
        public int worker() {
            return reader instanceof Reads.RangeReader r ? r.connectedWorker : -1;
        }

        @Override
        public void close() throws java.io.IOException {
            reader.close();
        }
    }
}
