package io.pymq.spark;

import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

import java.util.Arrays;

/**
 * A benchmark's sink ({@code bench/bench_spark.py}): records, for each row it is handed, the milliseconds
 * between the row's {@code timestamp} column (JMSTimestamp, stamped when the producer sent the message) and
 * the moment the row reached the sink in its task.  A JVM {@link ForeachWriter}, so both implementations of
 * the source are measured by the same sink, in micro-batch and in real-time mode (foreach is one of the sinks
 * real-time mode allows).  The figures live in this JVM (local mode: the driver's), read with the static
 * methods through py4j.
 */
public final class LatencyProbe extends ForeachWriter<Row> {
    private static final long serialVersionUID = 1L;
    private static long[] samples = new long[1 << 16];
    private static int count;
    private static long since;

    @Override
    public boolean open(long partitionId, long epochId) {
        return true;
    }

    @Override
    public void process(Row row) {
        long now = System.currentTimeMillis();
        java.sql.Timestamp stamp = row.getTimestamp(row.fieldIndex("timestamp"));
        record(stamp.getTime(), now - stamp.getTime());
    }

    @Override
    public void close(Throwable error) {
    }

    private static synchronized void record(long stamped, long ms) {
        if (stamped < since) {
            return;                      // sent before the measurement began (a warm-up's rows)
        }
        if (count == samples.length) {
            samples = Arrays.copyOf(samples, samples.length * 2);
        }
        samples[count++] = ms;
    }

    public static synchronized void reset() {
        reset(0);
    }

    /** Forget what was recorded; from now on record only rows stamped at or after {@code sinceMs}. */
    public static synchronized void reset(long sinceMs) {
        count = 0;
        since = sinceMs;
    }

    public static synchronized int count() {
        return count;
    }

    /** The {@code q}-quantile (0..1) of the recorded latencies, in ms (-1 when none). */
    public static synchronized long quantile(double q) {
        if (count == 0) {
            return -1;
        }
        long[] sorted = Arrays.copyOf(samples, count);
        Arrays.sort(sorted);
        return sorted[(int) Math.min(count - 1, Math.floor(q * count))];
    }
}
