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
 *
 * <p>A large body of known length ({@link #LARGE_BODY} or more, its content-length read) is filled directly:
 * once its head is parsed the body gets its own array of the declared length, and what arrives goes straight
 * into it, one copy after the socket read, instead of into the frame buffer (grown to hold it) and then
 * copied out of it (an Arrow range answer of tens of MiB paid both on every read).  At most
 * {@link #PREALLOCATE} bytes are allocated on the declaration alone; past it the array grows as bytes come,
 * so a declared length holds only what arrived (the Python scanner's rule, _ext/scanner.pyx).
 */
public final class FrameScanner {
    public static final int DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024;
    public static final int DEFAULT_MAX_HEADERS = 1000;
    /** A body of this many bytes or more, content-length known, is filled directly as it arrives. */
    public static final int LARGE_BODY = 64 * 1024;
    /** The most a body's declared length allocates before its bytes arrive. */
    public static final int PREALLOCATE = 64 * 1024 * 1024;

    private int maxFrameSize = DEFAULT_MAX_FRAME_SIZE;
    private int maxHeaders = DEFAULT_MAX_HEADERS;
    private String version;

    private byte[] buf = new byte[4096];
    private int len;      // bytes held
    private int pos;      // start of the frame being scanned; bytes before it are consumed
    private int scan;     // where to resume looking for the header end or the NUL (no rescans)
    private StompException failed;
    private Pending pending;   // a frame whose headers are parsed but whose body has not fully arrived
    private byte[] body;       // the pending frame's large body being filled as bytes arrive, or null
    private int have;          // bytes of it filled (its length: the declared one, once grown to it)
    int preallocate = PREALLOCATE;   // tests make it small to check the growth

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
        return len - pos + have;
    }

    /** The frame buffer's size (tests: a large body never grows it). */
    int capacity() {
        return buf.length;
    }

    /** Adds {@code data} and returns the frames it completes. */
    public List<Frame> feed(byte[] data) throws StompException {
        return feed(data, 0, data.length);
    }

    public List<Frame> feed(byte[] data, int offset, int count) throws StompException {
        if (failed != null) {
            throw failed;
        }
        if (body != null) {
            int used = fill(data, offset, count);
            offset += used;
            count -= used;
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
                body = null;
                have = 0;
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

    /** Copies what {@code data} holds of the large body being filled into it; returns how many bytes. */
    private int fill(byte[] data, int offset, int count) {
        int length = (int) pending.length;
        int take = Math.min(count, length - have);
        if (take <= 0) {
            return 0;
        }
        if (have + take > body.length) {   // past what the declaration alone allocated: grow as bytes come
            body = Arrays.copyOf(body, (int) Math.min(length, Math.max(2L * body.length, have + take)));
        }
        System.arraycopy(data, offset, body, have, take);
        have += take;
        return take;
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
        if (body != null) {
            return filled();
        }
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
                if (length >= LARGE_BODY) {
                    // the rest goes straight into the body: what the buffer holds of it now, then feed's bytes
                    body = new byte[Math.min(length, Math.max(preallocate, n - b))];
                    System.arraycopy(buf, b, body, 0, n - b);
                    have = n - b;
                    pos = scan = n;
                }
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

    /** The large body's frame once the body is full and its NUL has arrived; null before. */
    private Frame filled() throws StompException {
        Pending pf = pending;
        if (have < pf.length || pos >= len) {
            return null;
        }
        if (buf[pos] != 0) {
            throw new StompException(StompException.MALFORMED_FRAME, pf.command
                    + " frame: expected NUL after " + pf.length + " body bytes (content-length)");
        }
        byte[] full = body;    // grown at most to the declared length, so exactly full now
        body = null;
        have = 0;
        pending = null;
        pos = scan = pos + 1;
        return new Frame(pf.command, pf.headers, full);
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
