package io.pymq.selector;

import java.util.List;
import java.util.Set;

/**
 * The compiled form of a selector, node for node the tuple tree of {@code pymq/selector/_ir.py} (the
 * reference implementation): the parser has checked the static types, so evaluation never meets, say, a
 * string literal under {@code *}.
 */
sealed interface Expr {
    /** A literal: String, Long, Double or Boolean. */
    record Lit(Object value) implements Expr {
    }

    /** A message property or header field by name; absent is NULL. */
    record Prop(String name) implements Expr {
    }

    /** A value used as a condition: TRUE/FALSE when it is a Boolean, else UNKNOWN. */
    record Cond(Expr inner) implements Expr {
    }

    record Not(Expr inner) implements Expr {
    }

    record And(List<Expr> items) implements Expr {
    }

    record Or(List<Expr> items) implements Expr {
    }

    /** op is one of {@code = <> < > <= >=}. */
    record Cmp(String op, Expr left, Expr right) implements Expr {
    }

    /** op is one of {@code + - * /}. */
    record Arith(String op, Expr left, Expr right) implements Expr {
    }

    record Neg(Expr inner) implements Expr {
    }

    /** Unary plus: only checks that its operand is a number. */
    record Pos(Expr inner) implements Expr {
    }

    record Between(Expr value, Expr low, Expr high, boolean negated) implements Expr {
    }

    /** {@code strings}: a list of string literals, else of numbers (Long or Double). */
    record In(Expr value, boolean strings, Set<Object> items, boolean allLongs) implements Expr {
    }

    /** The pattern as code-point segments: literal runs, ONE ('_') and ANY ('%'). */
    record Like(Expr value, List<Segment> segments) implements Expr {
    }

    record Segment(Kind kind, int[] text) {
        enum Kind { LIT, ONE, ANY }
    }

    record IsNull(Expr value) implements Expr {
    }
}
