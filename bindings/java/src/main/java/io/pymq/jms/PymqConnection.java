package io.pymq.jms;

import io.pymq.stomp.Frame;
import io.pymq.stomp.Header;
import jakarta.jms.ConnectionConsumer;
import jakarta.jms.ConnectionMetaData;
import jakarta.jms.Destination;
import jakarta.jms.ExceptionListener;
import jakarta.jms.IllegalStateException;
import jakarta.jms.JMSException;
import jakarta.jms.Queue;
import jakarta.jms.QueueConnection;
import jakarta.jms.QueueSession;
import jakarta.jms.ServerSessionPool;
import jakarta.jms.Session;
import jakarta.jms.Topic;
import jakarta.jms.TopicConnection;
import jakarta.jms.TopicSession;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * A JMS Connection: one STOMP 1.2 connection ({@link BrokerLink}) shared by its sessions.  Thread-safe.
 *
 * <p>It connects (and authenticates) when created, stopped: messages are delivered once {@link #start()}
 * is called.  {@link #setClientID} is allowed before anything else is done with the connection; since the
 * client id travels in CONNECT, the provider then reconnects with it (nothing has happened on the first
 * connection yet).  Every failure of the STOMP connection, including any ERROR the broker answers (pymq
 * closes a connection after every ERROR, spec/stomp.md §6), is final: the exception listener hears it,
 * blocked receives return null, later calls throw.  The usual mistakes (a selector that does not parse, a
 * bad destination name, a durable subscription in use or unknown) are checked before anything is sent, so
 * they throw without ending the connection.
 */
public class PymqConnection implements QueueConnection, TopicConnection {
    private static final Logger LOG = Logger.getLogger(PymqConnection.class.getName());

    /** What receives the MESSAGE frames of one subscription id. */
    interface Subscriber {
        void deliver(Frame frame);

        /** The connection ended: wake whoever waits. */
        void wake();
    }

    private final PymqConnectionFactory factory;
    private final String user;
    private final String password;
    private volatile BrokerLink link;
    private final Object linkLock = new Object();
    private BrokerLink endHandled;            // the link whose end was handled (guarded by linkLock)
    private volatile String clientId;
    private volatile boolean clientIdFixed;   // set by the factory, or by setClientID, or the connection was used
    private final Object startLock = new Object();
    private volatile boolean started;
    private volatile boolean closed;
    private volatile boolean closing;
    private volatile ExceptionListener exceptionListener;
    final List<PymqSession> sessions = new CopyOnWriteArrayList<>();
    private final Map<String, Subscriber> subscribers = new ConcurrentHashMap<>();
    private final AtomicLong ids = new AtomicLong();
    private final Set<Destination> temporaries = ConcurrentHashMap.newKeySet();
    private volatile AdminChannel admin;

    PymqConnection(PymqConnectionFactory factory, String user, String password) throws JMSException {
        this.factory = factory;
        this.user = user;
        this.password = password;
        this.clientId = factory.getClientID();
        this.clientIdFixed = clientId != null;
        this.link = open(clientId);
    }

    private BrokerLink open(String withClientId) throws JMSException {
        List<Header> headers = new ArrayList<>();
        headers.add(new Header("accept-version", "1.2"));
        headers.add(new Header("host", "/"));
        if (user != null) {
            headers.add(new Header("login", user));
        }
        if (password != null) {
            headers.add(new Header("passcode", password));
        }
        if (withClientId != null) {
            headers.add(new Header("client-id", withClientId));
        }
        return BrokerLink.open(factory.endpoint(), factory.sslSocketFactory(), headers, factory.heartBeat(),
                factory.getTimeout(), new BrokerLink.Listener() {
                    @Override
                    public void message(Frame frame) {
                        Subscriber s = subscribers.get(frame.get("subscription", ""));
                        if (s != null) {
                            s.deliver(frame);
                        }
                    }

                    @Override
                    public void ended(BrokerLink ended, JMSException cause, boolean expected) {
                        linkEnded(ended, cause, expected);
                    }
                });
    }

    // -- package view ---------------------------------------------------------------------------------
    PymqConnectionFactory factory() {
        return factory;
    }

    BrokerLink link() throws JMSException {
        checkOpen();
        return link;
    }

    String nextId(String prefix) {
        return prefix + ids.incrementAndGet();
    }

    void register(String subId, Subscriber s) {
        subscribers.put(subId, s);
    }

    void unregister(String subId) {
        subscribers.remove(subId);
    }

    /** Marks the connection used: the client id can no longer be set (JMS 3.1 §6.1.2). */
    void used() {
        clientIdFixed = true;
    }

    void checkOpen() throws JMSException {
        if (closed || closing) {
            throw new IllegalStateException("the connection is closed");
        }
        JMSException failure = link.failure();
        if (failure != null) {
            throw failure;
        }
    }

    boolean isClosed() {
        return closed || closing || link.failed();
    }

    /** Waits while the connection is stopped; false if {@code deadlineNanos} passed first (0: no deadline). */
    boolean awaitStarted(long deadlineNanos) throws InterruptedException {
        synchronized (startLock) {
            while (!started && !isClosed()) {
                if (deadlineNanos == 0) {
                    startLock.wait(1000);
                } else {
                    long left = deadlineNanos - System.nanoTime();
                    if (left <= 0) {
                        return false;
                    }
                    TimeUnit.NANOSECONDS.timedWait(startLock, left);
                }
            }
            return true;
        }
    }

    boolean started() {
        return started;
    }

    /** The name durable subscriptions are scoped by: the client id, else the user name (spec/stomp.md §4). */
    String durableOwner() {
        String id = clientId;
        if (id != null) {
            return id;
        }
        String name = link.userName;
        return name != null ? name : (user != null ? user : "guest");
    }

    AdminChannel admin() throws JMSException {
        AdminChannel a = admin;
        if (a == null) {
            synchronized (this) {
                if (admin == null) {
                    admin = new AdminChannel(this);
                }
                a = admin;
            }
        }
        return a;
    }

    /**
     * A link ended.  Only the connection's current link speaks for it: the link setClientID replaced ends
     * on its own reader thread, possibly after the new link is in use (a TLS close makes that window
     * wide), and must not wake what waits on the new one (issue 28.5).
     */
    private void linkEnded(BrokerLink ended, JMSException cause, boolean expected) {
        synchronized (linkLock) {
            if (ended != link || ended == endHandled) {
                return;
            }
            endHandled = ended;
        }
        for (Subscriber s : subscribers.values()) {
            s.wake();
        }
        for (PymqSession s : sessions) {
            s.connectionEnded();
        }
        synchronized (startLock) {
            startLock.notifyAll();
        }
        ExceptionListener l = exceptionListener;
        if (!expected && !closing && !closed && l != null) {
            // on a thread of its own: the listener may close this connection, or take its time
            Thread t = new Thread(() -> {
                try {
                    l.onException(cause);
                } catch (RuntimeException e) {
                    LOG.log(Level.WARNING, "the exception listener failed", e);
                }
            }, "pymq-exception-listener");
            t.setDaemon(true);
            t.start();
        }
    }

    // -- temporary destinations -----------------------------------------------------------------------------
    PymqTemporaryQueue createTemporaryQueue() throws JMSException {
        checkOpen();
        used();
        PymqTemporaryQueue q = new PymqTemporaryQueue(java.util.UUID.randomUUID().toString().replace("-", ""), this);
        temporaries.add(q);
        return q;
    }

    PymqTemporaryTopic createTemporaryTopic() throws JMSException {
        checkOpen();
        used();
        PymqTemporaryTopic t = new PymqTemporaryTopic("pymq-tmp." + java.util.UUID.randomUUID().toString().replace("-", ""),
                this);
        temporaries.add(t);
        return t;
    }

    void deleteTemporary(Destination d) throws JMSException {
        checkOpen();
        for (PymqSession s : sessions) {
            if (s.consumesFrom(d)) {
                throw new IllegalStateException(d + " still has a consumer: close it before deleting the destination");
            }
        }
        temporaries.remove(d);
    }

    /** Checks that this connection may consume from {@code d} (its own, live temporary destinations only). */
    void checkConsumable(Destination d) throws JMSException {
        if (d instanceof PymqTemporaryQueue q) {
            if (q.owner() != this) {
                throw new jakarta.jms.InvalidDestinationException("only the connection that created " + q
                        + " can consume from it");
            }
            if (q.deleted()) {
                throw new jakarta.jms.InvalidDestinationException(q + " was deleted");
            }
        } else if (d instanceof PymqTemporaryTopic t) {
            if (t.owner() != this) {
                throw new jakarta.jms.InvalidDestinationException("only the connection that created " + t
                        + " can consume from it");
            }
            if (t.deleted()) {
                throw new jakarta.jms.InvalidDestinationException(t + " was deleted");
            }
        }
    }

    // -- Connection -----------------------------------------------------------------------------------------
    @Override
    public Session createSession(boolean transacted, int acknowledgeMode) throws JMSException {
        return createSession(transacted ? Session.SESSION_TRANSACTED : acknowledgeMode);
    }

    @Override
    public Session createSession(int sessionMode) throws JMSException {
        return newSession(sessionMode);
    }

    @Override
    public Session createSession() throws JMSException {
        return newSession(Session.AUTO_ACKNOWLEDGE);
    }

    PymqSession newSession(int mode) throws JMSException {
        checkOpen();
        used();
        if (mode < Session.SESSION_TRANSACTED || mode > Session.DUPS_OK_ACKNOWLEDGE) {
            throw new JMSException("unknown session mode " + mode + "; expected SESSION_TRANSACTED (0), AUTO_ACKNOWLEDGE "
                    + "(1), CLIENT_ACKNOWLEDGE (2) or DUPS_OK_ACKNOWLEDGE (3)");
        }
        PymqSession s = new PymqSession(this, mode);
        sessions.add(s);
        return s;
    }

    @Override
    public QueueSession createQueueSession(boolean transacted, int acknowledgeMode) throws JMSException {
        return newSession(transacted ? Session.SESSION_TRANSACTED : acknowledgeMode);
    }

    @Override
    public TopicSession createTopicSession(boolean transacted, int acknowledgeMode) throws JMSException {
        return newSession(transacted ? Session.SESSION_TRANSACTED : acknowledgeMode);
    }

    @Override
    public String getClientID() throws JMSException {
        checkOpen();
        return clientId;
    }

    /**
     * Sets the client id before the connection is used (JMS 3.1 §6.1.2).  The client id travels in
     * CONNECT, so this reconnects with it; a client id another connection holds is an
     * InvalidClientIDException.
     */
    @Override
    public synchronized void setClientID(String id) throws JMSException {
        checkOpen();
        if (clientIdFixed) {
            throw new IllegalStateException(clientId != null
                    ? "the client id is already set (" + clientId + ")"
                    : "the client id must be set before the connection is used");
        }
        if (id == null || id.isEmpty()) {
            throw new jakarta.jms.InvalidClientIDException("a client id must be a non-empty string");
        }
        BrokerLink fresh = open(id);
        BrokerLink old;
        synchronized (linkLock) {
            old = link;
            link = fresh;
        }
        old.close();             // its end is no longer the connection's: linkEnded ignores it
        clientId = id;
        clientIdFixed = true;
        JMSException lost = fresh.failure();
        if (lost != null) {      // the new link ended before it was current: its end was ignored then
            linkEnded(fresh, lost, false);
        }
    }

    @Override
    public ConnectionMetaData getMetaData() throws JMSException {
        checkOpen();
        return new PymqMetaData(link.server);
    }

    @Override
    public ExceptionListener getExceptionListener() throws JMSException {
        checkOpen();
        return exceptionListener;
    }

    @Override
    public void setExceptionListener(ExceptionListener listener) throws JMSException {
        checkOpen();
        used();
        this.exceptionListener = listener;
    }

    @Override
    public void start() throws JMSException {
        checkOpen();
        used();
        synchronized (startLock) {
            started = true;
            startLock.notifyAll();
        }
        for (PymqSession s : sessions) {
            s.wakeDispatcher();
        }
    }

    /**
     * Pauses delivery; returns once no message listener of this connection is running (JMS 3.1 §6.1.5).
     * A listener cannot stop its own connection (IllegalStateException).
     */
    @Override
    public void stop() throws JMSException {
        checkOpen();
        used();
        refuseFromListener("stop");
        synchronized (startLock) {
            started = false;
        }
        for (PymqSession s : sessions) {
            s.awaitListenerIdle();
        }
    }

    private void refuseFromListener(String what) throws IllegalStateException {
        for (PymqSession s : sessions) {
            if (s.isDispatcherThread()) {
                throw new IllegalStateException("a message listener must not " + what + " its own connection");
            }
        }
    }

    /**
     * Closes every session (rolling back open transactions; unacknowledged messages go back to the broker
     * for redelivery), waits for running listeners, sends DISCONNECT and waits for its receipt.
     */
    @Override
    public void close() throws JMSException {
        if (closed) {
            return;
        }
        refuseFromListener("close");
        closing = true;
        try {
            for (PymqSession s : sessions) {
                try {
                    s.close();
                } catch (JMSException e) {
                    LOG.log(Level.FINE, "closing a session of a closing connection", e);
                }
            }
            link.close();
        } finally {
            closed = true;
            closing = false;
            synchronized (startLock) {
                startLock.notifyAll();
            }
        }
    }

    @Override
    public ConnectionConsumer createConnectionConsumer(Destination destination, String messageSelector,
                                                       ServerSessionPool sessionPool, int maxMessages) throws JMSException {
        throw unsupportedConnectionConsumer();
    }

    @Override
    public ConnectionConsumer createSharedConnectionConsumer(Topic topic, String subscriptionName, String messageSelector,
                                                             ServerSessionPool sessionPool, int maxMessages) throws JMSException {
        throw unsupportedConnectionConsumer();
    }

    @Override
    public ConnectionConsumer createDurableConnectionConsumer(Topic topic, String subscriptionName, String messageSelector,
                                                              ServerSessionPool sessionPool, int maxMessages) throws JMSException {
        throw unsupportedConnectionConsumer();
    }

    @Override
    public ConnectionConsumer createSharedDurableConnectionConsumer(Topic topic, String subscriptionName,
                                                                    String messageSelector, ServerSessionPool sessionPool,
                                                                    int maxMessages) throws JMSException {
        throw unsupportedConnectionConsumer();
    }

    @Override
    public ConnectionConsumer createConnectionConsumer(Queue queue, String messageSelector, ServerSessionPool sessionPool,
                                                       int maxMessages) throws JMSException {
        throw unsupportedConnectionConsumer();
    }

    @Override
    public ConnectionConsumer createConnectionConsumer(Topic topic, String messageSelector, ServerSessionPool sessionPool,
                                                       int maxMessages) throws JMSException {
        throw unsupportedConnectionConsumer();
    }

    private static JMSException unsupportedConnectionConsumer() {
        return new JMSException("connection consumers (the optional application-server facility of JMS 3.1 §9) are "
                + "not supported by pymq; use a MessageConsumer with a MessageListener");
    }

    @Override
    public String toString() {
        return "PymqConnection[" + factory.getBrokerURL() + ", session=" + link.session + "]";
    }
}
