package io.pymq.spark;

import io.pymq.stomp.Frame;
import io.pymq.stomp.FrameScanner;
import io.pymq.stomp.Header;
import io.pymq.stomp.Stomp;
import io.pymq.stomp.StompException;

import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SNIHostName;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.TrustManager;
import javax.net.ssl.TrustManagerFactory;
import javax.net.ssl.X509TrustManager;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

/**
 * One blocking STOMP 1.2 connection for the connector: the I/O shell around the Java binding's sans-IO
 * {@link FrameScanner} and {@link Stomp} encoder (bindings/java).  One thread uses it at a time (a task,
 * or the driver's planner), so there is no reader thread: a call writes its frames and reads the socket
 * until its answer is there, keeping frames that belong to other requests in flight (answers come in the
 * order asked, spec/spark.md §6).  A shared timer writes heart-beats while the connection is idle (in the
 * executors' cache between tasks), so the broker does not drop it.
 *
 * <p>Every failure of the connection (lost socket, no answer within the timeout, an ERROR frame: pymq
 * closes a connection after every ERROR) is final: the client is failed and the error thrown is a
 * {@link PymqException} whose code says whether the request may be tried again on a new connection.
 */
final class StompClient implements AutoCloseable {
    /** Answers larger than this are refused (a range answer's bodies are capped at 16 MiB by the broker). */
    static final int MAX_FRAME = 256 * 1024 * 1024;
    private static final ScheduledExecutorService BEATS = Executors.newSingleThreadScheduledExecutor(r -> {
        Thread t = new Thread(r, "pymq-spark-heartbeats");
        t.setDaemon(true);
        return t;
    });

    final Options.Connection options;
    /** The worker of a {@code --workers} broker this connection lives in ({@code pymq-worker}), or -1. */
    final int worker;
    /** How many workers that broker runs ({@code pymq-workers}), or 0 when it does not say. */
    final int workers;
    /** The owner rule its data directory keeps ({@code pymq-placement}: numbered or hash; hash when not said). */
    final String placement;
    private final Socket socket;
    private final InputStream in;
    private final OutputStream out;
    private final FrameScanner scanner;
    private final String version;
    private final Object writeLock = new Object();
    private final byte[] readBuffer = new byte[256 * 1024];
    private final ArrayDeque<Frame> unread = new ArrayDeque<>();
    private final Map<String, Frame> receipts = new HashMap<>();
    private final Map<String, Frame> ends = new HashMap<>();
    private final Map<String, List<Frame>> browsed = new HashMap<>();
    private final ScheduledFuture<?> beat;
    private volatile long lastWrite = System.nanoTime();
    private volatile PymqException failure;
    private long ids;

    private StompClient(Options.Connection options, Socket socket, FrameScanner scanner, Frame connected)
            throws IOException {
        this.options = options;
        this.socket = socket;
        this.in = socket.getInputStream();
        this.out = socket.getOutputStream();
        this.scanner = scanner;
        this.version = connected.get("version", Stomp.V10);
        this.worker = parseInt(connected.get("pymq-worker"), -1);
        this.workers = parseInt(connected.get("pymq-workers"), 0);
        this.placement = connected.get("pymq-placement", Planner.HASH);
        long[] theirs = parseBeats(connected.get("heart-beat"));
        long sendEvery = options.heartbeatSend() == 0 || theirs[1] == 0 ? 0 : Math.max(options.heartbeatSend(), theirs[1]);
        if (sendEvery > 0) {
            long every = Math.max(50, sendEvery / 2);
            this.beat = BEATS.scheduleAtFixedRate(() -> beat(sendEvery), every, every, TimeUnit.MILLISECONDS);
        } else {
            this.beat = null;
        }
    }

    private static int parseInt(String value, int fallback) {
        try {
            return value == null ? fallback : Integer.parseInt(value.strip());
        } catch (NumberFormatException e) {
            return fallback;
        }
    }

    private static long[] parseBeats(String value) {
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

    /** Connects and logs in; an ERROR answer is thrown as its PymqException. */
    static StompClient connect(Options.Connection o) {
        Socket socket = null;
        String where = o.host() + ":" + o.port();
        try {
            socket = new Socket();
            socket.setTcpNoDelay(true);
            socket.setReceiveBufferSize(1 << 20);
            socket.connect(new InetSocketAddress(o.host(), o.port()), (int) Math.min(Integer.MAX_VALUE, o.timeoutMs()));
            if (o.tls()) {
                socket = tls(socket, o);
            }
            socket.setSoTimeout((int) Math.min(Integer.MAX_VALUE, o.timeoutMs()));
            List<Header> headers = new ArrayList<>();
            headers.add(new Header("accept-version", "1.0,1.1,1.2"));
            headers.add(new Header("host", o.vhost() == null ? "/" : o.vhost()));
            if (o.username() != null) {
                headers.add(new Header("login", o.username()));
            }
            if (o.password() != null) {
                headers.add(new Header("passcode", o.password()));
            }
            headers.add(new Header("heart-beat", o.heartbeatSend() + "," + o.heartbeatReceive()));
            OutputStream os = socket.getOutputStream();
            os.write(Stomp.encode("CONNECT", headers, null, Stomp.V12));
            os.flush();
            FrameScanner scanner = new FrameScanner(Stomp.V10);
            scanner.maxFrameSize(MAX_FRAME);
            InputStream is = socket.getInputStream();
            byte[] buf = new byte[64 * 1024];
            List<Frame> first = List.of();
            while (first.isEmpty()) {
                int n = is.read(buf);
                if (n < 0) {
                    throw new IOException("the broker closed the connection during CONNECT");
                }
                first = scanner.feed(buf, 0, n);
            }
            Frame connected = first.get(0);
            if (connected.command().equals("ERROR")) {
                throw brokerError(connected);
            }
            if (!connected.command().equals("CONNECTED")) {
                throw new PymqException(PymqException.CONNECT_FAILED, "expected CONNECTED from " + where + ", got "
                        + connected.command());
            }
            StompClient client = new StompClient(o, socket, scanner, connected);
            scanner.version(client.version);
            client.unread.addAll(first.subList(1, first.size()));
            client.unread.addAll(scanner.feed(new byte[0]));
            return client;
        } catch (PymqException e) {
            closeQuietly(socket);
            throw e;
        } catch (IOException | StompException | RuntimeException e) {
            closeQuietly(socket);
            throw new PymqException(PymqException.CONNECT_FAILED, "cannot connect to " + where + ": " + e, e);
        }
    }

    private static Socket tls(Socket plain, Options.Connection o) throws IOException {
        try {
            boolean verify = o.verify() == null || o.verify();
            TrustManager[] trust = null;
            if (!verify) {
                trust = new TrustManager[] {new X509TrustManager() {
                    @Override
                    public void checkClientTrusted(X509Certificate[] chain, String auth) {
                    }

                    @Override
                    public void checkServerTrusted(X509Certificate[] chain, String auth) {
                    }

                    @Override
                    public X509Certificate[] getAcceptedIssuers() {
                        return new X509Certificate[0];
                    }
                }};
            } else if (o.caFile() != null) {
                KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
                store.load(null, null);
                int i = 0;
                for (Certificate c : certificates(Path.of(o.caFile()))) {
                    store.setCertificateEntry("ca" + i++, c);
                }
                TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
                tmf.init(store);
                trust = tmf.getTrustManagers();
            }
            KeyManagerFactory keys = null;
            if (o.certFile() != null) {
                KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
                store.load(null, null);
                Collection<? extends Certificate> chain = certificates(Path.of(o.certFile()));
                PrivateKey key = privateKey(Path.of(o.keyFile() != null ? o.keyFile() : o.certFile()));
                store.setKeyEntry("client", key, new char[0], chain.toArray(new Certificate[0]));
                keys = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
                keys.init(store, new char[0]);
            }
            SSLContext ctx = SSLContext.getInstance("TLS");
            ctx.init(keys == null ? null : keys.getKeyManagers(), trust, null);
            String name = o.serverHostname() != null ? o.serverHostname() : o.host();
            SSLSocket ssl = (SSLSocket) ctx.getSocketFactory().createSocket(plain, name, o.port(), true);
            SSLParameters params = ssl.getSSLParameters();
            if (verify) {
                params.setEndpointIdentificationAlgorithm("HTTPS");     // the certificate must name the host
            }
            if (!name.matches("[0-9.]+") && !name.contains(":")) {
                params.setServerNames(List.of(new SNIHostName(name)));
            }
            ssl.setSSLParameters(params);
            ssl.setSoTimeout((int) Math.min(Integer.MAX_VALUE, o.timeoutMs()));
            ssl.startHandshake();
            return ssl;
        } catch (IOException e) {
            throw e;
        } catch (Exception e) {
            throw new IOException("TLS setup failed: " + e, e);
        }
    }

    private static Collection<? extends Certificate> certificates(Path pem) throws Exception {
        try (InputStream is = Files.newInputStream(pem)) {
            return CertificateFactory.getInstance("X.509").generateCertificates(is);
        }
    }

    /** An unencrypted PKCS#8 PEM key ("BEGIN PRIVATE KEY"), RSA or EC. */
    private static PrivateKey privateKey(Path pem) throws Exception {
        String text = Files.readString(pem, StandardCharsets.US_ASCII);
        int start = text.indexOf("-----BEGIN PRIVATE KEY-----");
        int end = text.indexOf("-----END PRIVATE KEY-----");
        if (start < 0 || end < 0) {
            throw new IOException(pem + ": the JVM connector reads unencrypted PKCS#8 keys (BEGIN PRIVATE KEY); "
                    + "convert with: openssl pkcs8 -topk8 -nocrypt");
        }
        byte[] der = Base64.getMimeDecoder().decode(text.substring(start + 27, end));
        for (String algorithm : List.of("RSA", "EC", "Ed25519")) {
            try {
                return KeyFactory.getInstance(algorithm).generatePrivate(new PKCS8EncodedKeySpec(der));
            } catch (Exception ignored) {
                // try the next algorithm
            }
        }
        throw new IOException(pem + ": not an RSA, EC or Ed25519 private key");
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

    static PymqException brokerError(Frame error) {
        String code = error.get("pymq-code", "broker-error");
        String message = error.get("message", "");
        if (message.isEmpty()) {
            message = new String(error.body(), StandardCharsets.UTF_8).strip();
        }
        return new PymqException(code, message.isEmpty() ? "the broker answered ERROR" : message);
    }

    // -- state -----------------------------------------------------------------------------------------

    boolean usable() {
        if (failure != null || socket.isClosed()) {
            return false;
        }
        try {
            // an idle connection in the cache may have been closed by the broker (an ERROR, a restart):
            // take in what arrived meanwhile; heart-beats are harmless, anything else ends it
            while (in.available() > 0) {
                int n = in.read(readBuffer, 0, Math.min(readBuffer.length, in.available()));
                if (n < 0) {
                    fail(new PymqException(PymqException.CONNECTION_CLOSED, "the broker closed the connection"));
                    return false;
                }
                for (Frame f : scanner.feed(readBuffer, 0, n)) {
                    if (f.command().equals("ERROR")) {
                        fail(brokerError(f));
                        return false;
                    }
                    unread.add(f);
                }
            }
        } catch (IOException | StompException e) {
            fail(new PymqException(PymqException.CONNECTION_CLOSED, "connection lost: " + e, e));
            return false;
        }
        return unread.isEmpty() && receipts.isEmpty() && ends.isEmpty();
    }

    private void beat(long every) {
        if (failure != null) {
            return;
        }
        if (System.nanoTime() - lastWrite >= TimeUnit.MILLISECONDS.toNanos(every) * 3 / 4) {
            try {
                synchronized (writeLock) {
                    out.write('\n');
                    out.flush();
                    lastWrite = System.nanoTime();
                }
            } catch (IOException e) {
                fail(new PymqException(PymqException.CONNECTION_CLOSED, "connection lost: " + e, e));
            }
        }
    }

    private PymqException fail(PymqException cause) {
        if (failure == null) {
            failure = cause;
            closeQuietly(socket);
            if (beat != null) {
                beat.cancel(false);
            }
        }
        return failure;
    }

    private void check() {
        PymqException f = failure;
        if (f != null) {
            throw new PymqException(f.code().equals(PymqException.CONNECT_FAILED) ? PymqException.CONNECTION_CLOSED
                    : f.retryable() ? f.code() : PymqException.CONNECTION_CLOSED,
                    "the connection failed: " + f.getMessage(), f);
        }
    }

    @Override
    public void close() {
        if (failure != null) {
            return;
        }
        try {
            String id = nextId("r");
            write(Stomp.encodeChecked("DISCONNECT", List.of(new Header("receipt", id)), null, version));
            awaitReceipt(id, "DISCONNECT");
        } catch (PymqException ignored) {
            // the broker went first: closing is all that is left
        }
        fail(new PymqException(PymqException.CONNECTION_CLOSED, "the connection is closed"));
    }

    // -- writing ---------------------------------------------------------------------------------------

    String nextId(String prefix) {
        return prefix + ++ids;
    }

    private void write(byte[]... parts) {
        check();
        try {
            synchronized (writeLock) {
                for (byte[] p : parts) {
                    out.write(p);
                }
                out.flush();
                lastWrite = System.nanoTime();
            }
        } catch (IOException e) {
            throw fail(new PymqException(PymqException.CONNECTION_CLOSED, "connection lost: " + e, e));
        }
    }

    /** A frame whose body is written as it is (not copied into the encoded frame): bulk SENDs of 4 MiB. */
    private void writeFrame(String command, List<Header> headers, byte[] body, int length) {
        StringBuilder b = new StringBuilder(64 + 32 * headers.size()).append(command).append('\n');
        for (Header h : headers) {
            b.append(Stomp.escapeFor(h.name(), version)).append(':').append(Stomp.escapeFor(h.value(), version))
                    .append('\n');
        }
        if (length > 0) {
            b.append("content-length:").append(length).append('\n');
        }
        b.append('\n');
        byte[] head = b.toString().getBytes(StandardCharsets.UTF_8);
        check();
        try {
            synchronized (writeLock) {
                out.write(head);
                if (length > 0) {
                    out.write(body, 0, length);
                }
                out.write(0);
                out.flush();
                lastWrite = System.nanoTime();
            }
        } catch (IOException e) {
            throw fail(new PymqException(PymqException.CONNECTION_CLOSED, "connection lost: " + e, e));
        }
    }

    // -- reading ---------------------------------------------------------------------------------------

    /** Reads until at least one more frame is filed; false never (failure throws). */
    private void pump() {
        check();
        if (!unread.isEmpty()) {
            file(unread.poll());
            return;
        }
        try {
            int n = in.read(readBuffer);
            if (n < 0) {
                throw fail(new PymqException(PymqException.CONNECTION_CLOSED, "the broker closed the connection"));
            }
            for (Frame f : scanner.feed(readBuffer, 0, n)) {
                file(f);
            }
        } catch (SocketTimeoutException e) {
            throw fail(new PymqException(PymqException.TIMEOUT, "no answer from the broker within "
                    + options.timeout() + "s (pymq.timeout)", e));
        } catch (IOException e) {
            throw fail(new PymqException(PymqException.CONNECTION_CLOSED, "connection lost: " + e, e));
        } catch (StompException e) {
            throw fail(new PymqException(PymqException.MESSAGE_FORMAT, "the broker sent a malformed frame: "
                    + e.getMessage(), e));
        }
    }

    private void file(Frame f) {
        switch (f.command()) {
            case "RECEIPT" -> receipts.put(f.get("receipt-id", ""), f);
            case "MESSAGE" -> {
                String sub = f.get("subscription", "");
                if ("end".equals(f.get("browser"))) {
                    ends.put(sub, f);
                } else {
                    browsed.computeIfAbsent(sub, k -> new ArrayList<>()).add(f);
                }
            }
            case "ERROR" -> throw fail(brokerError(f));
            default -> {
                // nothing else is sent to a client after CONNECTED
            }
        }
    }

    Frame awaitReceipt(String id, String what) {
        Frame r;
        while ((r = receipts.remove(id)) == null) {
            pump();
        }
        return r;
    }

    // -- requests --------------------------------------------------------------------------------------

    /** A range read on the wire: its subscription id and receipt. */
    record PendingRange(String subscription, String receipt, String destination) {
    }

    /** An answered range read (spec/stomp.md §9): the bounds and the Arrow body (null: per message). */
    record Range(long earliest, long latest, long next, long count, String source, byte[] arrow,
                 List<Frame> messages, Long bytes) {
    }

    /** Sends a range browse (SUBSCRIBE browser:true) with the given extra headers; answer with {@link #await}. */
    PendingRange range(String destination, Map<String, String> extra) {
        String sub = nextId("s");
        String receipt = nextId("r");
        List<Header> h = new ArrayList<>(8 + extra.size());
        h.add(new Header("destination", destination));
        h.add(new Header("id", sub));
        h.add(new Header("browser", "true"));
        h.add(new Header("ack", "auto"));
        for (Map.Entry<String, String> e : extra.entrySet()) {
            if (e.getValue() != null) {
                h.add(new Header(e.getKey(), e.getValue()));
            }
        }
        h.add(new Header("receipt", receipt));
        write(Stomp.encodeChecked("SUBSCRIBE", h, null, version));
        return new PendingRange(sub, receipt, destination);
    }

    Range await(PendingRange p) {
        awaitReceipt(p.receipt(), "SUBSCRIBE");
        Frame end;
        while ((end = ends.remove(p.subscription())) == null) {
            pump();
        }
        List<Frame> messages = browsed.remove(p.subscription());
        boolean arrow = "application/vnd.apache.arrow.stream".equals(end.get("content-type"));
        return new Range(seq(end, "pymq-earliest-seq"), seq(end, "pymq-latest-seq"), seq(end, "pymq-next-seq"),
                seq(end, "pymq-count"), end.get("pymq-source"), arrow ? end.body() : null,
                messages == null ? List.of() : messages, end.get("pymq-bytes") == null ? null : seq(end, "pymq-bytes"));
    }

    private static long seq(Frame f, String name) {
        String v = f.get(name);
        if (v == null) {
            return 0;
        }
        try {
            return Long.parseLong(v.strip());
        } catch (NumberFormatException e) {
            throw PymqException.format("the broker's " + name + " is not a number: " + Options.pyRepr(v));
        }
    }

    /** The common range headers (pymq/client/frames.py range_headers): null values are left out. */
    static Map<String, String> rangeHeaders(Long fromSeq, Long toSeq, Long maxMessages, Long maxBytes, Long fromTs,
                                            String selector, String subscription, String source, boolean arrow,
                                            String columns) {
        Map<String, String> h = new java.util.LinkedHashMap<>();
        h.put("pymq-from-seq", String.valueOf(fromSeq == null ? 0 : fromSeq));
        put(h, "pymq-to-seq", toSeq);
        put(h, "pymq-max-messages", maxMessages);
        put(h, "pymq-max-bytes", maxBytes);
        put(h, "pymq-from-timestamp", fromTs);
        if (selector != null && !selector.isEmpty()) {
            h.put("selector", selector);
        }
        if (subscription != null) {
            h.put("durable-subscription-name", subscription);
        }
        if (source != null) {
            h.put("pymq-source", source);
        }
        if (arrow) {
            h.put("pymq-format", "arrow");
        }
        if (columns != null) {
            h.put("pymq-columns", columns);
        }
        return h;
    }

    private static void put(Map<String, String> h, String name, Long v) {
        if (v != null) {
            h.put(name, String.valueOf(v));
        }
    }

    /** A bulk SEND (spec/spark.md §7) written now; {@link #awaitReceipt} takes its receipt later. */
    String sendBulk(String destination, byte[] body, int length) {
        String receipt = nextId("r");
        writeFrame("SEND", List.of(new Header("destination", destination), new Header("pymq-format", "arrow"),
                new Header("content-type", "application/vnd.apache.arrow.stream"), new Header("receipt", receipt)),
                body, length);
        return receipt;
    }

    /** ACK with pymq-ack-upto (spec/stomp.md §9), confirmed by its receipt. */
    void ackUpto(String destination, long seq, String subscription) {
        String receipt = nextId("r");
        List<Header> h = new ArrayList<>();
        h.add(new Header("id", "pymq-upto"));
        h.add(new Header("pymq-ack-upto", String.valueOf(seq)));
        h.add(new Header("destination", destination));
        if (subscription != null) {
            h.add(new Header("durable-subscription-name", subscription));
        }
        h.add(new Header("receipt", receipt));
        write(Stomp.encodeChecked("ACK", h, null, version));
        awaitReceipt(receipt, "ACK");
    }

    /** The broker's destinations (admin {@code list-destinations}, spec/admin.md) over this connection. */
    Map<String, List<String>> listDestinations() {
        String replyTo = "/temp-queue/admin-" + UUID.randomUUID().toString().replace("-", "").substring(0, 12);
        String sub = nextId("a");
        String receipt = nextId("r");
        write(Stomp.encodeChecked("SUBSCRIBE", List.of(new Header("destination", replyTo), new Header("id", sub),
                new Header("ack", "auto"), new Header("receipt", receipt)), null, version));
        awaitReceipt(receipt, "SUBSCRIBE");
        String correlation = UUID.randomUUID().toString();
        byte[] body = "{}".getBytes(StandardCharsets.UTF_8);
        write(Stomp.encodeChecked("SEND", List.of(new Header("destination", "/pymq/admin"),
                new Header("pymq-admin-op", "list-destinations"), new Header("reply-to", replyTo), new Header("correlation-id", correlation),
                new Header("content-type", "application/json")), body, version));
        Frame answer = null;
        while (answer == null) {
            List<Frame> got = browsed.get(sub);
            if (got != null) {
                for (Frame f : got) {
                    if (correlation.equals(f.get("correlation-id"))) {
                        answer = f;
                    }
                }
                browsed.remove(sub);
            }
            if (answer == null) {
                pump();
            }
        }
        String unsub = nextId("r");
        write(Stomp.encodeChecked("UNSUBSCRIBE", List.of(new Header("id", sub), new Header("receipt", unsub)), null,
                version));
        awaitReceipt(unsub, "UNSUBSCRIBE");
        try {
            var node = Options.JSON.readTree(new ByteArrayInputStream(answer.body()));
            if (!node.path("ok").asBoolean(false)) {
                throw PymqException.config("option 'destinationPattern' needs the broker's destination listing "
                        + "(admin operation list-destinations), which failed: " + node);
            }
            var result = node.path("result");
            Map<String, List<String>> out = new HashMap<>();
            for (String kind : List.of("queues", "topics", "logs")) {
                List<String> names = new ArrayList<>();
                if (result.has(kind)) {
                    result.get(kind).forEach(n -> names.add(n.asText()));
                }
                out.put(kind, names);
            }
            return out;
        } catch (IOException e) {
            throw PymqException.format("the broker's list-destinations answer is not JSON: " + e.getMessage());
        }
    }
}
