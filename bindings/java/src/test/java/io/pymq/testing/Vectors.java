package io.pymq.testing;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * The language-neutral vectors of spec/vectors/: {@code $PYMQ_SPEC_VECTORS}, else the first spec/vectors
 * found walking up from the working directory (Maven runs in bindings/java, inside the repository).
 *
 * <p>Every file loaded is recorded, one name per line, in {@code $PYMQ_VECTORS_REPORT} (default
 * {@code target/vectors-ran.txt}): tests/bindings/test_vector_coverage.py compares that list with
 * spec/vectors/bindings.json, so a vector file that Java neither runs nor declares not applicable fails CI.
 */
public final class Vectors {
    private static final ObjectMapper JSON = new ObjectMapper();

    private Vectors() {
    }

    public static Path dir() {
        String env = System.getenv("PYMQ_SPEC_VECTORS");
        if (env != null && !env.isEmpty()) {
            return Path.of(env);
        }
        Path d = Path.of("").toAbsolutePath();
        while (d != null) {
            Path candidate = d.resolve("spec").resolve("vectors");
            if (Files.isDirectory(candidate)) {
                return candidate;
            }
            d = d.getParent();
        }
        throw new IllegalStateException("spec/vectors not found above the working directory; set PYMQ_SPEC_VECTORS");
    }

    /** Parses spec/vectors/{@code name} and records that this binding ran it. */
    public static synchronized JsonNode load(String name) {
        try {
            JsonNode node = JSON.readTree(dir().resolve(name).toFile());
            String report = System.getenv("PYMQ_VECTORS_REPORT");
            Path out = report != null && !report.isEmpty() ? Path.of(report) : Path.of("target", "vectors-ran.txt");
            if (out.getParent() != null) {
                Files.createDirectories(out.getParent());
            }
            Files.writeString(out, name + "\n", StandardCharsets.UTF_8, StandardOpenOption.CREATE,
                    StandardOpenOption.APPEND);
            return node;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    public static byte[] hex(String s) {
        byte[] out = new byte[s.length() / 2];
        for (int i = 0; i < out.length; i++) {
            out[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
        }
        return out;
    }

    public static String hex(byte[] b) {
        StringBuilder s = new StringBuilder(b.length * 2);
        for (byte x : b) {
            s.append(String.format("%02x", x & 0xff));
        }
        return s.toString();
    }
}
