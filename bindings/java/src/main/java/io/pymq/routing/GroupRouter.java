package io.pymq.routing;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Comparator;
import java.util.LinkedHashSet;
import java.util.List;

/**
 * Routes keys (group ids, message ids, correlation ids) over a fixed destination set exactly as every other
 * pymq engine does (spec/routing.md §2; vectors spec/vectors/group_routing.json).
 *
 * <p>Destinations are sorted by their UTF-8 bytes compared unsigned (Unicode code-point order, which is
 * not {@link String#compareTo}'s UTF-16 order above U+FFFF).  {@link Strategy#RENDEZVOUS} (the default)
 * picks the highest {@code murmur3(UTF8(key), group_hash(d))}, ties to the first in sorted order;
 * {@link Strategy#MODULO} picks {@code sorted[group_hash(key) mod N]}.
 */
public final class GroupRouter {
    /** A routing algorithm. */
    public enum Strategy {
        /** Highest random weight: a membership change moves about 1/N of the groups. */
        RENDEZVOUS,
        /** The seed's {@code group_hash mod N} over the sorted destinations. */
        MODULO;

        /** "rendezvous" or "modulo", as the spec and the other bindings spell them. */
        public static Strategy named(String name) {
            return switch (name) {
                case "rendezvous" -> RENDEZVOUS;
                case "modulo" -> MODULO;
                default -> throw new IllegalArgumentException("unknown group routing strategy \"" + name
                        + "\"; expected rendezvous or modulo");
            };
        }
    }

    /** The empty destination set cannot route anything ({@code ClusterError: no valid destination}). */
    public static final class NoDestinationException extends IllegalArgumentException {
        NoDestinationException() {
            super("no valid destination");
        }
    }

    private static final Comparator<byte[]> UNSIGNED_BYTES = Arrays::compareUnsigned;

    private final List<String> destinations;
    private final byte[][] names;
    private final int[] seeds;      // group_hash of each destination, computed once
    private final Strategy strategy;

    public GroupRouter(Collection<String> destinations) {
        this(destinations, Strategy.RENDEZVOUS);
    }

    public GroupRouter(Collection<String> destinations, Strategy strategy) {
        this.strategy = strategy;
        this.destinations = sortDestinations(destinations);
        this.names = new byte[this.destinations.size()][];
        this.seeds = new int[this.destinations.size()];
        for (int i = 0; i < seeds.length; i++) {
            names[i] = Murmur3.utf8(this.destinations.get(i));
            seeds[i] = Murmur3.hash32(names[i], 0);
        }
    }

    /** The canonical destination list: distinct, ascending by UTF-8 bytes. */
    public static List<String> sortDestinations(Collection<String> destinations) {
        List<String> distinct = new ArrayList<>(new LinkedHashSet<>(destinations));
        if (distinct.isEmpty()) {
            throw new NoDestinationException();
        }
        distinct.sort(Comparator.comparing(Murmur3::utf8, UNSIGNED_BYTES));
        return List.copyOf(distinct);
    }

    /** The distinct destinations in UTF-8 byte order (the order {@link Strategy#MODULO} indexes). */
    public List<String> destinations() {
        return destinations;
    }

    public Strategy strategy() {
        return strategy;
    }

    /** The rendezvous score of {@code key} at every destination, in {@link #destinations()} order. */
    public long[] scores(String key) {
        byte[] k = Murmur3.utf8(key);
        long[] out = new long[seeds.length];
        for (int i = 0; i < seeds.length; i++) {
            out[i] = Integer.toUnsignedLong(Murmur3.hash32(k, seeds[i]));
        }
        return out;
    }

    /** The position in {@link #destinations()} of the key's destination. */
    public int index(String key) {
        if (strategy == Strategy.MODULO) {
            return (int) (Murmur3.groupHash(key) % destinations.size());
        }
        long[] scores = scores(key);
        int best = 0;
        for (int i = 1; i < scores.length; i++) {
            if (scores[i] > scores[best]) {   // strictly greater: ties stay with the first in sorted order
                best = i;
            }
        }
        return best;
    }

    /** The key's destination. */
    public String route(String key) {
        return destinations.get(index(key));
    }

    /**
     * Every destination in the key's order of preference; the first is {@link #route}.  Rendezvous:
     * descending score, ties in sorted order.  Modulo: the sorted list rotated to the routed index.
     */
    public List<String> ranking(String key) {
        int n = destinations.size();
        List<String> out = new ArrayList<>(n);
        if (strategy == Strategy.MODULO) {
            int start = index(key);
            out.addAll(destinations.subList(start, n));
            out.addAll(destinations.subList(0, start));
            return out;
        }
        long[] scores = scores(key);
        Integer[] order = new Integer[n];
        for (int i = 0; i < n; i++) {
            order[i] = i;
        }
        Arrays.sort(order, (a, b) -> Long.compare(scores[b], scores[a]));   // stable: ties keep sorted order
        for (int i : order) {
            out.add(destinations.get(i));
        }
        return out;
    }
}
