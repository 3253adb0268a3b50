package io.pymq.selector;

import jakarta.jms.InvalidSelectorException;

import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * A compiled JMS message selector with pymq's semantics (spec/selector.md; vectors
 * spec/vectors/selector.json).  The broker evaluates the selectors of subscriptions; the provider compiles
 * each one first ({@link #check}) so that a selector that does not parse is an InvalidSelectorException at
 * {@code createConsumer} (with the broker's position and wording) instead of an ERROR that would end the
 * connection.  {@link #evaluate} is the same three-valued evaluation the broker runs.
 *
 * <p>Values: null is NULL; Boolean; Long (also Integer, Short, Byte) and Double (also Float) are
 * numbers; String; {@link Untyped} (a header with no declared type whose text reads as a number, made by
 * {@link #untyped}); anything else is a value of no selector type (every comparison on it is UNKNOWN).
 */
public final class Selector {
    private final String text;
    private final Expr expr;        // null: the empty selector
    private final Set<String> identifiers;

    private Selector(String text, Expr expr, Set<String> identifiers) {
        this.text = text;
        this.expr = expr;
        this.identifiers = identifiers;
    }

    /** Compiles {@code text}; an invalid selector throws with its position and what was expected. */
    public static Selector compile(String text) throws InvalidSelectorException {
        if (text == null) {
            text = "";
        }
        try {
            SelectorParser p = new SelectorParser(text);
            Expr e = p.parse();
            return new Selector(text, e, Set.copyOf(p.reads));
        } catch (SelectorParser.Failure f) {
            throw f.jms();
        }
    }

    /** Throws InvalidSelectorException when {@code text} does not compile. */
    public static void check(String text) throws InvalidSelectorException {
        compile(text);
    }

    /** The error position (0-based code-point offset) and expectation of an invalid selector, else null. */
    public static Object[] error(String text) {
        try {
            new SelectorParser(text).parse();
            return null;
        } catch (SelectorParser.Failure f) {
            return new Object[] {f.position, f.expected};
        }
    }

    public String text() {
        return text;
    }

    /** The names the selector reads. */
    public Set<String> identifiers() {
        return identifiers;
    }

    /** TRUE, FALSE, or null for UNKNOWN. */
    public Boolean evaluate(Map<String, ?> values) {
        return expr == null ? Boolean.TRUE : (Boolean) eval(expr, values);
    }

    /** Whether the selector selects a message with these values (TRUE only). */
    public boolean matches(Map<String, ?> values) {
        return Boolean.TRUE.equals(evaluate(values));
    }

    // -- header values with no declared type (spec/selector.md section 3) --------------------------------
    /**
     * A header value no type was declared for (a plain STOMP header: no {@code pymq-types}) whose text reads
     * as a number: its number wherever a number is wanted (ordering, arithmetic, BETWEEN, {@code =} against a
     * number, IN a number list), its text against strings ({@code =}, {@code <>}, LIKE, IN a string list).
     *
     * @param text the header's text
     * @param number what it reads as: a Long, or a Double
     */
    public record Untyped(String text, Object number) {
    }

    /** The longest text read as a number. */
    static final int UNTYPED_MAX = 64;

    /** A header value with no declared type as the evaluator takes it: an {@link Untyped} or the text. */
    public static Object untyped(String text) {
        Object n = readNumber(text);
        return n == null ? text : new Untyped(text, n);
    }

    /**
     * The number an untyped value's text reads as (a Long, or a Double outside 64 bits or with a point or an
     * exponent), or null: ASCII {@code [+-]?digits[.digits][(e|E)[+-]digits]}, at most 64 characters.
     */
    public static Object readNumber(String text) {
        int n = text.length();
        if (n == 0 || n > UNTYPED_MAX) {
            return null;
        }
        int i = text.charAt(0) == '+' || text.charAt(0) == '-' ? 1 : 0;
        int start = i;
        while (i < n && isDigit(text.charAt(i))) {
            i++;
        }
        int whole = i - start;
        if (i == n) {
            if (whole == 0) {
                return null;
            }
            java.math.BigInteger big = new java.math.BigInteger(text.charAt(0) == '+' ? text.substring(1) : text);
            return big.bitLength() < 64 ? (Object) big.longValue() : (Object) big.doubleValue();
        }
        int fraction = 0;
        if (text.charAt(i) == '.') {
            i++;
            int mark = i;
            while (i < n && isDigit(text.charAt(i))) {
                i++;
            }
            fraction = i - mark;
        }
        if (whole == 0 && fraction == 0) {
            return null;
        }
        if (i < n && (text.charAt(i) == 'e' || text.charAt(i) == 'E')) {
            i++;
            if (i < n && (text.charAt(i) == '+' || text.charAt(i) == '-')) {
                i++;
            }
            int mark = i;
            while (i < n && isDigit(text.charAt(i))) {
                i++;
            }
            if (i == mark) {
                return null;
            }
        }
        return i == n ? (Object) Double.parseDouble(text) : null;
    }

    private static boolean isDigit(char c) {
        return c >= '0' && c <= '9';
    }

    /** A string value's text: a String's, or an Untyped's; null for other values. */
    private static String text(Object v) {
        return v instanceof String s ? s : v instanceof Untyped u ? u.text() : null;
    }

    // -- evaluation (pymq/selector/_evaluator_py.py, the reference) -----------------------------------
    /** A value as a selector number (Long or Double), or null when it is not one. */
    static Object number(Object v) {
        if (v instanceof Long || v instanceof Double) {
            return v;
        }
        if (v instanceof Untyped u) {
            return u.number();
        }
        if (v instanceof Integer || v instanceof Short || v instanceof Byte) {
            return ((Number) v).longValue();
        }
        if (v instanceof Float f) {
            return f.doubleValue();
        }
        return null;
    }

    private static String valueClass(Object v) {
        if (v instanceof Boolean) {
            return "bool";
        }
        if (v instanceof String) {
            return "str";
        }
        return "other";
    }

    static Boolean compare(String op, Object a, Object b) {
        if (a == null || b == null) {
            return null;
        }
        if ((op.equals("=") || op.equals("<>"))
                && (a instanceof Untyped && text(b) != null || b instanceof Untyped && a instanceof String)) {
            // an untyped value against a string (or another untyped value): their texts, as strings compare
            return text(a).equals(text(b)) == op.equals("=");
        }
        Object x = number(a);
        Object y = number(b);
        if (x != null && y != null) {
            int c;
            if (x instanceof Long lx && y instanceof Long ly) {
                c = Long.compare(lx, ly);
            } else {
                double dx = ((Number) x).doubleValue();
                double dy = ((Number) y).doubleValue();
                return switch (op) {     // IEEE: NaN compares false, -0.0 = 0.0
                    case "=" -> dx == dy;
                    case "<>" -> dx != dy;
                    case "<" -> dx < dy;
                    case ">" -> dx > dy;
                    case "<=" -> dx <= dy;
                    default -> dx >= dy;
                };
            }
            return switch (op) {
                case "=" -> c == 0;
                case "<>" -> c != 0;
                case "<" -> c < 0;
                case ">" -> c > 0;
                case "<=" -> c <= 0;
                default -> c >= 0;
            };
        }
        if (x != null || y != null) {
            return null;
        }
        String ca = valueClass(a);
        String cb = valueClass(b);
        if (!ca.equals(cb) || ca.equals("other")) {
            return null;
        }
        return switch (op) {
            case "=" -> a.equals(b);
            case "<>" -> !a.equals(b);
            default -> null;
        };
    }

    static Object arith(String op, Object a, Object b) {
        Object x = number(a);
        if (x == null) {
            return null;
        }
        Object y = number(b);
        if (y == null) {
            return null;
        }
        if (op.equals("/")) {
            double divisor = ((Number) y).doubleValue();
            if (divisor == 0.0) {
                return null;
            }
            return ((Number) x).doubleValue() / divisor;
        }
        if (x instanceof Long lx && y instanceof Long ly) {
            try {
                return switch (op) {
                    case "+" -> Math.addExact(lx, ly);
                    case "-" -> Math.subtractExact(lx, ly);
                    default -> Math.multiplyExact(lx, ly);
                };
            } catch (ArithmeticException overflow) {
                return null;
            }
        }
        double fx = ((Number) x).doubleValue();
        double fy = ((Number) y).doubleValue();
        return switch (op) {
            case "+" -> fx + fy;
            case "-" -> fx - fy;
            default -> fx * fy;
        };
    }

    private static Object eval(Expr e, Map<String, ?> values) {
        if (e instanceof Expr.Lit l) {
            return l.value();
        }
        if (e instanceof Expr.Prop p) {
            return values.get(p.name());
        }
        if (e instanceof Expr.Cond c) {
            Object v = eval(c.inner(), values);
            return v instanceof Boolean ? v : null;
        }
        if (e instanceof Expr.Not n) {
            Object v = eval(n.inner(), values);
            return v == null ? null : !(Boolean) v;
        }
        if (e instanceof Expr.And a) {
            Boolean result = Boolean.TRUE;
            for (Expr item : a.items()) {
                Object r = eval(item, values);
                if (Boolean.FALSE.equals(r)) {
                    return Boolean.FALSE;
                }
                if (r == null) {
                    result = null;
                }
            }
            return result;
        }
        if (e instanceof Expr.Or o) {
            Boolean result = Boolean.FALSE;
            for (Expr item : o.items()) {
                Object r = eval(item, values);
                if (Boolean.TRUE.equals(r)) {
                    return Boolean.TRUE;
                }
                if (r == null) {
                    result = null;
                }
            }
            return result;
        }
        if (e instanceof Expr.Cmp c) {
            return compare(c.op(), eval(c.left(), values), eval(c.right(), values));
        }
        if (e instanceof Expr.Arith a) {
            return arith(a.op(), eval(a.left(), values), eval(a.right(), values));
        }
        if (e instanceof Expr.Neg n) {
            Object x = number(eval(n.inner(), values));
            if (x instanceof Long l) {
                return l == Long.MIN_VALUE ? null : -l;
            }
            return x == null ? null : -(Double) x;
        }
        if (e instanceof Expr.Pos p) {
            return number(eval(p.inner(), values));
        }
        if (e instanceof Expr.Between b) {
            Object v = eval(b.value(), values);
            Object low = eval(b.low(), values);
            Object high = eval(b.high(), values);
            if (!b.negated()) {
                Boolean x = compare(">=", v, low);
                if (Boolean.FALSE.equals(x)) {
                    return false;
                }
                Boolean y = compare("<=", v, high);
                if (Boolean.FALSE.equals(y)) {
                    return false;
                }
                return Boolean.TRUE.equals(x) && Boolean.TRUE.equals(y) ? Boolean.TRUE : null;
            }
            Boolean x = compare("<", v, low);
            if (Boolean.TRUE.equals(x)) {
                return true;
            }
            Boolean y = compare(">", v, high);
            if (Boolean.TRUE.equals(y)) {
                return true;
            }
            return Boolean.FALSE.equals(x) && Boolean.FALSE.equals(y) ? Boolean.FALSE : null;
        }
        if (e instanceof Expr.In in) {
            Object v = eval(in.value(), values);
            if (in.strings()) {
                String s = text(v);
                return s != null ? in.items().contains(s) : null;
            }
            Object x = number(v);
            if (x == null) {
                return null;
            }
            if (in.allLongs() && x instanceof Long) {
                return in.items().contains(x);
            }
            double d = ((Number) x).doubleValue();
            for (Object item : in.items()) {
                if (((Number) item).doubleValue() == d) {
                    return true;
                }
            }
            return false;
        }
        if (e instanceof Expr.Like l) {
            String s = text(eval(l.value(), values));
            return s != null ? like(s.codePoints().toArray(), l.segments()) : null;
        }
        if (e instanceof Expr.IsNull n) {
            return eval(n.value(), values) == null;
        }
        throw new IllegalStateException("unknown selector node " + e);
    }

    /**
     * Whole-string match of code points against the LIKE segments ('_' one code point, '%' any run), by
     * dynamic programming over (pattern position, text position): linear in their product, so no pattern
     * can make it backtrack exponentially.
     */
    private static boolean like(int[] s, List<Expr.Segment> segs) {
        int size = 0;
        for (Expr.Segment seg : segs) {
            size += seg.kind() == Expr.Segment.Kind.LIT ? seg.text().length : 1;
        }
        int[] p = new int[size];    // a code point, or ANY / ONE
        int at = 0;
        for (Expr.Segment seg : segs) {
            switch (seg.kind()) {
                case LIT -> {
                    System.arraycopy(seg.text(), 0, p, at, seg.text().length);
                    at += seg.text().length;
                }
                case ONE -> p[at++] = ONE;
                default -> p[at++] = ANY;
            }
        }
        boolean[] row = new boolean[s.length + 1];    // row[i]: p[0..j) matches s[0..i)
        row[0] = true;
        for (int j = 0; j < p.length; j++) {
            boolean[] next = new boolean[s.length + 1];
            if (p[j] == ANY) {
                boolean any = false;
                for (int i = 0; i <= s.length; i++) {
                    any |= row[i];
                    next[i] = any;
                }
            } else {
                for (int i = 1; i <= s.length; i++) {
                    next[i] = row[i - 1] && (p[j] == ONE || p[j] == s[i - 1]);
                }
            }
            row = next;
        }
        return row[s.length];
    }

    private static final int ANY = -1;
    private static final int ONE = -2;

    @Override
    public String toString() {
        return "Selector[" + text + "]";
    }
}
