package io.pymq.spark;

/**
 * The connector's one error type: {@link #code()} says which kind, with the names of pymq's Python error
 * tree ({@code pymq.errors}), so a test harness (and a user reading a failed task) can tell them apart and
 * the Python data source's tests run against this implementation unchanged.
 *
 * <ul>
 *   <li>{@code config}: a wrong option or a query the broker says cannot be read ({@code ConfigError});</li>
 *   <li>{@code data-loss}: messages planned for a read are gone ({@code DataLoss}; {@link #requested()},
 *       {@link #earliest()});</li>
 *   <li>{@code connection-closed}, {@code connect-failed}, {@code timeout}: the connection failed, not the
 *       request; the same request on a new connection is safe ({@link #retryable()});</li>
 *   <li>{@code message-format}: a row the sink cannot send, or an answer of the broker that is not a pymq
 *       message batch (malformed Arrow);</li>
 *   <li>any other: the {@code pymq-code} of the broker's ERROR frame (spec/stomp.md §6).</li>
 * </ul>
 */
public class PymqException extends RuntimeException {
    public static final String CONFIG = "config";
    public static final String DATA_LOSS = "data-loss";
    public static final String CONNECTION_CLOSED = "connection-closed";
    public static final String CONNECT_FAILED = "connect-failed";
    public static final String TIMEOUT = "timeout";
    public static final String MESSAGE_FORMAT = "message-format";

    private final String code;
    private final String destination;
    private final long requested;
    private final long earliest;

    public PymqException(String code, String message) {
        this(code, message, null);
    }

    public PymqException(String code, String message, Throwable cause) {
        super(message, cause);
        this.code = code;
        this.destination = null;
        this.requested = -1;
        this.earliest = -1;
    }

    private PymqException(String message, String destination, long requested, long earliest) {
        super(message);
        this.code = DATA_LOSS;
        this.destination = destination;
        this.requested = requested;
        this.earliest = earliest;
    }

    public static PymqException config(String message) {
        return new PymqException(CONFIG, message);
    }

    public static PymqException dataLoss(String message, String destination, long requested, long earliest) {
        return new PymqException(message, destination, requested, earliest);
    }

    public static PymqException format(String message) {
        return new PymqException(MESSAGE_FORMAT, message);
    }

    public String code() {
        return code;
    }

    /** A failure of the connection rather than of the request. */
    public boolean retryable() {
        return code.equals(CONNECTION_CLOSED) || code.equals(CONNECT_FAILED) || code.equals(TIMEOUT);
    }

    public String destination() {
        return destination;
    }

    public long requested() {
        return requested;
    }

    public long earliest() {
        return earliest;
    }
}
