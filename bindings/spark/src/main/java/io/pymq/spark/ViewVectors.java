package io.pymq.spark;

import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Read columns that are the wire's Arrow vectors seen another way, without a copy or a pass over the rows
 * (spec/spark.md §4–§6's mapping): a UTF-8 group id as the binary {@code key}, milliseconds as Spark's
 * microsecond timestamps ({@code expires} 0 as null), and {@code reply_to} keeping STOMP destinations only.
 * Each value is computed when Spark reads it.  The Arrow vectors belong to the batch's reader, which
 * closes them; closing a view does nothing.
 */
final class ViewVectors {
    private ViewVectors() {
    }

    /** Everything unsupported by default; each view overrides what its type needs. */
    abstract static class View extends ColumnVector {
        View(DataType type) {
            super(type);
        }

        @Override
        public void close() {
        }

        @Override
        public boolean getBoolean(int rowId) {
            throw new UnsupportedOperationException();
        }

        @Override
        public byte getByte(int rowId) {
            throw new UnsupportedOperationException();
        }

        @Override
        public short getShort(int rowId) {
            throw new UnsupportedOperationException();
        }

        @Override
        public int getInt(int rowId) {
            throw new UnsupportedOperationException();
        }

        @Override
        public long getLong(int rowId) {
            throw new UnsupportedOperationException();
        }

        @Override
        public float getFloat(int rowId) {
            throw new UnsupportedOperationException();
        }

        @Override
        public double getDouble(int rowId) {
            throw new UnsupportedOperationException();
        }

        @Override
        public ColumnarArray getArray(int rowId) {
            throw new UnsupportedOperationException();
        }

        @Override
        public ColumnarMap getMap(int ordinal) {
            throw new UnsupportedOperationException();
        }

        @Override
        public Decimal getDecimal(int rowId, int precision, int scale) {
            throw new UnsupportedOperationException();
        }

        @Override
        public UTF8String getUTF8String(int rowId) {
            throw new UnsupportedOperationException();
        }

        @Override
        public byte[] getBinary(int rowId) {
            throw new UnsupportedOperationException();
        }

        @Override
        public ColumnVector getChild(int ordinal) {
            throw new UnsupportedOperationException();
        }
    }

    /** {@code group} (utf8) as {@code key} (binary): the same bytes. */
    static final class Utf8AsBinary extends View {
        private final VarCharVector v;

        Utf8AsBinary(VarCharVector v) {
            super(DataTypes.BinaryType);
            this.v = v;
        }

        @Override
        public boolean hasNull() {
            return v.getNullCount() > 0;
        }

        @Override
        public int numNulls() {
            return v.getNullCount();
        }

        @Override
        public boolean isNullAt(int rowId) {
            return v.isNull(rowId);
        }

        @Override
        public byte[] getBinary(int rowId) {
            return v.get(rowId);
        }
    }

    /** Milliseconds since the epoch as a timestamp in microseconds; with {@code zeroIsNull}, 0 is "never". */
    static final class MillisAsMicros extends View {
        private final BigIntVector v;
        private final boolean zeroIsNull;
        private final int nulls;

        MillisAsMicros(BigIntVector v, boolean zeroIsNull) {
            super(DataTypes.TimestampType);
            this.v = v;
            this.zeroIsNull = zeroIsNull;
            int n = v.getNullCount();
            if (zeroIsNull) {
                for (int i = 0, count = v.getValueCount(); i < count; i++) {
                    if (!v.isNull(i) && v.get(i) == 0) {
                        n++;
                    }
                }
            }
            this.nulls = n;
        }

        @Override
        public boolean hasNull() {
            return nulls > 0;
        }

        @Override
        public int numNulls() {
            return nulls;
        }

        @Override
        public boolean isNullAt(int rowId) {
            return v.isNull(rowId) || (zeroIsNull && v.get(rowId) == 0);
        }

        @Override
        public long getLong(int rowId) {
            return v.get(rowId) * 1000;
        }
    }

    /** {@code reply_to} keeping STOMP destinations only (spec/spark.md §4), as the per-message decoder does. */
    static final class DestinationsOnly extends View {
        private final VarCharVector v;
        private final java.util.BitSet dropped;
        private final int nulls;

        private DestinationsOnly(VarCharVector v, java.util.BitSet dropped) {
            super(DataTypes.StringType);
            this.v = v;
            this.dropped = dropped;
            this.nulls = v.getNullCount() + dropped.cardinality();
        }

        /** The view, or null when every value is a destination (then the vector is read as it is). */
        static DestinationsOnly of(VarCharVector v) {
            java.util.BitSet dropped = new java.util.BitSet();
            for (int i = 0, n = v.getValueCount(); i < n; i++) {
                if (!v.isNull(i) && !isDestination(v.get(i))) {
                    dropped.set(i);
                }
            }
            return dropped.isEmpty() ? null : new DestinationsOnly(v, dropped);
        }

        private static final byte[][] PREFIXES = {"/queue/".getBytes(java.nio.charset.StandardCharsets.US_ASCII),
                "/topic/".getBytes(java.nio.charset.StandardCharsets.US_ASCII),
                "/temp-queue/".getBytes(java.nio.charset.StandardCharsets.US_ASCII)};

        static boolean isDestination(byte[] value) {
            for (byte[] p : PREFIXES) {
                if (value.length >= p.length && java.util.Arrays.equals(value, 0, p.length, p, 0, p.length)) {
                    return true;
                }
            }
            return false;
        }

        @Override
        public boolean hasNull() {
            return nulls > 0;
        }

        @Override
        public int numNulls() {
            return nulls;
        }

        @Override
        public boolean isNullAt(int rowId) {
            return v.isNull(rowId) || dropped.get(rowId);
        }

        @Override
        public UTF8String getUTF8String(int rowId) {
            return UTF8String.fromBytes(v.get(rowId));
        }
    }
}
