package io.pymq.stomp;

import org.junit.jupiter.api.Test;

import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * A large body of known length is filled directly as its bytes arrive (FrameScanner's class comment): one copy
 * after the socket read, the frame buffer never grown to hold it, the same frames whatever the split.  Before,
 * the body went into the frame buffer (doubled up to its size) and was then copied out with copyOfRange.
 */
class LargeBodyTest {
    private static byte[] frame(String command, byte[] body, String... headers) {
        StringBuilder head = new StringBuilder(command).append('\n');
        for (String h : headers) {
            head.append(h).append('\n');
        }
        head.append("content-length:").append(body.length).append("\n\n");
        byte[] h = head.toString().getBytes(StandardCharsets.UTF_8);
        byte[] out = Arrays.copyOf(h, h.length + body.length + 1);
        System.arraycopy(body, 0, out, h.length, body.length);
        return out;    // the NUL is the array's last (zero) byte
    }

    private static byte[] concat(byte[]... parts) {
        int n = 0;
        for (byte[] p : parts) {
            n += p.length;
        }
        byte[] out = new byte[n];
        int at = 0;
        for (byte[] p : parts) {
            System.arraycopy(p, 0, out, at, p.length);
            at += p.length;
        }
        return out;
    }

    private static byte[] body(int n, long seed) {
        byte[] b = new byte[n];
        new Random(seed).nextBytes(b);
        return b;
    }

    private static List<Frame> feedIn(FrameScanner s, byte[] data, int[] cuts) throws StompException {
        List<Frame> frames = new ArrayList<>();
        int at = 0;
        for (int cut : cuts) {
            frames.addAll(s.feed(data, at, cut - at));
            at = cut;
        }
        frames.addAll(s.feed(data, at, data.length - at));
        return frames;
    }

    @Test
    void theSameFramesWhateverTheSplitAndTheBufferStaysSmall() throws StompException {
        for (int size : new int[] {FrameScanner.LARGE_BODY - 1, FrameScanner.LARGE_BODY, 1 << 20}) {
            byte[] big = body(size, size);
            byte[] head = frame("MESSAGE", new byte[0], "subscription:s", "message-id:1");
            byte[] data = concat("\n".getBytes(StandardCharsets.UTF_8), frame("MESSAGE", big, "subscription:s"),
                    head, "\n".getBytes(StandardCharsets.UTF_8));
            int bodyAt = data.length - head.length - 2 - size;          // the first body byte
            int nulAt = bodyAt + size;
            List<int[]> splits = new ArrayList<>(List.of(
                    new int[] {}, new int[] {bodyAt}, new int[] {bodyAt + 1}, new int[] {nulAt}, new int[] {nulAt + 1},
                    new int[] {bodyAt - 3, bodyAt + 10, nulAt - 1, nulAt}, new int[] {nulAt, nulAt + 1, nulAt + 2}));
            Random r = new Random(7);
            for (int k = 0; k < 3; k++) {
                List<Integer> cuts = new ArrayList<>();
                for (int at = 1 + r.nextInt(9000); at < data.length; at += 1 + r.nextInt(9000)) {
                    cuts.add(at);
                }
                splits.add(cuts.stream().mapToInt(Integer::intValue).toArray());
            }
            for (int[] cuts : splits) {
                FrameScanner s = new FrameScanner(Stomp.V12);
                s.maxFrameSize(64 * 1024 * 1024);
                List<Frame> frames = feedIn(s, data, cuts);
                String where = "size " + size + " cuts " + Arrays.toString(Arrays.copyOf(cuts, Math.min(cuts.length, 5)));
                assertEquals(2, frames.size(), where);
                assertArrayEquals(big, frames.get(0).body(), where);
                assertEquals("1", frames.get(1).get("message-id"), where);
                assertEquals(0, s.buffered(), where);
                if (size >= FrameScanner.LARGE_BODY && cuts.length > 0 && cuts[0] < nulAt) {
                    // the body was filled directly: the frame buffer held heads and reads, never the body
                    assertTrue(s.capacity() < 64 * 1024, where + ": buffer grew to " + s.capacity());
                }
            }
        }
    }

    @Test
    void aLargeBodyIsCopiedOnceAfterTheRead() throws StompException {
        com.sun.management.ThreadMXBean threads = (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();
        int size = 16 * 1024 * 1024;
        byte[] data = frame("MESSAGE", body(size, 1), "subscription:s");
        byte[] read = new byte[64 * 1024];                            // the socket's reads, reused
        FrameScanner s = new FrameScanner(Stomp.V12);
        s.maxFrameSize(64 * 1024 * 1024);
        long before = threads.getThreadAllocatedBytes(Thread.currentThread().getId());
        List<Frame> frames = new ArrayList<>();
        for (int at = 0; at < data.length; at += read.length) {
            int n = Math.min(read.length, data.length - at);
            System.arraycopy(data, at, read, 0, n);
            frames.addAll(s.feed(read, 0, n));
        }
        long allocated = threads.getThreadAllocatedBytes(Thread.currentThread().getId()) - before;
        assertEquals(1, frames.size());
        assertEquals(size, frames.get(0).body().length);
        // the body once (16 MiB) and small change; before: a buffer doubled up to 32 MiB, then the body copied out
        assertTrue(allocated < size + size / 4, "allocated " + allocated + " bytes for a " + size + "-byte body");
    }

    @Test
    void pastWhatTheDeclarationAllocatesTheBodyGrowsAsBytesCome() throws StompException {
        byte[] big = body(200_000, 3);
        byte[] data = concat(frame("MESSAGE", big, "subscription:s"), frame("RECEIPT", new byte[0], "receipt-id:r"));
        FrameScanner s = new FrameScanner(Stomp.V12);
        s.preallocate = 1000;
        List<Frame> frames = new ArrayList<>();
        int held = 0;
        for (int at = 0; at < data.length; at += 1000) {
            frames.addAll(s.feed(data, at, Math.min(1000, data.length - at)));
            if (frames.isEmpty()) {
                assertTrue(s.buffered() > held, "buffered " + s.buffered());     // what arrived, counted
                held = s.buffered();
            }
        }
        assertEquals(2, frames.size());
        assertArrayEquals(big, frames.get(0).body());
        assertEquals("r", frames.get(1).get("receipt-id"));
    }

    @Test
    void aByteOtherThanNulAfterTheBodyFailsAndTheScannerStaysFailed() throws StompException {
        byte[] data = frame("MESSAGE", body(100_000, 4), "subscription:s");
        data[data.length - 1] = 'x';
        FrameScanner s = new FrameScanner(Stomp.V12);
        assertTrue(s.feed(data, 0, 50_000).isEmpty());
        StompException e = assertThrows(StompException.class, () -> s.feed(data, 50_000, data.length - 50_000));
        assertEquals(StompException.MALFORMED_FRAME, e.code());
        assertTrue(e.getMessage().contains("expected NUL after 100000 body bytes"), e.getMessage());
        assertEquals(0, s.buffered());
        assertThrows(StompException.class, () -> s.feed("SEND\n\n\0".getBytes(StandardCharsets.UTF_8)));
    }
}
