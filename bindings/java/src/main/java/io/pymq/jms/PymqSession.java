package io.pymq.jms;

import io.pymq.selector.Selector;
import io.pymq.stomp.Frame;
import io.pymq.stomp.Header;
import jakarta.jms.BytesMessage;
import jakarta.jms.Destination;
import jakarta.jms.IllegalStateException;
import jakarta.jms.InvalidDestinationException;
import jakarta.jms.InvalidSelectorException;
import jakarta.jms.JMSException;
import jakarta.jms.MapMessage;
import jakarta.jms.Message;
import jakarta.jms.MessageConsumer;
import jakarta.jms.MessageListener;
import jakarta.jms.MessageProducer;
import jakarta.jms.ObjectMessage;
import jakarta.jms.Queue;
import jakarta.jms.QueueBrowser;
import jakarta.jms.QueueReceiver;
import jakarta.jms.QueueSender;
import jakarta.jms.QueueSession;
import jakarta.jms.Session;
import jakarta.jms.StreamMessage;
import jakarta.jms.TemporaryQueue;
import jakarta.jms.TemporaryTopic;
import jakarta.jms.TextMessage;
import jakarta.jms.Topic;
import jakarta.jms.TopicPublisher;
import jakarta.jms.TopicSession;
import jakarta.jms.TopicSubscriber;
import jakarta.jms.TransactionRolledBackException;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * A JMS Session.  Like every JMS session it is meant for one thread at a time; its message listeners run on
 * one dispatcher thread of its own, one message at a time, in delivery order.
 *
 * <p>Acknowledgement over STOMP (every subscription is {@code client-individual} with a prefetch):
 * AUTO_ACKNOWLEDGE and DUPS_OK_ACKNOWLEDGE send an ACK as {@code receive} returns a message or its listener
 * returns; CLIENT_ACKNOWLEDGE keeps what the application consumed and {@code acknowledge()} acknowledges
 * all of it (waiting for the broker to confirm); SESSION_TRANSACTED runs a broker transaction (BEGIN at
 * once and after every commit/rollback): sends and ACKs carry it, {@code commit()} applies them atomically.
 *
 * <p>{@link #recover()} and {@link #rollback()} give back (NACK) every message consumed and not
 * acknowledged, and with them the messages delivered here but not yet handed to the application, so that
 * the broker redelivers them in their original order, marked redelivered, with JMSXDeliveryCount counted
 * up; after the queue's {@code max_deliveries} (default 10) a message goes to the dead-letter queue
 * instead of looping.  A listener that throws a RuntimeException in AUTO/DUPS_OK mode has its message
 * redelivered the same way.
 */
public class PymqSession implements QueueSession, TopicSession {
    private static final Logger LOG = Logger.getLogger(PymqSession.class.getName());
    private static final Object STOP = new Object();

    /** One message handed to the application, and how to acknowledge it. */
    record Delivery(PymqMessageConsumer consumer, String ackId, PymqMessage message, BrokerLink link) {
    }

    private record Pending(PymqMessageConsumer consumer, Frame frame, BrokerLink link) {
    }

    final PymqConnection connection;
    final int mode;
    private volatile boolean closed;
    final List<PymqMessageConsumer> consumers = new CopyOnWriteArrayList<>();
    private final List<PymqMessageProducer> producers = new CopyOnWriteArrayList<>();
    /** consumed, not acknowledged (CLIENT_ACKNOWLEDGE, transacted), oldest first; guarded by this */
    private final List<Delivery> unacked = new ArrayList<>();
    /** closed consumers whose subscription ends at the next acknowledge/commit/rollback/recover */
    private final List<PymqMessageConsumer> closing = new ArrayList<>();
    private String tx;
    private boolean txWork;              // the open transaction sent or consumed something (guarded by this)
    private boolean rollbackOnly;        // it was lost with a link (failover): commit rolls back (guarded by this)
    // listener dispatch
    private final LinkedBlockingQueue<Object> dispatchQueue = new LinkedBlockingQueue<>();
    private volatile Thread dispatcher;
    private final Object listenerLock = new Object();
    private volatile boolean inListener;
    private Delivery current;            // the delivery a listener is processing (guarded by this)
    private boolean currentGivenBack;
    private final List<PymqMessageConsumer> closeAfterListener = new ArrayList<>();
    // asynchronous sends: completion listeners run here, in send order
    private volatile ExecutorService completions;
    private int pendingSends;            // guarded by sendLock
    private final Object sendLock = new Object();

    PymqSession(PymqConnection connection, int mode) throws JMSException {
        this.connection = connection;
        this.mode = mode;
        if (mode == SESSION_TRANSACTED) {
            begin();
        }
    }

    // -- state ---------------------------------------------------------------------------------------------
    void checkOpen() throws JMSException {
        if (closed) {
            throw new IllegalStateException("the session is closed");
        }
        connection.checkOpen();
    }

    boolean isClosed() {
        return closed || connection.isClosed();
    }

    boolean isDispatcherThread() {
        return Thread.currentThread() == dispatcher;
    }

    synchronized String transaction() {
        return tx;
    }

    private void begin() throws JMSException {
        begin(connection.link());
    }

    private void begin(BrokerLink on) throws JMSException {
        String id = "tx-" + UUID.randomUUID().toString().replace("-", "").substring(0, 16);
        synchronized (this) {
            tx = id;
            txWork = false;
        }
        on.send("BEGIN", List.of(new Header("transaction", id)), null);
    }

    /** The open transaction did something (a send or an acknowledgement inside it). */
    synchronized void txWorked() {
        txWork = true;
    }

    // -- failover (spec/ha.md §4.5) ---------------------------------------------------------------------
    /** The link was lost: a transaction that did something can only roll back now (the broker aborted it). */
    synchronized void linkLost() {
        if (mode == SESSION_TRANSACTED && txWork) {
            rollbackOnly = true;
        }
    }

    /**
     * A failover connection has a new link: deliveries of the old one are forgotten (the broker gives them
     * back, redelivered; acknowledging them is no longer possible) and a transacted session begins a new
     * transaction there.  Listeners keep running.
     */
    void relinked(BrokerLink fresh) throws JMSException {
        synchronized (this) {
            unacked.removeIf(d -> d.link() != fresh);
        }
        List<Object> held = new ArrayList<>();
        dispatchQueue.drainTo(held);
        for (Object o : held) {
            if (!(o instanceof Pending p) || p.link() == fresh) {
                dispatchQueue.add(o);
            }
        }
        for (PymqMessageConsumer c : consumers) {
            c.dropStale(fresh);
        }
        if (mode == SESSION_TRANSACTED && !closed) {
            begin(fresh);
        }
    }

    private static TransactionRolledBackException rolledBack(String why, JMSException cause) {
        TransactionRolledBackException t = new TransactionRolledBackException(why, "transaction");
        if (cause != null) {
            t.setLinkedException(cause);
        }
        return t;
    }

    /** Whether a consumer of this session still has a subscription to {@code d} (closed ones included
     *  until their unacknowledged messages are settled). */
    boolean consumesFrom(Destination d) {
        for (PymqMessageConsumer c : consumers) {
            if (c.destination.equals(d)) {
                return true;
            }
        }
        return false;
    }

    // -- delivery ------------------------------------------------------------------------------------------
    /** The message of a frame, as the application receives it. */
    private Delivery delivery(PymqMessageConsumer consumer, Frame f, BrokerLink link) {
        PymqMessage m = WireFormat.fromFrame(f);
        m.properties.put("JMSXDeliveryCount", m.deliveryCount);   // JMS: an int, 1 on the first delivery
        m.received();
        if (mode == CLIENT_ACKNOWLEDGE) {
            m.acknowledger = this::acknowledge;
        }
        return new Delivery(consumer, f.get("ack", ""), m, link);
    }

    /** A message taken by {@code receive}: acknowledged (or recorded) as the mode says. */
    Message consume(PymqMessageConsumer consumer, Frame f, BrokerLink link) throws JMSException {
        Delivery d = delivery(consumer, f, link);
        consumed(d);
        return d.message();
    }

    private void consumed(Delivery d) throws JMSException {
        if (d.link() != connection.currentLink()) {
            return;     // delivered by a lost link: the broker gives it back, redelivered (spec/ha.md §4.5)
        }
        switch (mode) {
            case AUTO_ACKNOWLEDGE, DUPS_OK_ACKNOWLEDGE -> acknowledgeOn(d.link(), "ACK", List.of(new Header("id", d.ackId())), false);
            case CLIENT_ACKNOWLEDGE -> {
                synchronized (this) {
                    unacked.add(d);
                }
            }
            default -> {
                synchronized (this) {
                    acknowledgeOn(d.link(), "ACK", List.of(new Header("id", d.ackId()), new Header("transaction", tx)), false);
                    unacked.add(d);
                    txWork = true;
                }
            }
        }
    }

    /** A frame for a consumer with a listener (reader thread). */
    void dispatch(PymqMessageConsumer consumer, Frame f, BrokerLink link) {
        dispatchQueue.add(new Pending(consumer, f, link));
    }

    synchronized void startDispatcher() {
        if (dispatcher == null) {
            Thread t = new Thread(this::dispatchLoop, "pymq-session-dispatch");
            t.setDaemon(true);
            dispatcher = t;
            t.start();
        }
    }

    void wakeDispatcher() {
        if (dispatcher != null) {
            synchronized (listenerLock) {
                listenerLock.notifyAll();
            }
        }
    }

    void connectionEnded() {
        dispatchQueue.add(STOP);
    }

    private void dispatchLoop() {
        try {
            while (true) {
                Object item = dispatchQueue.take();
                if (item == STOP || closed) {
                    return;
                }
                Pending p = (Pending) item;
                while (!connection.started()) {
                    if (closed || connection.isClosed()) {
                        return;
                    }
                    connection.awaitStarted(System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(500));
                }
                if (p.consumer().closed || closed) {
                    continue;      // its UNSUBSCRIBE gives the message back
                }
                MessageListener listener = p.consumer().getMessageListenerUnchecked();
                if (listener == null) {
                    continue;
                }
                if (p.link() != connection.currentLink()) {
                    continue;      // from a lost link: the broker redelivers it
                }
                runListener(p.consumer(), listener, p.frame(), p.link());
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private void runListener(PymqMessageConsumer consumer, MessageListener listener, Frame f, BrokerLink link) {
        Delivery d = delivery(consumer, f, link);
        boolean failed = false;
        synchronized (listenerLock) {
            inListener = true;
        }
        synchronized (this) {
            current = d;
            currentGivenBack = false;
        }
        try {
            listener.onMessage(d.message());
        } catch (RuntimeException e) {
            failed = true;
            LOG.log(Level.WARNING, "the message listener of " + consumer + " threw; the message is redelivered", e);
        } finally {
            boolean givenBack;
            synchronized (this) {
                current = null;
                givenBack = currentGivenBack;
            }
            try {
                if (!givenBack && !closed && !connection.isClosed()) {
                    if (failed && (mode == AUTO_ACKNOWLEDGE || mode == DUPS_OK_ACKNOWLEDGE)) {
                        giveBack(List.of(d));
                    } else {
                        consumed(d);
                    }
                }
            } catch (JMSException e) {
                LOG.log(Level.FINE, "acknowledging after a listener", e);
            }
            List<PymqMessageConsumer> toClose;
            synchronized (this) {
                toClose = new ArrayList<>(closeAfterListener);
                closeAfterListener.clear();
            }
            for (PymqMessageConsumer c : toClose) {
                finishClose(c);
            }
            synchronized (listenerLock) {
                inListener = false;
                listenerLock.notifyAll();
            }
        }
    }

    /** Returns once no listener of this session is running (Connection.stop and close). */
    void awaitListenerIdle() {
        if (isDispatcherThread()) {
            return;
        }
        synchronized (listenerLock) {
            while (inListener) {
                try {
                    listenerLock.wait(1000);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return;
                }
            }
        }
    }

    /** NACKs: the broker redelivers these messages (in their original order), counting the delivery. */
    private void giveBack(List<Delivery> deliveries) throws JMSException {
        BrokerLink link = connection.link();
        for (Delivery d : deliveries) {
            if (d.link() == link) {       // one of a lost link is given back by the broker itself
                if (!acknowledgeOn(link, "NACK", List.of(new Header("id", d.ackId())), false)) {
                    return;
                }
            }
        }
    }

    /**
     * Everything consumed and not acknowledged, the message a listener is processing, and what is buffered
     * here: NACKed so the broker redelivers all of it from the oldest (recover, rollback).
     */
    private void giveBackAll() throws JMSException {
        List<Delivery> ids = new ArrayList<>();
        synchronized (this) {
            ids.addAll(unacked);
            unacked.clear();
            if (current != null && !currentGivenBack) {
                ids.add(current);
                currentGivenBack = true;
            }
        }
        if (ids.isEmpty()) {
            return;        // nothing to redeliver: buffered messages keep their order as they are
        }
        List<Object> held = new ArrayList<>();
        dispatchQueue.drainTo(held);
        for (Object o : held) {
            if (o instanceof Pending p) {
                ids.add(new Delivery(p.consumer(), p.frame().get("ack", ""), null, p.link()));
            } else {
                dispatchQueue.add(o);
            }
        }
        for (PymqMessageConsumer c : consumers) {
            ids.addAll(c.drainBuffered());
        }
        giveBack(ids);
    }

    // -- acknowledgement and transactions ------------------------------------------------------------------
    /** CLIENT_ACKNOWLEDGE: acknowledges every message this session consumed, and waits for the broker. */
    void acknowledge() throws JMSException {
        checkOpen();
        if (mode != CLIENT_ACKNOWLEDGE) {
            return;
        }
        List<Delivery> done;
        BrokerLink link = connection.link();
        synchronized (this) {
            done = new ArrayList<>();
            for (Delivery d : unacked) {
                if (d.link() == link) {
                    done.add(d);    // one of a lost link is redelivered: acknowledging it is not possible
                }
            }
            unacked.clear();
        }
        for (int i = 0; i < done.size(); i++) {
            // the last one's receipt confirms every ACK before it
            if (!acknowledgeOn(link, "ACK", List.of(new Header("id", done.get(i).ackId())), i == done.size() - 1)) {
                break;
            }
        }
        endClosedConsumers();
    }

    /**
     * Sends an ACK or NACK on {@code link} (waiting for its receipt when {@code confirm}); false when a
     * failover connection lost that link meanwhile: its deliveries come back redelivered on the next link,
     * so the acknowledgement does nothing (spec/ha.md §4.5), as for a message of a link already lost.
     */
    private boolean acknowledgeOn(BrokerLink link, String command, List<Header> headers, boolean confirm)
            throws JMSException {
        try {
            if (confirm) {
                link.call(command, headers, null);
            } else {
                link.send(command, headers, null);
            }
            return true;
        } catch (JMSException e) {
            if (connection.failover() && PymqConnection.isLoss(e)) {
                return false;
            }
            throw e;
        }
    }

    @Override
    public void commit() throws JMSException {
        checkOpen();
        if (mode != SESSION_TRANSACTED) {
            throw new IllegalStateException("commit() needs a transacted session");
        }
        awaitSends();
        BrokerLink link = connection.link();    // while reconnecting: waits, and the loss is known by then
        boolean lost;
        synchronized (this) {
            lost = rollbackOnly;
        }
        if (lost) {
            rollbackAfterLoss();
            throw rolledBack("the transaction was rolled back: the connection failed over while it was open "
                    + "(spec/ha.md section 4.5)", null);
        }
        String committing = transaction();
        CompletableFuture<Frame> receipt;
        try {
            receipt = link.request("COMMIT", List.of(new Header("transaction", committing)), null);
        } catch (JMSException e) {
            if (connection.failover() && PymqConnection.isLoss(e)) {
                // the COMMIT never left: the broker aborted the transaction with the lost link
                rollbackAfterLoss();
                throw rolledBack("the transaction was rolled back: the connection was lost before COMMIT", e);
            }
            throw e;
        }
        try {
            link.await(receipt, "COMMIT");
        } catch (JMSException e) {
            if (connection.failover() && PymqConnection.isLoss(e)) {
                synchronized (this) {
                    unacked.clear();
                    rollbackOnly = false;       // the next transaction starts clean
                    txWork = false;
                }
                TransactionInDoubtException d = new TransactionInDoubtException("the connection was lost after COMMIT "
                        + "was sent and before its receipt: the transaction was applied whole or not at all, and the "
                        + "outcome is unknown (spec/ha.md section 4.5)", "transaction");
                d.setLinkedException(e);
                throw d;
            }
            if (connection.isClosed() && !(e instanceof TransactionRolledBackException)) {
                // the broker aborts the open transactions of a connection that ends
                TransactionRolledBackException t = new TransactionRolledBackException(
                        "the transaction was rolled back: " + e.getMessage(), e.getErrorCode());
                t.setLinkedException(e);
                throw t;
            }
            throw e;
        }
        synchronized (this) {
            unacked.clear();
        }
        endClosedConsumers();
        begin();
    }

    /** commit() of a transaction lost with its link: what rollback() does, on the link there is now. */
    private void rollbackAfterLoss() throws JMSException {
        BrokerLink link = connection.link();     // waits for the reconnection, which began a new transaction
        link.call("ABORT", List.of(new Header("transaction", tx)), null);
        synchronized (this) {
            rollbackOnly = false;
        }
        giveBackAll();
        endClosedConsumers();
        begin();
    }

    @Override
    public void rollback() throws JMSException {
        checkOpen();
        if (mode != SESSION_TRANSACTED) {
            throw new IllegalStateException("rollback() needs a transacted session");
        }
        awaitSends();
        connection.link().call("ABORT", List.of(new Header("transaction", tx)), null);
        synchronized (this) {
            rollbackOnly = false;
        }
        giveBackAll();
        endClosedConsumers();
        begin();
    }

    @Override
    public void recover() throws JMSException {
        checkOpen();
        if (mode == SESSION_TRANSACTED) {
            throw new IllegalStateException("recover() is for sessions that are not transacted; use rollback()");
        }
        giveBackAll();
        endClosedConsumers();
    }

    @Override
    public boolean getTransacted() throws JMSException {
        checkOpen();
        return mode == SESSION_TRANSACTED;
    }

    @Override
    public int getAcknowledgeMode() throws JMSException {
        checkOpen();
        return mode;
    }

    // -- asynchronous sends --------------------------------------------------------------------------------
    ExecutorService completions() {
        ExecutorService c = completions;
        if (c == null) {
            synchronized (sendLock) {
                if (completions == null) {
                    completions = Executors.newSingleThreadExecutor(r -> {
                        Thread t = new Thread(r, "pymq-send-completion");
                        t.setDaemon(true);
                        return t;
                    });
                }
                c = completions;
            }
        }
        return c;
    }

    void sendStarted() {
        synchronized (sendLock) {
            pendingSends++;
        }
    }

    void sendFinished() {
        synchronized (sendLock) {
            pendingSends--;
            sendLock.notifyAll();
        }
    }

    /** Waits for outstanding asynchronous sends (commit, rollback and close must, JMS 3.1 §7.3.8). */
    private void awaitSends() throws JMSException {
        if (Thread.currentThread().getName().equals("pymq-send-completion")) {
            throw new IllegalStateException("a completion listener must not commit, roll back or close its session");
        }
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(connection.factory().getTimeout() * 2);
        synchronized (sendLock) {
            while (pendingSends > 0) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    throw new JMSException(pendingSends + " asynchronous sends were not confirmed in time");
                }
                try {
                    TimeUnit.NANOSECONDS.timedWait(sendLock, left);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new JMSException("interrupted while waiting for asynchronous sends");
                }
            }
        }
    }

    // -- consumers ----------------------------------------------------------------------------------------
    PymqDestination pymqDestination(Destination d) throws JMSException {
        if (d == null) {
            throw new InvalidDestinationException("the destination must not be null");
        }
        if (d instanceof PymqDestination p) {
            return p;
        }
        if (d instanceof TemporaryQueue || d instanceof TemporaryTopic) {
            throw new InvalidDestinationException("a temporary destination of another provider cannot be used here: " + d);
        }
        if (d instanceof Queue q) {
            return (PymqDestination) createQueue(q.getQueueName());
        }
        if (d instanceof Topic t) {
            return (PymqDestination) createTopic(t.getTopicName());
        }
        throw new InvalidDestinationException("not a queue or topic: " + d);
    }

    private PymqMessageConsumer subscribe(Destination d, String selector, boolean noLocal, String durableName,
                                          List<Header> extra) throws JMSException {
        checkOpen();
        PymqDestination dest = pymqDestination(d);
        connection.checkConsumable(dest);
        if (selector != null && !selector.isBlank()) {
            Selector.check(selector);       // an InvalidSelectorException here, not an ERROR that ends the connection
        }
        PymqMessageConsumer c = new PymqMessageConsumer(this, dest, selector, noLocal, durableName, extra);
        consumers.add(c);
        return c;
    }

    void consumerClosed(PymqMessageConsumer c) {
        synchronized (this) {
            if (isDispatcherThread() && current != null && current.consumer() == c) {
                closeAfterListener.add(c);      // JMS: a listener may close its own consumer; it ends after onMessage
                return;
            }
            boolean holds = unacked.stream().anyMatch(d -> d.consumer() == c);
            if (holds) {
                closing.add(c);                 // its unacknowledged messages still belong to this session
                return;
            }
        }
        finishClose(c);
    }

    private void finishClose(PymqMessageConsumer c) {
        c.unsubscribe();
        consumers.remove(c);
    }

    private void endClosedConsumers() {
        List<PymqMessageConsumer> done;
        synchronized (this) {
            done = new ArrayList<>(closing);
            closing.clear();
        }
        for (PymqMessageConsumer c : done) {
            finishClose(c);
        }
    }

    @Override
    public MessageConsumer createConsumer(Destination destination) throws JMSException {
        return subscribe(destination, null, false, null, List.of());
    }

    @Override
    public MessageConsumer createConsumer(Destination destination, String messageSelector) throws JMSException {
        return subscribe(destination, messageSelector, false, null, List.of());
    }

    @Override
    public MessageConsumer createConsumer(Destination destination, String messageSelector, boolean noLocal)
            throws JMSException {
        return subscribe(destination, messageSelector, noLocal, null, List.of());
    }

    @Override
    public MessageConsumer createSharedConsumer(Topic topic, String sharedSubscriptionName) throws JMSException {
        return createSharedConsumer(topic, sharedSubscriptionName, null);
    }

    @Override
    public MessageConsumer createSharedConsumer(Topic topic, String sharedSubscriptionName, String messageSelector)
            throws JMSException {
        checkSubscriptionName(sharedSubscriptionName);
        return subscribe(topicOnly(topic), messageSelector, false, null,
                List.of(new Header("shared-subscription-name", sharedSubscriptionName)));
    }

    @Override
    public TopicSubscriber createDurableSubscriber(Topic topic, String name) throws JMSException {
        return createDurableSubscriber(topic, name, null, false);
    }

    @Override
    public TopicSubscriber createDurableSubscriber(Topic topic, String name, String messageSelector, boolean noLocal)
            throws JMSException {
        return durable(topic, name, messageSelector, noLocal);
    }

    @Override
    public MessageConsumer createDurableConsumer(Topic topic, String name) throws JMSException {
        return durable(topic, name, null, false);
    }

    @Override
    public MessageConsumer createDurableConsumer(Topic topic, String name, String messageSelector, boolean noLocal)
            throws JMSException {
        return durable(topic, name, messageSelector, noLocal);
    }

    /**
     * An unshared durable subscription, scoped by the client id (or the user name without one).  A name
     * already active elsewhere is an IllegalStateException, checked through the admin interface first.
     */
    private PymqMessageConsumer durable(Topic topic, String name, String selector, boolean noLocal) throws JMSException {
        checkOpen();
        checkSubscriptionName(name);
        Topic t = durableTopic(topicOnly(topic));
        for (PymqSession s : connection.sessions) {
            for (PymqMessageConsumer c : s.consumers) {
                if (name.equals(c.durableName) && !c.closed) {
                    throw new IllegalStateException("durable subscription " + name + " already has an active consumer");
                }
            }
        }
        AdminChannel.JsonValue existing = connection.admin().findSubscription("sub:" + connection.durableOwner() + ":" + name);
        if (existing != null && existing.get("consumers").value instanceof Long n && n > 0) {
            throw new IllegalStateException("durable subscription " + name + " already has an active consumer");
        }
        return subscribe(t, selector, noLocal, name, List.of(new Header("durable-subscription-name", name)));
    }

    @Override
    public MessageConsumer createSharedDurableConsumer(Topic topic, String name) throws JMSException {
        return createSharedDurableConsumer(topic, name, null);
    }

    @Override
    public MessageConsumer createSharedDurableConsumer(Topic topic, String name, String messageSelector)
            throws JMSException {
        checkSubscriptionName(name);
        return subscribe(durableTopic(topicOnly(topic)), messageSelector, false, null,
                List.of(new Header("durable-subscription-name", name), new Header("shared", "true")));
    }

    private Topic topicOnly(Topic topic) throws JMSException {
        if (topic == null) {
            throw new InvalidDestinationException("the topic must not be null");
        }
        return topic;
    }

    /** JMS: a durable subscription to a temporary topic is an InvalidDestinationException (checked here). */
    private static Topic durableTopic(Topic topic) throws JMSException {
        if (topic instanceof jakarta.jms.TemporaryTopic) {
            throw new InvalidDestinationException("a durable subscription cannot be made to a temporary topic (" + topic + ")");
        }
        return topic;
    }

    private static void checkSubscriptionName(String name) throws JMSException {
        if (name == null || name.isEmpty()) {
            throw new jakarta.jms.JMSException("a subscription name must be a non-empty string");
        }
    }

    /**
     * Deletes durable subscription {@code name} (unshared, of this client id or user; else shared).  An
     * unknown name is an InvalidDestinationException and one with an active consumer an
     * IllegalStateException, both checked before the broker is asked.
     */
    @Override
    public void unsubscribe(String name) throws JMSException {
        checkOpen();
        checkSubscriptionName(name);
        for (PymqSession s : connection.sessions) {
            for (PymqMessageConsumer c : s.consumers) {
                if (name.equals(c.durableName)) {
                    throw new IllegalStateException("durable subscription " + name + " still has a consumer here: close it first");
                }
            }
        }
        AdminChannel admin = connection.admin();
        boolean shared = false;
        AdminChannel.JsonValue sub = admin.findSubscription("sub:" + connection.durableOwner() + ":" + name);
        if (sub == null) {
            sub = admin.findSubscription("sub:shared:" + name);
            shared = true;
        }
        if (sub == null) {
            throw new InvalidDestinationException("no durable subscription named " + name);
        }
        if (sub.get("consumers").value instanceof Long n && n > 0) {
            throw new IllegalStateException("durable subscription " + name + " has " + n + " active consumers");
        }
        List<Header> h = new ArrayList<>();
        h.add(new Header("id", connection.nextId("unsub-")));
        h.add(new Header("pymq-durable-name", name));
        if (shared) {
            h.add(new Header("shared", "true"));
        }
        connection.link().call("UNSUBSCRIBE", h, null);
    }

    @Override
    public QueueBrowser createBrowser(Queue queue) throws JMSException {
        return createBrowser(queue, null);
    }

    @Override
    public QueueBrowser createBrowser(Queue queue, String messageSelector) throws JMSException {
        checkOpen();
        PymqDestination dest = pymqDestination(queue);
        if (messageSelector != null && !messageSelector.isBlank()) {
            Selector.check(messageSelector);
        }
        return new PymqQueueBrowser(this, (Queue) dest, messageSelector);
    }

    @Override
    public QueueReceiver createReceiver(Queue queue) throws JMSException {
        return subscribe(queue, null, false, null, List.of());
    }

    @Override
    public QueueReceiver createReceiver(Queue queue, String messageSelector) throws JMSException {
        return subscribe(queue, messageSelector, false, null, List.of());
    }

    @Override
    public TopicSubscriber createSubscriber(Topic topic) throws JMSException {
        return subscribe(topic, null, false, null, List.of());
    }

    @Override
    public TopicSubscriber createSubscriber(Topic topic, String messageSelector, boolean noLocal) throws JMSException {
        return subscribe(topic, messageSelector, noLocal, null, List.of());
    }

    // -- producers ---------------------------------------------------------------------------------------
    @Override
    public MessageProducer createProducer(Destination destination) throws JMSException {
        return newProducer(destination);
    }

    PymqMessageProducer newProducer(Destination destination) throws JMSException {
        checkOpen();
        PymqMessageProducer p = new PymqMessageProducer(this, destination == null ? null : pymqDestination(destination));
        producers.add(p);
        return p;
    }

    @Override
    public QueueSender createSender(Queue queue) throws JMSException {
        return newProducer(queue);
    }

    @Override
    public TopicPublisher createPublisher(Topic topic) throws JMSException {
        return newProducer(topic);
    }

    // -- destinations and messages -----------------------------------------------------------------------
    @Override
    public Queue createQueue(String queueName) throws JMSException {
        checkOpen();
        return new PymqQueue(PymqDestination.checkName(queueName, PymqDestination.QUEUE_PREFIX, "queue"));
    }

    @Override
    public Topic createTopic(String topicName) throws JMSException {
        checkOpen();
        return new PymqTopic(PymqDestination.checkName(topicName, PymqDestination.TOPIC_PREFIX, "topic"));
    }

    @Override
    public TemporaryQueue createTemporaryQueue() throws JMSException {
        checkOpen();
        return connection.createTemporaryQueue();
    }

    @Override
    public TemporaryTopic createTemporaryTopic() throws JMSException {
        checkOpen();
        return connection.createTemporaryTopic();
    }

    @Override
    public BytesMessage createBytesMessage() throws JMSException {
        checkOpen();
        return new PymqBytesMessage();
    }

    @Override
    public MapMessage createMapMessage() throws JMSException {
        checkOpen();
        return new PymqMapMessage();
    }

    @Override
    public Message createMessage() throws JMSException {
        checkOpen();
        return new PymqMessage();
    }

    @Override
    public TextMessage createTextMessage() throws JMSException {
        checkOpen();
        return new PymqTextMessage();
    }

    @Override
    public TextMessage createTextMessage(String text) throws JMSException {
        checkOpen();
        return new PymqTextMessage(text);
    }

    /**
     * Not supported: an ObjectMessage body is Java serialization, which no other pymq client (Python, Go,
     * TypeScript) can read, and deserializing what arrives from a broker is a well-known remote-code
     * hazard.  Send a MapMessage, a TextMessage with JSON, or a BytesMessage.
     */
    @Override
    public ObjectMessage createObjectMessage() throws JMSException {
        throw unsupportedObjectMessage();
    }

    @Override
    public ObjectMessage createObjectMessage(Serializable object) throws JMSException {
        throw unsupportedObjectMessage();
    }

    static JMSException unsupportedObjectMessage() {
        return new JMSException("pymq does not support ObjectMessage: Java serialization cannot be read by the other "
                + "pymq clients and is unsafe to deserialize; use a MapMessage, TextMessage or BytesMessage");
    }

    /**
     * Not supported: spec/stomp.md §7 defines no wire form for a StreamMessage that the other clients read.
     * A MapMessage or BytesMessage carries the same values.
     */
    @Override
    public StreamMessage createStreamMessage() throws JMSException {
        throw unsupportedStreamMessage();
    }

    static JMSException unsupportedStreamMessage() {
        return new JMSException("pymq does not support StreamMessage (no wire form in spec/stomp.md §7); use a "
                + "MapMessage or BytesMessage");
    }

    /** The optional application-server facility (JMS 3.1 §9): not supported. */
    @Override
    public MessageListener getMessageListener() throws JMSException {
        checkOpen();
        return null;
    }

    @Override
    public void setMessageListener(MessageListener listener) throws JMSException {
        throw new JMSException("Session.setMessageListener (the application-server facility) is not supported by pymq; "
                + "set a listener on a MessageConsumer");
    }

    @Override
    public void run() {
        throw new UnsupportedOperationException("Session.run (the application-server facility) is not supported by pymq");
    }

    // -- close ------------------------------------------------------------------------------------------
    /**
     * Closes the session: waits for asynchronous sends and for a running listener, rolls back an open
     * transaction, ends every subscription (the broker redelivers what was not acknowledged).  A listener
     * cannot close its own session (IllegalStateException, JMS 3.1 §6.2.16).
     */
    @Override
    public void close() throws JMSException {
        if (closed) {
            return;
        }
        if (isDispatcherThread()) {
            throw new IllegalStateException("a message listener must not close its own session");
        }
        try {
            awaitSends();
        } catch (JMSException e) {
            LOG.log(Level.FINE, "closing with asynchronous sends outstanding", e);
        }
        closed = true;
        dispatchQueue.add(STOP);
        awaitListenerIdle();
        if (mode == SESSION_TRANSACTED && !connection.isClosed()) {
            try {
                connection.link().call("ABORT", List.of(new Header("transaction", tx)), null);
            } catch (JMSException e) {
                LOG.log(Level.FINE, "rolling back on close", e);
            }
        }
        for (PymqMessageConsumer c : consumers) {
            c.closed = true;
            c.wake();
            c.unsubscribe();
        }
        consumers.clear();
        synchronized (this) {
            closing.clear();
            unacked.clear();
        }
        for (PymqMessageProducer p : producers) {
            p.closeLocal();
        }
        ExecutorService c = completions;
        if (c != null) {
            c.shutdown();
        }
        connection.sessions.remove(this);
    }
}
