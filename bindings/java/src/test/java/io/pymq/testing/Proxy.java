package io.pymq.testing;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A TCP proxy on 127.0.0.1 in front of a broker, for faults a test makes on purpose: it forwards bytes
 * both ways, numbers its connections from 1, and lets a test cut one connection the moment its client
 * writes a given STOMP command ({@link #cutOnClientCommand}), or cut them all ({@link #cutAll}).
 */
public final class Proxy implements AutoCloseable {
    private final ServerSocket server;
    private final String targetHost;
    private final int targetPort;
    private final AtomicInteger accepted = new AtomicInteger();
    private final List<Socket> sockets = new CopyOnWriteArrayList<>();
    private volatile int cutConnection = -1;
    private volatile String cutCommand;
    private volatile int dropConnection = -1;
    private volatile String dropCommand;
    private final List<String> clientChunks = new CopyOnWriteArrayList<>();
    private final java.util.Map<Integer, Socket[]> pairs = new java.util.concurrent.ConcurrentHashMap<>();
    private final java.util.Set<Integer> halfOpen = java.util.concurrent.ConcurrentHashMap.newKeySet();

    public Proxy(String target) throws IOException {
        int colon = target.lastIndexOf(':');
        targetHost = target.substring(0, colon);
        targetPort = Integer.parseInt(target.substring(colon + 1));
        server = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        Thread t = new Thread(this::acceptLoop, "test-proxy-accept");
        t.setDaemon(true);
        t.start();
    }

    /** host:port clients connect to. */
    public String address() {
        return "127.0.0.1:" + server.getLocalPort();
    }

    /** How many connections were accepted so far. */
    public int connections() {
        return accepted.get();
    }

    /**
     * Connection number {@code n} (from 1) is cut, toward both ends, when its client writes a frame starting
     * with {@code command}; that frame is not forwarded (the broker never sees it).
     */
    public void cutOnClientCommand(int n, String command) {
        cutCommand = command;
        cutConnection = n;
    }

    /** The broker's frames starting with {@code command} never reach the client of connection {@code n}. */
    public void dropServerCommand(int n, String command) {
        dropCommand = command;
        dropConnection = n;
    }

    /** Whether the client of connection {@code n} wrote {@code text} (within one read) so far. */
    public boolean clientWrote(int n, String text) {
        for (String c : clientChunks) {
            if (c.startsWith(n + ":") && c.contains(text)) {
                return true;
            }
        }
        return false;
    }

    /**
     * Connection {@code n} ends for its client only: the broker's side stays open and silent, as a network
     * partition leaves it (the broker notices at its heart-beat deadline, or at {@link #endHalfOpen}).
     */
    public void cutClientOnly(int n) {
        halfOpen.add(n);
        close(pairs.get(n)[0]);
    }

    /** The broker's side of every connection {@link #cutClientOnly} left open ends too. */
    public void endHalfOpen() {
        for (int n : halfOpen) {
            close(pairs.get(n)[1]);
        }
    }

    /** Cuts every open connection (a network failure, as both ends see it). */
    public void cutAll() {
        for (Socket s : sockets) {
            close(s);
        }
    }

    private void acceptLoop() {
        while (!server.isClosed()) {
            try {
                Socket client = server.accept();
                int n = accepted.incrementAndGet();
                Socket upstream = new Socket();
                upstream.connect(new InetSocketAddress(targetHost, targetPort), 5000);
                sockets.add(client);
                sockets.add(upstream);
                pairs.put(n, new Socket[] {client, upstream});
                pump(client, upstream, n, true);
                pump(upstream, client, n, false);
            } catch (IOException e) {
                return;
            }
        }
    }

    private void pump(Socket from, Socket to, int n, boolean fromClient) {
        Thread t = new Thread(() -> {
            byte[] buf = new byte[64 * 1024];
            try {
                // not try-with-resources: closing a socket's stream closes the socket, and a half-open
                // connection keeps the broker's side open
                InputStream in = from.getInputStream();
                OutputStream out = to.getOutputStream();
                int len;
                while ((len = in.read(buf)) >= 0) {
                    if (fromClient) {
                        clientChunks.add(n + ":" + new String(buf, 0, len, StandardCharsets.ISO_8859_1));
                    }
                    String cmd = cutCommand;
                    if (fromClient && n == cutConnection && cmd != null
                            && new String(buf, 0, len, StandardCharsets.ISO_8859_1).stripLeading().startsWith(cmd + "\n")) {
                        close(from);
                        close(to);
                        return;
                    }
                    String drop = dropCommand;
                    if (!fromClient && n == dropConnection && drop != null) {
                        String text = new String(buf, 0, len, StandardCharsets.ISO_8859_1);
                        StringBuilder kept = new StringBuilder();
                        String[] frames = text.split("\0", -1);
                        for (int i = 0; i < frames.length - 1; i++) {
                            if (!frames[i].stripLeading().startsWith(drop + "\n")) {
                                kept.append(frames[i]).append('\0');
                            }
                        }
                        kept.append(frames[frames.length - 1]);   // a frame's start, its rest comes next
                        byte[] rest = kept.toString().getBytes(StandardCharsets.ISO_8859_1);
                        out.write(rest);
                        out.flush();
                        continue;
                    }
                    out.write(buf, 0, len);
                    out.flush();
                }
            } catch (IOException ignored) {
                // one side went away: the other follows below
            }
            if (halfOpen.contains(n)) {
                return;              // the broker's side stays open until endHalfOpen
            }
            close(from);
            close(to);
        }, "test-proxy-" + n + (fromClient ? "-up" : "-down"));
        t.setDaemon(true);
        t.start();
    }

    private static void close(Socket s) {
        try {
            s.close();
        } catch (IOException ignored) {
            // already closed
        }
    }

    @Override
    public void close() {
        try {
            server.close();
        } catch (IOException ignored) {
            // already closed
        }
        cutAll();
    }
}
