package io.pymq.jms;

import io.pymq.stomp.Frame;
import io.pymq.stomp.Header;
import jakarta.jms.IllegalStateException;
import jakarta.jms.JMSException;
import jakarta.jms.Message;
import jakarta.jms.MessageListener;
import jakarta.jms.Queue;
import jakarta.jms.QueueReceiver;
import jakarta.jms.Topic;
import jakarta.jms.TopicSubscriber;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * A MessageConsumer: one STOMP subscription with broker-side credit ({@code client-individual} acks and
 * {@code prefetch-count}), so it never holds more than the factory's prefetch of unacknowledged messages
 * and a slow consumer never stalls the connection.  Acknowledgement follows the session's mode (see
 * {@link PymqSession}).  The selector is checked here before the SUBSCRIBE is sent
 * ({@link io.pymq.selector.Selector}), so a bad one is an InvalidSelectorException and the connection
 * lives on.
 */
public class PymqMessageConsumer implements QueueReceiver, TopicSubscriber, PymqConnection.Subscriber {
    /** A MESSAGE frame and the link it came by (acknowledging it is only possible on that link). */
    record Arrival(Frame frame, BrokerLink link) {
    }

    /** Wakes a blocked receive: the consumer or its connection closed. */
    private static final Arrival WAKE = new Arrival(new Frame("WAKE", List.of()), null);

    final PymqSession session;
    final PymqDestination destination;
    final String selector;
    final boolean noLocal;
    final String durableName;
    final String subId;
    private final LinkedBlockingQueue<Arrival> inbox = new LinkedBlockingQueue<>();
    private final List<Header> subscribeHeaders;
    private volatile MessageListener listener;
    volatile boolean closed;
    private volatile boolean unsubscribed;

    PymqMessageConsumer(PymqSession session, PymqDestination destination, String selector, boolean noLocal,
                        String durableName, List<Header> extra) throws JMSException {
        this.session = session;
        this.destination = destination;
        this.selector = selector == null || selector.isBlank() ? null : selector;
        this.noLocal = noLocal;
        this.durableName = durableName;
        PymqConnection connection = session.connection;
        this.subId = connection.nextId("sub-");
        List<Header> headers = new ArrayList<>();
        headers.add(new Header("destination", destination.stompName()));
        headers.add(new Header("id", subId));
        headers.add(new Header("ack", "client-individual"));
        headers.add(new Header("prefetch-count", Integer.toString(connection.factory().getPrefetch())));
        if (this.selector != null) {
            headers.add(new Header("selector", this.selector));
        }
        if (noLocal) {
            headers.add(new Header("no-local", "true"));
        }
        headers.addAll(extra);
        this.subscribeHeaders = List.copyOf(headers);
        connection.register(subId, this);
        try {
            connection.link().call("SUBSCRIBE", headers, null);
        } catch (JMSException e) {
            connection.unregister(subId);
            throw e;
        }
    }

    // -- frames from the reader thread ------------------------------------------------------------------
    @Override
    public void deliver(Frame frame, BrokerLink link) {
        synchronized (this) {
            if (closed) {
                return;        // a locally closed consumer: its UNSUBSCRIBE gives the message back
            }
            if (listener != null) {
                session.dispatch(this, frame, link);
            } else {
                inbox.add(new Arrival(frame, link));
            }
        }
    }

    /** After a failover: the same SUBSCRIBE (id, destination, selector, ack mode, names) on the new link. */
    @Override
    public List<Header> resubscribe() {
        return closed || unsubscribed ? null : subscribeHeaders;
    }

    /** After a failover: what the lost link delivered is dropped here (the broker redelivers it). */
    void dropStale(BrokerLink fresh) {
        synchronized (this) {
            inbox.removeIf(a -> a != WAKE && a.link() != fresh);
        }
    }

    @Override
    public void wake() {
        inbox.add(WAKE);
    }

    /** Takes the messages delivered here and not yet handed to the application (recover, rollback). */
    List<PymqSession.Delivery> drainBuffered() {
        List<PymqSession.Delivery> out = new ArrayList<>();
        for (Arrival a : drainArrivals()) {
            out.add(new PymqSession.Delivery(this, a.frame().get("ack", ""), null, a.link()));
        }
        return out;
    }

    private List<Arrival> drainArrivals() {
        List<Arrival> out = new ArrayList<>();
        synchronized (this) {
            for (Arrival a : inbox) {
                if (a != WAKE) {
                    out.add(a);
                }
            }
            inbox.removeIf(a -> a != WAKE);
        }
        return out;
    }

    // -- MessageConsumer ----------------------------------------------------------------------------------
    @Override
    public String getMessageSelector() throws JMSException {
        checkOpen();
        return selector;
    }

    MessageListener getMessageListenerUnchecked() {
        return listener;
    }

    @Override
    public MessageListener getMessageListener() throws JMSException {
        checkOpen();
        return listener;
    }

    /** Delivers messages to {@code listener} on the session's dispatcher thread, one at a time, in order. */
    @Override
    public void setMessageListener(MessageListener listener) throws JMSException {
        checkOpen();
        synchronized (this) {
            this.listener = listener;
            if (listener != null) {
                session.startDispatcher();
                // messages that arrived before the listener was set go to it, in order
                for (Arrival a : drainArrivals()) {
                    session.dispatch(this, a.frame(), a.link());
                }
            }
        }
    }

    @Override
    public Message receive() throws JMSException {
        return receive(0, false);
    }

    @Override
    public Message receive(long timeout) throws JMSException {
        return receive(timeout, false);
    }

    @Override
    public Message receiveNoWait() throws JMSException {
        return receive(0, true);
    }

    private Message receive(long timeout, boolean noWait) throws JMSException {
        checkOpen();
        if (listener != null) {
            throw new IllegalStateException("this consumer has a message listener: receive() cannot be used");
        }
        PymqConnection connection = session.connection;
        long deadline = noWait ? System.nanoTime() : timeout > 0 ? System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeout) : 0;
        try {
            while (true) {
                if (!connection.started()) {
                    if (noWait || !connection.awaitStarted(deadline)) {
                        return null;
                    }
                }
                Arrival f;
                if (noWait) {
                    f = inbox.poll();
                } else if (deadline == 0) {
                    f = inbox.poll(1, TimeUnit.SECONDS);
                    if (f == null) {
                        continue;
                    }
                } else {
                    long left = deadline - System.nanoTime();
                    f = left > 0 ? inbox.poll(left, TimeUnit.NANOSECONDS) : inbox.poll();
                }
                if (f == null) {
                    return null;
                }
                if (f == WAKE) {
                    if (closed || session.isClosed()) {
                        return null;       // JMS: a receive returns null when its consumer is closed meanwhile
                    }
                    connection.checkOpen();  // the connection failed: say why
                    continue;
                }
                if (!connection.started()) {       // stopped while waiting: keep it for later
                    synchronized (this) {
                        List<Arrival> rest = new ArrayList<>();
                        inbox.drainTo(rest);
                        inbox.add(f);
                        inbox.addAll(rest);
                    }
                    continue;
                }
                if (f.link() != connection.currentLink()) {
                    continue;              // delivered by a lost link: the broker redelivers it
                }
                return session.consume(this, f.frame(), f.link());
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new JMSException("interrupted while receiving from " + destination);
        }
    }

    /**
     * Closes the consumer.  A blocked receive returns null.  While this consumer has messages the session
     * has not acknowledged yet (CLIENT_ACKNOWLEDGE, or a transaction), the subscription itself ends only at
     * the session's next acknowledge/commit/rollback/recover/close, so those messages still take part in it.
     */
    @Override
    public void close() throws JMSException {
        if (closed) {
            return;
        }
        synchronized (this) {
            closed = true;
        }
        inbox.add(WAKE);
        session.consumerClosed(this);
    }

    /** Ends the STOMP subscription (the broker returns its unacknowledged messages for redelivery). */
    void unsubscribe() {
        if (unsubscribed) {
            return;
        }
        unsubscribed = true;
        PymqConnection connection = session.connection;
        try {
            if (!connection.isClosed()) {
                connection.link().call("UNSUBSCRIBE", List.of(new Header("id", subId)), null);
            }
        } catch (JMSException ignored) {
            // the connection is ending: the broker returns the messages anyway
        } finally {
            connection.unregister(subId);
        }
    }

    private void checkOpen() throws JMSException {
        if (closed) {
            throw new IllegalStateException("the consumer is closed");
        }
        session.checkOpen();
    }

    @Override
    public Queue getQueue() throws JMSException {
        checkOpen();
        if (destination instanceof Queue q) {
            return q;
        }
        throw new IllegalStateException("this consumer reads a topic, not a queue");
    }

    @Override
    public Topic getTopic() throws JMSException {
        checkOpen();
        if (destination instanceof Topic t) {
            return t;
        }
        throw new IllegalStateException("this consumer reads a queue, not a topic");
    }

    @Override
    public boolean getNoLocal() throws JMSException {
        checkOpen();
        return noLocal;
    }

    @Override
    public String toString() {
        return "PymqMessageConsumer[" + destination + (selector != null ? " where " + selector : "") + "]";
    }
}
