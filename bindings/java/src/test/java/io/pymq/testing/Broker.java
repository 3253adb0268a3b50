package io.pymq.testing;

import org.junit.jupiter.api.Assertions;
import org.junit.jupiter.api.Assumptions;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * The real pymq-server the live tests run against, started once per test JVM:
 *
 * <ul>
 *   <li>{@code PYMQ_BROKER_ADDR} (host:port): use a broker that is already running;</li>
 *   <li>else {@code PYMQ_SERVER} (a command line, e.g. {@code "python3 -m pymq_server"}; default
 *       {@code pymq-server}) is started with {@code --host 127.0.0.1 --port 0 --data-dir <temp>} and the
 *       port read from its {@code pymq-server listening on 127.0.0.1:<port>} line; it is stopped with
 *       SIGTERM when the JVM exits.</li>
 * </ul>
 * Without a broker the live tests are skipped, except when {@code CI} is set, where they fail (the rule
 * of tests/storage/services.py).
 */
public final class Broker {
    private static final Pattern LISTENING = Pattern.compile("pymq-server listening on (\\S+:\\d+)");
    /** A member of a live/backup group (spec/ha.md) waiting for the store: it listens once it takes over. */
    private static final Pattern BACKUP = Pattern.compile("pymq-server backup of node \\S+ waiting");
    private static String address;
    private static String reason;
    private static boolean tried;

    private Broker() {
    }

    public static boolean inCi() {
        String ci = System.getenv("CI");
        return ci != null && !List.of("", "0", "false", "no").contains(ci.strip().toLowerCase());
    }

    /** host:port of the broker, or skip (fail under CI). */
    public static synchronized String address() {
        if (!tried) {
            tried = true;
            String given = System.getenv("PYMQ_BROKER_ADDR");
            if (given != null && !given.isEmpty()) {
                address = given;
            } else {
                try {
                    address = start();
                } catch (Exception e) {
                    reason = "no pymq broker: " + e.getMessage()
                            + " (set PYMQ_BROKER_ADDR, or PYMQ_SERVER=\"python3 -m pymq_server\")";
                }
            }
        }
        if (address == null) {
            if (inCi()) {
                Assertions.fail(reason + " (CI is set: a missing broker is a failure)");
            }
            Assumptions.assumeTrue(false, reason);
        }
        return address;
    }

    /** The broker URL for a PymqConnectionFactory. */
    public static String url() {
        return "stomp://" + address();
    }

    public static String url(String query) {
        return url() + "?" + query;
    }

    /** A broker of its own, with a YAML config; its listeners as announced ("stomp", "tls", "websocket"). */
    public static synchronized java.util.Map<String, String> startOwn(String yaml) {
        if (System.getenv("PYMQ_SERVER") == null && !inCi()) {
            address();   // skips with the reason when there is no broker command at all
        }
        try {
            Path config = Files.createTempFile("pymq-java-broker-", ".yaml");
            Files.writeString(config, yaml);
            java.util.Map<String, String> listeners = new java.util.concurrent.ConcurrentHashMap<>();
            listeners.put("stomp", start(List.of("--config", config.toString()), listeners));
            return listeners;
        } catch (Exception e) {
            if (inCi()) {
                Assertions.fail("cannot start a broker: " + e.getMessage());
            }
            Assumptions.assumeTrue(false, "cannot start a broker: " + e.getMessage());
            return null;
        }
    }

    private static final Pattern OTHER = Pattern.compile("pymq-server (tls|websocket) listening on (\\S+)");

    private static String start() throws IOException, InterruptedException {
        return start(List.of(), new java.util.HashMap<>());
    }

    /** A broker process of a test's own, on a data directory it names (a takeover: the next one on the same). */
    public static final class Own {
        /** host:port, or null for a member that waits as a backup (see {@link #awaitLive}). */
        public final String address;
        public final Process process;
        private final CompletableFuture<String> live;

        Own(String address, Process process, CompletableFuture<String> live) {
            this.address = address;
            this.process = process;
            this.live = live;
        }

        /** The address of a member started as a backup once it has taken the store over and listens. */
        public String awaitLive(long seconds) throws Exception {
            return address != null ? address : live.get(seconds, TimeUnit.SECONDS);
        }

        /** SIGSTOP: the process holds its sockets (the kernel still accepts connections) and answers nothing. */
        public void pause() throws Exception {
            signal("STOP");
        }

        /** SIGCONT. */
        public void resume() throws Exception {
            signal("CONT");
        }

        private void signal(String name) throws Exception {
            new ProcessBuilder("kill", "-" + name, Long.toString(process.pid())).inheritIO().start().waitFor();
        }

        /** kill -9: the process gets no chance to close anything. */
        public void kill() throws InterruptedException {
            process.destroyForcibly();
            process.waitFor(30, TimeUnit.SECONDS);
        }
    }

    /**
     * A member of a live/backup pair over {@code dataDir} (spec/ha.md: the file store's lock and lease), with the
     * configuration {@code haYaml}: the first one started becomes live (its address once it listens), a later
     * one waits as a backup ({@code address} null until {@link Own#awaitLive}).
     */
    public static Own startMember(Path dataDir, int port, Path haYaml) {
        return startOn(dataDir, port, List.of("--config", haYaml.toString()));
    }

    /** Starts pymq-server on {@code dataDir} and {@code port} (0: any), or skips (fails under CI) without one. */
    public static Own startOn(Path dataDir, int port, List<String> extra) {
        if (System.getenv("PYMQ_SERVER") == null && !inCi()) {
            address();   // skips with the reason when there is no broker command at all
        }
        try {
            Process[] p = new Process[1];
            CompletableFuture<String> live = new CompletableFuture<>();
            String addr = start(extra, new java.util.HashMap<>(), dataDir, port, p, live);
            return new Own(addr.isEmpty() ? null : addr, p[0], live);
        } catch (Exception e) {
            if (inCi()) {
                Assertions.fail("cannot start a broker: " + e.getMessage());
            }
            Assumptions.assumeTrue(false, "cannot start a broker: " + e.getMessage());
            return null;
        }
    }

    private static String start(List<String> extra, java.util.Map<String, String> listeners) throws IOException, InterruptedException {
        return start(extra, listeners, Files.createTempDirectory("pymq-java-test-"), 0, new Process[1],
                new CompletableFuture<>());
    }

    /** Starts the broker; returns its address, or "" when it first announced itself a backup (a live/backup
     *  group's members all do; {@code live} then gets the address it listens on once it holds the store). */
    private static String start(List<String> extra, java.util.Map<String, String> listeners, Path dataDir, int port,
                                Process[] started, CompletableFuture<String> live) throws IOException, InterruptedException {
        String cmd = System.getenv("PYMQ_SERVER");
        List<String> command = new ArrayList<>(List.of((cmd == null || cmd.isBlank() ? "pymq-server" : cmd).strip().split("\\s+")));
        command.addAll(List.of("--host", "127.0.0.1", "--port", Integer.toString(port), "--data-dir", dataDir.toString()));
        command.addAll(extra);
        Process process = new ProcessBuilder(command).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
        started[0] = process;
        CompletableFuture<String> found = new CompletableFuture<>();
        StringBuilder log = new StringBuilder();
        Thread reader = new Thread(() -> {
            try (BufferedReader r = new BufferedReader(new InputStreamReader(process.getErrorStream(), StandardCharsets.UTF_8))) {
                String line;
                while ((line = r.readLine()) != null) {
                    Matcher m = LISTENING.matcher(line);
                    Matcher other = OTHER.matcher(line);
                    if (m.find()) {
                        if (!found.complete(m.group(1))) {
                            live.complete(m.group(1));
                        }
                    } else if (BACKUP.matcher(line).find()) {
                        found.complete("");
                    } else if (other.find()) {
                        listeners.put(other.group(1), other.group(2));
                    } else if (log.length() < 8192) {
                        log.append(line).append('\n');
                    }
                }
            } catch (IOException ignored) {
                // the broker's stderr closed
            }
            found.complete(null);
        }, "pymq-broker-stderr");
        reader.setDaemon(true);
        reader.start();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            process.destroy();     // SIGTERM: a clean stop
            try {
                if (!process.waitFor(15, TimeUnit.SECONDS)) {
                    process.destroyForcibly();
                }
            } catch (InterruptedException ignored) {
                process.destroyForcibly();
            }
            try (Stream<Path> files = Files.walk(dataDir)) {
                files.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
            } catch (IOException ignored) {
                // best effort
            }
        }));
        String addr;
        try {
            addr = found.get(60, TimeUnit.SECONDS);
        } catch (Exception e) {
            process.destroyForcibly();
            throw new IOException(command + " did not report its port within 60 s");
        }
        if (addr == null) {
            throw new IOException(command + " exited before listening:\n" + log);
        }
        return addr;
    }
}
