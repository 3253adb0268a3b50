package io.pymq.jms;

import jakarta.jms.CompletionListener;
import jakarta.jms.DeliveryMode;
import jakarta.jms.Destination;
import jakarta.jms.JMSProducer;
import jakarta.jms.JMSRuntimeException;
import jakarta.jms.MapMessage;
import jakarta.jms.Message;
import jakarta.jms.MessageFormatRuntimeException;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

/**
 * The simplified API's producer: settings and properties applied to every message it sends, through the
 * context's session.  Bodies: String → TextMessage, Map → MapMessage, byte[] → BytesMessage; a
 * Serializable (ObjectMessage) is refused, as {@link PymqSession#createObjectMessage()} explains.
 */
public class PymqJMSProducer implements JMSProducer {
    private final PymqContext context;
    private final PymqMessage properties = new PymqMessage();   // holds the properties and their conversions
    private int deliveryMode = DeliveryMode.PERSISTENT;
    private int priority = Message.DEFAULT_PRIORITY;
    private long timeToLive;
    private long deliveryDelay;
    private boolean disableMessageID;
    private boolean disableMessageTimestamp;
    private CompletionListener async;
    private String correlationId;
    private String type;
    private Destination replyTo;

    PymqJMSProducer(PymqContext context) {
        this.context = context;
    }

    @Override
    public JMSProducer send(Destination destination, Message message) {
        if (message == null) {
            throw new MessageFormatRuntimeException("the message must not be null");
        }
        PymqContext.call(() -> {
            for (Map.Entry<String, Object> p : properties.properties().entrySet()) {
                message.setObjectProperty(p.getKey(), p.getValue());
            }
            if (correlationId != null) {
                message.setJMSCorrelationID(correlationId);
            }
            if (type != null) {
                message.setJMSType(type);
            }
            if (replyTo != null) {
                message.setJMSReplyTo(replyTo);
            }
            PymqMessageProducer p = context.producer();
            synchronized (p) {
                p.setDeliveryDelay(deliveryDelay);
                p.setDisableMessageID(disableMessageID);
                p.setDisableMessageTimestamp(disableMessageTimestamp);
                if (destination == null) {
                    throw new jakarta.jms.InvalidDestinationException("the destination must not be null");
                }
                p.sendTo(destination, message, deliveryMode, priority, timeToLive, async);
            }
            return null;
        });
        return this;
    }

    @Override
    public JMSProducer send(Destination destination, String body) {
        return send(destination, PymqContext.call(() -> context.session().createTextMessage(body)));
    }

    @Override
    public JMSProducer send(Destination destination, Map<String, Object> body) {
        MapMessage m = PymqContext.call(() -> {
            MapMessage map = context.session().createMapMessage();
            if (body != null) {
                for (Map.Entry<String, Object> e : body.entrySet()) {
                    map.setObject(e.getKey(), e.getValue());
                }
            }
            return map;
        });
        return send(destination, m);
    }

    @Override
    public JMSProducer send(Destination destination, byte[] body) {
        return send(destination, PymqContext.call(() -> {
            PymqBytesMessage b = new PymqBytesMessage();
            if (body != null) {
                b.writeBytes(body);
            }
            return b;
        }));
    }

    @Override
    public JMSProducer send(Destination destination, Serializable body) {
        throw PymqContext.runtime(PymqSession.unsupportedObjectMessage());
    }

    @Override
    public JMSProducer setDisableMessageID(boolean value) {
        disableMessageID = value;
        return this;
    }

    @Override
    public boolean getDisableMessageID() {
        return disableMessageID;
    }

    @Override
    public JMSProducer setDisableMessageTimestamp(boolean value) {
        disableMessageTimestamp = value;
        return this;
    }

    @Override
    public boolean getDisableMessageTimestamp() {
        return disableMessageTimestamp;
    }

    @Override
    public JMSProducer setDeliveryMode(int deliveryMode) {
        PymqContext.call(() -> {
            PymqMessageProducer.checkDeliveryMode(deliveryMode);
            return null;
        });
        this.deliveryMode = deliveryMode;
        return this;
    }

    @Override
    public int getDeliveryMode() {
        return deliveryMode;
    }

    @Override
    public JMSProducer setPriority(int priority) {
        PymqContext.call(() -> {
            PymqMessageProducer.checkPriority(priority);
            return null;
        });
        this.priority = priority;
        return this;
    }

    @Override
    public int getPriority() {
        return priority;
    }

    @Override
    public JMSProducer setTimeToLive(long timeToLive) {
        if (timeToLive < 0) {
            throw new JMSRuntimeException("time to live must not be negative, got " + timeToLive);
        }
        this.timeToLive = timeToLive;
        return this;
    }

    @Override
    public long getTimeToLive() {
        return timeToLive;
    }

    @Override
    public JMSProducer setDeliveryDelay(long deliveryDelay) {
        if (deliveryDelay < 0) {
            throw new JMSRuntimeException("delivery delay must not be negative, got " + deliveryDelay);
        }
        this.deliveryDelay = deliveryDelay;
        return this;
    }

    @Override
    public long getDeliveryDelay() {
        return deliveryDelay;
    }

    @Override
    public JMSProducer setAsync(CompletionListener completionListener) {
        this.async = completionListener;
        return this;
    }

    @Override
    public CompletionListener getAsync() {
        return async;
    }

    private JMSProducer set(String name, Object value) {
        PymqContext.call(() -> {
            properties.setObjectProperty(name, value);
            return null;
        });
        return this;
    }

    @Override
    public JMSProducer setProperty(String name, boolean value) {
        return set(name, value);
    }

    @Override
    public JMSProducer setProperty(String name, byte value) {
        return set(name, value);
    }

    @Override
    public JMSProducer setProperty(String name, short value) {
        return set(name, value);
    }

    @Override
    public JMSProducer setProperty(String name, int value) {
        return set(name, value);
    }

    @Override
    public JMSProducer setProperty(String name, long value) {
        return set(name, value);
    }

    @Override
    public JMSProducer setProperty(String name, float value) {
        return set(name, value);
    }

    @Override
    public JMSProducer setProperty(String name, double value) {
        return set(name, value);
    }

    @Override
    public JMSProducer setProperty(String name, String value) {
        return set(name, value);
    }

    @Override
    public JMSProducer setProperty(String name, Object value) {
        return set(name, value);
    }

    @Override
    public JMSProducer clearProperties() {
        properties.clearProperties();
        return this;
    }

    @Override
    public boolean propertyExists(String name) {
        return properties.propertyExists(name);
    }

    @Override
    public boolean getBooleanProperty(String name) {
        return PymqContext.call(() -> properties.getBooleanProperty(name));
    }

    @Override
    public byte getByteProperty(String name) {
        return PymqContext.call(() -> properties.getByteProperty(name));
    }

    @Override
    public short getShortProperty(String name) {
        return PymqContext.call(() -> properties.getShortProperty(name));
    }

    @Override
    public int getIntProperty(String name) {
        return PymqContext.call(() -> properties.getIntProperty(name));
    }

    @Override
    public long getLongProperty(String name) {
        return PymqContext.call(() -> properties.getLongProperty(name));
    }

    @Override
    public float getFloatProperty(String name) {
        return PymqContext.call(() -> properties.getFloatProperty(name));
    }

    @Override
    public double getDoubleProperty(String name) {
        return PymqContext.call(() -> properties.getDoubleProperty(name));
    }

    @Override
    public String getStringProperty(String name) {
        return PymqContext.call(() -> properties.getStringProperty(name));
    }

    @Override
    public Object getObjectProperty(String name) {
        return properties.getObjectProperty(name);
    }

    @Override
    public Set<String> getPropertyNames() {
        return Collections.unmodifiableSet(new HashSet<>(properties.properties().keySet()));
    }

    @Override
    public JMSProducer setJMSCorrelationIDAsBytes(byte[] correlationID) {
        this.correlationId = correlationID == null ? null : new String(correlationID, StandardCharsets.ISO_8859_1);
        return this;
    }

    @Override
    public byte[] getJMSCorrelationIDAsBytes() {
        return correlationId == null ? null : correlationId.getBytes(StandardCharsets.ISO_8859_1);
    }

    @Override
    public JMSProducer setJMSCorrelationID(String correlationID) {
        this.correlationId = correlationID;
        return this;
    }

    @Override
    public String getJMSCorrelationID() {
        return correlationId;
    }

    @Override
    public JMSProducer setJMSType(String type) {
        this.type = type;
        return this;
    }

    @Override
    public String getJMSType() {
        return type;
    }

    @Override
    public JMSProducer setJMSReplyTo(Destination replyTo) {
        this.replyTo = replyTo;
        return this;
    }

    @Override
    public Destination getJMSReplyTo() {
        return replyTo;
    }
}
