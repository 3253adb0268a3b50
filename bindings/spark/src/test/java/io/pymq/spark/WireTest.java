package io.pymq.spark;

import com.fasterxml.jackson.databind.JsonNode;
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
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.junit.jupiter.api.Test;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Set;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The wire's message batch made into Spark columns (spec/vectors/spark_arrow.json "read", which the Python
 * data source runs too), and hostile answers: every malformed IPC stream or batch is a message-format
 * PymqException, never another exception, a crash or an allocation without bound.
 */
class WireTest {
    private static final List<String> ALL = Wire.WIRE_NAMES;

    /** An IPC stream of one batch of {@code rows} (each a vector row of spark_arrow.json's "wire"). */
    static byte[] ipc(BufferAllocator a, List<JsonNode> rows, List<String> columns) throws Exception {
        List<FieldVector> vectors = new ArrayList<>();
        for (String name : columns) {
            vectors.add(vector(a, name, rows));
        }
        try (VectorSchemaRoot root = new VectorSchemaRoot(vectors)) {
            root.setRowCount(rows.size());
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            try (ArrowStreamWriter w = new ArrowStreamWriter(root, null, out)) {
                w.start();
                w.writeBatch();
                w.end();
            }
            return out.toByteArray();
        }
    }

    private static FieldVector vector(BufferAllocator a, String name, List<JsonNode> rows) {
        int n = rows.size();
        switch (name) {
            case "seq", "timestamp", "expires" -> {
                BigIntVector v = new BigIntVector(name, a);
                v.allocateNew(n);
                for (int i = 0; i < n; i++) {
                    JsonNode x = rows.get(i).get(name);
                    if (x == null || x.isNull()) {
                        v.setNull(i);
                    } else {
                        v.set(i, x.asLong());
                    }
                }
                v.setValueCount(n);
                return v;
            }
            case "priority", "delivery_mode" -> {
                IntVector v = new IntVector(name, a);
                v.allocateNew(n);
                for (int i = 0; i < n; i++) {
                    JsonNode x = rows.get(i).get(name);
                    if (x == null || x.isNull()) {
                        v.setNull(i);
                    } else {
                        v.set(i, x.asInt());
                    }
                }
                v.setValueCount(n);
                return v;
            }
            case "body" -> {
                VarBinaryVector v = new VarBinaryVector(name, a);
                v.allocateNew();
                for (int i = 0; i < n; i++) {
                    JsonNode x = rows.get(i).get(name);
                    if (x == null || x.isNull()) {
                        v.setNull(i);
                    } else {
                        v.setSafe(i, Base64.getDecoder().decode(x.asText()));
                    }
                }
                v.setValueCount(n);
                return v;
            }
            case "properties" -> {
                Field entries = new Field("entries", FieldType.notNullable(ArrowType.Struct.INSTANCE), List.of(
                        new Field("key", FieldType.notNullable(ArrowType.Utf8.INSTANCE), null),
                        new Field("value", FieldType.nullable(ArrowType.Utf8.INSTANCE), null)));
                MapVector v = (MapVector) new Field(name, FieldType.nullable(new ArrowType.Map(false)),
                        List.of(entries)).createVector(a);
                v.allocateNew();
                UnionMapWriter w = v.getWriter();
                for (int i = 0; i < n; i++) {
                    w.setPosition(i);
                    JsonNode x = rows.get(i).get(name);
                    if (x == null || x.isNull()) {
                        w.writeNull();
                        continue;
                    }
                    w.startMap();
                    for (JsonNode kv : x) {
                        w.startEntry();
                        w.key().varChar().writeVarChar(new Text(kv.get(0).asText()));
                        w.value().varChar().writeVarChar(new Text(kv.get(1).asText()));
                        w.endEntry();
                    }
                    w.endMap();
                }
                v.setValueCount(n);
                return v;
            }
            default -> {
                VarCharVector v = new VarCharVector(name, a);
                v.allocateNew();
                for (int i = 0; i < n; i++) {
                    JsonNode x = rows.get(i).get(name);
                    if (x == null || x.isNull()) {
                        v.setNull(i);
                    } else {
                        v.setSafe(i, x.asText().getBytes(StandardCharsets.UTF_8));
                    }
                }
                v.setValueCount(n);
                return v;
            }
        }
    }

    private static Wire.Shape shape(String dest, StructType required, List<String> columns) {
        return new Wire.Shape(dest, Options.kind(dest), required, columns, null);
    }

    @Test
    void readVectors() throws Exception {
        JsonNode cases = VectorFiles.load("spark_arrow.json").get("read");
        try (BufferAllocator a = Reads.ROOT.newChildAllocator("test", 0, Long.MAX_VALUE)) {
            for (JsonNode c : cases) {
                JsonNode want = c.get("row");
                String dest = want.get("destination").asText();
                StructType schema = Wire.readSchema(true);
                byte[] body = ipc(a, List.of(c.get("wire")), ALL);
                try (Wire.Batches batches = new Wire.Batches(a, body, shape(dest, schema, ALL))) {
                    ColumnarBatch b = batches.next();
                    assertEquals(1, b.numRows());
                    for (int i = 0; i < schema.fields().length; i++) {
                        check(schema.fields()[i].name(), b.column(i), want);
                    }
                    assertNull(batches.next());
                }
            }
        }
    }

    private static void check(String name, ColumnVector v, JsonNode want) {
        JsonNode expected = want.has(name) ? want.get(name) : want.get(name + "_us");
        if (expected == null || expected.isNull()) {
            assertTrue(v.isNullAt(0), name + " is null");
            return;
        }
        assertFalse(v.isNullAt(0), name + " is not null");
        switch (name) {
            case "key", "value" -> assertArrayEquals(Base64.getDecoder().decode(expected.asText()), v.getBinary(0), name);
            case "partition", "timestampType", "priority", "deliveryMode", "deliveryCount" ->
                    assertEquals(expected.asInt(), v.getInt(0), name);
            case "offset", "timestamp", "expiration" -> assertEquals(expected.asLong(), v.getLong(0), name);
            case "redelivered" -> assertEquals(expected.asBoolean(), v.getBoolean(0), name);
            case "properties" -> {
                ColumnarMap m = v.getMap(0);
                assertEquals(expected.size(), m.numElements());
                for (int i = 0; i < m.numElements(); i++) {
                    assertEquals(expected.get(i).get(0).asText(), m.keyArray().getUTF8String(i).toString());
                    assertEquals(expected.get(i).get(1).asText(), m.valueArray().getUTF8String(i).toString());
                }
            }
            default -> assertEquals(expected.asText(), v.getUTF8String(0).toString(), name);
        }
    }

    @Test
    void aProjectionReadsOnlyTheColumnsAskedFor() throws Exception {
        JsonNode row = VectorFiles.load("spark_arrow.json").get("read").get(0).get("wire");
        try (BufferAllocator a = Reads.ROOT.newChildAllocator("test", 0, Long.MAX_VALUE)) {
            StructType required = new StructType().add("value", org.apache.spark.sql.types.DataTypes.BinaryType)
                    .add("destination", org.apache.spark.sql.types.DataTypes.StringType);
            List<String> columns = Wire.wireColumns(required, Set.of());
            assertEquals(List.of("seq", "body"), columns);
            byte[] body = ipc(a, List.of(row), columns);
            try (Wire.Batches batches = new Wire.Batches(a, body, shape("/queue/q", required, columns))) {
                ColumnarBatch b = batches.next();
                assertEquals("hi", new String(b.column(0).getBinary(0), StandardCharsets.UTF_8));
                assertEquals("/queue/q", b.column(1).getUTF8String(0).toString());
            }
            // the empty projection (count()): sequence numbers only, and rows without columns
            byte[] seqOnly = ipc(a, List.of(row, row), List.of("seq"));
            try (Wire.Batches batches = new Wire.Batches(a, seqOnly, shape("/queue/q", new StructType(),
                    List.of("seq")))) {
                assertEquals(2, batches.next().numRows());
            }
            // an answer whose columns are not the ones asked for (nor all of them) is refused
            PymqException e = assertThrows(PymqException.class, () -> new Wire.Batches(a, ipc(a, List.of(row),
                    List.of("seq", "group")), shape("/queue/q", required, columns)).close());
            assertTrue(e.getMessage().contains("not a pymq message batch"), e.getMessage());
        }
    }

    /** Every mutation of a valid answer is read (it still is a valid batch) or refused precisely (Fuzz). */
    @Test
    void hostileAnswersAreRefusedWithAMessageFormatError() {
        Fuzz.Result r = Fuzz.run(60_000, 4000, 20261128);
        assertNull(r.finding(), r.finding());
        assertEquals(4000, r.rounds());
        assertTrue(r.refused() > 1000, "most mutations are refused: " + r);
    }
}
