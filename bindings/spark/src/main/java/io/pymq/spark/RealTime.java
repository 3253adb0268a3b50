package io.pymq.spark;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.PartitionOffset;
import org.apache.spark.sql.connector.read.streaming.SupportsRealTimeRead;
import org.apache.spark.sql.vectorized.ColumnarBatch;

import java.io.IOException;

/**
 * Real-time mode's task (Spark's {@code trigger(realTime=...)}): one destination read from the batch's start
 * for as long as the batch lasts, row by row as Spark's real-time operators want them, each range answer
 * still one Arrow frame made into columns (the rows are views of them).  When the broker has nothing past
 * the cursor the task asks again every {@link #POLL_MS} ms (a range read that finds nothing costs the broker
 * one bounds look-up), so a message reaches Spark within about that much of its arrival.  The position it
 * reports is one past the last row handed to Spark (or past a whole answer once all of it was), so the
 * batch's end offset names exactly what was processed.
 */
final class RealTime {
    private RealTime() {
    }

    static final long POLL_MS = 5;

    static final class Factory implements PartitionReaderFactory {
        private final Reads.Factory columnar;

        Factory(Reads.Factory columnar) {
            this.columnar = columnar;
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            RangePartition p = (RangePartition) partition;
            return new Reader(p, columnar.shape(p));
        }

        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return false;
        }
    }

    static final class Reader implements SupportsRealTimeRead<InternalRow> {
        private final RangePartition p;
        private final Wire.Shape shape;
        private final BufferAllocator allocator;
        private StompClient client;
        private Wire.Batches current;
        private ColumnarBatch batch;
        private int row = -1;
        private long cursor;          // where the next range read starts
        private long answerEnd;       // the current answer's pymq-next-seq
        private long handed;          // one past the last row handed to Spark (the reported position)
        private int failures;

        Reader(RangePartition p, Wire.Shape shape) {
            this.p = p;
            this.shape = shape;
            this.cursor = p.start();
            this.handed = p.start();
            this.allocator = Reads.ROOT.newChildAllocator("pymq real-time " + p.destination(), 0, Reads.TASK_MEMORY);
        }

        @Override
        public PartitionOffset getOffset() {
            return new Streams.Position(p.destination(), handed);
        }

        @Override
        public boolean next() throws IOException {
            return nextWithTimeout(System.currentTimeMillis(), 0L).hasRecord();
        }

        @Override
        public RecordStatus nextWithTimeout(Long timeoutMs) throws IOException {
            return nextWithTimeout(System.currentTimeMillis(), timeoutMs);
        }

        @Override
        public RecordStatus nextWithTimeout(Long startTimeMs, Long timeoutMs) throws IOException {
            long deadline = startTimeMs + timeoutMs;
            while (true) {
                // a stopped query kills its tasks while they wait or read: Spark checks between rows, so a row
                // fetched after the kill would still reach the sink in a batch that never commits
                stopIfKilled();
                if (batch != null && row + 1 < batch.numRows()) {
                    row++;
                    handed = current.seq(row) + 1;
                    return RecordStatus.newStatusWithoutArrivalTime(true);
                }
                if (current != null) {
                    batch = current.next();
                    row = -1;
                    if (batch == null) {
                        current.close();
                        current = null;
                        handed = Math.max(handed, answerEnd);     // the whole answer (gaps included) is read
                    }
                    continue;
                }
                if (fetch()) {
                    continue;
                }
                long left = deadline - System.currentTimeMillis();
                if (left <= 0) {
                    return RecordStatus.newStatusWithoutArrivalTime(false);
                }
                Reads.sleep(Math.min(POLL_MS, left));
            }
        }

        private static void stopIfKilled() {
            TaskContext task = TaskContext.get();
            if (task != null) {
                task.killTaskIfInterrupted();
            }
        }

        /** One range read from the cursor; false when the broker had nothing past it. */
        private boolean fetch() {
            try {
                if (client == null) {
                    client = Connections.take(p.connection(), p.worker());
                }
                StompClient.Range r = client.await(client.range(p.destination(), Wire.rangeHeaders(p, cursor,
                        cursor + p.fetchSize(), shape.columns())));
                failures = 0;
                if (p.checkLoss()) {
                    Reads.checkLoss(p.destination(), cursor, r.earliest(), Long.MAX_VALUE);
                }
                if (r.next() <= cursor) {
                    return false;
                }
                if (r.arrow() != null) {
                    current = new Wire.Batches(allocator, r.arrow(), shape);
                } else if (r.count() > 0) {
                    throw PymqException.format("the broker answered " + p.destination() + " message by message (it "
                            + "has no pyarrow): the JVM connector reads Arrow answers only");
                }
                cursor = r.next();
                answerEnd = r.next();
                if (current == null) {
                    handed = Math.max(handed, answerEnd);
                }
                return true;
            } catch (PymqException e) {
                if (!e.retryable()) {
                    throw e;
                }
                if (client != null) {
                    Connections.closeQuietly(client);
                    client = null;
                }
                if (++failures > p.retries()) {
                    throw e;
                }
                Reads.sleep(p.retryIntervalMs());
                return false;
            }
        }

        @Override
        public InternalRow get() {
            return batch.getRow(row);
        }

        @Override
        public void close() {
            if (current != null) {
                current.close();
                current = null;
            }
            if (client != null) {
                Connections.give(p.connection(), p.worker(), client);
                client = null;
            }
            allocator.close();
        }
    }
}
