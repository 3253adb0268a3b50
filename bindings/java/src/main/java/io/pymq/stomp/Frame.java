package io.pymq.stomp;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * One STOMP frame.  {@link #headers()} holds each name once (its first occurrence, spec/stomp.md §2) in
 * arrival order.  Frames are values: the scanner hands out fresh ones and nothing mutates them.
 */
public record Frame(String command, List<Header> headers, byte[] body) {
    public static final byte[] NO_BODY = new byte[0];

    public Frame {
        headers = List.copyOf(headers);
        body = body == null ? NO_BODY : body;
    }

    public Frame(String command, List<Header> headers) {
        this(command, headers, NO_BODY);
    }

    /** The value of the named header, or null when it is absent. */
    public String get(String name) {
        for (Header h : headers) {
            if (h.name().equals(name)) {
                return h.value();
            }
        }
        return null;
    }

    /** The value of the named header, or {@code fallback} when it is absent. */
    public String get(String name, String fallback) {
        String v = get(name);
        return v == null ? fallback : v;
    }

    /** The headers as an ordered map (each name once, the first value). */
    public Map<String, String> headerMap() {
        Map<String, String> m = new LinkedHashMap<>();
        for (Header h : headers) {
            m.putIfAbsent(h.name(), h.value());
        }
        return m;
    }

    @Override
    public String toString() {
        return "Frame[" + command + " " + headers + " " + body.length + " body bytes]";
    }
}
