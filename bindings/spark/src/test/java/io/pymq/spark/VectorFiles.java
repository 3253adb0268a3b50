package io.pymq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;

/** spec/vectors/*.json, found walking up from the working directory (or PYMQ_SPEC_VECTORS). */
final class VectorFiles {
    private VectorFiles() {
    }

    static JsonNode load(String name) throws IOException {
        String given = System.getenv("PYMQ_SPEC_VECTORS");
        Path dir = given != null ? Path.of(given) : null;
        for (Path p = Path.of("").toAbsolutePath(); dir == null && p != null; p = p.getParent()) {
            if (Files.isDirectory(p.resolve("spec/vectors"))) {
                dir = p.resolve("spec/vectors");
            }
        }
        if (dir == null) {
            throw new IOException("spec/vectors not found above " + Path.of("").toAbsolutePath());
        }
        return new ObjectMapper().readTree(dir.resolve(name).toFile());
    }
}
