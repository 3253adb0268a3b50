package io.pymq.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * One task: {@code start <= seq < end} of one destination, and everything its read needs (an executor sees
 * nothing of the driver's state).  {@code worker}/{@code workers}: with a broker running several workers,
 * the one that owns the destination, which the task connects to (-1: any).
 */
record RangePartition(Options.Connection connection, String destination, long start, long end, String selector,
                      String subscription, int fetchSize, boolean checkLoss, String source, int retries,
                      long retryIntervalMs, int worker, int workers) implements InputPartition {
}
