package io.pymq.jms;

import jakarta.jms.Connection;
import jakarta.jms.JMSException;
import org.junit.jupiter.api.Test;

import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Heart-beats (spec/stomp.md §6) against a scripted STOMP server: the intervals are negotiated as STOMP 1.2
 * says, the provider beats when it has nothing else to send, and a broker that goes silent is declared dead
 * (the exception listener hears {@code heartbeat-timeout}).  No timing is asserted: the test waits for
 * events with generous limits.
 */
class HeartBeatTest {
    @Test
    void negotiationTakesTheLargerOfWhatEachSideOffers() {
        assertArrayEquals(new long[] {0, 0}, BrokerLink.parseHeartBeat(null));
        assertArrayEquals(new long[] {0, 0}, BrokerLink.parseHeartBeat("x,y"));
        assertArrayEquals(new long[] {5, 7}, BrokerLink.parseHeartBeat("5, 7"));
    }

    /** A server that completes CONNECT with {@code heart-beat:100,100}, then counts EOLs and never beats. */
    @Test
    void beatsWhenIdleAndDeclaresASilentBrokerDead() throws Exception {
        AtomicInteger beats = new AtomicInteger();
        CompletableFuture<String> connectFrame = new CompletableFuture<>();
        try (ServerSocket server = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
            Thread t = new Thread(() -> {
                try (Socket s = server.accept()) {
                    InputStream in = s.getInputStream();
                    OutputStream out = s.getOutputStream();
                    ByteArrayOutputStream head = new ByteArrayOutputStream();
                    int b;
                    while ((b = in.read()) > 0) {
                        head.write(b);
                    }
                    connectFrame.complete(head.toString(StandardCharsets.UTF_8));
                    out.write("CONNECTED\nversion:1.2\nheart-beat:100,100\nsession:fake\n\n\0".getBytes(StandardCharsets.UTF_8));
                    out.flush();
                    while ((b = in.read()) >= 0) {
                        if (b == '\n') {
                            beats.incrementAndGet();
                        }
                    }
                } catch (Exception ignored) {
                    // the client hung up: expected
                }
            });
            t.setDaemon(true);
            t.start();
            PymqConnectionFactory cf = new PymqConnectionFactory("stomp://127.0.0.1:" + server.getLocalPort()
                    + "?heartBeat=150,150&timeout=5000");
            Connection c = cf.createConnection("u", "p");
            CompletableFuture<JMSException> heard = new CompletableFuture<>();
            c.setExceptionListener(heard::complete);
            assertTrue(connectFrame.get(5, TimeUnit.SECONDS).contains("heart-beat:150,150"), connectFrame.get());
            assertArrayEquals(new long[] {150, 150}, ((PymqConnection) c).link().heartBeats(),
                    "send every max(150, 100), expect every max(100, 150)");
            JMSException dead = heard.get(20, TimeUnit.SECONDS);
            assertEquals("heartbeat-timeout", dead.getErrorCode(), dead.getMessage());
            assertTrue(beats.get() >= 1, "the provider sent heart-beats while idle: " + beats.get());
            c.close();
        }
    }

    @Test
    void noHeartBeatsWhenEitherSideSaysZero() throws Exception {
        try (ServerSocket server = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
            Thread t = new Thread(() -> {
                try (Socket s = server.accept()) {
                    InputStream in = s.getInputStream();
                    while (in.read() > 0) {
                        // the CONNECT frame
                    }
                    s.getOutputStream().write("CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\0".getBytes(StandardCharsets.UTF_8));
                    s.getOutputStream().flush();
                    while (in.read() >= 0) {
                        // DISCONNECT at the end
                    }
                } catch (Exception ignored) {
                    // closed
                }
            });
            t.setDaemon(true);
            t.start();
            Connection c = new PymqConnectionFactory("stomp://127.0.0.1:" + server.getLocalPort() + "?timeout=1000")
                    .createConnection();
            assertArrayEquals(new long[] {0, 0}, ((PymqConnection) c).link().heartBeats());
            c.close();
        }
    }
}
