package io.pymq.stomp;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.List;

/**
 * STOMP versions, header escaping and the frame encoder (spec/stomp.md §2; vectors:
 * spec/vectors/frames.json, shared with the Python reference {@code pymq/protocol/_scanner_py.py}).
 *
 * <p>From 1.1 on, names and values are escaped ({@code \r \n \c \\}; 1.1 has no {@code \r}, so a CR
 * travels raw there) except in CONNECT, STOMP and CONNECTED (the 1.2 rule, kept for every version).
 * 1.0 has no escaping: a header that cannot be written raw is refused rather than corrupting the stream.
 * Nothing here does I/O.
 */
public final class Stomp {
    public static final String V10 = "1.0";
    public static final String V11 = "1.1";
    public static final String V12 = "1.2";

    private Stomp() {
    }

    /** Frames whose headers are never escaped. */
    public static boolean unescapedCommand(String command) {
        return command.equals("CONNECT") || command.equals("STOMP") || command.equals("CONNECTED");
    }

    /** STOMP 1.2 header escaping. */
    public static String escape(String s) {
        return escapeFor(s, V12);
    }

    /** The header escaping of a version: 1.2 escapes CR, 1.1 sends it raw. */
    public static String escapeFor(String s, String version) {
        boolean cr = !V11.equals(version);
        StringBuilder b = null;
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            String rep = switch (c) {
                case '\\' -> "\\\\";
                case '\n' -> "\\n";
                case ':' -> "\\c";
                case '\r' -> cr ? "\\r" : null;
                default -> null;
            };
            if (rep == null) {
                if (b != null) {
                    b.append(c);
                }
                continue;
            }
            if (b == null) {
                b = new StringBuilder(s.length() + 8).append(s, 0, i);
            }
            b.append(rep);
        }
        return b == null ? s : b.toString();
    }

    /** Undoes {@link #escape}; an undefined escape or a lone trailing backslash is a bad-escape error. */
    public static String unescape(String s) throws StompException {
        if (s.indexOf('\\') < 0) {
            return s;
        }
        StringBuilder b = new StringBuilder(s.length());
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c != '\\') {
                b.append(c);
                continue;
            }
            if (i + 1 >= s.length()) {
                throw new StompException(StompException.BAD_ESCAPE, "header ends with a lone backslash");
            }
            char e = s.charAt(++i);
            switch (e) {
                case 'r' -> b.append('\r');
                case 'n' -> b.append('\n');
                case 'c' -> b.append(':');
                case '\\' -> b.append('\\');
                default -> throw new StompException(StompException.BAD_ESCAPE,
                        "undefined escape sequence '\\" + e + "' in header");
            }
        }
        return b.toString();
    }

    /**
     * Writes one frame.  A content-length header in {@code headers} is ignored and one is added whenever
     * the body is not empty.  With version 1.0, and for CONNECT/STOMP/CONNECTED, headers go unescaped; a
     * name or value that cannot be written that way (a LF, or a ':' in a name) is an invalid-header error.
     */
    public static byte[] encode(String command, List<Header> headers, byte[] body, String version)
            throws StompException {
        boolean raw = V10.equals(version) || unescapedCommand(command);
        StringBuilder b = new StringBuilder(64 + 32 * headers.size());
        b.append(command).append('\n');
        for (Header h : headers) {
            if (h.name().equals("content-length")) {
                continue;
            }
            if (raw) {
                if (h.name().indexOf('\n') >= 0 || h.value().indexOf('\n') >= 0 || h.name().indexOf(':') >= 0) {
                    throw new StompException(StompException.INVALID_HEADER, "header \"" + h.name()
                            + "\" cannot be sent unescaped in a " + command + " frame (STOMP " + version + ")");
                }
                b.append(h.name()).append(':').append(h.value());
            } else {
                b.append(escapeFor(h.name(), version)).append(':').append(escapeFor(h.value(), version));
            }
            b.append('\n');
        }
        int length = body == null ? 0 : body.length;
        if (length > 0) {
            b.append("content-length:").append(length).append('\n');
        }
        b.append('\n');
        byte[] head = b.toString().getBytes(StandardCharsets.UTF_8);
        ByteArrayOutputStream out = new ByteArrayOutputStream(head.length + length + 1);
        out.writeBytes(head);
        if (length > 0) {
            out.write(body, 0, length);
        }
        out.write(0);
        return out.toByteArray();
    }

    /** {@link #encode} for frames whose headers are known to be writable (the provider's own frames). */
    public static byte[] encodeChecked(String command, List<Header> headers, byte[] body, String version) {
        try {
            return encode(command, headers, body, version);
        } catch (StompException e) {
            throw new IllegalArgumentException(e.getMessage(), e);
        }
    }
}
