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
import java.util.Locale;

/**
 * The pymq ConnectionFactory: the one class an application names; everything else is {@code jakarta.jms}.
 *
 * <pre>{@code
 * ConnectionFactory cf = new PymqConnectionFactory("stomp://alice:secret@127.0.0.1:61613?clientId=app-1");
 * }</pre>
 *
 * <p>URL: {@code stomp://[user[:password]@]host[:port][?option=value&...]} ({@code tcp://} is the same),
 * or {@code stomp+ssl://} (also {@code ssl://}, {@code stomps://}) for TLS, default port 61613.  Options
 * (each also a setter): {@code clientId}; {@code prefetch} (most unacknowledged messages a consumer holds,
 * default 1000); {@code timeout} (ms for connecting and for every wait on the broker, default 10000);
 * {@code heartBeat} ("send,receive" ms this side offers, default "10000,10000"; "0,0" turns them off);
 * {@code syncSend} (default true: a persistent send outside a transaction returns once the broker's
 * receipt says the message is durable).  Credentials in the URL are percent-decoded; those given to
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
    private transient SSLSocketFactory sslSocketFactory;

    public PymqConnectionFactory() {
    }

    public PymqConnectionFactory(String brokerUrl) {
        setBrokerURL(brokerUrl);
    }

    /** Reads a broker URL (see the class documentation); an unknown option is an error naming it. */
    public void setBrokerURL(String url) {
        URI uri;
        try {
            uri = new URI(url);
        } catch (URISyntaxException e) {
            throw new IllegalArgumentException("not a broker URL: " + url + " (" + e.getMessage() + ")", e);
        }
        String scheme = uri.getScheme() == null ? "" : uri.getScheme().toLowerCase(Locale.ROOT);
        switch (scheme) {
            case "stomp", "tcp" -> tls = false;
            case "stomp+ssl", "stomp+tls", "ssl", "stomps" -> tls = true;
            default -> throw new IllegalArgumentException("unsupported URL " + url
                    + ": use stomp://host:port or stomp+ssl://host:port");
        }
        if (uri.getHost() != null) {
            host = uri.getHost();
        }
        port = uri.getPort() > 0 ? uri.getPort() : 61613;
        if (uri.getRawUserInfo() != null) {
            String info = uri.getRawUserInfo();
            int colon = info.indexOf(':');
            user = decode(colon < 0 ? info : info.substring(0, colon));
            password = colon < 0 ? null : decode(info.substring(colon + 1));
        }
        if (uri.getRawQuery() != null) {
            for (String pair : uri.getRawQuery().split("&")) {
                if (pair.isEmpty()) {
                    continue;
                }
                int eq = pair.indexOf('=');
                String key = decode(eq < 0 ? pair : pair.substring(0, eq));
                String value = eq < 0 ? "" : decode(pair.substring(eq + 1));
                switch (key) {
                    case "clientId" -> clientId = value;
                    case "prefetch" -> setPrefetch(Integer.parseInt(value));
                    case "timeout" -> setTimeout(Long.parseLong(value));
                    case "heartBeat" -> setHeartBeat(value);
                    case "syncSend" -> syncSend = Boolean.parseBoolean(value);
                    case "user" -> user = value;
                    case "password" -> password = value;
                    default -> throw new IllegalArgumentException("unknown option \"" + key + "\" in " + url
                            + "; known: clientId, prefetch, timeout, heartBeat, syncSend, user, password");
                }
            }
        }
    }

    private static String decode(String s) {
        return URLDecoder.decode(s.replace("+", "%2B"), StandardCharsets.UTF_8);
    }

    /** The broker URL these settings describe (without credentials). */
    public String getBrokerURL() {
        return (tls ? "stomp+ssl://" : "stomp://") + host + ":" + port;
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

    SSLSocketFactory sslSocketFactory() {
        return sslSocketFactory;
    }

    long[] heartBeat() {
        return new long[] {heartBeatSend, heartBeatReceive};
    }

    // -- ConnectionFactory ------------------------------------------------------------------------------
    @Override
    public Connection createConnection() throws JMSException {
        return createConnection(user, password);
    }

    @Override
    public Connection createConnection(String userName, String password) throws JMSException {
        return new PymqConnection(this, userName, password);
    }

    @Override
    public QueueConnection createQueueConnection() throws JMSException {
        return createQueueConnection(user, password);
    }

    @Override
    public QueueConnection createQueueConnection(String userName, String password) throws JMSException {
        return new PymqConnection(this, userName, password);
    }

    @Override
    public TopicConnection createTopicConnection() throws JMSException {
        return createTopicConnection(user, password);
    }

    @Override
    public TopicConnection createTopicConnection(String userName, String password) throws JMSException {
        return new PymqConnection(this, userName, password);
    }

    @Override
    public JMSContext createContext() {
        return createContext(user, password, JMSContext.AUTO_ACKNOWLEDGE);
    }

    @Override
    public JMSContext createContext(String userName, String password) {
        return createContext(userName, password, JMSContext.AUTO_ACKNOWLEDGE);
    }

    @Override
    public JMSContext createContext(int sessionMode) {
        return createContext(user, password, sessionMode);
    }

    @Override
    public JMSContext createContext(String userName, String password, int sessionMode) {
        PymqContext.checkMode(sessionMode);
        PymqConnection connection;
        try {
            connection = new PymqConnection(this, userName, password);
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
