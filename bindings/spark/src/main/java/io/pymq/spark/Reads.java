package io.pymq.spark;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayDeque;
import java.util.Deque;

/**
 * Executor side of a read: a task reads its partition's range in windows of {@code fetchSize} sequence
 * numbers, {@link #FETCHES_IN_FLIGHT} asked ahead on its connection (the broker builds the next answer while
 * Spark takes the current one), and hands each Arrow answer to Spark as ColumnarBatches (spec/spark.md §6).
 * Rows come in sequence order: a window whose answer stopped early (its byte cap) is finished from
 * {@code pymq-next-seq} before the next window's rows.  A fetch whose connection fails is retried on a new
 * connection from the cursor (the first sequence number not yet handed over), so a retry neither skips nor
 * repeats a row; with {@code failOnDataLoss} every fetch checks that nothing planned for it was removed.
 * Nothing is removed or acknowledged here: a retried or speculative task would otherwise lose messages.
 */
final class Reads {
    private Reads() {
    }

    private static final Logger LOG = LoggerFactory.getLogger("io.pymq.spark");

    /** A bound on one answer's body bytes (at least one message is always sent; the broker caps at 16 MiB). */
    static final long ARROW_FETCH_BYTES = 32L * 1024 * 1024;
    /** Range requests a task keeps on the wire (tests may lower it to 1: see {@link Probe}). */
    static volatile int FETCHES_IN_FLIGHT = 2;
    /** The executors' Arrow memory; each reader takes a bounded child of it. */
    static final BufferAllocator ROOT = new RootAllocator(Long.MAX_VALUE);
    /** At most this much Arrow memory per task: a hostile answer cannot make an executor allocate without end. */
    static final long TASK_MEMORY = 1L << 30;

    static final class Factory implements PartitionReaderFactory {
        private final Wire.Shape shapeTemplate;

        Factory(Wire.Shape shape) {
            this.shapeTemplate = shape;
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            throw new UnsupportedOperationException("the pymq source reads columnar batches only");
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            RangePartition p = (RangePartition) partition;
            return new RangeReader(p, shape(p));
        }

        Wire.Shape shape(RangePartition p) {
            return new Wire.Shape(p.destination(), Options.kind(p.destination()), shapeTemplate.required(),
                    shapeTemplate.columns(), shapeTemplate.filters());
        }

        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return true;
        }
    }

    /** DataLoss when messages from {@code cursor} on were planned for a read but are gone. */
    static void checkLoss(String destination, long cursor, long earliest, long end) {
        if (earliest > cursor) {
            throw PymqException.dataLoss(destination + ": messages " + cursor + ".." + (Math.min(earliest, end) - 1)
                    + " were planned for this read but the broker no longer holds them (retention or other "
                    + "consumers removed them; earliest available is " + earliest + "). Set failOnDataLoss=false "
                    + "to read what is left", destination, cursor, earliest);
        }
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new PymqException(PymqException.CONNECTION_CLOSED, "interrupted while waiting to retry");
        }
    }

    static final class RangeReader implements PartitionReader<ColumnarBatch> {
        private record Ahead(long upto, StompClient.PendingRange request) {
        }

        private final RangePartition p;
        private final Wire.Shape shape;
        private final BufferAllocator allocator;
        private final Deque<Ahead> ahead = new ArrayDeque<>();
        private StompClient client;
        private Wire.Batches current;
        private ColumnarBatch batch;
        private long cursor;
        private long asked;
        private boolean finished;
        private int failures;
        /** The worker of a --workers broker the last connection lived in (-1: none, or not told). */
        int connectedWorker = -1;

        RangeReader(RangePartition p, Wire.Shape shape) {
            this.p = p;
            this.shape = shape;
            this.cursor = p.start();
            this.asked = p.start();
            this.allocator = ROOT.newChildAllocator("pymq " + p.destination() + " " + p.start(), 0, TASK_MEMORY);
        }

        @Override
        public boolean next() {
            while (true) {
                if (current != null) {
                    ColumnarBatch b = current.next();
                    if (b == null) {
                        current.close();
                        current = null;
                        continue;
                    }
                    if (b.numRows() == 0) {
                        continue;
                    }
                    batch = b;
                    return true;
                }
                if (finished || cursor >= p.end()) {
                    return false;
                }
                fetch();
            }
        }

        /** Takes the next answer in window order into {@link #current}; retries a lost connection. */
        private void fetch() {
            try {
                if (client == null) {
                    client = Connections.take(p.connection(), p.worker());
                    connectedWorker = client.worker;
                    ahead.clear();
                    asked = cursor;
                }
                while (ahead.size() < FETCHES_IN_FLIGHT && asked < p.end()) {
                    long upto = Math.min(p.end(), asked + p.fetchSize());
                    ahead.add(new Ahead(upto, client.range(p.destination(), Wire.rangeHeaders(p, asked, upto,
                            shape.columns()))));
                    asked = upto;
                }
                Ahead next = ahead.poll();
                StompClient.Range r = client.await(next.request());
                failures = 0;
                if (p.checkLoss()) {
                    // on every fetch, not only the first: retention (or another consumer of a queue) may remove
                    // messages while a long partition is read; skipping them would be a silent gap
                    checkLoss(p.destination(), cursor, r.earliest(), p.end());
                }
                if (r.arrow() != null) {
                    current = new Wire.Batches(allocator, r.arrow(), shape);
                } else if (r.count() > 0 || !r.messages().isEmpty()) {
                    throw PymqException.format("the broker answered " + p.destination() + " message by message "
                            + "(it has no pyarrow): the JVM connector reads Arrow answers only; install pyarrow "
                            + "in the broker, or use the Python data source (see pyspark_pymq/README.md)");
                }
                if (r.next() <= cursor) {
                    finished = true;            // nothing at or past the cursor in this range
                    return;
                }
                cursor = r.next();
                if (cursor < next.upto()) {
                    // a limit ended the answer inside its window: the rest of the window comes next
                    ahead.addFirst(new Ahead(next.upto(), client.range(p.destination(),
                            Wire.rangeHeaders(p, cursor, next.upto(), shape.columns()))));
                }
            } catch (PymqException e) {
                if (!e.retryable()) {
                    throw e;
                }
                drop();
                failures++;
                if (failures > p.retries()) {
                    throw e;
                }
                LOG.warn("reading {} from {} failed ({}); retry {} of {} in {} ms", p.destination(), cursor,
                        e.getMessage(), failures, p.retries(), p.retryIntervalMs());
                sleep(p.retryIntervalMs());
            }
        }

        private void drop() {
            if (client != null) {
                Connections.closeQuietly(client);
                client = null;
            }
            ahead.clear();
        }

        @Override
        public ColumnarBatch get() {
            return batch;
        }

        @Override
        public void close() {
            if (current != null) {
                current.close();
                current = null;
            }
            if (client != null) {
                if (ahead.isEmpty()) {
                    Connections.give(p.connection(), p.worker(), client);
                } else {
                    Connections.closeQuietly(client);      // answers still on their way: not reusable
                }
                client = null;
            }
            allocator.close();
        }
    }
}
