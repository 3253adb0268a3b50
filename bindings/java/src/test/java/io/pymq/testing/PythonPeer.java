package io.pymq.testing;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.junit.jupiter.api.Assertions;
import org.junit.jupiter.api.Assumptions;

import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * The Python SDK as a peer: runs tests/bindings/python_peer.py with one JSON request and returns its JSON
 * answer.  The interpreter is {@code PYMQ_PYTHON} (the pytest wrapper passes its own), else python3.
 */
public final class PythonPeer {
    private static final ObjectMapper JSON = new ObjectMapper();

    private PythonPeer() {
    }

    static Path script() {
        Path d = Path.of("").toAbsolutePath();
        while (d != null) {
            Path candidate = d.resolve("tests").resolve("bindings").resolve("python_peer.py");
            if (Files.isRegularFile(candidate)) {
                return candidate;
            }
            d = d.getParent();
        }
        return null;
    }

    /** A request map: {@code request("op", "send", "destination", "/queue/x", ...)}. */
    public static Map<String, Object> request(Object... pairs) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < pairs.length; i += 2) {
            m.put((String) pairs[i], pairs[i + 1]);
        }
        m.putIfAbsent("url", Broker.url());
        return m;
    }

    /** Starts the peer (for scenarios where Java acts while Python waits); join() gives its answer. */
    public static CompletableFuture<JsonNode> start(Map<String, Object> request) {
        Path script = script();
        if (script == null) {
            String why = "tests/bindings/python_peer.py not found above the working directory";
            if (Broker.inCi()) {
                Assertions.fail(why);
            }
            Assumptions.assumeTrue(false, why);
        }
        String python = System.getenv().getOrDefault("PYMQ_PYTHON", "python3");
        try {
            Process p = new ProcessBuilder(python, script.toString()).redirectError(ProcessBuilder.Redirect.INHERIT).start();
            try (OutputStream in = p.getOutputStream()) {
                in.write(JSON.writeValueAsBytes(request));
            }
            return CompletableFuture.supplyAsync(() -> {
                try {
                    byte[] out = p.getInputStream().readAllBytes();
                    if (!p.waitFor(60, TimeUnit.SECONDS)) {
                        p.destroyForcibly();
                        throw new AssertionError("the Python peer did not finish: " + request);
                    }
                    JsonNode answer = JSON.readTree(new String(out, StandardCharsets.UTF_8));
                    if (answer == null || !answer.path("ok").asBoolean()) {
                        throw new AssertionError("the Python peer failed on " + request + ": " + answer);
                    }
                    return answer;
                } catch (IOException | InterruptedException e) {
                    throw new AssertionError("the Python peer failed on " + request + ": " + e, e);
                }
            });
        } catch (IOException e) {
            throw new AssertionError("cannot run " + python + " " + script + ": " + e, e);
        }
    }

    public static JsonNode run(Map<String, Object> request) {
        return start(request).join();
    }
}
