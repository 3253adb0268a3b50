package io.pymq.stomp;

import java.util.Objects;

/** One {@code name:value} header line; frames keep headers as a list so order and repeats survive. */
public record Header(String name, String value) {
    public Header {
        Objects.requireNonNull(name, "name");
        Objects.requireNonNull(value, "value");
    }
}
