package io.pymq.jms;

import jakarta.jms.JMSException;
import jakarta.jms.MapMessage;
import jakarta.jms.MessageFormatException;

import java.util.Base64;
import java.util.Collections;
import java.util.Enumeration;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A MapMessage: {@code application/x-pymq-map+json} on the wire, a JSON object whose values are JSON
 * scalars or {@code {"$bytes": "<base64>"}} (spec/stomp.md §7), so Python, Go and TypeScript read the same
 * map.  JSON has one kind of integer and one kind of real, and a {@code char} travels as a one-character
 * string; {@code pymq-jms-types} names the entries set narrower ({@code :count=int}, {@code :f=float},
 * {@code :c=char}; spec/stomp.md §7), so a Java receiver's {@link #getObject} gives back the type that was
 * set (JMS 3.11.3); from other SDKs integral values come back as {@code Long}, floating ones as
 * {@code Double}.  The getters convert as {@link TypedValues} explains (and {@link #getChar} accepts a
 * one-character string).
 * A received body is decoded on first use: a body that is not such an object makes the getters throw
 * MessageFormatException, not the receive.
 */
public class PymqMapMessage extends PymqMessage implements MapMessage {
    private Map<String, Object> map;
    private byte[] encoded;          // a received body not decoded yet

    public PymqMapMessage() {
        this.map = new LinkedHashMap<>();
    }

    PymqMapMessage(byte[] body) {
        this(body, null);
    }

    /** A received body and its {@code pymq-jms-types} header (null: none), which narrows its entries. */
    PymqMapMessage(byte[] body, String jmsTypes) {
        this.encoded = body;
        this.jmsTypes = jmsTypes;
    }

    private String jmsTypes;         // the received pymq-jms-types: the narrowing of the entries not decoded yet

    /**
     * The map entries' items of {@code pymq-jms-types} ({@code :name=int}, ...; spec/stomp.md section 7) for
     * the entries narrower than their JSON value, so a Java receiver's getObject gives back the type that was
     * set.  An entry whose name holds ',' or '=' cannot be named there: it comes back as Long / Double /
     * String.
     */
    String entryJmsTypes() {
        StringBuilder out = new StringBuilder();
        if (map == null) {        // received and not touched: what it came with
            WireFormat.entryJmsTypes(jmsTypes).forEach((name, code) -> append(out, name, code));
            return out.toString();
        }
        for (Map.Entry<String, Object> e : map.entrySet()) {
            String code = WireFormat.entryJmsTypeCode(e.getValue());
            String name = e.getKey();
            if (code != null && name.indexOf(',') < 0 && name.indexOf('=') < 0) {
                append(out, name, code);
            }
        }
        return out.toString();
    }

    private static void append(StringBuilder out, String name, String code) {
        out.append(out.length() > 0 ? "," : "").append(WireFormat.MAP_ENTRY).append(name).append('=').append(code);
    }

    @Override
    String contentType() {
        return WireFormat.MAP_TYPE;
    }

    @Override
    byte[] bodyBytes() throws JMSException {
        if (map == null) {
            return encoded.clone();
        }
        return WireFormat.encodeMap(map);
    }

    /**
     * The decoded map (a read-only view): values are Boolean, Long, Double, String, byte[] or null, or the
     * narrower type that was set (Integer, Short, Byte, Float, Character) when the sender named it.
     */
    public Map<String, Object> map() throws JMSException {
        return Collections.unmodifiableMap(values());
    }

    private Map<String, Object> values() throws JMSException {
        if (map == null) {
            map = WireFormat.decodeMap(encoded, WireFormat.entryJmsTypes(jmsTypes));
            encoded = null;
            jmsTypes = null;
        }
        return map;
    }

    private Object get(String name) throws JMSException {
        return values().get(name);
    }

    private void set(String name, Object value) throws JMSException {
        if (name == null || name.isEmpty()) {
            throw new IllegalArgumentException("map names must be non-empty");
        }
        checkWritable();
        values().put(name, value);
    }

    @Override
    public boolean getBoolean(String name) throws JMSException {
        return TypedValues.toBoolean(get(name), name);
    }

    @Override
    public byte getByte(String name) throws JMSException {
        return TypedValues.toByte(get(name), name);
    }

    @Override
    public short getShort(String name) throws JMSException {
        return TypedValues.toShort(get(name), name);
    }

    @Override
    public char getChar(String name) throws JMSException {
        Object v = get(name);
        if (v instanceof Character c) {
            return c;
        }
        if (v instanceof String s && s.length() == 1) {
            return s.charAt(0);
        }
        if (v == null) {
            throw new NullPointerException("no char value named " + name);
        }
        throw TypedValues.cannot(v, "char", name);
    }

    @Override
    public int getInt(String name) throws JMSException {
        return TypedValues.toInt(get(name), name);
    }

    @Override
    public long getLong(String name) throws JMSException {
        return TypedValues.toLong(get(name), name);
    }

    @Override
    public float getFloat(String name) throws JMSException {
        return TypedValues.toFloat(get(name), name);
    }

    @Override
    public double getDouble(String name) throws JMSException {
        return TypedValues.toDouble(get(name), name);
    }

    @Override
    public String getString(String name) throws JMSException {
        Object v = get(name);
        if (v instanceof byte[]) {
            throw TypedValues.cannot(v, "String", name);
        }
        return v == null ? null : String.valueOf(v);
    }

    @Override
    public byte[] getBytes(String name) throws JMSException {
        Object v = get(name);
        if (v == null) {
            return null;
        }
        if (v instanceof byte[] b) {
            return b.clone();
        }
        throw TypedValues.cannot(v, "byte[]", name);
    }

    @Override
    public Object getObject(String name) throws JMSException {
        Object v = get(name);
        return v instanceof byte[] b ? b.clone() : v;
    }

    @Override
    public Enumeration<String> getMapNames() throws JMSException {
        return Collections.enumeration(values().keySet());
    }

    @Override
    public void setBoolean(String name, boolean value) throws JMSException {
        set(name, value);
    }

    @Override
    public void setByte(String name, byte value) throws JMSException {
        set(name, value);
    }

    @Override
    public void setShort(String name, short value) throws JMSException {
        set(name, value);
    }

    @Override
    public void setChar(String name, char value) throws JMSException {
        set(name, value);
    }

    @Override
    public void setInt(String name, int value) throws JMSException {
        set(name, value);
    }

    @Override
    public void setLong(String name, long value) throws JMSException {
        set(name, value);
    }

    @Override
    public void setFloat(String name, float value) throws JMSException {
        set(name, value);
    }

    @Override
    public void setDouble(String name, double value) throws JMSException {
        set(name, value);
    }

    @Override
    public void setString(String name, String value) throws JMSException {
        set(name, value);
    }

    @Override
    public void setBytes(String name, byte[] value) throws JMSException {
        set(name, value == null ? null : value.clone());
    }

    @Override
    public void setBytes(String name, byte[] value, int offset, int length) throws JMSException {
        byte[] part = new byte[length];
        System.arraycopy(value, offset, part, 0, length);
        set(name, part);
    }

    @Override
    public void setObject(String name, Object value) throws JMSException {
        if (value != null && !(TypedValues.isPropertyValue(value) || value instanceof Character || value instanceof byte[])) {
            throw new MessageFormatException("map value " + name + " must be a boxed primitive, String or byte[], not "
                    + value.getClass().getName());
        }
        set(name, value instanceof byte[] b ? b.clone() : value);
    }

    @Override
    public boolean itemExists(String name) throws JMSException {
        return values().containsKey(name);
    }

    @Override
    public void clearBody() throws JMSException {
        super.clearBody();
        map = new LinkedHashMap<>();
        encoded = null;
    }

    @Override
    public <T> T getBody(Class<T> c) throws JMSException {
        Map<String, Object> values = values();
        if (values.isEmpty()) {
            return null;
        }
        if (!c.isAssignableFrom(Map.class)) {
            throw new MessageFormatException("a MapMessage body is a Map, not a " + c.getName());
        }
        return c.cast(new LinkedHashMap<>(values));
    }

    @Override
    @SuppressWarnings("rawtypes")
    public boolean isBodyAssignableTo(Class c) {
        try {
            return values().isEmpty() || c.isAssignableFrom(Map.class);
        } catch (JMSException e) {
            return false;
        }
    }

    static String describe(Object v) {
        return v instanceof byte[] b ? "{$bytes: " + Base64.getEncoder().encodeToString(b) + "}" : String.valueOf(v);
    }
}
