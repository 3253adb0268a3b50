package io.pymq.jms;

import jakarta.jms.Connection;
import jakarta.jms.JMSContext;
import jakarta.jms.JMSException;
import jakarta.jms.JMSRuntimeException;
import jakarta.jms.QueueConnection;
import jakarta.jms.QueueConnectionFactory;
import jakarta.jms.TopicConnection;
import jakarta.jms.TopicConnectionFactory;

import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLSocketFactory;
import java.io.Serializable;
import java.net.URI;
import java.net.URISyntaxException;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * The pymq ConnectionFactory: the one class an application names; everything else is {@code jakarta.jms}.
 *
 * <pre>{@code
 * ConnectionFactory cf = new PymqConnectionFactory("stomp://alice:secret@127.0.0.1:61613?clientId=app-1");
 * }</pre>
 *
 * <p>URL: {@code stomp://[user[:password]@]host[:port][/vhost][?option=value&...]} ({@code tcp://} is the same),
 * or {@code stomp+ssl://} (also {@code ssl://}, {@code stomps://}) for TLS, default port 61613.  Options
 * (each also a setter): {@code clientId}; {@code prefetch} (most unacknowledged messages a consumer holds,
 * default 1000); {@code timeout} (ms for connecting and for every wait on the broker, default 10000);
 * {@code heartBeat} ("send,receive" ms this side offers, default "10000,10000"; "0,0" turns them off);
 * {@code syncSend} (default true: a persistent send outside a transaction returns once the broker's
 * receipt says the message is durable); {@code vhost} (the broker's virtual host, spec/stomp.md section 1, sent
 * as {@code host:/<vhost>} to every broker whose URL has no path; a path names it too and wins for its broker:
 * {@code stomp://host:61613/shop}, also a failover member's; default: the broker's default vhost {@code /}).  Credentials in the URL are percent-decoded; those given to
 * {@code createConnection(user, password)} win.  Without any, the broker treats the connection as guest
 * (accepted from loopback only).
 */
public class PymqConnectionFactory implements QueueConnectionFactory, TopicConnectionFactory, Serializable {
    private static final long serialVersionUID = 1L;

    private String host = "127.0.0.1";
    private int port = 61613;
    private boolean tls;
    private String user;
    private String password;
    private String clientId;
    private int prefetch = 1000;
    private long timeoutMs = 10_000;
    private long heartBeatSend = 10_000;
    private long heartBeatReceive = 10_000;
    private boolean syncSend = true;
    private String vhost;
    private transient SSLSocketFactory sslSocketFactory;
    private List<Member> members;
    private BrokerGroup group;
    private transient volatile TransportListener transportListener;

    public PymqConnectionFactory() {
    }

    public PymqConnectionFactory(String brokerUrl) {
        setBrokerURL(brokerUrl);
    }

    /**
     * One broker of the URL: where it is, its own credentials (null when absent), its options and the
     * virtual host its URL's path names (null: none; the factory's {@code vhost} setting applies, see vhostAt).
     */
    record Member(BrokerLink.Endpoint endpoint, String user, String password, Map<String, String> options,
                  String vhost) implements Serializable {
    }

    /**
     * Reads a broker URL (see the class documentation): one broker, or a group of brokers to fail over
     * between (spec/ha.md §4).  An unknown option or a bad value is an IllegalArgumentException naming it.
     */
    public void setBrokerURL(String url) {
        List<Member> read = new ArrayList<>();
        BrokerGroup g = BrokerGroup.parse(url, m -> read.add(member(m)));
        // the options of every member apply to the connection, in order (they are the provider's settings)
        for (Member m : read) {
            m.options().forEach(this::option);
        }
        Member first = read.get(0);
        host = first.endpoint().host();
        port = first.endpoint().port();
        tls = first.endpoint().tls();
        if (first.user() != null) {
            user = first.user();
            password = first.password();
        }
        String u = m0option(read, "user");
        if (u != null) {
            user = u;
        }
        String p = m0option(read, "password");
        if (p != null) {
            password = p;
        }
        members = List.copyOf(read);
        group = g;
    }

    private static String m0option(List<Member> read, String key) {
        return read.get(0).options().get(key);
    }

    /** One single-broker URL, checked whole (IllegalArgumentException naming what is wrong). */
    static Member member(String url) {
        URI uri;
        try {
            uri = new URI(url);
        } catch (URISyntaxException e) {
            throw new IllegalArgumentException("not a broker URL: " + BrokerGroup.redacted(url) + " (" + e.getReason() + ")", e);
        }
        String scheme = uri.getScheme() == null ? "" : uri.getScheme().toLowerCase(Locale.ROOT);
        boolean secure;
        switch (scheme) {
            case "stomp", "tcp" -> secure = false;
            case "stomp+ssl", "stomp+tls", "ssl", "stomps" -> secure = true;
            default -> throw new IllegalArgumentException("unsupported URL " + BrokerGroup.redacted(url)
                    + ": use stomp://host:port or stomp+ssl://host:port");
        }
        if (uri.getRawAuthority() != null && uri.getHost() == null) {
            throw new IllegalArgumentException("not a host:port in " + BrokerGroup.redacted(url));
        }
        if (uri.getPort() > 65535) {
            throw new IllegalArgumentException("port " + uri.getPort() + " out of range in " + BrokerGroup.redacted(url));
        }
        String path = uri.getRawPath() == null ? "" : decode(uri.getRawPath().replaceFirst("^/", ""));
        if (!path.isEmpty()) {
            checkVhost(path, url);     // the path names the broker's virtual host (spec/stomp.md section 1)
        }
        String h = uri.getHost() == null ? "127.0.0.1" : uri.getHost();
        if (h.startsWith("[") && h.endsWith("]")) {
            h = h.substring(1, h.length() - 1);
        }
        String u = null;
        String pw = null;
        if (uri.getRawUserInfo() != null) {
            String info = uri.getRawUserInfo();
            int colon = info.indexOf(':');
            u = decode(colon < 0 ? info : info.substring(0, colon));
            pw = colon < 0 ? null : decode(info.substring(colon + 1));
        }
        Map<String, String> options = new LinkedHashMap<>();
        if (uri.getRawQuery() != null) {
            for (String pair : uri.getRawQuery().split("&")) {
                if (pair.isEmpty()) {
                    continue;
                }
                int eq = pair.indexOf('=');
                String key = decode(eq < 0 ? pair : pair.substring(0, eq));
                String value = eq < 0 ? "" : decode(pair.substring(eq + 1));
                if (!OPTIONS.contains(key)) {
                    throw new IllegalArgumentException("unknown option \"" + key + "\" in " + BrokerGroup.redacted(url)
                            + "; known: " + String.join(", ", OPTIONS));
                }
                options.put(key, value);
            }
        }
        // the values are checked here too, so a bad one refuses the URL before anything is set
        new PymqConnectionFactory().applyAll(options);
        return new Member(new BrokerLink.Endpoint(h, uri.getPort() > 0 ? uri.getPort() : 61613, secure), u, pw,
                Map.copyOf(options), path.isEmpty() ? null : path);
    }

    private static final List<String> OPTIONS = List.of("clientId", "prefetch", "timeout", "heartBeat", "syncSend",
            "user", "password", "vhost");

    private static final java.util.regex.Pattern VHOST = java.util.regex.Pattern.compile("[A-Za-z0-9_-]{1,64}");

    private static void checkVhost(String name, String url) {
        if (!VHOST.matcher(name).matches()) {
            throw new IllegalArgumentException("a virtual host name is letters, digits, '_' and '-' (at most 64), not \""
                    + name + "\"" + (url == null ? "" : " in " + BrokerGroup.redacted(url)));
        }
    }

    private void applyAll(Map<String, String> options) {
        options.forEach(this::option);
    }

    private void option(String key, String value) {
        switch (key) {
            case "clientId" -> clientId = value;
            case "prefetch" -> setPrefetch(Integer.parseInt(value));
            case "timeout" -> setTimeout(Long.parseLong(value));
            case "heartBeat" -> setHeartBeat(value);
            case "syncSend" -> syncSend = Boolean.parseBoolean(value);
            case "user" -> user = value;
            case "password" -> password = value;
            case "vhost" -> setVhost(value);
            default -> throw new IllegalArgumentException("unknown option \"" + key + "\"");
        }
    }

    private static String decode(String s) {
        return URLDecoder.decode(s.replace("+", "%2B"), StandardCharsets.UTF_8);
    }

    /** The broker URL these settings describe (without credentials). */
    public String getBrokerURL() {
        if (group != null && group.failover) {
            StringBuilder b = new StringBuilder("failover:(");
            for (int i = 0; i < members.size(); i++) {
                BrokerLink.Endpoint e = members.get(i).endpoint();
                b.append(i > 0 ? "," : "").append(e.tls() ? "stomp+ssl://" : "stomp://").append(hostPort(e));
            }
            return b.append(")").toString();
        }
        return (tls ? "stomp+ssl://" : "stomp://") + hostPort(new BrokerLink.Endpoint(host, port, tls));
    }

    private static String hostPort(BrokerLink.Endpoint e) {
        return (e.host().contains(":") ? "[" + e.host() + "]" : e.host()) + ":" + e.port();
    }

    public void setUser(String user) {
        this.user = user;
    }

    public void setPassword(String password) {
        this.password = password;
    }

    public String getClientID() {
        return clientId;
    }

    public void setClientID(String clientId) {
        this.clientId = clientId;
    }

    /**
     * The virtual host setting (spec/stomp.md section 1: setVhost or the {@code vhost} URL option), or null for the
     * broker's default vhost "/": a link enters it at every broker whose URL has no path (a path wins for its broker).
     */
    public String getVhost() {
        return vhost;
    }

    /** Selects the broker's virtual host ({@code host:/<vhost>} in CONNECT); null or "" or "/": the default. */
    public void setVhost(String vhost) {
        String name = vhost == null ? "" : vhost.replaceFirst("^/", "");
        if (!name.isEmpty()) {
            checkVhost(name, null);
        }
        this.vhost = name.isEmpty() ? null : name;
    }

    public int getPrefetch() {
        return prefetch;
    }

    public void setPrefetch(int prefetch) {
        if (prefetch < 1) {
            throw new IllegalArgumentException("prefetch must be at least 1, got " + prefetch);
        }
        this.prefetch = prefetch;
    }

    public long getTimeout() {
        return timeoutMs;
    }

    public void setTimeout(long timeoutMs) {
        if (timeoutMs < 1) {
            throw new IllegalArgumentException("timeout must be at least 1 ms, got " + timeoutMs);
        }
        this.timeoutMs = timeoutMs;
    }

    /** "send,receive": the heart-beat intervals (ms) this side offers; "0,0" turns them off. */
    public void setHeartBeat(String value) {
        String[] parts = value.split(",");
        if (parts.length != 2) {
            throw new IllegalArgumentException("heartBeat is \"send,receive\" in ms, got \"" + value + "\"");
        }
        long send = Long.parseLong(parts[0].strip());
        long receive = Long.parseLong(parts[1].strip());
        if (send < 0 || receive < 0) {
            throw new IllegalArgumentException("heart-beat intervals must not be negative: " + value);
        }
        heartBeatSend = send;
        heartBeatReceive = receive;
    }

    public String getHeartBeat() {
        return heartBeatSend + "," + heartBeatReceive;
    }

    public boolean isSyncSend() {
        return syncSend;
    }

    public void setSyncSend(boolean syncSend) {
        this.syncSend = syncSend;
    }

    /** The TLS context for stomp+ssl:// (default: the JVM's, with its default trust store). */
    public void setSslContext(SSLContext context) {
        this.sslSocketFactory = context.getSocketFactory();
    }

    // -- package view for the connection --------------------------------------------------------------
    BrokerLink.Endpoint endpoint() {
        return new BrokerLink.Endpoint(host, port, tls);
    }

    /**
     * The brokers to connect to, in the URL's order, with their own credentials: the URL's group, or the
     * one broker the setters describe.
     */
    List<Member> brokers() {
        if (group == null || !group.failover) {
            return List.of(new Member(endpoint(), null, null, Map.of(), members == null ? null : members.get(0).vhost()));
        }
        return members;
    }

    /**
     * The virtual host a link to {@code m} enters (spec/stomp.md section 1, vectors spec/vectors/failover_urls.json
     * "vhosts"): its URL's own path, else this factory's {@code vhost} setting, else null (the broker's default "/").
     */
    String vhostAt(Member m) {
        return m.vhost() != null ? m.vhost() : vhost;
    }

    /** The brokers of the URL as written, with their own credentials (the failover vectors read them). */
    List<Member> urlMembers() {
        return members;
    }

    /** Whether a lost connection is replaced (a failover URL: spec/ha.md §4). */
    boolean failover() {
        return group != null && group.failover;
    }

    BrokerGroup.Options failoverOptions() {
        return group != null ? group.options : BrokerGroup.Options.DEFAULTS;
    }

    /**
     * Listens to every connection this factory makes: {@code transportInterrupted} when a failover
     * connection loses its broker, {@code transportResumed} when it is back (ActiveMQ's
     * {@code setTransportListener}).
     */
    public void setTransportListener(TransportListener listener) {
        transportListener = listener;
    }

    TransportListener transportListener() {
        return transportListener;
    }

    SSLSocketFactory sslSocketFactory() {
        return sslSocketFactory;
    }

    long[] heartBeat() {
        return new long[] {heartBeatSend, heartBeatReceive};
    }

    // -- ConnectionFactory ------------------------------------------------------------------------------
    @Override
    public Connection createConnection() throws JMSException {
        return new PymqConnection(this, user, password, false);
    }

    @Override
    public Connection createConnection(String userName, String password) throws JMSException {
        return new PymqConnection(this, userName, password, true);
    }

    @Override
    public QueueConnection createQueueConnection() throws JMSException {
        return new PymqConnection(this, user, password, false);
    }

    @Override
    public QueueConnection createQueueConnection(String userName, String password) throws JMSException {
        return new PymqConnection(this, userName, password, true);
    }

    @Override
    public TopicConnection createTopicConnection() throws JMSException {
        return new PymqConnection(this, user, password, false);
    }

    @Override
    public TopicConnection createTopicConnection(String userName, String password) throws JMSException {
        return new PymqConnection(this, userName, password, true);
    }

    @Override
    public JMSContext createContext() {
        return context(user, password, JMSContext.AUTO_ACKNOWLEDGE, false);
    }

    @Override
    public JMSContext createContext(String userName, String password) {
        return createContext(userName, password, JMSContext.AUTO_ACKNOWLEDGE);
    }

    @Override
    public JMSContext createContext(int sessionMode) {
        return context(user, password, sessionMode, false);
    }

    @Override
    public JMSContext createContext(String userName, String password, int sessionMode) {
        return context(userName, password, sessionMode, true);
    }

    private JMSContext context(String userName, String password, int sessionMode, boolean explicit) {
        PymqContext.checkMode(sessionMode);
        PymqConnection connection;
        try {
            connection = new PymqConnection(this, userName, password, explicit);
        } catch (JMSException e) {
            throw PymqContext.runtime(e);
        }
        return new PymqContext(connection, sessionMode, new java.util.concurrent.atomic.AtomicInteger(1));
    }

    String user() {
        return user;
    }

    String password() {
        return password;
    }

    boolean tls() {
        return tls;
    }

    @Override
    public String toString() {
        return "PymqConnectionFactory[" + getBrokerURL() + (clientId != null ? ", clientId=" + clientId : "") + "]";
    }

    /** The runtime exception a JMSContext method throws for a JMSException (kept for JMSContext users). */
    static JMSRuntimeException runtime(JMSException e) {
        return PymqContext.runtime(e);
    }
}
