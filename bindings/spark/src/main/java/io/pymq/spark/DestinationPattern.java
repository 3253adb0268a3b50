package io.pymq.spark;

import java.util.ArrayList;
import java.util.List;

/**
 * {@code destinationPattern} (spec/spark.md §2.1): one or more comma-separated {@code /topic/<pattern>} or
 * {@code /queue/<pattern>}, the pattern matched against a destination's name with the broker's wildcard
 * syntax ({@link TopicPattern}, spec/routing.md §5), for queue names as for topic names.  A word with '*',
 * '?' or '[' inside it is refused rather than read literally: it is what a glob looked like when the
 * option was one, and a literal reading would silently read nothing.  The Python data source has the same
 * rules ({@code pyspark_pymq/_patterns.py}); both run the {@code destination_patterns} vectors of
 * spec/vectors/spark.json.
 */
final class DestinationPattern {
    static final String SYNTAX = "/topic/<pattern> or /queue/<pattern>, comma-separated (spec/routing.md §5: "
            + "'.' between words, '*' one word, '#' or '>' zero or more words)";

    private record Part(String kind, TopicPattern pattern) {
    }

    private final List<Part> parts = new ArrayList<>();

    DestinationPattern(String text) {
        for (String raw : text.split(",", -1)) {
            String item = raw.strip();
            String kind = item.startsWith(Options.TOPIC) ? Options.TOPIC
                    : item.startsWith(Options.QUEUE) ? Options.QUEUE : null;
            if (kind == null) {
                throw PymqException.config("option 'destinationPattern' takes " + SYNTAX + "; got "
                        + Options.pyRepr(item));
            }
            String pattern = item.substring(kind.length());
            if (pattern.isEmpty()) {
                throw PymqException.config("option 'destinationPattern' has no pattern after " + Options.pyRepr(kind)
                        + " in " + Options.pyRepr(text));
            }
            for (String word : TopicPattern.split(pattern)) {
                boolean wildcard = word.equals(TopicPattern.ONE) || word.equals(TopicPattern.MANY)
                        || word.equals(TopicPattern.MANY_ACTIVEMQ);
                if (!wildcard && (word.contains("*") || word.contains("?") || word.contains("["))) {
                    throw PymqException.config("option 'destinationPattern' uses the broker's wildcard syntax, not a "
                            + "glob: in " + Options.pyRepr(item) + " the word " + Options.pyRepr(word) + " has '*', '?' "
                            + "or '[' inside it (a glob before); write " + SYNTAX + ", such as '" + kind + "orders.#', "
                            + "or name the destinations with 'queue', 'topic' or 'destinations'");
                }
            }
            parts.add(new Part(kind, new TopicPattern(pattern)));
        }
    }

    boolean topicsOnly() {
        for (Part p : parts) {
            if (!p.kind().equals(Options.TOPIC)) {
                return false;
            }
        }
        return true;
    }

    boolean matches(String name) {
        for (Part p : parts) {
            if (name.startsWith(p.kind()) && p.pattern().matches(name.substring(p.kind().length()))) {
                return true;
            }
        }
        return false;
    }
}
