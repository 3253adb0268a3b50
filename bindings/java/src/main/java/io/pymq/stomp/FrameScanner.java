package io.pymq.stomp;

import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * An incremental STOMP frame parser (sans-IO).  Feed it bytes as they arrive, in any split; it returns the
 * complete frames found so far and keeps at most one partial frame.  After an error it stays failed (its
 * connection is about to close).
 *
 * <p>The rules are spec/stomp.md §2, the vectors spec/vectors/frames.json: EOLs between frames are
 * heart-beats; lines end in LF or CRLF; a header splits at its first colon and is never trimmed; the first
 * of a repeated header wins; from 1.1 on names and values are unescaped except in CONNECT, STOMP and
 * CONNECTED; a body is content-length bytes followed by NUL, or runs to the first NUL.  Limits are checked
 * as soon as they are known (a declared content-length over the limit fails before the body arrives).
 *
 * <p>{@link #feed} returns right after a CONNECT, STOMP or CONNECTED frame and keeps later bytes buffered:
 * they must be parsed with the version that frame negotiates.  Set the version, then feed an empty array.
 */
public final class FrameScanner {
    public static final int DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024;
    public static final int DEFAULT_MAX_HEADERS = 1000;

    private int maxFrameSize = DEFAULT_MAX_FRAME_SIZE;
    private int maxHeaders = DEFAULT_MAX_HEADERS;
    private String version;

    private byte[] buf = new byte[4096];
    private int len;      // bytes held
    private int pos;      // start of the frame being scanned; bytes before it are consumed
    private int scan;     // where to resume looking for the header end or the NUL (no rescans)
    private StompException failed;
    private Pending pending;   // a frame whose headers are parsed but whose body has not fully arrived

    private record Pending(String command, List<Header> headers, long length, int bodyStart) {
    }

    public FrameScanner(String version) {
        this.version = version;
    }

    public String version() {
        return version;
    }

    /** The version that drives unescaping ("1.0" does none); set once CONNECTED settles it. */
    public void version(String version) {
        this.version = version;
    }

    public void maxFrameSize(int limit) {
        this.maxFrameSize = limit;
    }

    public void maxHeaders(int limit) {
        this.maxHeaders = limit;
    }

    /** Bytes held for a frame that has not completed yet. */
    public int buffered() {
        return len - pos;
    }

    /** Adds {@code data} and returns the frames it completes. */
    public List<Frame> feed(byte[] data) throws StompException {
        return feed(data, 0, data.length);
    }

    public List<Frame> feed(byte[] data, int offset, int count) throws StompException {
        if (failed != null) {
            throw failed;
        }
        append(data, offset, count);
        List<Frame> frames = new ArrayList<>();
        while (true) {
            Frame f;
            try {
                f = next();
            } catch (StompException e) {
                failed = e;
                buf = new byte[0];
                len = pos = scan = 0;
                pending = null;
                throw e;
            }
            if (f == null) {
                break;
            }
            frames.add(f);
            if (Stomp.unescapedCommand(f.command())) {
                break; // what follows waits for the version this frame negotiates
            }
        }
        if (pos > 0) {
            // compact once per feed, not once per frame: many small frames per read stay linear
            System.arraycopy(buf, pos, buf, 0, len - pos);
            len -= pos;
            scan -= pos;
            pos = 0;
        }
        return frames;
    }

    private void append(byte[] data, int offset, int count) {
        if (count == 0) {
            return;
        }
        if (len + count > buf.length) {
            buf = Arrays.copyOf(buf, Math.max(buf.length * 2, len + count));
        }
        System.arraycopy(data, offset, buf, len, count);
        len += count;
    }

    private Frame next() throws StompException {
        int limit = maxFrameSize;
        int n = len;
        int p = pos;
        if (pending == null) {
            while (p < n && (buf[p] == '\n' || buf[p] == '\r')) { // heart-beats
                if (buf[p] == '\r') {
                    if (p + 1 >= n) {
                        break; // a CR whose LF has not arrived yet
                    }
                    if (buf[p + 1] != '\n') {
                        throw new StompException(StompException.MALFORMED_FRAME, "stray CR before a command");
                    }
                }
                p++;
            }
            pos = p;
            if (scan < p) {
                scan = p;
            }
            if (p >= n || buf[p] == '\r') {
                return null;
            }
            long[] end = headerEnd(p);
            if (end == null) {
                if (n - p > limit) {
                    throw StompException.tooLarge(n - p, limit);
                }
                return null;
            }
            int headLen = (int) end[0];
            int bodyStart = (int) end[1];
            if (bodyStart > limit) {
                throw StompException.tooLarge(bodyStart, limit);
            }
            pending = parseHead(p, headLen, bodyStart);
            scan = p + bodyStart;
        }
        Pending pf = pending;
        int b = p + pf.bodyStart;
        int end;
        if (pf.length >= 0) {
            if (pf.length > (long) limit - pf.bodyStart) {
                long size = pf.bodyStart + pf.length;
                if (size < 0) {
                    size = Long.MAX_VALUE;
                }
                throw StompException.tooLarge(size, limit);
            }
            int length = (int) pf.length;
            if (n < b + length + 1) {
                return null;
            }
            if (buf[b + length] != 0) {
                throw new StompException(StompException.MALFORMED_FRAME, pf.command
                        + " frame: expected NUL after " + length + " body bytes (content-length)");
            }
            end = b + length;
        } else {
            int i = indexOf(buf, (byte) 0, scan, n);
            if (i < 0) {
                if (n - p > limit) {
                    throw StompException.tooLarge(n - p, limit);
                }
                scan = n;
                return null;
            }
            end = i;
            if (end - p > limit) {
                throw StompException.tooLarge(end - p, limit);
            }
        }
        byte[] body = Arrays.copyOfRange(buf, b, end);
        pos = scan = end + 1;
        pending = null;
        return new Frame(pf.command, pf.headers, body);
    }

    private static int indexOf(byte[] a, byte v, int from, int to) {
        for (int i = from; i < to; i++) {
            if (a[i] == v) {
                return i;
            }
        }
        return -1;
    }

    /**
     * The length of the command and header text and the offset of the body, both relative to p, or null
     * while the blank line has not arrived.  Resumes where the last search stopped.
     */
    private long[] headerEnd(int p) {
        int n = len;
        int from = Math.max(scan - 2, p);
        while (true) {
            int i = indexOf(buf, (byte) '\n', from, n);
            if (i < 0 || i + 1 >= n) {
                break;
            }
            if (buf[i + 1] == '\n') {
                return new long[] {i - p, i + 2 - p};
            }
            if (buf[i + 1] == '\r') {
                if (i + 2 >= n) {
                    scan = Math.max(n - 2, p);
                    return null;
                }
                if (buf[i + 2] == '\n') {
                    return new long[] {i - p, i + 3 - p};
                }
            }
            from = i + 1;
        }
        scan = Math.max(n - 2, p);
        return null;
    }

    private Pending parseHead(int start, int headLen, int bodyStart) throws StompException {
        if (indexOf(buf, (byte) 0, start, start + headLen) >= 0) {
            throw new StompException(StompException.MALFORMED_FRAME, "NUL inside the header block");
        }
        String head;
        try {
            CharsetDecoder dec = StandardCharsets.UTF_8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT);
            CharBuffer chars = dec.decode(ByteBuffer.wrap(buf, start, headLen));
            head = chars.toString();
        } catch (CharacterCodingException e) {
            throw new StompException(StompException.MALFORMED_FRAME, "frame header is not valid UTF-8");
        }
        String[] lines = head.split("\n", -1);
        String command = stripCr(lines[0]);
        if (command.isEmpty()) {
            throw new StompException(StompException.MALFORMED_FRAME, "empty command line");
        }
        boolean escaped = !Stomp.V10.equals(version) && !Stomp.unescapedCommand(command);
        if (lines.length - 1 > maxHeaders) {
            throw new StompException(StompException.MALFORMED_FRAME, command + " frame has " + (lines.length - 1)
                    + " headers, more than the limit of " + maxHeaders);
        }
        List<Header> headers = new ArrayList<>(lines.length - 1);
        Set<String> seen = new HashSet<>();
        for (int k = 1; k < lines.length; k++) {
            String line = stripCr(lines[k]);
            int colon = line.indexOf(':');
            if (colon < 0) {
                throw new StompException(StompException.MALFORMED_FRAME, command + " frame: header line without ':'");
            }
            if (colon == 0) {
                throw new StompException(StompException.MALFORMED_FRAME, command + " frame: header with an empty name");
            }
            String name = line.substring(0, colon);
            String value = line.substring(colon + 1);
            if (escaped) {
                name = Stomp.unescape(name);
                value = Stomp.unescape(value);
            }
            if (seen.add(name)) {
                headers.add(new Header(name, value));
            }
        }
        long length = -1;
        for (Header h : headers) {
            if (!h.name().equals("content-length")) {
                continue;
            }
            String v = h.value();
            if (v.isEmpty() || !v.chars().allMatch(c -> c >= '0' && c <= '9')) {
                throw new StompException(StompException.INVALID_HEADER, command + " frame: content-length \""
                        + v + "\" is not a non-negative integer");
            }
            // more digits than a long holds: certainly over any limit
            length = v.length() > 18 ? Long.MAX_VALUE : Long.parseLong(v);
        }
        return new Pending(command, headers, length, bodyStart);
    }

    private static String stripCr(String s) {
        return s.endsWith("\r") ? s.substring(0, s.length() - 1) : s;
    }
}
