package io.pymq.spark;

import org.apache.spark.SparkContext;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * {@code spark.read.format("pymq")} (and the stream's scan): the columns Spark needs become the wire
 * columns the broker is asked for ({@code pymq-columns}: a {@code count()} moves only sequence numbers), and
 * with {@code filterPushdown=true} the filters the Python data source claims are claimed here too (no
 * Spark setting needed: that one is for Python sources).
 */
final class BatchScan implements ScanBuilder, SupportsPushDownRequiredColumns, SupportsPushDownFilters {
    private final Options.Read opts;
    private final Map<String, String> options;
    private StructType required;
    private final Filters.Pushdown push = new Filters.Pushdown();
    private Filter[] pushed = new Filter[0];

    BatchScan(Options.Read opts, Map<String, String> options) {
        this.opts = opts;
        this.options = options;
        this.required = Wire.readSchema(opts.includeProperties());
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
        this.required = requiredSchema;
    }

    @Override
    public Filter[] pushFilters(Filter[] filters) {
        if (!opts.filterPushdown()) {
            return filters;
        }
        List<Filter> remaining = Filters.translate(filters, push);
        List<Filter> taken = new ArrayList<>(List.of(filters));
        taken.removeAll(remaining);
        pushed = taken.toArray(new Filter[0]);
        return remaining.toArray(new Filter[0]);
    }

    @Override
    public Filter[] pushedFilters() {
        return pushed;
    }

    @Override
    public Scan build() {
        return new PymqScan(opts, options, required, push);
    }

    /** Spark's default parallelism on the driver (the pieces a read is cut into at least). */
    static long parallelism(Options.Read opts) {
        if (opts.minPartitions() != null) {
            return opts.minPartitions();
        }
        try {
            return Math.max(1, SparkContext.getOrCreate().defaultParallelism());
        } catch (RuntimeException e) {
            return 1;
        }
    }

    static final class PymqScan implements Scan, Batch {
        private final Options.Read opts;
        private final Map<String, String> options;
        private final StructType required;
        private final Filters.Pushdown push;

        PymqScan(Options.Read opts, Map<String, String> options, StructType required, Filters.Pushdown push) {
            this.opts = opts;
            this.options = options;
            this.required = required;
            this.push = push;
        }

        @Override
        public StructType readSchema() {
            return required;
        }

        @Override
        public String description() {
            return "pymq " + (opts.pattern() != null ? opts.pattern() : String.join(",", opts.destinations()));
        }

        @Override
        public Batch toBatch() {
            // the rules that depend on batch or stream (consume mode, the per-trigger limits) are checked
            // here, when Spark plans the batch read, before any job
            Options.read(options, false);
            return this;
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
            return new Streams.Micro(Options.read(options, true), required);
        }

        @Override
        public InputPartition[] planInputPartitions() {
            try (Planner planner = new Planner(opts)) {
                List<RangePartition> parts = planner.retrying(() -> plan(planner), "planning the read");
                return parts.toArray(new InputPartition[0]);
            }
        }

        private List<RangePartition> plan(Planner planner) {
            List<String> kept = new ArrayList<>();
            for (String d : planner.resolve()) {
                if (push.keeps(d)) {
                    kept.add(d);
                }
            }
            List<Plan.Span> spans = new ArrayList<>();
            for (Map.Entry<String, long[]> e : planner.readable(kept).entrySet()) {
                String dest = e.getKey();
                long start = planner.start(dest, "earliest", e.getValue());
                long end = planner.end(dest, e.getValue());
                long[] narrowed = push.narrow(start, end);
                spans.add(new Plan.Span(dest, narrowed[0], Math.max(narrowed[0], narrowed[1])));
            }
            // bodies dominate what a task moves only when it reads them: a read without `value` (a count(),
            // headers only) moves a few fixed bytes a row, so its pieces are cut by width, without probes
            boolean bodies = List.of(required.fieldNames()).contains("value");
            return planner.partitions(spans, parallelism(opts), bodies);
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return factory(opts, required, push.headerFilters);
        }
    }

    static Reads.Factory factory(Options.Read opts, StructType required, List<Filter> headerFilters) {
        List<String> filterColumns = new ArrayList<>(Filters.columnsOf(headerFilters));
        List<String> columns = Wire.wireColumns(required, new java.util.HashSet<>(filterColumns));
        for (StructField f : required.fields()) {
            if (f.name().equals("properties") && !opts.includeProperties()) {
                throw PymqException.config("column 'properties' needs option includeProperties=true");
            }
        }
        return new Reads.Factory(new Wire.Shape("", "", required, columns,
                headerFilters.isEmpty() ? null : new Filters.Rows(headerFilters)));
    }
}
