package io.pymq.spark;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

import java.util.Map;
import java.util.Set;

/**
 * The {@code pymq} format on the JVM: a Spark DataSource V2 that PySpark (or Scala, Java) loads from its
 * jar ({@code spark.jars} / {@code --packages}); with the jar on the classpath Spark's lookup finds this class
 * for {@code format("pymq")} before any Python data source of that name, and without it the Python data
 * source ({@code pyspark_pymq}) answers.  Options, schema and guarantees are the Python data source's
 * (pyspark_pymq/README.md; spec/spark.md is the contract both implement).
 */
public final class PymqSource implements TableProvider, DataSourceRegister {
    @Override
    public String shortName() {
        return "pymq";
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        // called by load() for reads: the earliest place to refuse bad read options, before any job
        return Wire.readSchema(Options.read(options.asCaseSensitiveMap(), null).includeProperties());
    }

    @Override
    public boolean supportsExternalMetadata() {
        // a write hands over the DataFrame's own schema (a Kafka-style flexible sink)
        return true;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return new PymqTable(schema, properties);
    }

    static final class PymqTable implements SupportsRead, SupportsWrite {
        private final StructType schema;
        private final Map<String, String> properties;

        PymqTable(StructType schema, Map<String, String> properties) {
            this.schema = schema;
            this.properties = properties;
        }

        @Override
        public String name() {
            return "pymq";
        }

        @Override
        public StructType schema() {
            return schema;
        }

        @Override
        public Set<TableCapability> capabilities() {
            return Set.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ, TableCapability.BATCH_WRITE,
                    TableCapability.STREAMING_WRITE, TableCapability.TRUNCATE, TableCapability.ACCEPT_ANY_SCHEMA);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            Map<String, String> opts = options.asCaseSensitiveMap();
            return new BatchScan(Options.read(opts, null), opts);
        }

        @Override
        public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
            return new Sink.Builder(info);
        }
    }
}
