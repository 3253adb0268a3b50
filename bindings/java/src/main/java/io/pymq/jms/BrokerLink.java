package io.pymq.jms;

import io.pymq.stomp.Frame;
import io.pymq.stomp.FrameScanner;
import io.pymq.stomp.Header;
import io.pymq.stomp.Stomp;
import io.pymq.stomp.StompException;
import jakarta.jms.JMSException;

import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.SSLSocketFactory;
import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;

/**
 * One STOMP 1.2 connection to a broker: the I/O shell around the sans-IO {@link FrameScanner} and
 * {@link Stomp#encode}.  A reader thread owns the socket's input: it completes receipts, hands MESSAGE
 * frames to the {@link Listener} (which must not block: consumer buffers are bounded by broker credit),
 * and turns an ERROR frame into the mapped JMSException.  Writes are serialised by one lock.
 *
 * <p>Heart-beats (spec/stomp.md §6): this side offers {@code heart-beat: send,receive}; with the broker's
 * answer the intervals are {@code max(cx, sy)} for sending and {@code max(sx, cy)} for receiving, 0 = none.
 * A timer sends an EOL when nothing else was written for the send interval, and declares the broker dead
 * after {@link #GRACE} times the receive interval without any traffic.
 *
 * <p>Every failure (ERROR frame, lost socket, missed heart-beats) is final: the link fails every pending
 * request with it and tells the listener once.  pymq closes a connection after every ERROR.
 */
final class BrokerLink {
    /** A peer is declared dead after this many receive intervals without traffic (as the broker does). */
    static final double GRACE = 2.0;

    interface Listener {
        /** A MESSAGE frame (reader thread; must not block). */
        void message(BrokerLink link, Frame frame);

        /**
         * {@code link} failed or was closed ({@code expected}: by {@link #close}); called once per link, on
         * whichever thread ended it, possibly after the link's owner has already replaced it.
         */
        void ended(BrokerLink link, JMSException cause, boolean expected);
    }

    /** Where to connect: host, port and whether to speak TLS. */
    record Endpoint(String host, int port, boolean tls) implements java.io.Serializable {
    }

    private final Socket socket;
    private final InputStream in;
    private final OutputStream out;
    private final FrameScanner scanner;
    private final Listener listener;
    private final Object writeLock = new Object();
    private final Map<String, CompletableFuture<Frame>> receipts = new ConcurrentHashMap<>();
    private final AtomicLong ids = new AtomicLong();
    private final long sendEvery;
    private final long expectEvery;
    private volatile long lastRead = System.nanoTime();
    private volatile long lastWrite = System.nanoTime();
    private volatile JMSException failure;
    private volatile boolean closing;
    private ScheduledExecutorService beats;
    /**
     * Tests only: runs on the thread that ends a link, after its pending requests have failed and before
     * the listener hears of it; a test widens that window (a TLS close widens it in life) to provoke the
     * races it hides.  Null in production.
     */
    static volatile java.util.function.Consumer<BrokerLink> endingForTests;
    final String version;
    final String session;
    final String server;
    final String userName;
    final long timeoutMs;
    /**
     * Temporary names (spec/ha.md section 4.7): CONNECTED's {@code pymq-reclaim-token} (a secret: never logged;
     * null from a broker with {@code temporary_reclaim_ms: 0}), {@code pymq-reclaimed} ("true" when this link
     * re-claimed the lost link's temporaries' global names) and {@code pymq-reclaim-refused} (why not).
     */
    final String reclaimToken;
    final String reclaimed;
    final String reclaimRefused;

    private BrokerLink(Socket socket, FrameScanner scanner, Frame connected, Listener listener, long[] offered,
                       long timeoutMs) throws IOException {
        this.socket = socket;
        this.in = socket.getInputStream();
        this.out = new BufferedOutputStream(socket.getOutputStream(), 64 * 1024);
        this.scanner = scanner;
        this.listener = listener;
        this.timeoutMs = timeoutMs;
        this.version = connected.get("version", Stomp.V10);
        this.session = connected.get("session", "");
        this.server = connected.get("server", "");
        this.userName = connected.get("user-name");
        this.reclaimToken = connected.get("pymq-reclaim-token");
        this.reclaimed = connected.get("pymq-reclaimed");
        this.reclaimRefused = connected.get("pymq-reclaim-refused");
        long[] theirs = parseHeartBeat(connected.get("heart-beat"));
        this.sendEvery = offered[0] == 0 || theirs[1] == 0 ? 0 : Math.max(offered[0], theirs[1]);
        this.expectEvery = offered[1] == 0 || theirs[0] == 0 ? 0 : Math.max(offered[1], theirs[0]);
    }

    static long[] parseHeartBeat(String value) {
        if (value == null) {
            return new long[] {0, 0};
        }
        String[] parts = value.split(",");
        try {
            return new long[] {Math.max(0, Long.parseLong(parts[0].strip())),
                    parts.length > 1 ? Math.max(0, Long.parseLong(parts[1].strip())) : 0};
        } catch (NumberFormatException e) {
            return new long[] {0, 0};
        }
    }

    /** The negotiated intervals (ms, 0 = none): [this side sends every, the broker sends every]. */
    long[] heartBeats() {
        return new long[] {sendEvery, expectEvery};
    }

    /**
     * Connects, sends CONNECT with {@code headers} and waits for CONNECTED; an ERROR answer is thrown as its
     * JMSException.  {@code heartBeat} is what this side offers: {send every, expect every} in ms.
     */
    static BrokerLink open(Endpoint endpoint, SSLSocketFactory tls, List<Header> headers, long[] heartBeat,
                           long timeoutMs, long connectMs, Listener listener) throws JMSException {
        Socket socket = null;
        try {
            socket = new Socket();
            socket.setTcpNoDelay(true);
            socket.connect(new InetSocketAddress(endpoint.host(), endpoint.port()), (int) connectMs);
            if (endpoint.tls()) {
                SSLSocketFactory factory = tls != null ? tls : (SSLSocketFactory) SSLSocketFactory.getDefault();
                SSLSocket ssl = (SSLSocket) factory.createSocket(socket, endpoint.host(), endpoint.port(), true);
                SSLParameters params = ssl.getSSLParameters();
                params.setEndpointIdentificationAlgorithm("HTTPS");    // check the certificate names the host
                ssl.setSSLParameters(params);
                ssl.setSoTimeout((int) connectMs);
                ssl.startHandshake();
                socket = ssl;
            }
            socket.setSoTimeout((int) connectMs);
            List<Header> connect = new ArrayList<>(headers);
            connect.add(new Header("heart-beat", heartBeat[0] + "," + heartBeat[1]));
            OutputStream o = socket.getOutputStream();
            o.write(Stomp.encode("CONNECT", connect, null, Stomp.V12));
            o.flush();
            FrameScanner scanner = new FrameScanner(Stomp.V10);
            scanner.maxFrameSize(64 * 1024 * 1024);
            InputStream i = socket.getInputStream();
            byte[] buf = new byte[64 * 1024];
            Frame first = null;
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(connectMs);
            while (first == null) {
                if (System.nanoTime() > deadline) {
                    throw new SocketTimeoutException("no CONNECTED within " + connectMs + " ms");
                }
                int n = i.read(buf);
                if (n < 0) {
                    throw new IOException("the broker closed the connection during CONNECT");
                }
                List<Frame> frames = scanner.feed(buf, 0, n);
                if (!frames.isEmpty()) {
                    first = frames.get(0);
                }
            }
            if (first.command().equals("ERROR")) {
                throw BrokerErrors.fromFrame(first, true);
            }
            if (!first.command().equals("CONNECTED")) {
                throw new JMSException("expected CONNECTED from the broker, got " + first.command());
            }
            socket.setSoTimeout(0);       // from now on heart-beats decide when the broker is gone
            BrokerLink link = new BrokerLink(socket, scanner, first, listener, heartBeat, timeoutMs);
            scanner.version(link.version);
            link.start();
            return link;
        } catch (JMSException e) {
            closeQuietly(socket);
            throw e;
        } catch (IOException | StompException e) {
            closeQuietly(socket);
            JMSException j = new JMSException("cannot connect to " + endpoint.host() + ":" + endpoint.port() + ": " + e,
                    "connect-failed");
            j.setLinkedException(e);
            throw j;
        }
    }

    private static void closeQuietly(Socket s) {
        if (s != null) {
            try {
                s.close();
            } catch (IOException ignored) {
                // closing after a failure: the failure is what is reported
            }
        }
    }

    private void start() {
        Thread reader = new Thread(this::readLoop, "pymq-reader-" + session);
        reader.setDaemon(true);
        reader.start();
        if (sendEvery > 0 || expectEvery > 0) {
            beats = Executors.newSingleThreadScheduledExecutor(r -> {
                Thread t = new Thread(r, "pymq-heartbeat-" + session);
                t.setDaemon(true);
                return t;
            });
            long every = Math.max(50, Math.min(sendEvery > 0 ? sendEvery : Long.MAX_VALUE,
                    expectEvery > 0 ? expectEvery : Long.MAX_VALUE) / 4);
            beats.scheduleAtFixedRate(this::beat, every, every, TimeUnit.MILLISECONDS);
        }
    }

    private void beat() {
        long now = System.nanoTime();
        if (expectEvery > 0 && now - lastRead > TimeUnit.MILLISECONDS.toNanos((long) (expectEvery * GRACE))) {
            fail(new JMSException("no traffic from the broker for " + (long) (expectEvery * GRACE)
                    + " ms (heart-beat every " + expectEvery + " ms expected)", "heartbeat-timeout"));
            return;
        }
        if (sendEvery > 0 && now - lastWrite >= TimeUnit.MILLISECONDS.toNanos(sendEvery) * 3 / 4) {
            try {
                synchronized (writeLock) {
                    out.write('\n');
                    out.flush();
                    lastWrite = System.nanoTime();
                }
            } catch (IOException e) {
                fail(lost(e));
            }
        }
    }

    private void readLoop() {
        byte[] buf = new byte[64 * 1024];
        try {
            dispatch(scanner.feed(new byte[0]));   // frames that came with CONNECTED
            while (failure == null) {
                int n = in.read(buf);
                if (n < 0) {
                    fail(new JMSException("the broker closed the connection", "connection-closed"));
                    return;
                }
                lastRead = System.nanoTime();
                dispatch(scanner.feed(buf, 0, n));
            }
        } catch (StompException e) {
            JMSException j = new JMSException("the broker sent a malformed frame: " + e.getMessage(), e.code());
            j.setLinkedException(e);
            fail(j);
        } catch (IOException e) {
            fail(lost(e));
        } catch (RuntimeException e) {
            JMSException j = new JMSException("the connection's reader failed: " + e);
            j.setLinkedException(e);
            fail(j);
        }
    }

    private static JMSException lost(IOException e) {
        JMSException j = new JMSException("connection lost: " + e, "connection-closed");
        j.setLinkedException(e);
        return j;
    }

    private void dispatch(List<Frame> frames) {
        for (Frame f : frames) {
            switch (f.command()) {
                case "MESSAGE" -> listener.message(this, f);
                case "RECEIPT" -> {
                    CompletableFuture<Frame> waiter = receipts.remove(f.get("receipt-id", ""));
                    if (waiter != null) {
                        waiter.complete(f);
                    }
                }
                case "ERROR" -> {
                    JMSException e = BrokerErrors.fromFrame(f, false);
                    String rid = f.get("receipt-id");
                    CompletableFuture<Frame> waiter = rid == null ? null : receipts.remove(rid);
                    if (waiter != null) {
                        waiter.completeExceptionally(e);
                    }
                    fail(e);
                }
                default -> {
                    // nothing else is sent to a client after CONNECTED
                }
            }
        }
    }

    /** Ends the link with {@code cause}: every pending request fails with it; the listener hears once. */
    void fail(JMSException cause) {
        synchronized (this) {
            if (failure != null) {
                return;
            }
            failure = cause;
        }
        closeQuietly(socket);
        if (beats != null) {
            beats.shutdownNow();
        }
        for (CompletableFuture<Frame> w : receipts.values()) {
            w.completeExceptionally(cause);
        }
        receipts.clear();
        java.util.function.Consumer<BrokerLink> hook = endingForTests;
        if (hook != null) {
            hook.accept(this);
        }
        listener.ended(this, cause, closing);
    }

    boolean failed() {
        return failure != null;
    }

    /** Why the link ended, as a fresh exception for the caller at hand (null while it is open). */
    JMSException failure() {
        JMSException f = failure;
        if (f == null) {
            return null;
        }
        JMSException e = closing ? new jakarta.jms.IllegalStateException("the connection is closed", "connection-closed")
                : new JMSException("the connection failed: " + f.getMessage(), f.getErrorCode());
        e.setLinkedException(f);
        return e;
    }

    private void write(byte[] data) throws JMSException {
        JMSException f = failure();
        if (f != null) {
            throw f;
        }
        try {
            synchronized (writeLock) {
                out.write(data);
                out.flush();
                lastWrite = System.nanoTime();
            }
        } catch (IOException e) {
            fail(lost(e));
            throw failure();
        }
    }

    /** Writes one frame (no receipt). */
    void send(String command, List<Header> headers, byte[] body) throws JMSException {
        byte[] data;
        try {
            data = Stomp.encode(command, headers, body, version);
        } catch (StompException e) {
            throw new JMSException(e.getMessage(), e.code());
        }
        write(data);
    }

    /** Writes one frame with a receipt header; the future completes with the RECEIPT (or the ERROR). */
    CompletableFuture<Frame> request(String command, List<Header> headers, byte[] body) throws JMSException {
        String id = "r" + ids.incrementAndGet();
        CompletableFuture<Frame> waiter = new CompletableFuture<>();
        receipts.put(id, waiter);
        List<Header> h = new ArrayList<>(headers.size() + 1);
        h.addAll(headers);
        h.add(new Header("receipt", id));
        try {
            send(command, h, body);
        } catch (JMSException e) {
            receipts.remove(id);
            throw e;
        }
        if (failure != null) {      // failed between registering and sending: fail() may have missed it
            receipts.remove(id);
            waiter.completeExceptionally(failure());
        }
        return waiter;
    }

    /** {@link #request} and wait for the receipt (the link's timeout). */
    Frame call(String command, List<Header> headers, byte[] body) throws JMSException {
        return await(request(command, headers, body), command);
    }

    /** Waits for a request's receipt: its ERROR, or the link's failure, is thrown. */
    Frame await(CompletableFuture<Frame> waiter, String what) throws JMSException {
        try {
            return waiter.get(timeoutMs, TimeUnit.MILLISECONDS);
        } catch (ExecutionException e) {
            if (e.getCause() instanceof JMSException j) {
                throw j;
            }
            JMSException j = new JMSException(String.valueOf(e.getCause()));
            j.setLinkedException((Exception) e.getCause());
            throw j;
        } catch (TimeoutException e) {
            throw new JMSException("no RECEIPT for " + what + " within " + timeoutMs + " ms", "timeout");
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new JMSException("interrupted while waiting for the receipt of " + what);
        }
    }

    /**
     * DISCONNECT, waiting for its receipt (the broker then processed every earlier frame), then close.
     * Idempotent; a failed link just closes.
     */
    void close() {
        if (failure != null) {
            return;
        }
        closing = true;
        try {
            call("DISCONNECT", List.of(), null);
        } catch (JMSException ignored) {
            // the broker went away first: closing is all that is left to do
        }
        fail(new JMSException("the connection is closed", "connection-closed"));
    }
}
