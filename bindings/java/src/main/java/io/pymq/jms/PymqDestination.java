package io.pymq.jms;

import jakarta.jms.Destination;
import jakarta.jms.InvalidDestinationException;

import java.io.Serializable;
import java.util.Objects;

/**
 * A pymq destination: a value named by its STOMP destination ({@code /queue/x}, {@code /topic/x},
 * {@code /temp-queue/x}, {@code /temp-topic/x}, spec/stomp.md §3).  Equal names are equal destinations.
 */
public abstract class PymqDestination implements Destination, Serializable {
    private static final long serialVersionUID = 1L;

    static final String QUEUE_PREFIX = "/queue/";
    static final String TOPIC_PREFIX = "/topic/";
    static final String TEMP_QUEUE_PREFIX = "/temp-queue/";
    static final String TEMP_TOPIC_PREFIX = "/temp-topic/";

    private final String name;

    PymqDestination(String name) {
        this.name = name;
    }

    /** The name without its prefix. */
    public String name() {
        return name;
    }

    abstract String prefix();

    /** The STOMP destination ({@code /queue/orders}). */
    public String stompName() {
        return prefix() + name;
    }

    /**
     * The destination a STOMP name stands for, or null for a name of no known form (a foreign client's
     * destination: as the Python SDK, the message then has no JMSDestination / JMSReplyTo).
     */
    public static PymqDestination fromStompName(String stompName) {
        if (stompName == null) {
            return null;
        }
        if (stompName.startsWith(TEMP_QUEUE_PREFIX) && stompName.length() > TEMP_QUEUE_PREFIX.length()) {
            return new PymqTemporaryQueue(stompName.substring(TEMP_QUEUE_PREFIX.length()), null);
        }
        if (stompName.startsWith(TEMP_TOPIC_PREFIX) && stompName.length() > TEMP_TOPIC_PREFIX.length()) {
            return new PymqTemporaryTopic(stompName.substring(TEMP_TOPIC_PREFIX.length()), null);
        }
        if (stompName.startsWith(QUEUE_PREFIX) && stompName.length() > QUEUE_PREFIX.length()) {
            return new PymqQueue(stompName.substring(QUEUE_PREFIX.length()));
        }
        if (stompName.startsWith(TOPIC_PREFIX) && stompName.length() > TOPIC_PREFIX.length()) {
            return new PymqTopic(stompName.substring(TOPIC_PREFIX.length()));
        }
        return null;
    }

    /**
     * Checks a name as the broker would (1–255 characters, no control characters), so a bad name is an
     * exception here and not an ERROR that ends the connection.  A name given with its own prefix
     * ({@code "/queue/orders"} to createQueue) is accepted without it.
     */
    static String checkName(String name, String prefix, String what) throws InvalidDestinationException {
        if (name == null) {
            throw new InvalidDestinationException(what + " name must not be null");
        }
        if (name.startsWith(prefix)) {
            name = name.substring(prefix.length());
        } else if (name.startsWith(QUEUE_PREFIX) || name.startsWith(TOPIC_PREFIX) || name.startsWith(TEMP_QUEUE_PREFIX)
                || name.startsWith(TEMP_TOPIC_PREFIX)) {
            throw new InvalidDestinationException("\"" + name + "\" names another kind of destination than a " + what);
        }
        if (name.isEmpty() || name.length() > 255) {
            throw new InvalidDestinationException(what + " names are 1 to 255 characters, got " + name.length());
        }
        for (int i = 0; i < name.length(); i++) {
            if (Character.isISOControl(name.charAt(i))) {
                throw new InvalidDestinationException(what + " name must not contain control characters (position "
                        + i + ")");
            }
        }
        return name;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof PymqDestination d && d.stompName().equals(stompName());
    }

    @Override
    public int hashCode() {
        return Objects.hash(stompName());
    }

    @Override
    public String toString() {
        return stompName();
    }
}
