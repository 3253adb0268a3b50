package io.pymq.jms;

import jakarta.jms.DeliveryMode;
import jakarta.jms.Destination;
import jakarta.jms.JMSException;
import jakarta.jms.Message;
import jakarta.jms.MessageFormatException;
import jakarta.jms.MessageNotWriteableException;

import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.Enumeration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;

/**
 * A JMS message as pymq carries it over STOMP (spec/stomp.md §4 and §7).  This class is the body-less
 * {@code Message}; {@link PymqTextMessage}, {@link PymqBytesMessage} and {@link PymqMapMessage} add
 * bodies.  A body-less message travels as an empty {@code application/octet-stream} body, so a receiver
 * (in any language) gets an empty BytesMessage, as from the Python SDK.
 *
 * <p>Properties hold the JMS property types; on the wire the integral ones become {@code i}, the floating
 * ones {@code f}, booleans {@code b} (the {@code pymq-types} header), strings stay plain, so a Python,
 * Go or TypeScript receiver gets the same values back, and {@code pymq-jms-types} names the JMS type of
 * each Integer, Short, Byte and Float, so a Java receiver's getObjectProperty returns the type that was set
 * (JMS 3.1 §3.5.4).  Integral values from other clients are {@code Long} and floating ones {@code Double};
 * the getters convert as {@link TypedValues} explains.
 * {@code JMSXDeliveryCount} reads as an Integer (1 on the first delivery).
 */
public class PymqMessage implements Message {
    /** Header names that are JMS header fields or protocol machinery, never properties (as the Python SDK). */
    static final Set<String> RESERVED = Set.of(
            "destination", "message-id", "subscription", "ack", "receipt", "transaction", "content-length",
            "content-type", "persistent", "priority", "expires", "expiration", "timestamp", "correlation-id",
            "reply-to", "type", "redelivered", "pymq-types", "pymq-seq", "transformation", "browser",
            "pymq-dedup-id", "pymq-delivery-time", WireFormat.JMS_TYPES);

    String messageId;
    long timestamp;
    String correlationId;
    Destination replyTo;
    Destination destination;
    int deliveryMode = DeliveryMode.PERSISTENT;
    boolean redelivered;
    String type;
    long expiration;
    long deliveryTime;
    int priority = Message.DEFAULT_PRIORITY;
    /** pymq-seq: the broker's per-destination sequence number, or null */
    Long sequence;
    int deliveryCount = 1;
    final Map<String, Object> properties = new LinkedHashMap<>();
    boolean readOnlyProperties;
    boolean readOnlyBody;
    /** set on received messages of a CLIENT_ACKNOWLEDGE session */
    transient Acknowledger acknowledger;

    /** What {@link #acknowledge()} does for a received message (the session's acknowledge). */
    @FunctionalInterface
    interface Acknowledger {
        void acknowledge() throws JMSException;
    }

    /** The content-type this kind travels with. */
    String contentType() {
        return WireFormat.BYTES_TYPE;
    }

    /** The body as it goes on the wire. */
    byte[] bodyBytes() throws JMSException {
        return new byte[0];
    }

    // -- header fields ------------------------------------------------------------------------------
    @Override
    public String getJMSMessageID() {
        return messageId;
    }

    @Override
    public void setJMSMessageID(String id) {
        this.messageId = id;
    }

    @Override
    public long getJMSTimestamp() {
        return timestamp;
    }

    @Override
    public void setJMSTimestamp(long timestamp) {
        this.timestamp = timestamp;
    }

    /** The correlation id's bytes as ISO-8859-1 characters (pymq carries correlation ids as text). */
    @Override
    public byte[] getJMSCorrelationIDAsBytes() {
        return correlationId == null ? null : correlationId.getBytes(StandardCharsets.ISO_8859_1);
    }

    @Override
    public void setJMSCorrelationIDAsBytes(byte[] correlationID) {
        this.correlationId = correlationID == null ? null : new String(correlationID, StandardCharsets.ISO_8859_1);
    }

    @Override
    public void setJMSCorrelationID(String correlationID) {
        this.correlationId = correlationID;
    }

    @Override
    public String getJMSCorrelationID() {
        return correlationId;
    }

    @Override
    public Destination getJMSReplyTo() {
        return replyTo;
    }

    @Override
    public void setJMSReplyTo(Destination replyTo) {
        this.replyTo = replyTo;
    }

    @Override
    public Destination getJMSDestination() {
        return destination;
    }

    @Override
    public void setJMSDestination(Destination destination) {
        this.destination = destination;
    }

    @Override
    public int getJMSDeliveryMode() {
        return deliveryMode;
    }

    @Override
    public void setJMSDeliveryMode(int deliveryMode) {
        this.deliveryMode = deliveryMode;
    }

    @Override
    public boolean getJMSRedelivered() {
        return redelivered;
    }

    @Override
    public void setJMSRedelivered(boolean redelivered) {
        this.redelivered = redelivered;
    }

    @Override
    public String getJMSType() {
        return type;
    }

    @Override
    public void setJMSType(String type) {
        this.type = type;
    }

    @Override
    public long getJMSExpiration() {
        return expiration;
    }

    @Override
    public void setJMSExpiration(long expiration) {
        this.expiration = expiration;
    }

    @Override
    public long getJMSDeliveryTime() {
        return deliveryTime;
    }

    @Override
    public void setJMSDeliveryTime(long deliveryTime) {
        this.deliveryTime = deliveryTime;
    }

    @Override
    public int getJMSPriority() {
        return priority;
    }

    @Override
    public void setJMSPriority(int priority) {
        this.priority = priority;
    }

    /** The broker's per-destination sequence number of a received message (pymq-seq), or null. */
    public Long getSequence() {
        return sequence;
    }

    // -- properties ---------------------------------------------------------------------------------
    @Override
    public void clearProperties() {
        properties.clear();
        readOnlyProperties = false;
    }

    @Override
    public boolean propertyExists(String name) {
        return properties.containsKey(name);
    }

    @Override
    public boolean getBooleanProperty(String name) throws JMSException {
        return TypedValues.toBoolean(properties.get(name), name);
    }

    @Override
    public byte getByteProperty(String name) throws JMSException {
        return TypedValues.toByte(properties.get(name), name);
    }

    @Override
    public short getShortProperty(String name) throws JMSException {
        return TypedValues.toShort(properties.get(name), name);
    }

    @Override
    public int getIntProperty(String name) throws JMSException {
        return TypedValues.toInt(properties.get(name), name);
    }

    @Override
    public long getLongProperty(String name) throws JMSException {
        return TypedValues.toLong(properties.get(name), name);
    }

    @Override
    public float getFloatProperty(String name) throws JMSException {
        return TypedValues.toFloat(properties.get(name), name);
    }

    @Override
    public double getDoubleProperty(String name) throws JMSException {
        return TypedValues.toDouble(properties.get(name), name);
    }

    @Override
    public String getStringProperty(String name) throws JMSException {
        return TypedValues.toStringValue(properties.get(name), name);
    }

    @Override
    public Object getObjectProperty(String name) {
        return properties.get(name);
    }

    @Override
    public Enumeration<String> getPropertyNames() {
        return Collections.enumeration(properties.keySet());
    }

    /** The properties, in the order they were set or received (a read-only view). */
    public Map<String, Object> properties() {
        return Collections.unmodifiableMap(properties);
    }

    @Override
    public void setBooleanProperty(String name, boolean value) throws JMSException {
        put(name, value);
    }

    @Override
    public void setByteProperty(String name, byte value) throws JMSException {
        put(name, value);
    }

    @Override
    public void setShortProperty(String name, short value) throws JMSException {
        put(name, value);
    }

    @Override
    public void setIntProperty(String name, int value) throws JMSException {
        put(name, value);
    }

    @Override
    public void setLongProperty(String name, long value) throws JMSException {
        put(name, value);
    }

    @Override
    public void setFloatProperty(String name, float value) throws JMSException {
        put(name, value);
    }

    @Override
    public void setDoubleProperty(String name, double value) throws JMSException {
        put(name, value);
    }

    @Override
    public void setStringProperty(String name, String value) throws JMSException {
        put(name, value);
    }

    @Override
    public void setObjectProperty(String name, Object value) throws JMSException {
        if (value != null && !TypedValues.isPropertyValue(value)) {
            throw new MessageFormatException("property " + name + " must be a Boolean, Byte, Short, Integer, Long, "
                    + "Float, Double or String, not " + value.getClass().getName());
        }
        put(name, value);
    }

    private void put(String name, Object value) throws JMSException {
        checkPropertyName(name);
        if (readOnlyProperties) {
            throw new MessageNotWriteableException("the properties of a received message are read-only; "
                    + "call clearProperties() first");
        }
        if ((value instanceof Float f && !Float.isFinite(f)) || (value instanceof Double d && !Double.isFinite(d))) {
            throw new MessageFormatException("property " + name + " must be a finite number (spec/stomp.md §7)");
        }
        if (value == null) {
            properties.remove(name);
        } else {
            properties.put(name, value);
        }
    }

    /** Property names go on the wire as header names: they must not clash with a header or break pymq-types. */
    static void checkPropertyName(String name) {
        if (name == null || name.isEmpty()) {
            throw new IllegalArgumentException("property names must be non-empty");
        }
        if (RESERVED.contains(name)) {
            throw new IllegalArgumentException("\"" + name + "\" is a header, not a property; use the JMS header field");
        }
        for (int i = 0; i < name.length(); i++) {
            char c = name.charAt(i);
            if (c == ',' || c == '=' || c == '\n' || c == '\r') {
                throw new IllegalArgumentException("property name \"" + name
                        + "\" must not contain ',', '=' or line breaks (spec/stomp.md §7)");
            }
        }
    }

    // -- acknowledgement and body -----------------------------------------------------------------------
    @Override
    public void acknowledge() throws JMSException {
        Acknowledger a = acknowledger;
        if (a != null) {
            a.acknowledge();
        }
    }

    @Override
    public void clearBody() throws JMSException {
        readOnlyBody = false;
    }

    void checkWritable() throws MessageNotWriteableException {
        if (readOnlyBody) {
            throw new MessageNotWriteableException("the body of a received message is read-only; call clearBody() first");
        }
    }

    @Override
    public <T> T getBody(Class<T> c) throws JMSException {
        return null;
    }

    @Override
    @SuppressWarnings("rawtypes")
    public boolean isBodyAssignableTo(Class c) {
        return true;
    }

    /** Marks a received message read-only, as JMS requires. */
    void received() {
        readOnlyBody = true;
        readOnlyProperties = true;
    }

    @Override
    public String toString() {
        return getClass().getSimpleName() + "[id=" + messageId + ", destination=" + destination + ", properties="
                + properties + "]";
    }
}
