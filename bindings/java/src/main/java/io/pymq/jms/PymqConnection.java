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
import java.util.concurrent.CompletableFuture;
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
        /** A MESSAGE frame of {@code link} (its reader thread; must not block). */
        void deliver(Frame frame, BrokerLink link);

        /** The connection ended for good: wake whoever waits. */
        void wake();

        /** The SUBSCRIBE headers to make this subscription again after a failover, or null for none. */
        default List<Header> resubscribe() {
            return null;
        }

        /** The link was lost and a failover connection is reconnecting (what waits on it will not come). */
        default void linkLost() {
        }
    }

    /** Where a failover connection is (spec/ha.md §4.3). */
    enum Status { OPEN, RECONNECTING, CLOSED }

    private final PymqConnectionFactory factory;
    private final String user;
    private final String password;
    private final boolean explicitCredentials;     // given to createConnection: they win over the URLs' own
    private final List<PymqConnectionFactory.Member> brokers;
    private final boolean failover;
    private final BrokerGroup.Options failoverOptions;
    private int brokerIndex;                        // the broker of the current link (guarded by linkLock)
    private volatile Status status = Status.OPEN;
    private volatile JMSException finalFailure;    // why a connection ended for good
    private final Object statusLock = new Object();
    private volatile Thread reconnector;
    private final List<TransportListener> transportListeners = new CopyOnWriteArrayList<>();
    private final java.util.concurrent.ExecutorService events;
    private final java.util.Random random = new java.util.Random();
    // SENDs not yet receipted (failover only): re-sent in order on the next link, with their dedup ids
    private final String connectionId = java.util.UUID.randomUUID().toString().replace("-", "").substring(0, 16);
    private final AtomicLong sendNumbers = new AtomicLong();
    private final Object sendLock = new Object();
    private final java.util.ArrayDeque<PendingSend> window = new java.util.ArrayDeque<>();
    /** At most this many SENDs wait for their receipt; a send blocks while the window is full. */
    static final int SEND_WINDOW = 1000;
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
    /** The last CONNECTED's re-claim token (spec/ha.md section 4.7), offered by a reconnection; never logged. */
    private volatile String reclaimToken;
    private volatile AdminChannel admin;

    PymqConnection(PymqConnectionFactory factory, String user, String password, boolean explicitCredentials)
            throws JMSException {
        this.factory = factory;
        this.user = user;
        this.password = password;
        this.explicitCredentials = explicitCredentials;
        this.brokers = factory.brokers();
        this.failover = factory.failover();
        this.failoverOptions = factory.failoverOptions();
        this.clientId = factory.getClientID();
        this.clientIdFixed = clientId != null;
        TransportListener l = factory.transportListener();
        if (l != null) {
            transportListeners.add(l);
        }
        this.events = failover ? java.util.concurrent.Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, "pymq-transport-events");
            t.setDaemon(true);
            return t;
        }) : null;
        this.link = failover ? connectFirst(clientId) : open(clientId, 0);
    }

    /**
     * The first connect of a failover connection: the brokers in order (or shuffled), (1 +
     * startupMaxReconnectAttempts) passes (-1: until one answers), with the back-off between attempts.  A
     * broker that refuses the login is final.
     */
    private BrokerLink connectFirst(String withClientId) throws JMSException {
        BrokerGroup.Options o = failoverOptions;
        long passes = o.startupMaxReconnectAttempts() < 0 ? Long.MAX_VALUE : 1L + o.startupMaxReconnectAttempts();
        JMSException last = null;
        int attempt = 0;
        for (long pass = 0; pass < passes; pass++) {
            for (int i : order(-1)) {
                attempt++;
                sleep(o.jitteredDelayBefore(attempt, random));
                try {
                    BrokerLink l = open(withClientId, i);
                    brokerIndex = i;
                    return l;
                } catch (JMSException e) {
                    if (!"connect-failed".equals(e.getErrorCode())) {
                        throw e;         // the broker answered and refused: trying again changes nothing
                    }
                    last = e;
                }
            }
        }
        throw last;
    }

    /** The brokers to try, starting after {@code lost} (-1: from the first), shuffled when asked. */
    private List<Integer> order(int lost) {
        List<Integer> out = new ArrayList<>();
        for (int k = 1; k <= brokers.size(); k++) {
            out.add((lost + k) % brokers.size());
        }
        if (failoverOptions.randomize()) {
            java.util.Collections.shuffle(out, random);
        }
        return out;
    }

    private static void sleep(long ms) throws JMSException {
        if (ms <= 0) {
            return;
        }
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new JMSException("interrupted while reconnecting");
        }
    }

    private BrokerLink open(String withClientId, int broker) throws JMSException {
        return open(withClientId, broker, false);
    }

    /**
     * Opens a link to broker {@code broker}; a reconnection ({@code reclaim}) offers the lost link's re-claim
     * token, never a link opened beside a live one (setClientID's), which would make the broker end that one.
     */
    private BrokerLink open(String withClientId, int broker, boolean reclaim) throws JMSException {
        PymqConnectionFactory.Member m = brokers.get(broker);
        String login = user;
        String passcode = password;
        if (!explicitCredentials && m.user() != null) {
            login = m.user();
            passcode = m.password();
        }
        List<Header> headers = new ArrayList<>();
        headers.add(new Header("accept-version", "1.2"));
        String vhost = factory.vhostAt(m);
        headers.add(new Header("host", vhost == null ? "/" : "/" + vhost));    // spec/stomp.md section 1
        if (login != null) {
            headers.add(new Header("login", login));
        }
        if (passcode != null) {
            headers.add(new Header("passcode", passcode));
        }
        if (withClientId != null) {
            headers.add(new Header("client-id", withClientId));
        }
        String token = reclaimToken;
        if (reclaim && failover && token != null) {
            // the temporaries of the lost link keep their global names (spec/ha.md section 4.7)
            headers.add(new Header("pymq-reclaim", token));
        }
        // a group's attempts end after connectionTimeout (spec/ha.md section 4.2); a single broker has the timeout
        long connectMs = failover ? failoverOptions.attemptTimeout(factory.getTimeout()) : factory.getTimeout();
        BrokerLink opened = BrokerLink.open(m.endpoint(), factory.sslSocketFactory(), headers, factory.heartBeat(),
                factory.getTimeout(), connectMs, new BrokerLink.Listener() {
                    @Override
                    public void message(BrokerLink from, Frame frame) {
                        Subscriber s = subscribers.get(frame.get("subscription", ""));
                        if (s != null) {
                            s.deliver(frame, from);
                        }
                    }

                    @Override
                    public void ended(BrokerLink ended, JMSException cause, boolean expected) {
                        linkEnded(ended, cause, expected);
                    }
                });
        reclaimToken = opened.reclaimToken;
        return opened;
    }

    // -- package view ---------------------------------------------------------------------------------
    /** Tests only: the re-claim token the next reconnection offers (a test forges one). */
    String reclaimTokenForTests() {
        return reclaimToken;
    }

    void reclaimTokenForTests(String token) {
        reclaimToken = token;
    }

    PymqConnectionFactory factory() {
        return factory;
    }

    /** The current link; while a failover connection reconnects, waits for the next one (its timeout). */
    BrokerLink link() throws JMSException {
        checkOpen();
        if (status == Status.RECONNECTING) {
            awaitOpen();
        }
        return link;
    }

    /** The current link without waiting (deliveries compare theirs with it). */
    BrokerLink currentLink() {
        return link;
    }

    boolean failover() {
        return failover;
    }

    Status status() {
        return status;
    }

    /** Waits while reconnecting: until open, the end, or the failover timeout (-1: until attempts are spent). */
    private void awaitOpen() throws JMSException {
        int timeout = failoverOptions.timeout();
        long deadline = timeout < 0 ? Long.MAX_VALUE : System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeout);
        synchronized (statusLock) {
            while (status == Status.RECONNECTING && !closed && !closing) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    throw new JMSException("still reconnecting after " + timeout + " ms (the failover timeout)", "timeout");
                }
                try {
                    TimeUnit.NANOSECONDS.timedWait(statusLock, Math.min(left, TimeUnit.SECONDS.toNanos(1)));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new JMSException("interrupted while waiting for the connection to come back");
                }
            }
        }
        checkOpen();
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
        JMSException end = finalFailure;
        if (end != null) {
            JMSException e = new JMSException("the connection failed: " + end.getMessage(), end.getErrorCode());
            e.setLinkedException(end);
            throw e;
        }
        if (status == Status.RECONNECTING) {
            return;                  // calls wait for the next link (link())
        }
        JMSException failure = link.failure();
        if (failure != null && !failover) {
            throw failure;
        }
    }

    /** Closed, or failed for good (a failover connection that is reconnecting is not closed). */
    boolean isClosed() {
        return closed || closing || status == Status.CLOSED || (!failover && link.failed());
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
     * wide), and must not wake what waits on the new one (issue 28.5).  A failover connection that lost its
     * link (not by close, not by an ERROR of the broker's) reconnects; anything else ends it for good.
     */
    private void linkEnded(BrokerLink ended, JMSException cause, boolean expected) {
        boolean reconnect;
        synchronized (linkLock) {
            if (ended != link || ended == endHandled) {
                return;
            }
            endHandled = ended;
            reconnect = failover && !expected && !closing && !closed && isLoss(cause)
                    && failoverOptions.maxReconnectAttempts() != 0;
            if (reconnect) {
                setStatus(Status.RECONNECTING);
            }
        }
        if (reconnect) {
            lost(ended);
        } else {
            ends(cause, expected);
        }
    }

    /**
     * A refusal that passes: the broker still holds this connection's client id (or a durable subscription)
     * for the link it has not yet seen die (a half-open TCP connection ends at its heart-beat deadline), so a
     * reconnection tries again later instead of ending.
     */
    static boolean stillHeld(JMSException e) {
        return "illegal-state".equals(e.getErrorCode());
    }

    /** Whether {@code e} says the link was lost (socket, end of stream, heart-beats), not refused by the broker. */
    static boolean isLoss(Throwable e) {
        if (e instanceof java.util.concurrent.CompletionException && e.getCause() != null) {
            e = e.getCause();
        }
        return e instanceof JMSException j && !(j instanceof jakarta.jms.IllegalStateException)
                && ("connection-closed".equals(j.getErrorCode()) || "heartbeat-timeout".equals(j.getErrorCode())
                || "connect-failed".equals(j.getErrorCode()));
    }

    private void setStatus(Status s) {
        synchronized (statusLock) {
            status = s;
            statusLock.notifyAll();
        }
    }

    /** The connection ends for good: everything waiting wakes, the exception listener hears why. */
    private void ends(JMSException cause, boolean expected) {
        if (!expected && finalFailure == null) {
            finalFailure = cause;
        }
        setStatus(Status.CLOSED);
        synchronized (sendLock) {
            for (PendingSend p : window) {
                p.done.completeExceptionally(cause);
            }
            window.clear();
            sendLock.notifyAll();
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
        if (events != null) {
            events.shutdown();
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

    // -- failover (spec/ha.md §4.3-4.5) ----------------------------------------------------------------------
    private void event(boolean resumed) {
        tell(l -> {
            if (resumed) {
                l.transportResumed();
            } else {
                l.transportInterrupted();
            }
        });
    }

    /** The transport listeners hear that {@code renamed} have new global names (before {@code resumed}). */
    private void renamed(Set<Destination> renamed, String why) {
        tell(l -> l.temporariesRenamed(renamed, why));
    }

    /** Every transport listener hears {@code what}, in order, on the events thread (one failing is logged). */
    private void tell(java.util.function.Consumer<TransportListener> what) {
        java.util.concurrent.ExecutorService e = events;
        if (e == null || transportListeners.isEmpty()) {
            return;
        }
        try {
            e.execute(() -> {
                for (TransportListener l : transportListeners) {
                    try {
                        what.accept(l);
                    } catch (RuntimeException x) {
                        LOG.log(Level.WARNING, "a transport listener failed", x);
                    }
                }
            });
        } catch (java.util.concurrent.RejectedExecutionException ignored) {
            // the connection ended meanwhile
        }
    }

    /** The link was lost: sessions and subscribers hear it, a thread reconnects. */
    private void lost(BrokerLink ended) {
        event(false);
        for (PymqSession s : sessions) {
            s.linkLost();
        }
        for (Subscriber s : subscribers.values()) {
            s.linkLost();
        }
        Thread t = new Thread(() -> reconnect(ended), "pymq-reconnect");
        t.setDaemon(true);
        reconnector = t;
        t.start();
    }

    /**
     * Tries the brokers after the lost one, with the back-off of spec/ha.md §4.2, until one takes the
     * connection back (then {@link #restore}) or the attempts are spent (then the connection ends).
     */
    private void reconnect(BrokerLink ended) {
        BrokerGroup.Options o = failoverOptions;
        long max = o.maxReconnectAttempts() < 0 ? Long.MAX_VALUE : o.maxReconnectAttempts();
        JMSException last = ended.failure();
        int lostIndex;
        synchronized (linkLock) {
            lostIndex = brokerIndex;
        }
        long attempt = 0;
        while (attempt < max) {
            for (int i : order(lostIndex)) {
                if (attempt >= max || closed || closing) {
                    break;
                }
                attempt++;
                try {
                    sleep(o.jitteredDelayBefore((int) Math.min(attempt, Integer.MAX_VALUE), random));
                } catch (JMSException e) {
                    return;
                }
                if (closed || closing) {
                    return;
                }
                BrokerLink fresh;
                try {
                    fresh = open(clientId, i, true);
                } catch (JMSException e) {
                    last = e;
                    if (!"connect-failed".equals(e.getErrorCode()) && !stillHeld(e)) {
                        ends(e, false);     // the broker answered and refused (a login): final
                        return;
                    }
                    continue;
                }
                try {
                    synchronized (linkLock) {
                        link = fresh;
                        brokerIndex = i;
                    }
                    restore(fresh);
                    return;
                } catch (JMSException e) {
                    last = e;
                    if (!isLoss(e) && !fresh.failed()) {
                        fresh.close();
                        ends(e, false);
                        return;
                    }
                    lostIndex = i;       // lost again while restoring: go on with the next broker
                }
            }
        }
        if (!closed && !closing) {
            JMSException spent = new JMSException("every reconnection attempt failed (" + attempt + " attempts); last: "
                    + (last == null ? "?" : last.getMessage()), "connection-closed");
            if (last != null) {
                spent.setLinkedException(last);
            }
            ends(spent, false);
        }
    }

    /**
     * Makes the connection whole on {@code fresh} before any call uses it: sessions begin their
     * transactions again and forget deliveries of the old link, every subscription is made again with
     * its id and headers, the unreceipted SENDs go again in order with their dedup ids; then the status is
     * open and the transport listeners hear {@code resumed}.
     */
    private void restore(BrokerLink fresh) throws JMSException {
        for (PymqSession s : sessions) {
            s.relinked(fresh);
        }
        List<Map.Entry<String, Subscriber>> subs = new ArrayList<>(subscribers.entrySet());
        subs.sort(java.util.Comparator.comparingLong(e -> idNumber(e.getKey())));
        for (Map.Entry<String, Subscriber> e : subs) {
            List<Header> h = e.getValue().resubscribe();
            if (h != null) {
                fresh.call("SUBSCRIBE", h, null);
            }
        }
        synchronized (sendLock) {
            for (PendingSend p : window) {
                transmit(p, fresh);
            }
        }
        if (fresh.failed()) {
            throw fresh.failure();
        }
        synchronized (linkLock) {
            if (link == fresh) {
                setStatus(Status.OPEN);
            }
        }
        for (PymqSession s : sessions) {
            s.wakeDispatcher();
        }
        if (!"true".equals(fresh.reclaimed) && !temporaries.isEmpty()) {
            String why = fresh.reclaimRefused != null ? fresh.reclaimRefused
                    : "no re-claim was offered or answered (a broker with temporary_reclaim_ms: 0 gives no token)";
            renamed(Set.copyOf(temporaries), why);
        }
        event(true);
        // lost again between the SUBSCRIBEs and now: its end was ignored while reconnecting
        JMSException again = fresh.failure();
        if (again != null) {
            linkEnded(fresh, again, false);
        }
    }

    private static long idNumber(String id) {
        int i = id.length();
        while (i > 0 && Character.isDigit(id.charAt(i - 1))) {
            i--;
        }
        return i < id.length() ? Long.parseLong(id.substring(i)) : 0;
    }

    /** A SEND of a failover connection waiting for its receipt. */
    static final class PendingSend {
        final List<Header> headers;
        final byte[] body;
        final CompletableFuture<Frame> done = new CompletableFuture<>();
        volatile long sentAt;

        PendingSend(List<Header> headers, byte[] body) {
            this.headers = headers;
            this.body = body;
        }
    }

    /**
     * A SEND through the window of a failover connection (spec/ha.md §4.4): it carries a
     * {@code pymq-dedup-id} (unless the application gave one) and asks for a receipt; the future completes
     * with the RECEIPT, across reconnections (the SEND goes again on the next link with the same id, and the
     * broker drops a copy it already has).  Blocks while the window is full.
     */
    CompletableFuture<Frame> sendReliably(List<Header> headers, byte[] body) throws JMSException {
        List<Header> h = new ArrayList<>(headers);
        boolean hasId = false;
        for (Header x : h) {
            if (x.name().equals("pymq-dedup-id") || x.name().equals("_AMQ_DUPL_ID")) {
                hasId = true;
            }
        }
        if (!hasId) {
            h.add(new Header("pymq-dedup-id", connectionId + ":" + sendNumbers.incrementAndGet()));
        }
        PendingSend p = new PendingSend(List.copyOf(h), body);
        link();             // waits while reconnecting
        synchronized (sendLock) {
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(factory.getTimeout());
            while (window.size() >= SEND_WINDOW) {
                checkOpen();
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    throw new jakarta.jms.ResourceAllocationException(SEND_WINDOW + " sends wait for their receipt",
                            "timeout");
                }
                try {
                    TimeUnit.NANOSECONDS.timedWait(sendLock, Math.min(left, TimeUnit.MILLISECONDS.toNanos(200)));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new JMSException("interrupted while waiting for room among the unreceipted sends");
                }
            }
            checkOpen();
            window.add(p);
            if (status == Status.OPEN) {
                transmit(p, link);
            }
        }
        return p.done;
    }

    /** Sends {@code p} on {@code l} (under sendLock); a loss leaves it in the window for the next link. */
    private void transmit(PendingSend p, BrokerLink l) {
        p.sentAt = System.nanoTime();
        CompletableFuture<Frame> receipt;
        try {
            receipt = l.request("SEND", p.headers, p.body);
        } catch (JMSException e) {
            if (!isLoss(e)) {
                window.remove(p);
                p.done.completeExceptionally(e);
            }
            return;
        }
        receipt.whenComplete((frame, error) -> {
            if (error == null || !isLoss(error) || status == Status.CLOSED) {
                synchronized (sendLock) {
                    window.remove(p);
                    sendLock.notifyAll();
                }
                if (error == null) {
                    p.done.complete(frame);
                } else {
                    p.done.completeExceptionally(error instanceof java.util.concurrent.CompletionException c
                            && c.getCause() != null ? c.getCause() : error);
                }
            }
        });
    }

    /**
     * Waits for a SEND of {@link #sendReliably}: while the connection is open, the link's timeout after
     * the SEND (last) went out; while it reconnects, the failover timeout.
     */
    Frame awaitSend(CompletableFuture<Frame> receipt) throws JMSException {
        long reconnectingSince = 0;
        while (true) {
            try {
                return receipt.get(100, TimeUnit.MILLISECONDS);
            } catch (java.util.concurrent.ExecutionException e) {
                if (e.getCause() instanceof JMSException j) {
                    throw j;
                }
                throw new JMSException(String.valueOf(e.getCause()));
            } catch (java.util.concurrent.TimeoutException e) {
                if (status == Status.RECONNECTING) {
                    long now = System.nanoTime();
                    reconnectingSince = reconnectingSince == 0 ? now : reconnectingSince;
                    int t = failoverOptions.timeout();
                    if (t >= 0 && now - reconnectingSince > TimeUnit.MILLISECONDS.toNanos(t)) {
                        throw new JMSException("still reconnecting after " + t + " ms (the failover timeout)", "timeout");
                    }
                } else {
                    reconnectingSince = 0;
                    checkOpen();
                    long sent = lastSentAt(receipt);
                    if (sent != 0 && System.nanoTime() - sent > TimeUnit.MILLISECONDS.toNanos(factory.getTimeout())) {
                        throw new JMSException("no RECEIPT for SEND within " + factory.getTimeout() + " ms", "timeout");
                    }
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new JMSException("interrupted while waiting for the receipt of a SEND");
            }
        }
    }

    private long lastSentAt(CompletableFuture<Frame> receipt) {
        synchronized (sendLock) {
            for (PendingSend p : window) {
                if (p.done == receipt) {
                    return p.sentAt;
                }
            }
        }
        return 0;
    }

    /** Hears this connection lose its broker and get one back (a failover URL; spec/ha.md §4.3). */
    public void addTransportListener(TransportListener listener) {
        if (listener == null) {
            throw new IllegalArgumentException("the transport listener must not be null");
        }
        transportListeners.add(listener);
    }

    public void removeTransportListener(TransportListener listener) {
        transportListeners.remove(listener);
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
        PymqTemporaryTopic t = new PymqTemporaryTopic(java.util.UUID.randomUUID().toString().replace("-", ""), this);
        temporaries.add(t);
        return t;
    }

    /**
     * Deletes one of this connection's temporary destinations on the broker (spec/stomp.md §3: UNSUBSCRIBE
     * with {@code pymq-delete-temporary}), with the messages it holds.  Refused with IllegalStateException,
     * before anything is sent, while a consumer of this connection reads it (JMS 3.1 §6.2.8): one still
     * open, or one closed whose unacknowledged messages keep its subscription until the session acknowledges.
     */
    void deleteTemporary(PymqDestination d) throws JMSException {
        checkOpen();
        for (PymqSession s : sessions) {
            if (s.consumesFrom(d)) {
                throw new IllegalStateException(d + " still has a consumer: close it (and acknowledge what it "
                        + "received) before deleting the destination");
            }
        }
        if (temporaries.remove(d)) {
            link().call("UNSUBSCRIBE", List.of(new Header("id", nextId("delete-")),
                    new Header("pymq-delete-temporary", d.stompName())), null);
        }
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
        int at;
        synchronized (linkLock) {
            at = brokerIndex;
        }
        BrokerLink fresh = open(id, at);
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
            Thread r = reconnector;
            if (r != null) {
                r.interrupt();
                try {
                    r.join(factory.getTimeout());
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            link.close();
        } finally {
            closed = true;
            closing = false;
            setStatus(Status.CLOSED);
            synchronized (sendLock) {
                for (PendingSend p : window) {
                    p.done.completeExceptionally(new IllegalStateException("the connection is closed", "connection-closed"));
                }
                window.clear();
                sendLock.notifyAll();
            }
            if (events != null) {
                events.shutdown();
            }
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
