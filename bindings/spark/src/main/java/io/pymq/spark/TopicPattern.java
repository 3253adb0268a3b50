package io.pymq.spark;

import java.util.ArrayList;
import java.util.BitSet;
import java.util.List;

/**
 * The broker's topic patterns (spec/routing.md §5), for {@code destinationPattern}: '.' separates words (an
 * empty word is a word), the word '*' matches one word, '#' zero or more, ActiveMQ's '>' is read as '#'; a
 * wildcard is a whole word ('a*b' is a plain word).  The broker's matcher ({@code pymq.routing.topics}) walks
 * a trie of many patterns; one pattern here is the same automaton without the trie: the set of pattern
 * positions a topic's words can reach, each position at most once per word, so '#.#.#…' cannot backtrack.
 * Runs spec/vectors/topic_patterns.json ({@code TopicPatternVectorsTest}) as the broker's twins do.
 */
final class TopicPattern {
    static final String SEPARATOR = ".";
    static final String ONE = "*";
    static final String MANY = "#";
    static final String MANY_ACTIVEMQ = ">";

    private final String text;
    private final String[] words;

    TopicPattern(String pattern) {
        this.text = normalize(pattern);
        this.words = split(text);
    }

    /** Words of a name: '.' separates them, empty words included ({@code ""} is one empty word). */
    static String[] split(String name) {
        List<String> out = new ArrayList<>();
        int from = 0;
        for (int at = name.indexOf('.'); at >= 0; at = name.indexOf('.', from)) {
            out.add(name.substring(from, at));
            from = at + 1;
        }
        out.add(name.substring(from));
        return out.toArray(new String[0]);
    }

    /** The normal form: '>' written '#', a run of '#' words one '#'. */
    static String normalize(String pattern) {
        List<String> out = new ArrayList<>();
        for (String word : split(pattern)) {
            String w = word.equals(MANY_ACTIVEMQ) ? MANY : word;
            if (w.equals(MANY) && !out.isEmpty() && out.get(out.size() - 1).equals(MANY)) {
                continue;
            }
            out.add(w);
        }
        return String.join(SEPARATOR, out);
    }

    /** {@code name} has a wildcard word: a pattern, not a topic one can publish to. */
    static boolean isPattern(String name) {
        for (String w : split(name)) {
            if (w.equals(ONE) || w.equals(MANY) || w.equals(MANY_ACTIVEMQ)) {
                return true;
            }
        }
        return false;
    }

    String text() {
        return text;
    }

    boolean matches(String topic) {
        int n = words.length;
        BitSet states = new BitSet(n + 1);
        states.set(0);
        close(states);
        for (String word : split(topic)) {
            BitSet next = new BitSet(n + 1);
            for (int s = states.nextSetBit(0); s >= 0 && s < n; s = states.nextSetBit(s + 1)) {
                String w = words[s];
                if (w.equals(MANY)) {
                    next.set(s);                        // '#' takes this word and may take more
                } else if (w.equals(ONE) || w.equals(word)) {
                    next.set(s + 1);
                }
            }
            if (next.isEmpty()) {
                return false;
            }
            close(next);
            states = next;
        }
        return states.get(n);
    }

    /** '#' may also take no word: a position at '#' reaches the next one. */
    private void close(BitSet states) {
        for (int s = states.nextSetBit(0); s >= 0 && s < words.length; s = states.nextSetBit(s + 1)) {
            if (words[s].equals(MANY)) {
                states.set(s + 1);
            }
        }
    }

    @Override
    public String toString() {
        return "TopicPattern(" + text + ")";
    }
}
