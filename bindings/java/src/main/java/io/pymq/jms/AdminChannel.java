package io.pymq.jms;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import io.pymq.stomp.Frame;
import io.pymq.stomp.Header;
import jakarta.jms.JMSException;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * The broker's admin operations (spec/admin.md) over the connection itself: a SEND to {@code /pymq/admin}
 * with a private temporary reply queue and correlation ids.  A refused request is an answer, not an ERROR,
 * so the provider uses it to check what would otherwise end the connection (does this durable subscription
 * exist, is it in use).  Only the small JSON reading those checks need is done here.
 */
final class AdminChannel implements PymqConnection.Subscriber {
    private static final JsonFactory JSON = new JsonFactory();

    private final PymqConnection connection;
    private final String replyTo;
    private final String subId;
    private final Map<String, CompletableFuture<Frame>> waiting = new ConcurrentHashMap<>();
    private final List<Header> subscribeHeaders;
    /** Completes an admin request whose answer went with a lost link: it is asked again on the next one. */
    private static final class Lost extends JMSException {
        private static final long serialVersionUID = 1L;

        Lost() {
            super("the link was lost during an admin request", "connection-closed");
        }
    }

    AdminChannel(PymqConnection connection) throws JMSException {
        this.connection = connection;
        this.replyTo = "/temp-queue/pymq-admin-" + UUID.randomUUID().toString().replace("-", "").substring(0, 12);
        this.subId = connection.nextId("admin-");
        this.subscribeHeaders = List.of(new Header("destination", replyTo), new Header("id", subId),
                new Header("ack", "auto"));
        connection.register(subId, this);
        try {
            connection.link().call("SUBSCRIBE", subscribeHeaders, null);
        } catch (JMSException e) {
            connection.unregister(subId);
            throw e;
        }
    }

    @Override
    public void deliver(Frame frame, BrokerLink link) {
        CompletableFuture<Frame> w = waiting.remove(frame.get("correlation-id", ""));
        if (w != null) {
            w.complete(frame);
        }
    }

    @Override
    public List<Header> resubscribe() {
        return subscribeHeaders;
    }

    @Override
    public void linkLost() {
        for (CompletableFuture<Frame> w : waiting.values()) {
            w.completeExceptionally(new Lost());
        }
    }

    @Override
    public void wake() {
        for (CompletableFuture<Frame> w : waiting.values()) {
            w.completeExceptionally(new JMSException("the connection ended during an admin request"));
        }
    }

    /**
     * Runs {@code op} with a JSON object body; returns the answer's JSON text of {@code result}.  Asked
     * again (a few times) when a failover connection loses its link meanwhile: the operations the provider
     * uses only read.
     */
    JsonValue call(String op, String argsJson) throws JMSException {
        for (int attempt = 1; ; attempt++) {
            try {
                return callOnce(op, argsJson);
            } catch (Lost e) {
                if (attempt >= 3) {
                    throw e;
                }
            }
        }
    }

    private JsonValue callOnce(String op, String argsJson) throws JMSException {
        String corr = UUID.randomUUID().toString();
        CompletableFuture<Frame> w = new CompletableFuture<>();
        waiting.put(corr, w);
        BrokerLink link = connection.link();
        try {
            link.send("SEND", List.of(new Header("destination", "/pymq/admin"), new Header("pymq-admin-op", op),
                    new Header("reply-to", replyTo), new Header("correlation-id", corr),
                    new Header("content-type", "application/json")), argsJson.getBytes(StandardCharsets.UTF_8));
            Frame answer = w.get(link.timeoutMs, TimeUnit.MILLISECONDS);
            JsonValue root = JsonValue.parse(answer.body());
            if (!Boolean.TRUE.equals(root.get("ok").value)) {
                JsonValue err = root.get("error");
                throw BrokerErrors.exception((String) err.get("code").value, "pymq broker: " + err.get("message").value);
            }
            return root.get("result");
        } catch (ExecutionException e) {
            if (e.getCause() instanceof Lost lost) {
                throw lost;
            }
            JMSException f = link.failure();
            throw f != null ? f : new JMSException(e.toString());
        } catch (TimeoutException e) {
            throw new JMSException("no answer to admin operation " + op + " within " + link.timeoutMs + " ms", "timeout");
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new JMSException("interrupted during admin operation " + op);
        } finally {
            waiting.remove(corr);
        }
    }

    /** A parsed JSON value: a Map, List, String, Boolean, Long, Double or null, wrapped for easy walking. */
    static final class JsonValue {
        final Object value;

        JsonValue(Object value) {
            this.value = value;
        }

        static JsonValue parse(byte[] body) throws JMSException {
            try (JsonParser p = JSON.createParser(body)) {
                p.nextToken();
                return new JsonValue(read(p));
            } catch (IOException e) {
                throw new JMSException("the broker's admin answer is not JSON: " + e.getMessage());
            }
        }

        private static Object read(JsonParser p) throws IOException {
            JsonToken t = p.currentToken();
            switch (t) {
                case START_OBJECT -> {
                    Map<String, Object> m = new LinkedHashMap<>();
                    while (p.nextToken() == JsonToken.FIELD_NAME) {
                        String k = p.currentName();
                        p.nextToken();
                        m.put(k, read(p));
                    }
                    return m;
                }
                case START_ARRAY -> {
                    List<Object> l = new ArrayList<>();
                    while (p.nextToken() != JsonToken.END_ARRAY) {
                        l.add(read(p));
                    }
                    return l;
                }
                case VALUE_STRING -> {
                    return p.getText();
                }
                case VALUE_NUMBER_INT -> {
                    return p.getLongValue();
                }
                case VALUE_NUMBER_FLOAT -> {
                    return p.getDoubleValue();
                }
                case VALUE_TRUE -> {
                    return Boolean.TRUE;
                }
                case VALUE_FALSE -> {
                    return Boolean.FALSE;
                }
                default -> {
                    return null;
                }
            }
        }

        JsonValue get(String key) {
            return new JsonValue(value instanceof Map<?, ?> m ? m.get(key) : null);
        }

        List<JsonValue> items() {
            List<JsonValue> out = new ArrayList<>();
            if (value instanceof List<?> l) {
                l.forEach(v -> out.add(new JsonValue(v)));
            }
            return out;
        }
    }

    /** The durable subscription named {@code key} (the broker's {@code sub:<owner>:<name>}), or null. */
    JsonValue findSubscription(String key) throws JMSException {
        for (JsonValue topic : call("list-topics", "{}").items()) {
            for (JsonValue sub : topic.get("subscriptions").items()) {
                if (key.equals(sub.get("name").value)) {
                    return sub;
                }
            }
        }
        return null;
    }
}
