package io.pymq.jms;

import io.pymq.stomp.Frame;
import io.pymq.stomp.Header;
import jakarta.jms.IllegalStateException;
import jakarta.jms.InvalidClientIDException;
import jakarta.jms.InvalidDestinationException;
import jakarta.jms.InvalidSelectorException;
import jakarta.jms.JMSException;
import jakarta.jms.JMSSecurityException;
import jakarta.jms.MessageFormatException;
import jakarta.jms.ResourceAllocationException;
import jakarta.jms.TransactionRolledBackException;

import java.util.Map;
import java.util.TreeMap;

/**
 * The broker's error codes ({@code pymq-code}, spec/stomp.md §6; the registry {@code ERROR_CODES} of
 * pymq/errors.py) as JMS exception types: the one table this provider maps them with.  The exception's
 * {@link JMSException#getErrorCode() error code} is the {@code pymq-code}; its message is the broker's
 * sentence followed by the structured {@code pymq-field-*} values.  Codes this table does not name (a
 * newer broker's) become a plain JMSException, as pymq.errors makes them a plain PymqError.
 */
final class BrokerErrors {
    private BrokerErrors() {
    }

    /** What a code becomes; codes not listed are a plain JMSException. */
    enum Kind {
        SECURITY, INVALID_DESTINATION, INVALID_SELECTOR, ILLEGAL_STATE, RESOURCE, MESSAGE_FORMAT, TRANSACTION, PLAIN
    }

    static final Map<String, Kind> CODES = Map.ofEntries(
            Map.entry("authentication-failed", Kind.SECURITY),
            Map.entry("access-denied", Kind.SECURITY),
            Map.entry("invalid-destination", Kind.INVALID_DESTINATION),
            Map.entry("unknown-destination", Kind.INVALID_DESTINATION),
            Map.entry("destination-exists", Kind.INVALID_DESTINATION),
            Map.entry("invalid-selector", Kind.INVALID_SELECTOR),
            Map.entry("illegal-state", Kind.ILLEGAL_STATE),
            Map.entry("resource-limit", Kind.RESOURCE),
            Map.entry("queue-full", Kind.RESOURCE),
            Map.entry("frame-too-large", Kind.RESOURCE),
            Map.entry("message-format", Kind.MESSAGE_FORMAT),
            Map.entry("schema-violation", Kind.MESSAGE_FORMAT),
            Map.entry("transaction", Kind.TRANSACTION),
            // a broken frame or protocol step is a provider error: a plain JMSException
            Map.entry("protocol", Kind.PLAIN), Map.entry("malformed-frame", Kind.PLAIN),
            Map.entry("bad-escape", Kind.PLAIN), Map.entry("unknown-command", Kind.PLAIN),
            Map.entry("missing-header", Kind.PLAIN), Map.entry("invalid-header", Kind.PLAIN),
            Map.entry("unsupported-version", Kind.PLAIN), Map.entry("unknown-subscription", Kind.PLAIN),
            Map.entry("unknown-message", Kind.PLAIN), Map.entry("heartbeat-timeout", Kind.PLAIN),
            Map.entry("connection-closed", Kind.PLAIN), Map.entry("connect-failed", Kind.PLAIN),
            Map.entry("storage", Kind.PLAIN), Map.entry("cluster", Kind.PLAIN), Map.entry("config", Kind.PLAIN),
            Map.entry("data-loss", Kind.PLAIN), Map.entry("timeout", Kind.PLAIN), Map.entry("error", Kind.PLAIN));

    /** The exception for a code and message (also used for admin answers, which carry the same codes). */
    static JMSException exception(String code, String message) {
        Kind kind = CODES.getOrDefault(code == null ? "" : code, Kind.PLAIN);
        return switch (kind) {
            case SECURITY -> new JMSSecurityException(message, code);
            case INVALID_DESTINATION -> new InvalidDestinationException(message, code);
            case INVALID_SELECTOR -> new InvalidSelectorException(message, code);
            case ILLEGAL_STATE -> new IllegalStateException(message, code);
            case RESOURCE -> new ResourceAllocationException(message, code);
            case MESSAGE_FORMAT -> new MessageFormatException(message, code);
            case TRANSACTION -> new TransactionRolledBackException(message, code);
            case PLAIN -> new JMSException(message, code);
        };
    }

    /** The exception an ERROR frame describes; {@code connecting}: it answered CONNECT. */
    static JMSException fromFrame(Frame error, boolean connecting) {
        String code = error.get("pymq-code");
        String message = error.get("message");
        if (message == null || message.isEmpty()) {
            message = new String(error.body(), java.nio.charset.StandardCharsets.UTF_8).strip();
        }
        if (message.isEmpty()) {
            message = "broker error";
        }
        Map<String, String> fields = new TreeMap<>();
        for (Header h : error.headers()) {
            if (h.name().startsWith("pymq-field-")) {
                fields.put(h.name().substring("pymq-field-".length()), h.value());
            }
        }
        String text = "pymq broker: " + message + (fields.isEmpty() ? "" : " " + fields)
                + (code == null ? "" : " [" + code + "]");
        if (connecting && "illegal-state".equals(code)) {
            // the one illegal-state a CONNECT can meet: the client id is held by another connection
            return new InvalidClientIDException(text, code);
        }
        return exception(code, text);
    }
}
