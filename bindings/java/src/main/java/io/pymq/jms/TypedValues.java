package io.pymq.jms;

import jakarta.jms.MessageFormatException;

/**
 * The JMS conversion table for property and map values (JMS 3.1 §3.5.4 and §3.11.3), with the two
 * widenings that pymq's wire forces: integers travel as one type ({@code i}, spec/stomp.md §7) and come
 * back as {@code Long}, floating-point values as {@code f} and come back as {@code Double}.  So any
 * integral value reads as any integral type it fits in (an out-of-range value is a
 * MessageFormatException, never a silent truncation), and a double reads as a float by rounding.
 * Everything else is the JMS table: strings convert to every type through {@code valueOf}, booleans
 * only to boolean and String, and a missing value behaves like {@code valueOf(null)}.
 */
final class TypedValues {
    private TypedValues() {
    }

    static boolean toBoolean(Object v, String name) throws MessageFormatException {
        if (v instanceof Boolean b) {
            return b;
        }
        if (v == null || v instanceof String) {
            return Boolean.parseBoolean((String) v);
        }
        throw cannot(v, "boolean", name);
    }

    static long integral(Object v, String name, String type, long min, long max) throws MessageFormatException {
        long value;
        if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
            value = ((Number) v).longValue();
        } else if (v == null || v instanceof String) {
            // JMS: Byte.valueOf(null) etc. throw NumberFormatException; so does a bad string
            String s = (String) v;
            if (s == null) {
                throw new NumberFormatException("null cannot be read as " + type + " (" + name + ")");
            }
            value = Long.parseLong(s);
        } else {
            throw cannot(v, type, name);
        }
        if (value < min || value > max) {
            throw new MessageFormatException(name + " holds " + value + ", which does not fit in a " + type);
        }
        return value;
    }

    static byte toByte(Object v, String name) throws MessageFormatException {
        return (byte) integral(v, name, "byte", Byte.MIN_VALUE, Byte.MAX_VALUE);
    }

    static short toShort(Object v, String name) throws MessageFormatException {
        return (short) integral(v, name, "short", Short.MIN_VALUE, Short.MAX_VALUE);
    }

    static int toInt(Object v, String name) throws MessageFormatException {
        return (int) integral(v, name, "int", Integer.MIN_VALUE, Integer.MAX_VALUE);
    }

    static long toLong(Object v, String name) throws MessageFormatException {
        return integral(v, name, "long", Long.MIN_VALUE, Long.MAX_VALUE);
    }

    static float toFloat(Object v, String name) throws MessageFormatException {
        if (v instanceof Float f) {
            return f;
        }
        if (v instanceof Double d) {
            return d.floatValue();
        }
        if (v == null) {
            throw new NullPointerException("null cannot be read as float (" + name + ")");
        }
        if (v instanceof String s) {
            return Float.parseFloat(s);
        }
        throw cannot(v, "float", name);
    }

    static double toDouble(Object v, String name) throws MessageFormatException {
        if (v instanceof Float || v instanceof Double) {
            return ((Number) v).doubleValue();
        }
        if (v == null) {
            throw new NullPointerException("null cannot be read as double (" + name + ")");
        }
        if (v instanceof String s) {
            return Double.parseDouble(s);
        }
        throw cannot(v, "double", name);
    }

    static String toStringValue(Object v, String name) throws MessageFormatException {
        if (v == null) {
            return null;
        }
        if (v instanceof byte[]) {
            throw cannot(v, "String", name);
        }
        return String.valueOf(v);
    }

    static MessageFormatException cannot(Object v, String type, String name) {
        return new MessageFormatException(name + " holds a " + v.getClass().getSimpleName() + ", which cannot be read as "
                + type);
    }

    /** Whether {@code v} is a value a property may hold (JMS: the boxed primitives and String). */
    static boolean isPropertyValue(Object v) {
        return v instanceof Boolean || v instanceof Byte || v instanceof Short || v instanceof Integer
                || v instanceof Long || v instanceof Float || v instanceof Double || v instanceof String;
    }
}
