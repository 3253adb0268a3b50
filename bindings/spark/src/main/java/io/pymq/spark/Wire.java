package io.pymq.spark;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.complex.MapVector;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.vector.VectorLoader;
import org.apache.arrow.vector.ipc.ReadChannel;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.ipc.message.MessageMetadataResult;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.flatbuf.MessageHeader;
import org.apache.arrow.flatbuf.RecordBatch;
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
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
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
            // Spark's map accessor finds the entries' children by these names
            List<Field> kv = entries.get(0).getChildren();
            if (!kv.get(0).getName().equals(MapVector.KEY_NAME) || !kv.get(1).getName().equals(MapVector.VALUE_NAME)
                    || kv.get(0).isNullable() || !(entries.get(0).getType() instanceof ArrowType.Struct)) {
                return false;
            }
            for (Field f2 : kv) {
                if (!f2.getType().equals(ArrowType.Utf8.INSTANCE)) {
                    return false;
                }
            }
        }
        return true;
    }

    /**
     * Arrow Java's full validation of every column.  Its type check refuses every MapVector (19.0 checks a
     * map against the list type it extends), so a map column is checked here by the same rules: offsets from
     * 0, never decreasing, within its entries, which are then validated in full as a struct.
     */
    static void validate(VectorSchemaRoot root) {
        if (root.getRowCount() < 0) {
            throw new IllegalArgumentException("negative row count " + root.getRowCount());
        }
        for (FieldVector v : root.getFieldVectors()) {
            if (v.getValueCount() != root.getRowCount()) {
                throw new IllegalArgumentException("column " + v.getName() + " has " + v.getValueCount()
                        + " values for " + root.getRowCount() + " rows");
            }
            if (v instanceof MapVector map) {
                int n = map.getValueCount();
                var offsets = map.getOffsetBuffer();
                if (offsets.capacity() < (long) (n + 1) * MapVector.OFFSET_WIDTH && n > 0) {
                    throw new IllegalArgumentException("map column " + v.getName() + ": offset buffer too small");
                }
                int entries = map.getDataVector().getValueCount();
                int previous = n > 0 ? offsets.getInt(0) : 0;
                if (previous < 0) {
                    throw new IllegalArgumentException("map column " + v.getName() + ": negative first offset");
                }
                for (int i = 1; i <= n; i++) {
                    int o = offsets.getInt((long) i * MapVector.OFFSET_WIDTH);
                    if (o < previous || o > entries) {
                        throw new IllegalArgumentException("map column " + v.getName() + ": offset " + o + " at "
                                + i + " is out of order or past its " + entries + " entries");
                    }
                    previous = o;
                }
                ValueVectorUtility.validateFull(map.getDataVector());
            } else if (v instanceof org.apache.arrow.vector.BaseVariableWidthVector w) {
                // validateFull's data check of a variable-width column is its offsets, none negative or
                // decreasing, each boxed into its message's arguments whether it fails or not (about a fifth
                // of the JVM's CPU of a full scan, measured): offsets() below checks the same and more, so
                // only Arrow's buffer checks are asked of it here, and a string column's UTF-8 once its
                // offsets are known good (validateScalars reads every value by them)
                ValueVectorUtility.validate(w);
            } else {
                ValueVectorUtility.validateFull(v);
            }
            offsets(v);
            if (v instanceof org.apache.arrow.vector.BaseVariableWidthVector w) {
                w.validateScalars();
            }
        }
    }

    /**
     * What Arrow Java's validation leaves out for variable-width values (found by the fuzz target): every
     * offset from 0 on, never decreasing, the last within the data buffer; children too.
     */
    private static void offsets(org.apache.arrow.vector.ValueVector v) {
        if (v instanceof org.apache.arrow.vector.BaseVariableWidthVector w) {
            int n = w.getValueCount();
            var offsets = w.getOffsetBuffer();
            if (n > 0 && offsets.capacity() < (long) (n + 1) * 4) {
                throw new IllegalArgumentException(w.getName() + ": offset buffer too small for " + n + " values");
            }
            long previous = 0;
            for (int i = 0; i <= n && n > 0; i++) {
                int o = offsets.getInt((long) i * 4);
                if (o < previous) {
                    throw new IllegalArgumentException(w.getName() + ": offset " + o + " at " + i
                            + " is negative or decreasing");
                }
                previous = o;
            }
            if (n > 0 && previous > w.getDataBuffer().capacity()) {
                throw new IllegalArgumentException(w.getName() + ": values end at " + previous + ", past the "
                        + w.getDataBuffer().capacity() + " bytes of data");
            }
        }
        if (v instanceof org.apache.arrow.vector.complex.AbstractStructVector s) {
            for (int i = 0; i < s.size(); i++) {
                offsets(s.getChildByOrdinal(i));
            }
        }
        if (v instanceof MapVector m) {
            offsets(m.getDataVector());
        }
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
        private final ByteArrayInputStream in;
        private final ReadChannel channel;
        private final VectorSchemaRoot root;
        private final BufferAllocator allocator;
        private final Shape shape;
        private final UTF8String destination;
        private final UTF8String kind;
        private VectorSchemaRoot filtered;
        private VectorSchemaRoot last;

        /**
         * Reads the stream message by message with Arrow Java's own parts (rather than its ArrowStreamReader,
         * which keeps a record batch's body buffer when the batch's metadata points outside it: a leak per
         * hostile answer) and checks the schema before anything is allocated for it.
         */
        Batches(BufferAllocator allocator, byte[] ipc, Shape shape) {
            this.allocator = allocator;
            this.shape = shape;
            this.destination = UTF8String.fromString(shape.destination());
            this.kind = UTF8String.fromString(shape.kind());
            this.in = new ByteArrayInputStream(ipc);
            this.channel = new ReadChannel(Channels.newChannel(in));
            VectorSchemaRoot made = null;
            try {
                MessageMetadataResult first = readMeta();
                if (first == null || first.getMessage().headerType() != MessageHeader.Schema) {
                    throw new IllegalArgumentException("the stream does not start with a schema");
                }
                skipBody(first);
                Schema schema = MessageSerializer.deserializeSchema(first.getMessage());
                checkSchema(schema, shape.columns());
                made = VectorSchemaRoot.create(schema, allocator);
            } catch (PymqException e) {
                throw e;
            } catch (IOException | RuntimeException e) {
                throw malformed(shape.destination(), e);
            }
            this.root = made;
        }

        /**
         * One message's metadata (the IPC framing: an optional 0xFFFFFFFF continuation, an int32 length, the
         * flatbuffer), or null at the end-of-stream marker or the answer's end.  Read here rather than by
         * Arrow's MessageSerializer, which allocates whatever length the stream claims on the heap: a
         * hostile length is refused before any allocation.
         */
        private MessageMetadataResult readMeta() throws IOException {
            if (in.available() == 0) {
                return null;
            }
            int length = readInt();
            if (length == -1) {
                length = readInt();
            }
            if (length == 0) {
                return null;
            }
            if (length < 0 || length > in.available()) {
                throw new IllegalArgumentException("a message's metadata of " + length + " bytes where "
                        + in.available() + " remain");
            }
            return MessageMetadataResult.create(ByteBuffer.wrap(in.readNBytes(length)), length);
        }

        private int readInt() throws IOException {
            if (in.available() < 4) {
                throw new IllegalArgumentException("the stream ends inside a message's length");
            }
            byte[] b = in.readNBytes(4);
            return (b[0] & 0xFF) | (b[1] & 0xFF) << 8 | (b[2] & 0xFF) << 16 | (b[3] & 0xFF) << 24;
        }

        private void skipBody(MessageMetadataResult m) throws IOException {
            long length = m.getMessageBodyLength();
            if (length < 0 || length > in.available()) {
                throw new IllegalArgumentException("a message body of " + length + " bytes where " + in.available()
                        + " remain");
            }
            in.skipNBytes(length);
        }

        /**
         * The next record batch loaded into the root (validated), or null at the stream's end.  Read with
         * Arrow Java's own parts rather than its ArrowStreamReader, whose reads keep a message's body buffer
         * when the message is malformed (a leak per hostile answer): a body is allocated only once its length
         * is known to lie within the answer, and released whatever fails after.
         */
        VectorSchemaRoot nextRoot() {
            try {
                MessageMetadataResult m = readMeta();
                if (m == null) {
                    return null;
                }
                if (m.getMessage().headerType() != MessageHeader.RecordBatch) {
                    throw new IllegalArgumentException("a message of type " + m.getMessage().headerType()
                            + " where record batches were expected (a pymq answer has no dictionaries)");
                }
                long length = m.getMessageBodyLength();
                if (length < 0 || length > in.available()) {
                    throw new IllegalArgumentException("a record batch body of " + length + " bytes where "
                            + in.available() + " remain");
                }
                checkBuffers(m, length, root.getSchema());
                ArrowBuf body = allocator.buffer(length);
                ArrowRecordBatch batch;
                try {
                    if (channel.readFully(body, length) != length) {
                        throw new IOException("the record batch's body ends early");
                    }
                    // releases the body itself once it made the batch (whose buffers are slices of it)
                    batch = MessageSerializer.deserializeRecordBatch(m.getMessage(), body);
                } catch (IOException | RuntimeException e) {
                    // nothing holds the body or a slice of it any more: every reference goes
                    if (body.refCnt() > 0) {
                        body.getReferenceManager().release(body.refCnt());
                    }
                    throw e;
                }
                try (batch) {
                    new VectorLoader(root).load(batch);
                }
                validate(root);
                return root;
            } catch (PymqException e) {
                throw e;
            } catch (IOException | RuntimeException e) {
                throw malformed(shape.destination(), e);
            }
        }

        /** A record batch's metadata must place every buffer inside its body, count no negative rows and
         * use no compression (pymq never compresses: a codec's output size is the sender's to choose). */
        private static void checkBuffers(MessageMetadataResult m, long bodyLength, Schema schema) {
            RecordBatch rb = (RecordBatch) m.getMessage().header(new RecordBatch());
            if (rb == null) {
                throw new IllegalArgumentException("a record batch message without its header");
            }
            if (rb.length() < 0 || rb.length() > Integer.MAX_VALUE) {
                throw new IllegalArgumentException("a record batch of " + rb.length() + " rows");
            }
            if (rb.compression() != null) {
                throw new IllegalArgumentException("a compressed record batch (pymq answers are not compressed)");
            }
            for (int i = 0; i < rb.nodesLength(); i++) {
                var node = rb.nodes(i);
                if (node.length() < 0 || node.nullCount() < 0 || node.nullCount() > node.length()) {
                    throw new IllegalArgumentException("field node " + i + ": length " + node.length()
                            + ", null count " + node.nullCount());
                }
            }
            // every top-level column has as many values as the batch has rows, and every buffer is as large as
            // its values need (Arrow Java grows a column otherwise, and leaks the new buffer when that fails)
            int[] at = {0, 0};
            for (Field f : schema.getFields()) {
                if (at[0] >= rb.nodesLength() || rb.nodes(at[0]).length() != rb.length()) {
                    throw new IllegalArgumentException("column " + f.getName() + " does not have the batch's "
                            + rb.length() + " rows");
                }
                sizes(f, rb, at);
            }
            for (int i = 0; i < rb.buffersLength(); i++) {
                var b = rb.buffers(i);
                long offset = b.offset();
                long length = b.length();
                if (offset < 0 || length < 0 || offset > bodyLength || length > bodyLength - offset) {
                    throw new IllegalArgumentException("buffer " + i + " at " + offset + " of " + length
                            + " bytes lies outside the batch's body of " + bodyLength + " bytes");
                }
            }
        }

        /** A field's buffers (and its children's, depth first) are large enough for its node's values. */
        private static void sizes(Field f, RecordBatch rb, int[] at) {
            if (at[0] >= rb.nodesLength()) {
                throw new IllegalArgumentException("no field node for " + f.getName());
            }
            var node = rb.nodes(at[0]++);
            long n = node.length();
            int count = org.apache.arrow.vector.TypeLayout.getTypeBufferCount(f.getType());
            if (at[1] + count > rb.buffersLength()) {
                throw new IllegalArgumentException("not enough buffers for " + f.getName());
            }
            long validity = rb.buffers(at[1]).length();
            long second = count > 1 ? rb.buffers(at[1] + 1).length() : 0;
            at[1] += count;
            if (validity < (n + 7) / 8 && !(validity == 0 && node.nullCount() == 0)) {
                throw new IllegalArgumentException(f.getName() + ": validity buffer of " + validity + " bytes for "
                        + n + " values");
            }
            long needed = switch (f.getType().getTypeID()) {
                case Int -> n * (((ArrowType.Int) f.getType()).getBitWidth() / 8);
                case Utf8, Binary, Map, List -> n > 0 ? (n + 1) * 4 : 0;
                default -> 0;
            };
            if (second < needed) {
                throw new IllegalArgumentException(f.getName() + ": a buffer of " + second + " bytes for " + n
                        + " values (" + needed + " needed)");
            }
            for (Field c : f.getChildren()) {
                sizes(c, rb, at);
            }
        }

        /** The next batch of the answer (rows a filter keeps), or null at its end. */
        ColumnarBatch next() {
            VectorSchemaRoot loaded = nextRoot();
            if (loaded == null) {
                return null;
            }
            if (shape.filters() != null) {
                loaded = keep(loaded);
            }
            last = loaded;
            try {
                return columns(loaded);
            } catch (PymqException e) {
                throw e;
            } catch (RuntimeException e) {
                throw malformed(shape.destination(), e);
            }
        }

        /** The sequence number of a row of the batch {@link #next} returned last. */
        long seq(int row) {
            return ((BigIntVector) last.getVector("seq")).get(row);
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
            if (root != null) {
                root.close();
            }
            try {
                channel.close();
            } catch (IOException | RuntimeException ignored) {
                // a byte array's channel: nothing to release
            }
        }
    }

    /** The headers of a range read in Arrow for a task. */
    static Map<String, String> rangeHeaders(RangePartition p, long lo, long hi, List<String> columns) {
        return StompClient.rangeHeaders(lo, hi, (long) p.fetchSize(), Reads.ARROW_FETCH_BYTES, null, p.selector(),
                p.subscription(), p.source(), true, String.join(",", columns));
    }
}
