package io.pymq.spark;

import org.apache.arrow.vector.IntVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.spark.sql.sources.EqualNullSafe;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.IsNotNull;
import org.apache.spark.sql.sources.IsNull;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.sources.Not;
import org.apache.spark.sql.sources.StringContains;
import org.apache.spark.sql.sources.StringEndsWith;
import org.apache.spark.sql.sources.StringStartsWith;

import java.io.Serializable;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.BitSet;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Spark filters of a batch read pushed into the read ({@code filterPushdown=true}), with exactly the claims
 * of the Python data source ({@code pyspark_pymq/_filters.py}): {@code offset} comparisons narrow the
 * sequence range, {@code destination}/{@code destinationType} equalities drop destinations on the driver,
 * and conditions on JMS headers are evaluated by each task on the Arrow batches it reads, with SQL's
 * three-valued logic (a row whose answer is unknown is not kept, NOT unknown stays unknown).  They are not
 * sent to the broker as a selector: a selector makes the broker look at every message one by one.
 */
final class Filters {
    private Filters() {
    }

    private static final Map<String, String> STRING_HEADERS = Map.of("messageId", "message_id",
            "correlationId", "correlation_id", "type", "type", "replyTo", "reply_to", "key", "group");

    /** What the driver does with the claimed filters. */
    static final class Pushdown {
        Long offsetFrom;
        Long offsetTo;
        Set<String> destinations;
        Set<String> kinds;
        final List<Filter> headerFilters = new ArrayList<>();

        boolean keeps(String destination) {
            return (destinations == null || destinations.contains(destination))
                    && (kinds == null || kinds.contains(Options.kind(destination)));
        }

        long[] narrow(long start, long end) {
            if (offsetFrom != null) {
                start = Math.max(start, offsetFrom);
            }
            if (offsetTo != null) {
                end = Math.min(end, offsetTo);
            }
            return new long[] {start, Math.max(start, end)};
        }
    }

    /** Splits {@code filters} into the pushdown and the filters Spark must still evaluate (returned). */
    static List<Filter> translate(Filter[] filters, Pushdown push) {
        List<Filter> remaining = new ArrayList<>();
        for (Filter f : filters) {
            Filter inner = f instanceof Not not ? not.child() : f;
            String column = column(inner);
            boolean negated = f instanceof Not;
            if (column == null) {
                remaining.add(f);
                continue;
            }
            if ((column.equals("offset") || column.equals("destination") || column.equals("destinationType")
                    || column.equals("partition")) && f instanceof IsNotNull) {
                continue;                                        // never NULL
            }
            if (column.equals("offset") && !negated) {
                if (!offset(f, push)) {
                    remaining.add(f);
                }
                continue;
            }
            if ((column.equals("destination") || column.equals("destinationType")) && !negated) {
                Set<String> members = members(f);
                if (members == null) {
                    remaining.add(f);
                    continue;
                }
                if (column.equals("destination")) {
                    push.destinations = intersect(push.destinations, members);
                } else {
                    push.kinds = intersect(push.kinds, members);
                }
                continue;
            }
            if (negated && inner instanceof EqualNullSafe) {
                remaining.add(f);                                // kept with Spark (rare, easy to get wrong)
                continue;
            }
            if (claims(inner)) {
                push.headerFilters.add(f);
            } else {
                remaining.add(f);
            }
        }
        return remaining;
    }

    private static Set<String> intersect(Set<String> a, Set<String> b) {
        if (a == null) {
            return b;
        }
        Set<String> out = new HashSet<>(a);
        out.retainAll(b);
        return out;
    }

    private static String column(Filter f) {
        String[] refs = f.references();
        return refs.length == 1 && !refs[0].contains(".") ? refs[0] : null;
    }

    private static Object value(Filter f) {
        if (f instanceof EqualTo e) {
            return e.value();
        }
        if (f instanceof EqualNullSafe e) {
            return e.value();
        }
        if (f instanceof GreaterThan e) {
            return e.value();
        }
        if (f instanceof GreaterThanOrEqual e) {
            return e.value();
        }
        if (f instanceof LessThan e) {
            return e.value();
        }
        if (f instanceof LessThanOrEqual e) {
            return e.value();
        }
        if (f instanceof StringStartsWith e) {
            return e.value();
        }
        if (f instanceof StringEndsWith e) {
            return e.value();
        }
        if (f instanceof StringContains e) {
            return e.value();
        }
        return null;
    }

    private static boolean isInt(Object v) {
        return v instanceof Integer || v instanceof Long || v instanceof Short || v instanceof Byte;
    }

    private static boolean offset(Filter f, Pushdown push) {
        Object v = value(f);
        if (f instanceof In in) {
            Object[] values = in.values();
            if (values.length > 0 && Arrays.stream(values).allMatch(Filters::isInt)) {
                long lo = Arrays.stream(values).mapToLong(x -> ((Number) x).longValue()).min().getAsLong();
                long hi = Arrays.stream(values).mapToLong(x -> ((Number) x).longValue()).max().getAsLong() + 1;
                push.offsetFrom = push.offsetFrom == null ? lo : Math.max(push.offsetFrom, lo);
                push.offsetTo = push.offsetTo == null ? hi : Math.min(push.offsetTo, hi);
            }
            return false;                          // a window, not the set itself: Spark still checks
        }
        if (!isInt(v)) {
            return false;
        }
        long x = ((Number) v).longValue();
        Long lo = null;
        Long hi = null;
        if (f instanceof EqualTo || f instanceof EqualNullSafe) {
            lo = x;
            hi = x + 1;
        } else if (f instanceof GreaterThan) {
            lo = x + 1;
        } else if (f instanceof GreaterThanOrEqual) {
            lo = x;
        } else if (f instanceof LessThan) {
            hi = x;
        } else if (f instanceof LessThanOrEqual) {
            hi = x + 1;
        } else {
            return false;
        }
        if (lo != null) {
            push.offsetFrom = push.offsetFrom == null ? lo : Math.max(push.offsetFrom, lo);
        }
        if (hi != null) {
            push.offsetTo = push.offsetTo == null ? hi : Math.min(push.offsetTo, hi);
        }
        return true;
    }

    private static Set<String> members(Filter f) {
        Object v = value(f);
        if ((f instanceof EqualTo || f instanceof EqualNullSafe) && v instanceof String s) {
            return Set.of(s);
        }
        if (f instanceof In in && Arrays.stream(in.values()).allMatch(x -> x instanceof String)) {
            Set<String> out = new HashSet<>();
            for (Object x : in.values()) {
                out.add((String) x);
            }
            return out;
        }
        return null;
    }

    /** Text of a filter value for a string header (a binary key is compared as UTF-8), or null. */
    private static String text(Object v) {
        if (v instanceof String s) {
            return s;
        }
        if (v instanceof byte[] b) {
            try {
                return StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                        .decode(java.nio.ByteBuffer.wrap(b)).toString();
            } catch (CharacterCodingException e) {
                return null;
            }
        }
        return null;
    }

    /** The filters the Python data source claims (those with an exact selector form). */
    private static boolean claims(Filter f) {
        String column = column(f);
        Object v = value(f);
        if (STRING_HEADERS.containsKey(column)) {
            if (f instanceof EqualTo || f instanceof EqualNullSafe) {
                return v == null ? f instanceof EqualNullSafe : text(v) != null;
            }
            if (f instanceof In in) {
                Object[] values = in.values();
                return values.length > 0 && Arrays.stream(values).allMatch(x -> x != null && text(x) != null);
            }
            if (f instanceof StringStartsWith || f instanceof StringEndsWith || f instanceof StringContains) {
                return v instanceof String;
            }
            return f instanceof IsNull || f instanceof IsNotNull;
        }
        if ("priority".equals(column) || "deliveryMode".equals(column)) {
            if (f instanceof IsNotNull) {
                return true;
            }
            if (f instanceof In in) {
                return in.values().length > 0 && Arrays.stream(in.values()).allMatch(Filters::isInt);
            }
            if ("deliveryMode".equals(column)) {
                return (f instanceof EqualTo || f instanceof EqualNullSafe) && isInt(v);
            }
            return (f instanceof EqualTo || f instanceof EqualNullSafe || f instanceof GreaterThan
                    || f instanceof GreaterThanOrEqual || f instanceof LessThan || f instanceof LessThanOrEqual)
                    && isInt(v);
        }
        return false;
    }

    static Set<String> columnsOf(List<Filter> filters) {
        Set<String> out = new HashSet<>();
        for (Filter f : filters) {
            out.add(column(f instanceof Not n ? n.child() : f));
        }
        return out;
    }

    /** The claimed header filters, evaluated per row of a wire batch (serializable, for the tasks). */
    static final class Rows implements Serializable {
        private final Filter[] filters;

        Rows(List<Filter> filters) {
            this.filters = filters.toArray(new Filter[0]);
        }

        /** The rows every filter keeps (SQL: TRUE, not FALSE or unknown). */
        BitSet evaluate(VectorSchemaRoot root) {
            int n = root.getRowCount();
            BitSet kept = new BitSet(n);
            kept.set(0, n);
            for (Filter f : filters) {
                for (int i = kept.nextSetBit(0); i >= 0; i = kept.nextSetBit(i + 1)) {
                    if (truth(f, root, i) != Boolean.TRUE) {
                        kept.clear(i);
                    }
                }
            }
            return kept;
        }

        /** TRUE, FALSE, or null for unknown. */
        private static Boolean truth(Filter f, VectorSchemaRoot root, int row) {
            if (f instanceof Not not) {
                Boolean inner = truth(not.child(), root, row);
                return inner == null ? null : !inner;
            }
            String column = column(f);
            Object v = value(f);
            if (STRING_HEADERS.containsKey(column)) {
                VarCharVector vec = (VarCharVector) root.getVector(STRING_HEADERS.get(column));
                byte[] raw = vec.isNull(row) ? null : vec.get(row);
                if (raw != null && column.equals("replyTo") && !ViewVectors.DestinationsOnly.isDestination(raw)) {
                    raw = null;                            // the read column's value: not a destination, null
                }
                if (f instanceof IsNull) {
                    return raw == null;
                }
                if (f instanceof IsNotNull) {
                    return raw != null;
                }
                if (f instanceof EqualNullSafe && v == null) {
                    return raw == null;
                }
                if (raw == null) {
                    return f instanceof EqualNullSafe ? Boolean.FALSE : null;
                }
                String s = new String(raw, StandardCharsets.UTF_8);
                if (f instanceof EqualTo || f instanceof EqualNullSafe) {
                    return s.equals(text(v));
                }
                if (f instanceof In in) {
                    for (Object x : in.values()) {
                        if (s.equals(text(x))) {
                            return true;
                        }
                    }
                    return false;
                }
                if (f instanceof StringStartsWith) {
                    return s.startsWith((String) v);
                }
                if (f instanceof StringEndsWith) {
                    return s.endsWith((String) v);
                }
                if (f instanceof StringContains) {
                    return s.contains((String) v);
                }
                return null;
            }
            if (f instanceof IsNotNull) {
                return true;                               // priority and deliveryMode are never NULL
            }
            IntVector vec = (IntVector) root.getVector(column.equals("priority") ? "priority" : "delivery_mode");
            long x = vec.get(row);
            if (f instanceof In in) {
                for (Object y : in.values()) {
                    if (((Number) y).longValue() == x) {
                        return true;
                    }
                }
                return false;
            }
            long y = ((Number) v).longValue();
            if (f instanceof EqualTo || f instanceof EqualNullSafe) {
                return x == y;
            }
            if (f instanceof GreaterThan) {
                return x > y;
            }
            if (f instanceof GreaterThanOrEqual) {
                return x >= y;
            }
            if (f instanceof LessThan) {
                return x < y;
            }
            return x <= y;
        }
    }
}
