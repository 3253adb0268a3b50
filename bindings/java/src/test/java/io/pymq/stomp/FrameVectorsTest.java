package io.pymq.stomp;

import com.fasterxml.jackson.databind.JsonNode;
import io.pymq.testing.Vectors;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

/** spec/vectors/frames.json: each parse case whole, byte by byte and at three seeded random splits; encode. */
class FrameVectorsTest {
    private static final Map<String, String> CLASS_CODES = Map.of(
            "MalformedFrame", StompException.MALFORMED_FRAME, "BadEscape", StompException.BAD_ESCAPE,
            "FrameTooLarge", StompException.FRAME_TOO_LARGE, "InvalidHeader", StompException.INVALID_HEADER);

    static List<Integer> splits(int n, String mode, long seed) {
        List<Integer> cuts = new ArrayList<>();
        if (mode.equals("whole")) {
            cuts.add(n);
        } else if (mode.equals("bytewise")) {
            for (int i = 0; i < n; i++) {
                cuts.add(1);
            }
        } else {
            Random r = new Random(seed);
            int left = n;
            while (left > 0) {
                int c = 1 + r.nextInt(Math.max(1, Math.min(left, 7)));
                cuts.add(c);
                left -= c;
            }
        }
        return cuts;
    }

    static List<Frame> feedAll(FrameScanner s, byte[] data, List<Integer> chunks) throws StompException {
        List<Frame> frames = new ArrayList<>();
        int at = 0;
        for (int c : chunks) {
            frames.addAll(s.feed(data, at, c));
            at += c;
            // a CONNECT pauses the scanner: feed again (empty) as the connection would
            while (!frames.isEmpty() && Stomp.unescapedCommand(frames.get(frames.size() - 1).command())) {
                List<Frame> more = s.feed(new byte[0]);
                if (more.isEmpty()) {
                    break;
                }
                frames.addAll(more);
            }
        }
        if (chunks.isEmpty()) {
            frames.addAll(s.feed(new byte[0]));
        }
        return frames;
    }

    @TestFactory
    List<DynamicTest> parseVectors() {
        JsonNode v = Vectors.load("frames.json");
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode c : v.get("parse")) {
            byte[] data = Vectors.hex(c.get("input_hex").asText());
            String[] modes = {"whole", "bytewise", "random", "random", "random"};
            for (int i = 0; i < modes.length; i++) {
                String mode = modes[i];
                long seed = i;
                tests.add(DynamicTest.dynamicTest(c.get("name").asText() + "/" + mode + i, () -> runParse(c, data, mode, seed)));
            }
        }
        assertTrue(tests.size() > 100);
        return tests;
    }

    private static void runParse(JsonNode c, byte[] data, String mode, long seed) throws StompException {
        FrameScanner s = new FrameScanner(c.get("version").asText());
        if (c.has("max_frame_size")) {
            s.maxFrameSize(c.get("max_frame_size").asInt());
        }
        if (c.has("max_headers")) {
            s.maxHeaders(c.get("max_headers").asInt());
        }
        List<Integer> chunks = splits(data.length, mode, seed);
        if (c.has("error")) {
            StompException e = assertThrows(StompException.class, () -> feedAll(s, data, chunks));
            JsonNode err = c.get("error");
            assertEquals(CLASS_CODES.get(err.get("class").asText()), e.code(), e.getMessage());
            assertTrue(e.getMessage().contains(err.get("contains").asText()), e.getMessage());
            assertThrows(StompException.class, () -> s.feed("SEND\n\n\0".getBytes(StandardCharsets.UTF_8)),
                    "a failed scanner must stay failed");
            return;
        }
        List<Frame> frames = feedAll(s, data, chunks);
        JsonNode want = c.get("frames");
        assertEquals(want.size(), frames.size(), () -> "frames " + frames);
        for (int i = 0; i < frames.size(); i++) {
            Frame got = frames.get(i);
            JsonNode w = want.get(i);
            assertEquals(w.get("command").asText(), got.command());
            List<Header> headers = new ArrayList<>();
            for (JsonNode h : w.get("headers")) {
                headers.add(new Header(h.get(0).asText(), h.get(1).asText()));
            }
            assertEquals(headers, got.headers());
            assertEquals(w.get("body_hex").asText(), Vectors.hex(got.body()));
        }
        if (c.has("buffered")) {
            assertEquals(c.get("buffered").asInt(), s.buffered());
        }
    }

    @TestFactory
    List<DynamicTest> encodeVectors() {
        JsonNode v = Vectors.load("frames.json");
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode c : v.get("encode")) {
            tests.add(DynamicTest.dynamicTest(c.get("name").asText(), () -> {
                List<Header> headers = new ArrayList<>();
                for (JsonNode h : c.get("headers")) {
                    headers.add(new Header(h.get(0).asText(), h.get(1).asText()));
                }
                byte[] body = Vectors.hex(c.path("body_hex").asText(""));
                String version = c.get("version").asText();
                String command = c.get("command").asText();
                if (c.has("error")) {
                    StompException e = assertThrows(StompException.class, () -> Stomp.encode(command, headers, body, version));
                    assertEquals(CLASS_CODES.get(c.get("error").get("class").asText()), e.code());
                    assertTrue(e.getMessage().contains(c.get("error").get("contains").asText()), e.getMessage());
                    return;
                }
                assertEquals(c.get("bytes_hex").asText(), Vectors.hex(Stomp.encode(command, headers, body, version)));
            }));
        }
        return tests;
    }

    @Test
    void pausesAfterConnectUntilFedAgain() throws StompException {
        FrameScanner s = new FrameScanner(Stomp.V10);
        List<Frame> first = s.feed("CONNECT\naccept-version:1.2\n\n\0SEND\ndestination:/q\nk:a\\cb\n\n\0"
                .getBytes(StandardCharsets.UTF_8));
        assertEquals(1, first.size());
        assertEquals("CONNECT", first.get(0).command());
        s.version(Stomp.V12);
        List<Frame> rest = s.feed(new byte[0]);
        assertEquals(1, rest.size());
        assertEquals("a:b", rest.get(0).get("k"));
    }

    @Test
    void roundTripsThroughEncode() throws StompException {
        String[] values = {"", "plain", "a:b", "line\nbreak", "back\\slash", "cr\rhere", "ünïcödé ✓ 𝄞", "\\c\\n"};
        for (String version : new String[] {Stomp.V11, Stomp.V12}) {
            for (String v : values) {
                if (version.equals(Stomp.V11) && v.endsWith("\r")) {
                    continue;
                }
                List<Header> headers = List.of(new Header("destination", "/queue/x"), new Header("k" + v, v));
                byte[] body = v.getBytes(StandardCharsets.UTF_8);
                FrameScanner s = new FrameScanner(version);
                List<Frame> got = s.feed(Stomp.encode("SEND", headers, body, version));
                assertEquals(1, got.size());
                if (version.equals(Stomp.V11) && v.contains("\r")) {
                    continue;   // 1.1 sends a CR raw (spec/stomp.md §2): only checked in 1.2
                }
                assertEquals(headers.get(1), got.get(0).headers().get(1));
                assertEquals(new String(body, StandardCharsets.UTF_8), new String(got.get(0).body(), StandardCharsets.UTF_8));
            }
        }
    }

    @Test
    void manySmallFramesInOneFeed() throws StompException {
        StringBuilder b = new StringBuilder();
        for (int i = 0; i < 20000; i++) {
            b.append("MESSAGE\nsubscription:s\nmessage-id:").append(i).append("\n\nx\0\n");
        }
        FrameScanner s = new FrameScanner(Stomp.V12);
        List<Frame> frames = s.feed(b.toString().getBytes(StandardCharsets.UTF_8));
        assertEquals(20000, frames.size());
        assertEquals("19999", frames.get(19999).get("message-id"));
        assertEquals(0, s.buffered());
    }

    @Test
    void declaredContentLengthOverTheLimitFailsBeforeTheBody() {
        FrameScanner s = new FrameScanner(Stomp.V12);
        s.maxFrameSize(1024);
        StompException e = assertThrows(StompException.class,
                () -> s.feed("MESSAGE\ncontent-length:99999999999999999999\n\n".getBytes(StandardCharsets.UTF_8)));
        assertEquals(StompException.FRAME_TOO_LARGE, e.code());
        if (s.buffered() != 0) {
            fail("a failed scanner holds nothing");
        }
    }
}
