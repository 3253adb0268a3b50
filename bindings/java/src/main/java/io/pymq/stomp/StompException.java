package io.pymq.stomp;

/**
 * A framing error.  {@link #code()} is the wire code of spec/stomp.md §6 (malformed-frame, bad-escape,
 * frame-too-large, invalid-header); for frame-too-large, {@link #size()} and {@link #limit()} say by
 * how much.
 */
public final class StompException extends Exception {
    public static final String MALFORMED_FRAME = "malformed-frame";
    public static final String BAD_ESCAPE = "bad-escape";
    public static final String FRAME_TOO_LARGE = "frame-too-large";
    public static final String INVALID_HEADER = "invalid-header";

    private final String code;
    private final long size;
    private final long limit;

    public StompException(String code, String message) {
        this(code, message, 0, 0);
    }

    private StompException(String code, String message, long size, long limit) {
        super(message);
        this.code = code;
        this.size = size;
        this.limit = limit;
    }

    static StompException tooLarge(long size, long limit) {
        return new StompException(FRAME_TOO_LARGE,
                "frame of " + size + " bytes exceeds the limit of " + limit + " bytes", size, limit);
    }

    public String code() {
        return code;
    }

    public long size() {
        return size;
    }

    public long limit() {
        return limit;
    }
}
