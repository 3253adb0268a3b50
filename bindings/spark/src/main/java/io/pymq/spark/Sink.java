package io.pymq.spark;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BaseVariableWidthVector;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.IntVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.complex.MapVector;
import org.apache.arrow.vector.complex.impl.UnionMapWriter;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.SupportsTruncate;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.internal.connector.SupportsStreamingUpdateAsAppend;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.UUID;

/**
 * {@code df.write.format("pymq")} and {@code df.writeStream.format("pymq")}: each task turns its rows into
 * bulk SENDs (spec/spark.md §7) with the columns, defaults, checks and error sentences of the Python
 * sink ({@code pyspark_pymq/_bulk.py}, {@code sink.py}; user table in pyspark_pymq/README.md "Writing"):
 * rows are written straight from Spark's {@link InternalRow}s (a columnar input reaches a V2 writer as rows
 * over its column vectors; a value or key is copied from the row's own memory, no array made per value)
 * into Arrow vectors per destination, cut at about 8 MiB, up to three frames in flight while the next is
 * built (each frame's vectors and IPC buffer reused for the next), and the task reports success only after
 * its last receipt.  At-least-once, like
 * Kafka; with {@code dedup=true} every message carries {@code <query id>:<batch id>:<partition>:<row>}
 * (streams) or {@code <dedupPrefix or a per-write id>:<partition>:<row>} (batch), and the broker drops the
 * copies a retried task or a replayed micro-batch sends (spec/spark.md §3).
 */
final class Sink {
    private Sink() {
    }

    static final int FRAME_BYTES = 8 * 1024 * 1024;
    static final int FRAMES_IN_FLIGHT = 3;

    static final Map<String, List<String>> WRITE_COLUMNS = new LinkedHashMap<>();
    static final Set<String> IGNORED = Set.of("destinationType", "partition", "offset", "messageId", "timestamp",
            "timestampType", "redelivered", "deliveryCount");
    static final List<String> PROPERTY_VALUE_TYPES = List.of("string", "boolean", "byte", "short", "integer", "long",
            "float", "double");
    static final Set<String> RESERVED = Set.of("ack", "browser", "content-length", "content-type", "correlation-id",
            "destination", "expiration", "expires", "message-id", "persistent", "priority", "pymq-dedup-id",
            "pymq-seq", "pymq-types", "receipt", "redelivered", "reply-to", "subscription", "timestamp",
            "transaction", "transformation", "type");

    static {
        WRITE_COLUMNS.put("value", List.of("binary", "string"));
        WRITE_COLUMNS.put("destination", List.of("string"));
        WRITE_COLUMNS.put("topic", List.of("string"));
        WRITE_COLUMNS.put("key", List.of("binary", "string"));
        WRITE_COLUMNS.put("properties", List.of("map"));
        WRITE_COLUMNS.put("priority", List.of("byte", "short", "integer", "long"));
        WRITE_COLUMNS.put("timeToLive", List.of("byte", "short", "integer", "long"));
        WRITE_COLUMNS.put("deliveryMode", List.of("byte", "short", "integer", "long", "string"));
        WRITE_COLUMNS.put("correlationId", List.of("string"));
        WRITE_COLUMNS.put("type", List.of("string"));
        WRITE_COLUMNS.put("replyTo", List.of("string"));
        WRITE_COLUMNS.put("bodyType", List.of("string"));
        WRITE_COLUMNS.put("dedupId", List.of("string"));
        WRITE_COLUMNS.put("expiration", List.of("timestamp", "timestamp_ntz"));
    }

    /** Refuse, on the driver, a DataFrame the sink cannot turn into messages (before any job). */
    static void checkSchema(StructType schema, Options.Write opts) {
        List<String> names = List.of(schema.fieldNames());
        if (!names.contains("value")) {
            throw PymqException.config("the DataFrame written to pymq needs a 'value' column (string or binary); it "
                    + "has " + (names.isEmpty() ? "no columns" : String.join(", ", names)));
        }
        if (names.contains("destination") && names.contains("topic")) {
            throw PymqException.config("columns 'destination' and 'topic' both say where a row goes; keep one");
        }
        if (opts.destination() == null && !names.contains("destination") && !names.contains("topic")) {
            throw PymqException.config("say where to send: a 'destination' column (e.g. '/queue/orders'), a 'topic' "
                    + "column (a topic name, as Kafka's sink takes it), or the 'destination', 'queue' or 'topic' "
                    + "option");
        }
        for (StructField f : schema.fields()) {
            if (IGNORED.contains(f.name())) {
                continue;
            }
            List<String> accepted = WRITE_COLUMNS.get(f.name());
            if (accepted == null) {
                throw PymqException.config("column '" + f.name() + "' has no meaning for the pymq sink; its columns are "
                        + String.join(", ", WRITE_COLUMNS.keySet()) + " (drop or rename the others)");
            }
            String kind = f.dataType().typeName();
            if (!accepted.contains(kind)) {
                throw PymqException.config("column '" + f.name() + "' must be of type " + String.join(" or ", accepted)
                        + ", not " + kind);
            }
            if (f.name().equals("properties")) {
                MapType m = (MapType) f.dataType();
                String key = m.keyType().typeName();
                String value = m.valueType().typeName();
                if (!key.equals("string") || !PROPERTY_VALUE_TYPES.contains(value)) {
                    throw PymqException.config("column 'properties' must be a map from string to one of "
                            + String.join(", ", PROPERTY_VALUE_TYPES) + "; got map<" + key + "," + value + ">");
                }
            }
        }
    }

    // -- Spark's write API ---------------------------------------------------------------------------------

    static final class Builder implements WriteBuilder, SupportsTruncate, SupportsStreamingUpdateAsAppend {
        private final LogicalWriteInfo info;
        private final Options.Write opts;
        private boolean truncate;

        Builder(LogicalWriteInfo info) {
            this.info = info;
            this.opts = Options.write(info.options().asCaseSensitiveMap());
            checkSchema(info.schema(), opts);
        }

        @Override
        public WriteBuilder truncate() {
            // a stream's outputMode("complete") sends the whole result table again each trigger, as Kafka's sink
            // does; a batch write cannot replace what a destination holds (refused in buildForBatch)
            truncate = true;
            return this;
        }

        @Override
        public Write build() {
            return new Write() {
                @Override
                public BatchWrite toBatch() {
                    if (truncate) {
                        throw PymqException.config("pymq destinations are append-only: a batch write cannot replace "
                                + "what a destination holds; use mode('append')");
                    }
                    return new Batch(opts, info.schema());
                }

                @Override
                public StreamingWrite toStreaming() {
                    return new Stream(opts, info.schema(), info.queryId());
                }
            };
        }
    }

    /** A task's result: the rows it wrote. */
    record Sent(int partition, long count) implements WriterCommitMessage {
    }

    static final class Batch implements BatchWrite {
        private final Options.Write opts;
        private final StructType schema;
        // drawn here, on the driver, once per write: every attempt of a task sees the same id
        private final String writeId;

        Batch(Options.Write opts, StructType schema) {
            this.opts = opts;
            this.schema = schema;
            this.writeId = opts.dedupPrefix() != null ? opts.dedupPrefix() : UUID.randomUUID().toString().replace("-", "");
        }

        @Override
        public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
            Options.Write o = opts;
            StructType s = schema;
            String id = writeId;
            return (DataWriterFactory) (partitionId, taskId) ->
                    new Writer(o, s, o.dedup() ? Plan.batchDedupBase(id, partitionId) : null, partitionId);
        }

        @Override
        public boolean useCommitCoordinator() {
            return false;
        }

        @Override
        public void commit(WriterCommitMessage[] messages) {
            // each task's frames were durable (their receipts) before it reported success
        }

        @Override
        public void abort(WriterCommitMessage[] messages) {
            // what finished tasks sent stays (a queue has no undo); a rerun with the same dedupPrefix and dedup=true
            // does not send it twice
        }
    }

    static final class Stream implements StreamingWrite {
        private final Options.Write opts;
        private final StructType schema;
        private final String queryId;

        Stream(Options.Write opts, StructType schema, String queryId) {
            this.opts = opts;
            this.schema = schema;
            this.queryId = queryId;
        }

        @Override
        public StreamingDataWriterFactory createStreamingWriterFactory(PhysicalWriteInfo info) {
            Options.Write o = opts;
            StructType s = schema;
            String fallbackQuery = queryId;
            return (StreamingDataWriterFactory) (partitionId, taskId, epochId) -> {
                String base = null;
                if (o.dedup()) {
                    // Spark's persistent query id (kept in the checkpoint: the same after a restart), as the
                    // Python sink reads it; the micro-batch id is the epoch
                    TaskContext ctx = TaskContext.get();
                    String query = ctx == null ? null : ctx.getLocalProperty("sql.streaming.queryId");
                    String id = o.dedupPrefix() != null ? o.dedupPrefix() : query != null ? query : fallbackQuery;
                    base = Plan.streamDedupBase(id, epochId, partitionId);
                }
                return new Writer(o, s, base, partitionId);
            };
        }

        @Override
        public boolean useCommitCoordinator() {
            return false;
        }

        @Override
        public void commit(long epochId, WriterCommitMessage[] messages) {
            // the tasks' frames were durable before they reported success
        }

        @Override
        public void abort(long epochId, WriterCommitMessage[] messages) {
            // sent messages stay; the replayed batch carries the same dedup ids with dedup=true
        }
    }

    // -- one task ------------------------------------------------------------------------------------------

    static final class Writer implements DataWriter<InternalRow> {
        private final Options.Write opts;
        private final int partition;
        private final String dedupBase;
        private final Layout layout;
        private final BufferAllocator allocator;
        private final Map<String, Frame> frames = new LinkedHashMap<>();
        // a flushed frame's vectors keep their capacity for the next frame, and the IPC stream is written into
        // one buffer per task: a frame is written to the socket before sendBulk returns, so neither is
        // allocated (nor grown, nor zeroed) again for every 8 MiB frame
        private Frame spare;
        private final IpcBuffer ipc = new IpcBuffer();
        private final Deque<InFlight> inFlight = new ArrayDeque<>();
        private final Map<String, String> checkedNames = new HashMap<>();
        private StompClient client;
        private long rows;
        private final long now = System.currentTimeMillis();

        private record InFlight(String receipt, String destination, int rows, long firstRow) {
        }

        Writer(Options.Write opts, StructType schema, String dedupBase, int partition) {
            this.opts = opts;
            this.partition = partition;
            this.dedupBase = dedupBase;
            this.layout = new Layout(schema, opts, dedupBase != null);
            this.allocator = Reads.ROOT.newChildAllocator("pymq sink " + partition, 0, Reads.TASK_MEMORY);
        }

        @Override
        public void write(InternalRow row) throws IOException {
            long index = rows;
            String dest = layout.destination(row, index, checkedNames);
            Frame frame = frames.get(dest);
            if (frame == null) {
                frame = spare != null ? spare.restart(index) : new Frame(layout, allocator, index);
                spare = null;
                frames.put(dest, frame);
            }
            frame.add(row, index, now, dedupBase);
            rows++;
            if (frame.bytes() >= FRAME_BYTES) {
                flush(dest);
            }
        }

        private void flush(String dest) {
            Frame frame = frames.remove(dest);
            if (frame == null || frame.count == 0) {
                if (frame != null) {
                    frame.close();
                }
                return;
            }
            int count = frame.count;
            long firstRow = frame.firstRow;
            try {
                ipc.reset(frame.bytes() + 64 * 1024);
                frame.writeIpc(ipc);
            } catch (RuntimeException e) {
                frame.close();
                throw e;
            }
            if (spare == null) {
                spare = frame;
            } else {
                frame.close();
            }
            if (client == null) {
                client = Connections.take(opts.connection(), -1);
            }
            settle(FRAMES_IN_FLIGHT - 1);
            inFlight.add(new InFlight(client.sendBulk(dest, ipc.array(), ipc.size()), dest, count, firstRow));
        }

        /** Waits for receipts until at most {@code limit} frames are in flight. */
        private void settle(int limit) {
            while (inFlight.size() > limit) {
                InFlight f = inFlight.poll();
                try {
                    client.awaitReceipt(f.receipt(), "SEND");
                } catch (PymqException e) {
                    if (e.getMessage() != null && e.getMessage().contains("no pyarrow")) {
                        throw new PymqException(e.code(), "the broker takes no Arrow bulk SEND (no pyarrow there): "
                                + "the JVM connector writes bulk SENDs only; install pyarrow in the broker, or use "
                                + "the Python data source (see pyspark_pymq/README.md)", e);
                    }
                    throw new PymqException(e.code(), "a bulk SEND of " + f.rows() + " rows to " + f.destination()
                            + ", from row " + f.firstRow() + " of this partition on: " + e.getMessage(), e);
                }
            }
        }

        @Override
        public WriterCommitMessage commit() {
            for (String dest : new ArrayList<>(frames.keySet())) {
                flush(dest);
            }
            if (client != null) {
                settle(0);
                Connections.give(opts.connection(), -1, client);
                client = null;
            }
            return new Sent(partition, rows);
        }

        @Override
        public void abort() {
            for (Frame f : frames.values()) {
                f.close();
            }
            frames.clear();
            if (spare != null) {
                spare.close();
                spare = null;
            }
            if (client != null) {
                Connections.closeQuietly(client);
                client = null;
            }
        }

        @Override
        public void close() {
            abort();
            allocator.close();
        }
    }

    /**
     * Where a frame's IPC stream is written: a channel straight into one byte array (Arrow's buffers are copied
     * once, from their memory into it; an OutputStream behind Channels.newChannel copied them twice, through a
     * transfer array), reused for every frame of a task and handed to the socket as it is.
     */
    static final class IpcBuffer implements java.nio.channels.WritableByteChannel {
        private byte[] buf = new byte[0];
        private int size;

        /** Empty again, with room for {@code expected} bytes (grown when a frame needs more than any before). */
        void reset(long expected) {
            size = 0;
            if (buf.length < expected) {
                buf = new byte[(int) Math.min(Integer.MAX_VALUE - 8, expected)];
            }
        }

        @Override
        public int write(ByteBuffer src) {
            int n = src.remaining();
            if ((long) size + n > buf.length) {
                long grown = Math.max((long) size + n, 2L * buf.length);
                if (grown > Integer.MAX_VALUE - 8) {
                    throw new PymqException(PymqException.MESSAGE_FORMAT, "a bulk SEND's Arrow stream outgrew 2 GiB");
                }
                buf = java.util.Arrays.copyOf(buf, (int) grown);
            }
            src.get(buf, size, n);
            size += n;
            return n;
        }

        byte[] array() {
            return buf;
        }

        int size() {
            return size;
        }

        @Override
        public boolean isOpen() {
            return true;
        }

        @Override
        public void close() {
        }
    }

    // -- the columns a DataFrame gives, and each row's values --------------------------------------------------

    /** Which input column is where, and which bulk columns a frame carries (fixed by the schema). */
    static final class Layout {
        final Options.Write opts;
        final int value;
        final boolean textValue;
        final int bodyType;
        final int destination;
        final int topic;
        final int key;
        final boolean textKey;
        final int properties;
        final String propertyCode;          // i, b, f; null for string values (no property_types column)
        final DataType propertyType;
        final int correlationId;
        final int type;
        final int replyTo;
        final int dedupId;
        final int deliveryMode;
        final boolean textMode;
        final int priority;
        final int timeToLive;
        final DataType ttlType;
        final DataType priorityType;
        final DataType modeType;
        final int expiration;
        final boolean dedup;
        final boolean hasBodyType;

        Layout(StructType schema, Options.Write opts, boolean dedup) {
            this.opts = opts;
            this.dedup = dedup;
            value = index(schema, "value");
            textValue = schema.fields()[value].dataType() == DataTypes.StringType;
            bodyType = index(schema, "bodyType");
            destination = index(schema, "destination");
            topic = index(schema, "topic");
            key = index(schema, "key");
            textKey = key >= 0 && schema.fields()[key].dataType() == DataTypes.StringType;
            properties = index(schema, "properties");
            if (properties >= 0) {
                propertyType = ((MapType) schema.fields()[properties].dataType()).valueType();
                String t = propertyType.typeName();
                propertyCode = switch (t) {
                    case "byte", "short", "integer", "long" -> "i";
                    case "boolean" -> "b";
                    case "float", "double" -> "f";
                    default -> null;
                };
            } else {
                propertyType = null;
                propertyCode = null;
            }
            correlationId = index(schema, "correlationId");
            type = index(schema, "type");
            replyTo = index(schema, "replyTo");
            dedupId = index(schema, "dedupId");
            deliveryMode = index(schema, "deliveryMode");
            modeType = deliveryMode >= 0 ? schema.fields()[deliveryMode].dataType() : null;
            textMode = modeType == DataTypes.StringType;
            priority = index(schema, "priority");
            priorityType = priority >= 0 ? schema.fields()[priority].dataType() : null;
            timeToLive = index(schema, "timeToLive");
            ttlType = timeToLive >= 0 ? schema.fields()[timeToLive].dataType() : null;
            expiration = index(schema, "expiration");
            // a column of "bytes" says what a missing one says (spec/spark.md §7: null is bytes): left out
            hasBodyType = bodyType >= 0 || textValue;
        }

        private static int index(StructType schema, String name) {
            String[] names = schema.fieldNames();
            for (int i = 0; i < names.length; i++) {
                if (names[i].equals(name)) {
                    return i;
                }
            }
            return -1;
        }

        static PymqException bad(long row, String column, String what) {
            return new PymqException(PymqException.MESSAGE_FORMAT, "row " + row + " of this partition, column '"
                    + column + "': " + what);
        }

        String destination(InternalRow row, long index, Map<String, String> checked) {
            if (opts.destination() != null) {
                return opts.destination();
            }
            String raw;
            if (destination >= 0) {
                raw = row.isNullAt(destination) ? null : row.getUTF8String(destination).toString();
            } else {
                raw = row.isNullAt(topic) ? null : row.getUTF8String(topic).toString();
                if (raw != null && !raw.startsWith("/")) {
                    raw = Options.TOPIC + raw;
                }
            }
            if (raw == null || raw.isEmpty()) {
                checkValue(row, index);
                throw bad(index, "destination", "no destination: the row's 'destination' is null and no "
                        + "'destination' option was given");
            }
            String name = checked.get(raw);
            if (name == null) {
                String problem = stompProblem(raw);
                if (problem != null) {
                    checkValue(row, index);
                    throw bad(index, "destination", problem);
                }
                checked.put(raw, raw);
                name = raw;
            }
            return name;
        }

        /** The per-message path's column order: a row's value is checked before its destination. */
        private void checkValue(InternalRow row, long index) {
            bodyTypeOf(row, index);
        }

        /** Why {@code raw} is not a STOMP destination (pymq.destination.as_destination), or null. */
        static String stompProblem(String raw) {
            for (String p : List.of("/temp-queue/", "/temp-topic/", Options.QUEUE, Options.TOPIC)) {
                if (raw.startsWith(p)) {
                    if (raw.length() == p.length()) {
                        String cls = switch (p) {
                            case "/temp-queue/" -> "TemporaryQueue";
                            case "/temp-topic/" -> "TemporaryTopic";
                            case "/queue/" -> "Queue";
                            default -> "Topic";
                        };
                        return cls + " needs a non-empty name, got ''";
                    }
                    return null;
                }
            }
            return "destination " + Options.pyRepr(raw) + " must be a Queue, a Topic, or a string starting with "
                    + "/queue/, /topic/, /temp-queue/ or /temp-topic/";
        }

        String bodyTypeOf(InternalRow row, long index) {
            String fallback = textValue ? "text" : "bytes";
            if (bodyType < 0 || row.isNullAt(bodyType)) {
                return fallback;
            }
            String k = row.getUTF8String(bodyType).toString();
            if (!k.equals("text") && !k.equals("bytes") && !k.equals("map")) {
                throw bad(index, "value", "bodyType must be 'text', 'bytes' or 'map', got " + Options.pyRepr(k));
            }
            return k;
        }
    }

    private static String utf8(byte[] raw) throws CharacterCodingException {
        return StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(raw)).toString();
    }

    /** Python's {@code str()} of a property value as the broker's text form. */
    static String propertyText(DataType type, Object v) {
        if (v instanceof Boolean b) {
            return b ? "true" : "false";
        }
        if (type == DataTypes.FloatType) {
            return pythonFloat(((Float) v).doubleValue());
        }
        if (type == DataTypes.DoubleType) {
            return pythonFloat((Double) v);
        }
        if (v instanceof UTF8String s) {
            return s.toString();
        }
        return String.valueOf(v);
    }

    /** Python's repr of a float: shortest round-trip digits, exponent form outside [1e-4, 1e16). */
    static String pythonFloat(double d) {
        if (Double.isNaN(d)) {
            return "nan";
        }
        if (Double.isInfinite(d)) {
            return d > 0 ? "inf" : "-inf";
        }
        if (d == 0) {
            return (1 / d < 0) ? "-0.0" : "0.0";
        }
        java.math.BigDecimal exact = new java.math.BigDecimal(Double.toString(d)).stripTrailingZeros();
        int exponent = exact.precision() - exact.scale() - 1;
        if (exponent < -4 || exponent >= 16) {
            String digits = exact.unscaledValue().abs().toString();
            String mantissa = digits.length() == 1 ? digits : digits.charAt(0) + "." + digits.substring(1);
            return (d < 0 ? "-" : "") + mantissa + "e" + (exponent < 0 ? "-" : "+")
                    + (Math.abs(exponent) < 10 ? "0" : "") + Math.abs(exponent);
        }
        String plain = exact.toPlainString();
        return plain.contains(".") ? plain : plain + ".0";
    }

    /** One destination's rows of a task, as the bulk columns of spec/spark.md §7, until flushed. */
    static final class Frame implements AutoCloseable {
        private final Layout l;
        private final VectorSchemaRoot root;
        private final VarBinaryVector body;
        private final VarCharVector bodyType;
        private final VarCharVector group;
        private final MapVector properties;
        private final UnionMapWriter propertyWriter;
        private final VarCharVector propertyTypes;
        private final VarCharVector correlationId;
        private final VarCharVector type;
        private final VarCharVector replyTo;
        private final VarCharVector dedupId;
        private final IntVector deliveryMode;
        private final IntVector priority;
        private final BigIntVector expires;
        long firstRow;
        int count;
        private long bytes;

        Frame(Layout l, BufferAllocator allocator, long firstRow) {
            this.l = l;
            this.firstRow = firstRow;
            List<FieldVector> vectors = new ArrayList<>();
            body = add(vectors, new VarBinaryVector("body", allocator));
            bodyType = l.hasBodyType ? add(vectors, new VarCharVector("body_type", allocator)) : null;
            group = l.key >= 0 ? add(vectors, new VarCharVector("group", allocator)) : null;
            if (l.properties >= 0) {
                // map<utf8, utf8> with the non-nullable entries struct Arrow's C++ (the broker's pyarrow) requires
                Field entries = new Field("entries", FieldType.notNullable(ArrowType.Struct.INSTANCE), List.of(
                        new Field("key", FieldType.notNullable(ArrowType.Utf8.INSTANCE), null),
                        new Field("value", FieldType.nullable(ArrowType.Utf8.INSTANCE), null)));
                properties = add(vectors, (MapVector) new Field("properties",
                        FieldType.nullable(new ArrowType.Map(false)), List.of(entries)).createVector(allocator));
                propertyWriter = properties.getWriter();
                propertyTypes = l.propertyCode != null ? add(vectors, new VarCharVector("property_types", allocator))
                        : null;
            } else {
                properties = null;
                propertyWriter = null;
                propertyTypes = null;
            }
            correlationId = l.correlationId >= 0 ? add(vectors, new VarCharVector("correlation_id", allocator)) : null;
            type = l.type >= 0 ? add(vectors, new VarCharVector("type", allocator)) : null;
            replyTo = l.replyTo >= 0 ? add(vectors, new VarCharVector("reply_to", allocator)) : null;
            dedupId = l.dedup || l.dedupId >= 0 ? add(vectors, new VarCharVector("dedup_id", allocator)) : null;
            deliveryMode = add(vectors, new IntVector("delivery_mode", allocator));
            priority = add(vectors, new IntVector("priority", allocator));
            expires = add(vectors, new BigIntVector("expires", allocator));
            root = new VectorSchemaRoot(vectors);
        }

        private static <T extends FieldVector> T add(List<FieldVector> vectors, T v) {
            v.allocateNew();
            vectors.add(v);
            return v;
        }

        long bytes() {
            return bytes;
        }

        /** Empty again for the rows of a next frame from {@code row} on, its vectors' memory kept. */
        Frame restart(long row) {
            for (FieldVector v : root.getFieldVectors()) {
                v.reset();
            }
            root.setRowCount(0);
            firstRow = row;
            count = 0;
            bytes = 0;
            return this;
        }

        private static final byte[] EMPTY = new byte[0];
        private static final byte[] TEXT = "text".getBytes(StandardCharsets.US_ASCII);
        private static final byte[] BYTES = "bytes".getBytes(StandardCharsets.US_ASCII);
        private static final byte[] MAP = "map".getBytes(StandardCharsets.US_ASCII);

        /**
         * {@code v[i]} = a string column's bytes, taken where the row keeps them (a row's UTF8String points into
         * its memory): no byte array made per value, which a 1M-row write paid for each column; its length.
         */
        private static int putText(BaseVariableWidthVector v, int i, UTF8String s) {
            int n = s.numBytes();
            if (s.getBaseObject() instanceof byte[] array) {
                v.setSafe(i, array, (int) (s.getBaseOffset() - Platform.BYTE_ARRAY_OFFSET), n);
            } else {
                v.setSafe(i, s.getBytes());
            }
            return n;
        }

        /** {@code v[i]} = a binary column's bytes, from an UnsafeRow's own memory where it is one; its length. */
        private static int putBinary(BaseVariableWidthVector v, int i, InternalRow row, int column) {
            if (row instanceof UnsafeRow u && u.getBaseObject() instanceof byte[] array) {
                long offsetAndSize = u.getLong(column);          // UnsafeRow.getBinary's layout, without its copy
                int size = (int) offsetAndSize;
                v.setSafe(i, array, (int) (u.getBaseOffset() - Platform.BYTE_ARRAY_OFFSET + (offsetAndSize >> 32)),
                        size);
                return size;
            }
            byte[] b = row.getBinary(column);
            v.setSafe(i, b);
            return b.length;
        }

        void add(InternalRow row, long index, long now, String dedupBase) {
            int i = count;
            // value -> body, body_type
            String kind = l.bodyTypeOf(row, index);
            boolean mapBody = kind.equals("map");
            int length;
            if (row.isNullAt(l.value)) {
                byte[] value = mapBody ? mapBody(EMPTY, index) : EMPTY;
                body.setSafe(i, value);
                length = value.length;
            } else if (l.textValue && !mapBody) {
                length = putText(body, i, row.getUTF8String(l.value));       // text is UTF-8 already
            } else if (!l.textValue && kind.equals("bytes")) {
                length = putBinary(body, i, row, l.value);
            } else {
                byte[] value = l.textValue ? row.getUTF8String(l.value).getBytes() : row.getBinary(l.value);
                if (mapBody) {
                    value = mapBody(value, index);
                } else {
                    try {
                        utf8(value);
                    } catch (CharacterCodingException e) {
                        throw Layout.bad(index, "value", "'utf-8' codec can't decode the value: " + e.getMessage());
                    }
                }
                body.setSafe(i, value);
                length = value.length;
            }
            bytes += length + 24;
            if (bodyType != null) {
                bodyType.setSafe(i, mapBody ? MAP : kind.equals("text") ? TEXT : BYTES);
            }
            // key -> group
            if (group != null && !row.isNullAt(l.key)) {
                if (l.textKey) {
                    bytes += putText(group, i, row.getUTF8String(l.key));
                } else {
                    byte[] k = row.getBinary(l.key);
                    try {
                        utf8(k);
                    } catch (CharacterCodingException e) {
                        throw Layout.bad(index, "key", "'utf-8' codec can't decode the key: " + e.getMessage());
                    }
                    group.setSafe(i, k);
                    bytes += k.length;
                }
            }
            // properties -> properties, property_types
            if (properties != null) {
                propertyWriter.setPosition(i);
                if (row.isNullAt(l.properties)) {
                    propertyWriter.writeNull();
                } else {
                    MapData map = row.getMap(l.properties);
                    ArrayData keys = map.keyArray();
                    ArrayData values = map.valueArray();
                    StringBuilder types = l.propertyCode != null ? new StringBuilder() : null;
                    propertyWriter.startMap();
                    for (int j = 0; j < map.numElements(); j++) {
                        String name = keys.getUTF8String(j).toString();
                        if (RESERVED.contains(name)) {
                            throw Layout.bad(index, "properties", Options.pyRepr(name) + " is a header, not a property; "
                                    + "use the message attribute");
                        }
                        if (name.isEmpty() || name.indexOf(',') >= 0 || name.indexOf('=') >= 0
                                || name.indexOf('\r') >= 0 || name.indexOf('\n') >= 0) {
                            throw Layout.bad(index, "properties", "property name " + Options.pyRepr(name)
                                    + " must not be empty or contain ',', '=' or line breaks");
                        }
                        if (values.isNullAt(j)) {
                            continue;              // null values are left out, as the per-message path leaves them
                        }
                        String text = propertyText(l.propertyType, values.get(j, l.propertyType));
                        propertyWriter.startEntry();
                        writeText(propertyWriter.key().varChar(), name);
                        writeText(propertyWriter.value().varChar(), text);
                        propertyWriter.endEntry();
                        bytes += name.length() + text.length() + 8;
                        if (types != null) {
                            types.append(types.length() == 0 ? "" : ",").append(name).append('=').append(l.propertyCode);
                        }
                    }
                    propertyWriter.endMap();
                    if (types != null && types.length() > 0) {
                        propertyTypes.setSafe(i, types.toString().getBytes(StandardCharsets.UTF_8));
                    }
                }
            }
            text(correlationId, row, l.correlationId, i);
            text(type, row, l.type, i);
            if (replyTo != null && !row.isNullAt(l.replyTo)) {
                String r = row.getUTF8String(l.replyTo).toString();
                String problem = Layout.stompProblem(r);
                if (problem != null) {
                    throw Layout.bad(index, "replyTo", problem);
                }
                replyTo.setSafe(i, r.getBytes(StandardCharsets.UTF_8));
            }
            if (dedupId != null) {
                String id = l.dedupId >= 0 && !row.isNullAt(l.dedupId) ? row.getUTF8String(l.dedupId).toString()
                        : dedupBase != null ? dedupBase + ":" + index : null;
                if (id != null) {
                    byte[] b = id.getBytes(StandardCharsets.UTF_8);
                    dedupId.setSafe(i, b);
                    bytes += b.length;
                }
            }
            deliveryMode.setSafe(i, mode(row, index));
            priority.setSafe(i, priorityOf(row, index));
            expires.setSafe(i, expiresOf(row, index, now));
            count++;
        }

        private static void writeText(org.apache.arrow.vector.complex.writer.VarCharWriter w, String s) {
            w.writeVarChar(new org.apache.arrow.vector.util.Text(s));
        }

        private void text(VarCharVector v, InternalRow row, int column, int i) {
            if (v != null && !row.isNullAt(column)) {
                bytes += putText(v, i, row.getUTF8String(column));
            }
        }

        /** A map body is its JSON wire form: an object ({"$bytes": base64} values checked); empty is {}. */
        private static byte[] mapBody(byte[] raw, long index) {
            if (raw.length == 0) {
                return "{}".getBytes(StandardCharsets.US_ASCII);
            }
            try {
                var node = Options.JSON.readTree(utf8(raw));
                if (node == null || !node.isObject()) {
                    throw Layout.bad(index, "value", "a map body must be a JSON object");
                }
                var it = node.fields();
                while (it.hasNext()) {
                    var v = it.next().getValue();
                    if (v.isObject() && v.has("$bytes")) {
                        java.util.Base64.getDecoder().decode(v.get("$bytes").asText());
                    }
                }
                return raw;
            } catch (PymqException e) {
                throw e;
            } catch (Exception e) {
                throw Layout.bad(index, "value", e.getMessage());
            }
        }

        private int mode(InternalRow row, long index) {
            if (l.deliveryMode < 0 || row.isNullAt(l.deliveryMode)) {
                return l.opts.deliveryMode();
            }
            Object raw;
            if (l.textMode) {
                String s = row.getUTF8String(l.deliveryMode).toString();
                raw = s;
                switch (s.strip().toLowerCase(Locale.ROOT)) {
                    case "persistent", "2" -> {
                        return 2;
                    }
                    case "non_persistent", "non-persistent", "1" -> {
                        return 1;
                    }
                    default -> {
                    }
                }
            } else {
                long v = integral(row, l.deliveryMode, l.modeType);
                raw = v;
                if (v == 1 || v == 2) {
                    return (int) v;
                }
            }
            throw Layout.bad(index, "deliveryMode", "deliveryMode must be 1, 2, 'persistent' or 'non_persistent', "
                    + "got " + (raw instanceof String s ? Options.pyRepr(s) : raw));
        }

        private int priorityOf(InternalRow row, long index) {
            if (l.priority < 0 || row.isNullAt(l.priority)) {
                return l.opts.priority();
            }
            long p = integral(row, l.priority, l.priorityType);
            if (p < 0 || p > 9) {
                throw Layout.bad(index, "priority", "priority must be between 0 and 9, got " + p);
            }
            return (int) p;
        }

        private long expiresOf(InternalRow row, long index, long now) {
            Long ttl = l.timeToLive >= 0 && !row.isNullAt(l.timeToLive) ? integral(row, l.timeToLive, l.ttlType) : null;
            if (ttl == null && l.expiration >= 0 && !row.isNullAt(l.expiration)) {
                // a read's absolute JMSExpiration, sent as the time left; one already past it gets 1 ms, so it
                // expires on arrival instead of living forever
                ttl = Math.max(1, row.getLong(l.expiration) / 1000 - now);
            }
            if (ttl == null) {
                ttl = l.opts.timeToLive();
            }
            if (ttl < 0) {
                throw Layout.bad(index, "timeToLive", "timeToLive must be >= 0 ms, got " + ttl);
            }
            return ttl > 0 ? now + ttl : 0;
        }

        private static long integral(InternalRow row, int column, DataType type) {
            if (type == DataTypes.ByteType) {
                return row.getByte(column);
            }
            if (type == DataTypes.ShortType) {
                return row.getShort(column);
            }
            if (type == DataTypes.IntegerType) {
                return row.getInt(column);
            }
            return row.getLong(column);
        }

        void writeIpc(java.nio.channels.WritableByteChannel out) {
            root.setRowCount(count);
            for (FieldVector v : root.getFieldVectors()) {
                v.setValueCount(count);
            }
            try (ArrowStreamWriter writer = new ArrowStreamWriter(root, null, out)) {
                writer.start();
                writer.writeBatch();
                writer.end();
            } catch (IOException e) {
                throw new PymqException(PymqException.MESSAGE_FORMAT, "cannot encode a bulk SEND: " + e, e);
            }
        }

        @Override
        public void close() {
            root.close();
        }
    }
}
