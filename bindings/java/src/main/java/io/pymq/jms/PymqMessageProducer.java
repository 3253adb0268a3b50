package io.pymq.jms;

import io.pymq.stomp.Frame;
import io.pymq.stomp.Header;
import jakarta.jms.BytesMessage;
import jakarta.jms.CompletionListener;
import jakarta.jms.DeliveryMode;
import jakarta.jms.Destination;
import jakarta.jms.IllegalStateException;
import jakarta.jms.InvalidDestinationException;
import jakarta.jms.JMSException;
import jakarta.jms.MapMessage;
import jakarta.jms.Message;
import jakarta.jms.MessageFormatException;
import jakarta.jms.ObjectMessage;
import jakarta.jms.Queue;
import jakarta.jms.QueueSender;
import jakarta.jms.StreamMessage;
import jakarta.jms.TextMessage;
import jakarta.jms.Topic;
import jakarta.jms.TopicPublisher;

import java.util.ArrayList;
import java.util.Enumeration;
import java.util.List;
import java.util.concurrent.CompletableFuture;

/**
 * A MessageProducer.  A persistent message sent outside a transaction waits for the broker's RECEIPT
 * (which comes once the message is durable) and then carries the JMSMessageID the broker gave it; with the
 * factory's {@code syncSend=false}, and for non-persistent messages, the send returns as soon as the frame
 * is written and JMSMessageID stays null (pymq ids are assigned by the broker).  Inside a transaction
 * nothing waits: COMMIT confirms everything.  An asynchronous send (with a {@link CompletionListener})
 * always asks for a receipt and calls the listener on the session's completion thread, in send order.
 *
 * <p>Delivery delay travels as {@code AMQ_SCHEDULED_DELAY}, time to live as the absolute {@code expires}
 * (spec/stomp.md §4).
 */
public class PymqMessageProducer implements QueueSender, TopicPublisher {
    private final PymqSession session;
    private final PymqDestination destination;
    private volatile boolean closed;
    private int deliveryMode = DeliveryMode.PERSISTENT;
    private int priority = Message.DEFAULT_PRIORITY;
    private long timeToLive;
    private long deliveryDelay;
    private boolean disableMessageID;
    private boolean disableMessageTimestamp;

    PymqMessageProducer(PymqSession session, PymqDestination destination) {
        this.session = session;
        this.destination = destination;
    }

    private void checkOpen() throws JMSException {
        if (closed) {
            throw new IllegalStateException("the producer is closed");
        }
        session.checkOpen();
    }

    void closeLocal() {
        closed = true;
    }

    @Override
    public void close() {
        closed = true;
    }

    // -- settings ------------------------------------------------------------------------------------------
    @Override
    public void setDisableMessageID(boolean value) throws JMSException {
        checkOpen();
        disableMessageID = value;
    }

    @Override
    public boolean getDisableMessageID() throws JMSException {
        checkOpen();
        return disableMessageID;
    }

    @Override
    public void setDisableMessageTimestamp(boolean value) throws JMSException {
        checkOpen();
        disableMessageTimestamp = value;
    }

    @Override
    public boolean getDisableMessageTimestamp() throws JMSException {
        checkOpen();
        return disableMessageTimestamp;
    }

    @Override
    public void setDeliveryMode(int deliveryMode) throws JMSException {
        checkOpen();
        checkDeliveryMode(deliveryMode);
        this.deliveryMode = deliveryMode;
    }

    @Override
    public int getDeliveryMode() throws JMSException {
        checkOpen();
        return deliveryMode;
    }

    @Override
    public void setPriority(int priority) throws JMSException {
        checkOpen();
        checkPriority(priority);
        this.priority = priority;
    }

    @Override
    public int getPriority() throws JMSException {
        checkOpen();
        return priority;
    }

    @Override
    public void setTimeToLive(long timeToLive) throws JMSException {
        checkOpen();
        if (timeToLive < 0) {
            throw new JMSException("time to live must not be negative, got " + timeToLive);
        }
        this.timeToLive = timeToLive;
    }

    @Override
    public long getTimeToLive() throws JMSException {
        checkOpen();
        return timeToLive;
    }

    @Override
    public void setDeliveryDelay(long deliveryDelay) throws JMSException {
        checkOpen();
        if (deliveryDelay < 0) {
            throw new JMSException("delivery delay must not be negative, got " + deliveryDelay);
        }
        this.deliveryDelay = deliveryDelay;
    }

    @Override
    public long getDeliveryDelay() throws JMSException {
        checkOpen();
        return deliveryDelay;
    }

    @Override
    public Destination getDestination() throws JMSException {
        checkOpen();
        return destination;
    }

    @Override
    public Queue getQueue() throws JMSException {
        checkOpen();
        return destination instanceof Queue q ? q : null;
    }

    @Override
    public Topic getTopic() throws JMSException {
        checkOpen();
        return destination instanceof Topic t ? t : null;
    }

    static void checkDeliveryMode(int mode) throws JMSException {
        if (mode != DeliveryMode.PERSISTENT && mode != DeliveryMode.NON_PERSISTENT) {
            throw new JMSException("delivery mode must be PERSISTENT (2) or NON_PERSISTENT (1), got " + mode);
        }
    }

    static void checkPriority(int priority) throws JMSException {
        if (priority < 0 || priority > 9) {
            throw new JMSException("priority must be between 0 and 9, got " + priority);
        }
    }

    // -- send -------------------------------------------------------------------------------------------
    @Override
    public void send(Message message) throws JMSException {
        send(message, deliveryMode, priority, timeToLive);
    }

    @Override
    public void send(Message message, int deliveryMode, int priority, long timeToLive) throws JMSException {
        sendTo(null, message, deliveryMode, priority, timeToLive, null);
    }

    @Override
    public void send(Destination destination, Message message) throws JMSException {
        send(destination, message, deliveryMode, priority, timeToLive);
    }

    @Override
    public void send(Destination destination, Message message, int deliveryMode, int priority, long timeToLive)
            throws JMSException {
        sendTo(destinationOrRefuse(destination), message, deliveryMode, priority, timeToLive, null);
    }

    @Override
    public void send(Message message, CompletionListener completionListener) throws JMSException {
        send(message, deliveryMode, priority, timeToLive, completionListener);
    }

    @Override
    public void send(Message message, int deliveryMode, int priority, long timeToLive,
                     CompletionListener completionListener) throws JMSException {
        sendTo(null, message, deliveryMode, priority, timeToLive, requireListener(completionListener));
    }

    @Override
    public void send(Destination destination, Message message, CompletionListener completionListener)
            throws JMSException {
        send(destination, message, deliveryMode, priority, timeToLive, completionListener);
    }

    @Override
    public void send(Destination destination, Message message, int deliveryMode, int priority, long timeToLive,
                     CompletionListener completionListener) throws JMSException {
        sendTo(destinationOrRefuse(destination), message, deliveryMode, priority, timeToLive,
                requireListener(completionListener));
    }

    @Override
    public void send(Queue queue, Message message) throws JMSException {
        send((Destination) queue, message);
    }

    @Override
    public void send(Queue queue, Message message, int deliveryMode, int priority, long timeToLive) throws JMSException {
        send((Destination) queue, message, deliveryMode, priority, timeToLive);
    }

    @Override
    public void publish(Message message) throws JMSException {
        send(message);
    }

    @Override
    public void publish(Message message, int deliveryMode, int priority, long timeToLive) throws JMSException {
        send(message, deliveryMode, priority, timeToLive);
    }

    @Override
    public void publish(Topic topic, Message message) throws JMSException {
        send(topic, message);
    }

    @Override
    public void publish(Topic topic, Message message, int deliveryMode, int priority, long timeToLive)
            throws JMSException {
        send(topic, message, deliveryMode, priority, timeToLive);
    }

    private static CompletionListener requireListener(CompletionListener l) {
        if (l == null) {
            throw new IllegalArgumentException("the completion listener must not be null");
        }
        return l;
    }

    private Destination destinationOrRefuse(Destination d) throws JMSException {
        if (destination != null) {
            throw new UnsupportedOperationException("this producer sends to " + destination
                    + "; a destination per send needs a producer created without one");
        }
        if (d == null) {
            throw new InvalidDestinationException("the destination must not be null");
        }
        return d;
    }

    /** The send itself; {@code to} is null for the producer's own destination. */
    void sendTo(Destination to, Message message, int mode, int prio, long ttl, CompletionListener listener)
            throws JMSException {
        checkOpen();
        if (message == null) {
            throw new MessageFormatException("the message must not be null");
        }
        checkDeliveryMode(mode);
        checkPriority(prio);
        if (ttl < 0) {
            throw new JMSException("time to live must not be negative, got " + ttl);
        }
        if (to == null && destination == null) {
            throw new UnsupportedOperationException("this producer has no destination: pass one to send()");
        }
        PymqDestination target = to != null ? session.pymqDestination(to) : destination;
        if ((target instanceof PymqTemporaryQueue q && q.deleted()) || (target instanceof PymqTemporaryTopic t && t.deleted())) {
            throw new InvalidDestinationException(target + " was deleted");
        }
        PymqMessage m = message instanceof PymqMessage own ? own : foreign(message);
        long now = System.currentTimeMillis();
        m.destination = target;
        m.deliveryMode = mode;
        m.priority = prio;
        m.timestamp = disableMessageTimestamp ? 0 : now;
        m.expiration = ttl > 0 ? now + ttl : 0;
        m.deliveryTime = now + deliveryDelay;
        m.messageId = null;
        List<Header> headers = new ArrayList<>();
        headers.add(new Header("destination", target.stompName()));
        headers.addAll(WireFormat.sendHeaders(m));
        if (deliveryDelay > 0) {
            headers.add(new Header("AMQ_SCHEDULED_DELAY", Long.toString(deliveryDelay)));
        }
        boolean transacted = session.mode == jakarta.jms.Session.SESSION_TRANSACTED;
        byte[] body = m.bodyBytes();
        PymqConnection connection = session.connection;
        BrokerLink link = connection.link();      // while a failover connection reconnects: waits
        if (transacted) {
            headers.add(new Header("transaction", session.transaction()));
            session.txWorked();
        }
        if (connection.failover() && !transacted) {
            // every SEND asks for a receipt and is re-sent after a failover with its dedup id (spec/ha.md §4.4)
            if (listener != null) {
                session.sendStarted();
                CompletableFuture<Frame> receipt;
                try {
                    receipt = connection.sendReliably(headers, body);
                } catch (JMSException e) {
                    session.sendFinished();
                    throw e;
                }
                complete(receipt, m, message, false, listener);
            } else {
                CompletableFuture<Frame> receipt = connection.sendReliably(headers, body);
                if (mode == DeliveryMode.PERSISTENT && connection.factory().isSyncSend()) {
                    setId(m, message, connection.awaitSend(receipt).get("message-id"));
                }
            }
        } else if (listener != null) {
            session.sendStarted();
            CompletableFuture<Frame> receipt;
            try {
                receipt = link.request("SEND", headers, body);
            } catch (JMSException e) {
                session.sendFinished();
                throw e;
            }
            complete(receipt, m, message, transacted, listener);
        } else if (!transacted && mode == DeliveryMode.PERSISTENT && session.connection.factory().isSyncSend()) {
            Frame receipt = link.call("SEND", headers, body);
            setId(m, message, receipt.get("message-id"));
        } else {
            link.send("SEND", headers, body);
        }
        if (m != message) {
            copyHeaders(m, message);
        }
    }

    /** Calls the completion listener of an asynchronous send once its receipt (or error) is in. */
    private void complete(CompletableFuture<Frame> receipt, PymqMessage m, Message message, boolean transacted,
                          CompletionListener listener) {
        receipt.whenCompleteAsync((frame, error) -> {
            try {
                if (error == null) {
                    if (!transacted) {
                        setId(m, message, frame.get("message-id"));
                    }
                    listener.onCompletion(message);
                } else {
                    Throwable t = error instanceof java.util.concurrent.CompletionException c && c.getCause() != null
                            ? c.getCause() : error;
                    listener.onException(message, t instanceof JMSException j ? j : new JMSException(String.valueOf(t)));
                }
            } finally {
                session.sendFinished();
            }
        }, session.completions());
    }

    private static void setId(PymqMessage m, Message original, String id) {
        m.messageId = id;
        if (m != original) {
            try {
                original.setJMSMessageID(id);
            } catch (JMSException ignored) {
                // a foreign message that refuses its id: ours has it
            }
        }
    }

    /** JMS 3.1 §3.4.11: after sending a foreign message, its header fields are set as if it were ours. */
    private static void copyHeaders(PymqMessage m, Message original) throws JMSException {
        original.setJMSDestination(m.destination);
        original.setJMSDeliveryMode(m.deliveryMode);
        original.setJMSPriority(m.priority);
        original.setJMSTimestamp(m.timestamp);
        original.setJMSExpiration(m.expiration);
        original.setJMSDeliveryTime(m.deliveryTime);
        original.setJMSMessageID(m.messageId);
    }

    /** A message of another JMS provider, copied into ours (JMS requires providers to send them). */
    static PymqMessage foreign(Message message) throws JMSException {
        PymqMessage m;
        if (message instanceof TextMessage t) {
            m = new PymqTextMessage(t.getText());
        } else if (message instanceof MapMessage mm) {
            PymqMapMessage map = new PymqMapMessage();
            for (Enumeration<?> e = mm.getMapNames(); e.hasMoreElements(); ) {
                String name = (String) e.nextElement();
                map.setObject(name, mm.getObject(name));
            }
            m = map;
        } else if (message instanceof BytesMessage b) {
            b.reset();
            byte[] data = new byte[(int) b.getBodyLength()];
            b.readBytes(data);
            m = new PymqBytesMessage(data);
        } else if (message instanceof ObjectMessage) {
            throw PymqSession.unsupportedObjectMessage();
        } else if (message instanceof StreamMessage) {
            throw PymqSession.unsupportedStreamMessage();
        } else {
            m = new PymqMessage();
        }
        m.readOnlyBody = false;
        m.correlationId = message.getJMSCorrelationID();
        m.replyTo = message.getJMSReplyTo() == null ? null
                : message.getJMSReplyTo() instanceof PymqDestination d ? d : null;
        m.type = message.getJMSType();
        for (Enumeration<?> e = message.getPropertyNames(); e.hasMoreElements(); ) {
            String name = (String) e.nextElement();
            m.setObjectProperty(name, message.getObjectProperty(name));
        }
        return m;
    }

    @Override
    public String toString() {
        return "PymqMessageProducer[" + destination + "]";
    }
}
