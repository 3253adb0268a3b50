package io.pymq.spark;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.arrow.vector.util.TransferPair;
import org.apache.arrow.vector.util.ValueVectorUtility;
import org.apache.spark.sql.execution.vectorized.ConstantColumnVector;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.unsafe.types.UTF8String;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The message batch of the wire (spec/spark.md §5) and the read schema (pyspark_pymq/README.md; the Python
 * twin is {@code pyspark_pymq/_arrow.py}), and one range answer's IPC stream turned into Spark
 * {@link ColumnarBatch}es of the read schema without a row conversion: the broker's Arrow vectors are
 * Spark's columns ({@link ArrowColumnVector}), constants are {@link ConstantColumnVector}s, and the few
 * columns that differ from the wire are views over its vectors ({@link ViewVectors}).
 *
 * <p>An answer is untrusted input: its schema must be the message batch, column for column, every record
 * batch is checked by Arrow Java's own validation ({@link ValueVectorUtility#validateFull}) before Spark
 * sees it, memory comes from a bounded allocator, and anything wrong is a {@code message-format}
 * {@link PymqException} saying what, never a crash of the executor.
 */
final class Wire {
    private Wire() {
    }

    static final String ARROW_STREAM = "application/vnd.apache.arrow.stream";

    /** The wire's columns, in spec/spark.md §5's order. */
    static final List<String> WIRE_NAMES = List.of("seq", "message_id", "timestamp", "expires", "priority",
            "delivery_mode", "body_type", "content_type", "body", "group", "correlation_id", "type", "reply_to",
            "properties", "property_types", "dedup_id");

    static ArrowType wireType(String name) {
        return switch (name) {
            case "seq", "timestamp", "expires" -> new ArrowType.Int(64, true);
            case "priority", "delivery_mode" -> new ArrowType.Int(32, true);
            case "body" -> ArrowType.Binary.INSTANCE;
            case "properties" -> new ArrowType.Map(false);
            default -> ArrowType.Utf8.INSTANCE;
        };
    }

    /** The read schema's columns and the wire column each is made of (null: a constant). */
    static final String[][] READ_COLUMNS = {
            {"destination", null}, {"destinationType", null}, {"partition", null}, {"offset", "seq"},
            {"messageId", "message_id"}, {"correlationId", "correlation_id"}, {"key", "group"}, {"value", "body"},
            {"bodyType", "body_type"}, {"timestamp", "timestamp"}, {"timestampType", null},
            {"expiration", "expires"}, {"priority", "priority"}, {"deliveryMode", "delivery_mode"},
            {"redelivered", null}, {"deliveryCount", null}, {"replyTo", "reply_to"}, {"type", "type"},
            {"properties", "properties"}};

    static String wireOf(String readColumn) {
        for (String[] c : READ_COLUMNS) {
            if (c[0].equals(readColumn)) {
                return c[1];
            }
        }
        return null;
    }

    static StructType readSchema(boolean includeProperties) {
        StructType s = new StructType()
                .add("destination", DataTypes.StringType)
                .add("destinationType", DataTypes.StringType)
                .add("partition", DataTypes.IntegerType)
                .add("offset", DataTypes.LongType)
                .add("messageId", DataTypes.StringType)
                .add("correlationId", DataTypes.StringType)
                .add("key", DataTypes.BinaryType)
                .add("value", DataTypes.BinaryType)
                .add("bodyType", DataTypes.StringType)
                .add("timestamp", DataTypes.TimestampType)
                .add("timestampType", DataTypes.IntegerType)
                .add("expiration", DataTypes.TimestampType)
                .add("priority", DataTypes.IntegerType)
                .add("deliveryMode", DataTypes.IntegerType)
                .add("redelivered", DataTypes.BooleanType)
                .add("deliveryCount", DataTypes.IntegerType)
                .add("replyTo", DataTypes.StringType)
                .add("type", DataTypes.StringType);
        return includeProperties ? s.add("properties",
                DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType)) : s;
    }

    /** The wire columns to ask for ({@code pymq-columns}): {@code seq} and those of the read columns wanted. */
    static List<String> wireColumns(StructType required, Set<String> filterColumns) {
        Set<String> wanted = new LinkedHashSet<>();
        wanted.add("seq");
        for (StructField f : required.fields()) {
            String w = wireOf(f.name());
            if (w != null) {
                wanted.add(w);
            }
        }
        for (String c : filterColumns) {
            String w = wireOf(c);
            if (w != null) {
                wanted.add(w);
            }
        }
        List<String> out = new ArrayList<>();
        for (String n : WIRE_NAMES) {
            if (wanted.contains(n)) {
                out.add(n);
            }
        }
        return out;
    }

    /** What a task's answers are made into: the read columns wanted, for which destination. */
    record Shape(String destination, String kind, StructType required, List<String> columns,
                 Filters.Rows filters) implements Serializable {
    }

    /** The answer's schema must be §5's batch: every column, or exactly the ones asked for, in order. */
    static void checkSchema(Schema schema, List<String> asked) {
        List<Field> fields = schema.getFields();
        List<String> names = new ArrayList<>();
        for (Field f : fields) {
            names.add(f.getName());
        }
        boolean ok = names.equals(WIRE_NAMES) || names.equals(asked);
        for (Field f : fields) {
            ok = ok && typeOk(f);
        }
        if (!ok) {
            StringBuilder got = new StringBuilder();
            for (Field f : fields) {
                got.append(got.length() == 0 ? "" : ", ").append(f.getName()).append(' ').append(f.getType());
            }
            throw PymqException.format("the broker's Arrow answer is not a pymq message batch (spec/spark.md §5): "
                    + "got columns " + got);
        }
    }

    private static boolean typeOk(Field f) {
        if (!WIRE_NAMES.contains(f.getName()) || !f.getType().equals(wireType(f.getName()))) {
            return false;
        }
        if (f.getName().equals("properties")) {
            // map<utf8, utf8>: one struct child of a utf8 key and a utf8 value
            List<Field> entries = f.getChildren();
            if (entries.size() != 1 || entries.get(0).getChildren().size() != 2) {
                return false;
            }
            for (Field kv : entries.get(0).getChildren()) {
                if (!kv.getType().equals(ArrowType.Utf8.INSTANCE)) {
                    return false;
                }
            }
        }
        return true;
    }

    static PymqException malformed(String what, Throwable e) {
        return new PymqException(PymqException.MESSAGE_FORMAT, "the broker's Arrow answer for " + what
                + " is not a valid Arrow IPC stream of a pymq message batch: " + e, e);
    }

    /**
     * One answer's record batches as ColumnarBatches of the read shape.  {@link #next} returns a batch that
     * stays valid until the following call (Spark's PartitionReader contract); {@link #close} frees it all.
     */
    static final class Batches implements AutoCloseable {
        private final ArrowStreamReader reader;
        private final BufferAllocator allocator;
        private final Shape shape;
        private final UTF8String destination;
        private final UTF8String kind;
        private VectorSchemaRoot filtered;

        Batches(BufferAllocator allocator, byte[] ipc, Shape shape) {
            this.allocator = allocator;
            this.shape = shape;
            this.destination = UTF8String.fromString(shape.destination());
            this.kind = UTF8String.fromString(shape.kind());
            try {
                this.reader = new ArrowStreamReader(new ByteArrayInputStream(ipc), allocator);
                checkSchema(reader.getVectorSchemaRoot().getSchema(), shape.columns());
            } catch (PymqException e) {
                throw e;
            } catch (IOException | RuntimeException e) {
                throw malformed(shape.destination(), e);
            }
        }

        /** The next batch of the answer (rows a filter keeps), or null at its end. */
        ColumnarBatch next() {
            VectorSchemaRoot root;
            try {
                if (!reader.loadNextBatch()) {
                    return null;
                }
                root = reader.getVectorSchemaRoot();
                ValueVectorUtility.validateFull(root);
            } catch (IOException | RuntimeException e) {
                throw malformed(shape.destination(), e);
            }
            if (shape.filters() != null) {
                root = keep(root);
            }
            return columns(root);
        }

        /** The rows of {@code root} the pushed filters keep (a copy only when some row is dropped). */
        private VectorSchemaRoot keep(VectorSchemaRoot root) {
            int n = root.getRowCount();
            java.util.BitSet kept = shape.filters().evaluate(root);
            if (kept.cardinality() == n) {
                return root;
            }
            if (filtered != null) {
                filtered.close();
            }
            List<FieldVector> copies = new ArrayList<>();
            for (FieldVector v : root.getFieldVectors()) {
                FieldVector target = v.getField().createVector(allocator);
                target.allocateNew();
                TransferPair pair = v.makeTransferPair(target);
                int j = 0;
                for (int i = kept.nextSetBit(0); i >= 0; i = kept.nextSetBit(i + 1)) {
                    pair.copyValueSafe(i, j++);
                }
                target.setValueCount(j);
                copies.add(target);
            }
            filtered = new VectorSchemaRoot(copies);
            filtered.setRowCount(kept.cardinality());
            return filtered;
        }

        private ColumnarBatch columns(VectorSchemaRoot root) {
            int n = root.getRowCount();
            StructField[] fields = shape.required().fields();
            ColumnVector[] cols = new ColumnVector[fields.length];
            for (int i = 0; i < fields.length; i++) {
                cols[i] = column(fields[i].name(), fields[i].dataType(), root, n);
            }
            return new ColumnarBatch(cols, n);
        }

        private ColumnVector column(String name, DataType type, VectorSchemaRoot root, int n) {
            switch (name) {
                case "destination" -> {
                    return text(n, destination);
                }
                case "destinationType" -> {
                    return text(n, kind);
                }
                case "partition", "timestampType" -> {
                    ConstantColumnVector c = new ConstantColumnVector(n, DataTypes.IntegerType);
                    c.setInt(0);
                    return c;
                }
                case "deliveryCount" -> {
                    ConstantColumnVector c = new ConstantColumnVector(n, DataTypes.IntegerType);
                    c.setInt(1);          // range reads carry no delivery state (as the per-message path)
                    return c;
                }
                case "redelivered" -> {
                    ConstantColumnVector c = new ConstantColumnVector(n, DataTypes.BooleanType);
                    c.setBoolean(false);
                    return c;
                }
                case "key" -> {
                    return new ViewVectors.Utf8AsBinary((VarCharVector) vector(root, "group"));
                }
                case "timestamp" -> {
                    return new ViewVectors.MillisAsMicros((BigIntVector) vector(root, "timestamp"), false);
                }
                case "expiration" -> {
                    return new ViewVectors.MillisAsMicros((BigIntVector) vector(root, "expires"), true);
                }
                case "replyTo" -> {
                    VarCharVector v = (VarCharVector) vector(root, "reply_to");
                    ViewVectors.DestinationsOnly view = ViewVectors.DestinationsOnly.of(v);
                    return view != null ? view : new ArrowColumnVector(v);
                }
                default -> {
                    return new ArrowColumnVector(vector(root, wireOf(name)));
                }
            }
        }

        private FieldVector vector(VectorSchemaRoot root, String wire) {
            FieldVector v = root.getVector(wire);
            if (v == null) {
                throw PymqException.format("the broker's Arrow answer for " + shape.destination() + " has no column '"
                        + wire + "', which this read asked for");
            }
            return v;
        }

        private static ColumnVector text(int n, UTF8String value) {
            ConstantColumnVector c = new ConstantColumnVector(n, DataTypes.StringType);
            c.setUtf8String(value);
            return c;
        }

        @Override
        public void close() {
            if (filtered != null) {
                filtered.close();
                filtered = null;
            }
            try {
                reader.close();
            } catch (IOException | RuntimeException ignored) {
                // its buffers are released either way; a close failure changes nothing for the read
            }
        }
    }

    /** The headers of a range read in Arrow for a task. */
    static Map<String, String> rangeHeaders(RangePartition p, long lo, long hi, List<String> columns) {
        return StompClient.rangeHeaders(lo, hi, (long) p.fetchSize(), Reads.ARROW_FETCH_BYTES, null, p.selector(),
                p.subscription(), p.source(), true, String.join(",", columns));
    }
}
