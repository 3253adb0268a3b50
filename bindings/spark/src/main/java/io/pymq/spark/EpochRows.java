package io.pymq.spark;

import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * A sink that keeps what a transactional sink would (the tests' exactly-once check, tests/spark/
 * test_realtime.py): each task's rows (the first column, as text) are published for its (epoch, partition)
 * when the task's writer closes without an error, replacing what an earlier attempt of the same epoch
 * published, and dropped when it closes with one (a task killed by a stopped query).  Every row handed to
 * {@link #process} is also kept in {@link #handed}, what a sink that writes as rows come sees: rows of a
 * batch cut short by a stop are handed again when the restarted query reads them from the last committed
 * offset (Spark's foreach sink is at-least-once).  The figures live in this JVM (local mode: the driver's),
 * read with the static methods through py4j, like {@link LatencyProbe}'s.
 */
public final class EpochRows extends ForeachWriter<Row> {
    private static final long serialVersionUID = 1L;
    private static final Map<String, List<String>> PUBLISHED = new TreeMap<>();
    private static final List<String> HANDED = new ArrayList<>();

    private transient List<String> rows;
    private transient String key;

    @Override
    public boolean open(long partitionId, long epochId) {
        rows = new ArrayList<>();
        key = epochId + ":" + partitionId;
        return true;
    }

    @Override
    public void process(Row row) {
        String id = String.valueOf(row.get(0));
        rows.add(id);
        synchronized (EpochRows.class) {
            HANDED.add(id);
        }
    }

    @Override
    public void close(Throwable error) {
        if (error == null && rows != null) {
            synchronized (EpochRows.class) {
                PUBLISHED.put(key, rows);
            }
        }
        rows = null;
    }

    public static synchronized void reset() {
        PUBLISHED.clear();
        HANDED.clear();
    }

    /** Every row published, epoch by epoch (the last attempt of each), in order. */
    public static synchronized List<String> published() {
        List<String> out = new ArrayList<>();
        PUBLISHED.values().forEach(out::addAll);
        return out;
    }

    /** The "epoch:partition" keys published. */
    public static synchronized List<String> epochs() {
        return new ArrayList<>(PUBLISHED.keySet());
    }

    /** Every row handed to a writer, in the order they came (a row again when a batch was read again). */
    public static synchronized List<String> handed() {
        return new ArrayList<>(HANDED);
    }
}
