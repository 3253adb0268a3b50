package io.pymq.spark;

import org.apache.arrow.memory.BufferAllocator;
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
import org.apache.arrow.vector.util.Text;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

/**
 * The JVM reader's fuzz target: range answers of the broker (spec/spark.md §6), mutated (bit flips, random
 * bytes, truncation, huge lengths), read as a task reads them, every value touched as Spark would.  Each one
 * must be read or refused with a message-format {@link PymqException}; any other throwable, or memory left
 * allocated, is a finding.  Run by the module's unit tests briefly and by {@code python -m bench.fuzz
 * --only jvm} for as long as it is given:
 *
 * <pre>java -cp pymq-spark.jar:$PYSPARK/jars/* io.pymq.spark.Fuzz SECONDS [SEED]</pre>
 *
 * prints one JSON line of counts and exits 1 on a finding.
 */
public final class Fuzz {
    private Fuzz() {
    }

    /** Counts of one run; {@code finding} is the first unexpected throwable's description, or null. */
    public record Result(long rounds, long read, long refused, String finding) {
        String json() {
            return "{\"rounds\": " + rounds + ", \"read\": " + read + ", \"refused\": " + refused + ", \"finding\": "
                    + (finding == null ? "null" : Options.JSON.valueToTree(finding).toString()) + "}";
        }
    }

    public static void main(String[] args) {
        double seconds = args.length > 0 ? Double.parseDouble(args[0]) : 10;
        long seed = args.length > 1 ? Long.parseLong(args[1]) : System.nanoTime();
        Result r = run((long) (seconds * 1000), Long.MAX_VALUE, seed);
        System.out.println(r.json());
        System.exit(r.finding() == null ? 0 : 1);
    }

    /** Mutates valid answers until {@code millis} or {@code maxRounds}; stops at the first finding. */
    public static Result run(long millis, long maxRounds, long seed) {
        Random random = new Random(seed);
        long deadline = System.nanoTime() + millis * 1_000_000L;
        long rounds = 0;
        long read = 0;
        long refused = 0;
        StructType schema = Wire.readSchema(true);
        Wire.Shape shape = new Wire.Shape("/topic/fuzz", "topic", schema, Wire.WIRE_NAMES, null);
        BufferAllocator a = Reads.ROOT.newChildAllocator("fuzz", 0, 64L << 20);
        String finding = null;
        try {
            List<byte[]> seeds = List.of(sample(a, 1), sample(a, 3), sample(a, 17));
            while (finding == null && rounds < maxRounds && System.nanoTime() < deadline) {
                byte[] bad = mutate(seeds.get(random.nextInt(seeds.size())), random);
                rounds++;
                String where = "round " + rounds + " (seed " + seed + "): ";
                try (Wire.Batches batches = new Wire.Batches(a, bad, shape)) {
                    ColumnarBatch b;
                    while ((b = batches.next()) != null) {
                        touch(b, schema);
                    }
                    read++;
                } catch (PymqException e) {
                    if (!PymqException.MESSAGE_FORMAT.equals(e.code())) {
                        finding = where + e;
                    }
                    refused++;
                } catch (Throwable t) {
                    finding = where + t;
                }
                if (finding == null && a.getAllocatedMemory() != 0) {
                    finding = where + a.getAllocatedMemory() + " bytes of Arrow memory left allocated";
                }
            }
        } catch (Throwable t) {
            finding = "seed " + seed + ": " + t;
        }
        try {
            a.close();
        } catch (RuntimeException e) {
            finding = finding != null ? finding : "seed " + seed + ": " + e.getMessage();
        }
        return new Result(rounds, read, refused, finding);
    }

    static byte[] mutate(byte[] valid, Random random) {
        byte[] bad = valid.clone();
        switch (random.nextInt(5)) {
            case 0 -> bad[random.nextInt(bad.length)] ^= (byte) (1 + random.nextInt(255));
            case 1 -> {
                for (int k = 0; k < 1 + random.nextInt(16); k++) {
                    bad[random.nextInt(bad.length)] = (byte) random.nextInt(256);
                }
            }
            case 2 -> bad = Arrays.copyOf(bad, random.nextInt(bad.length));
            case 3 -> {
                // a huge or negative number where the stream keeps a length, a count or an offset
                int at = random.nextInt(Math.max(1, bad.length - 8)) & ~3;
                long v = switch (random.nextInt(4)) {
                    case 0 -> Long.MAX_VALUE;
                    case 1 -> 1L << 40;
                    case 2 -> -1;
                    default -> Integer.MAX_VALUE;
                };
                ByteBuffer buf = ByteBuffer.wrap(bad).order(ByteOrder.LITTLE_ENDIAN);
                if (random.nextBoolean() && at + 8 <= bad.length) {
                    buf.putLong(at, v);
                } else {
                    buf.putInt(at, (int) v);
                }
            }
            default -> {
                // a slice of the stream moved elsewhere (messages out of order, a batch repeated)
                int from = random.nextInt(bad.length);
                int len = random.nextInt(Math.min(64, bad.length - from) + 1);
                int to = random.nextInt(Math.max(1, bad.length - len));
                System.arraycopy(valid, from, bad, to, len);
            }
        }
        return bad;
    }

    private static void touch(ColumnarBatch b, StructType schema) {
        StructField[] fields = schema.fields();
        for (int i = 0; i < b.numCols(); i++) {
            ColumnVector v = b.column(i);
            for (int r = 0; r < b.numRows(); r++) {
                if (v.isNullAt(r)) {
                    continue;
                }
                switch (fields[i].name()) {
                    case "key", "value" -> v.getBinary(r);
                    case "offset", "timestamp", "expiration" -> v.getLong(r);
                    case "redelivered" -> v.getBoolean(r);
                    case "properties" -> {
                        var m = v.getMap(r);
                        for (int k = 0; k < m.numElements(); k++) {
                            m.keyArray().getUTF8String(k);
                            if (!m.valueArray().isNullAt(k)) {
                                m.valueArray().getUTF8String(k);
                            }
                        }
                    }
                    case "partition", "timestampType", "priority", "deliveryMode", "deliveryCount" -> v.getInt(r);
                    default -> v.getUTF8String(r);
                }
            }
        }
    }

    /** A valid answer of {@code n} rows of every wire column, as the broker sends them. */
    static byte[] sample(BufferAllocator a, int n) throws Exception {
        List<FieldVector> vectors = new ArrayList<>();
        BigIntVector seq = new BigIntVector("seq", a);
        VarCharVector id = new VarCharVector("message_id", a);
        BigIntVector ts = new BigIntVector("timestamp", a);
        BigIntVector exp = new BigIntVector("expires", a);
        IntVector prio = new IntVector("priority", a);
        IntVector mode = new IntVector("delivery_mode", a);
        VarCharVector kind = new VarCharVector("body_type", a);
        VarCharVector ctype = new VarCharVector("content_type", a);
        VarBinaryVector body = new VarBinaryVector("body", a);
        VarCharVector group = new VarCharVector("group", a);
        VarCharVector corr = new VarCharVector("correlation_id", a);
        VarCharVector type = new VarCharVector("type", a);
        VarCharVector reply = new VarCharVector("reply_to", a);
        Field entries = new Field("entries", FieldType.notNullable(ArrowType.Struct.INSTANCE), List.of(
                new Field("key", FieldType.notNullable(ArrowType.Utf8.INSTANCE), null),
                new Field("value", FieldType.nullable(ArrowType.Utf8.INSTANCE), null)));
        MapVector props = (MapVector) new Field("properties", FieldType.nullable(new ArrowType.Map(false)),
                List.of(entries)).createVector(a);
        VarCharVector types = new VarCharVector("property_types", a);
        VarCharVector dedup = new VarCharVector("dedup_id", a);
        vectors.addAll(List.of(seq, id, ts, exp, prio, mode, kind, ctype, body, group, corr, type, reply, props,
                types, dedup));
        for (FieldVector v : vectors) {
            v.allocateNew();
        }
        UnionMapWriter w = props.getWriter();
        for (int i = 0; i < n; i++) {
            seq.setSafe(i, 100 + i);
            id.setSafe(i, ("ID:n-" + i).getBytes(StandardCharsets.UTF_8));
            ts.setSafe(i, 1_700_000_000_000L + i);
            exp.setSafe(i, i % 2 == 0 ? 0 : 1_800_000_000_000L);
            prio.setSafe(i, i % 10);
            mode.setSafe(i, 1 + i % 2);
            kind.setSafe(i, "text".getBytes(StandardCharsets.UTF_8));
            ctype.setSafe(i, "text/plain;charset=utf-8".getBytes(StandardCharsets.UTF_8));
            body.setSafe(i, ("body " + i).getBytes(StandardCharsets.UTF_8));
            if (i % 3 != 0) {
                group.setSafe(i, ("g" + i).getBytes(StandardCharsets.UTF_8));
                reply.setSafe(i, (i % 2 == 0 ? "/queue/r" : "nowhere").getBytes(StandardCharsets.UTF_8));
            }
            corr.setSafe(i, ("c" + i).getBytes(StandardCharsets.UTF_8));
            type.setSafe(i, "k".getBytes(StandardCharsets.UTF_8));
            w.setPosition(i);
            w.startMap();
            for (int k = 0; k < i % 3; k++) {
                w.startEntry();
                w.key().varChar().writeVarChar(new Text("p" + k));
                w.value().varChar().writeVarChar(new Text(String.valueOf(k)));
                w.endEntry();
            }
            w.endMap();
            types.setSafe(i, "p0=i".getBytes(StandardCharsets.UTF_8));
            dedup.setSafe(i, ("d" + i).getBytes(StandardCharsets.UTF_8));
        }
        for (FieldVector v : vectors) {
            v.setValueCount(n);
        }
        try (VectorSchemaRoot root = new VectorSchemaRoot(vectors)) {
            root.setRowCount(n);
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            try (ArrowStreamWriter writer = new ArrowStreamWriter(root, null, out)) {
                writer.start();
                writer.writeBatch();
                writer.writeBatch();           // two batches: a mutation may hit the second one's metadata
                writer.end();
            }
            return out.toByteArray();
        }
    }
}
