package io.pymq.selector;

import jakarta.jms.InvalidSelectorException;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Set;

/**
 * The JMS selector grammar of spec/selector.md §1–2, ported from the reference parser
 * ({@code pymq/selector/_lexer.py} and {@code _parser.py}) so that an invalid selector fails here with the
 * same {@code position} (a code-point offset, as Python counts) and {@code expected} text as on the broker.
 */
final class SelectorParser {
    static final Set<String> RESERVED = Set.of("NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "NULL", "TRUE",
            "FALSE", "ESCAPE");
    private static final String[] OPERATORS = {"<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "(", ")", ","};

    // static kinds
    static final int BOOL = 0;
    static final int NUM = 1;
    static final int STR = 2;
    static final int ANY = 3;
    private static final String[] KIND_NAMES = {"a boolean expression", "a numeric expression", "a string expression",
            "a value"};

    enum TokenKind { KEYWORD, IDENT, STRING, INT, FLOAT, OP, EOF }

    /** value: keyword upper-case, ident word, string text, BigInteger or Double, operator symbol. */
    record Token(TokenKind kind, Object value, int pos, String text) {
        String describe() {
            return kind == TokenKind.EOF ? "end of input" : "'" + text + "'";
        }

        boolean is(TokenKind k, String v) {
            return kind == k && v.equals(value);
        }
    }

    /** A parsed expression with what the parser knows about it. */
    record Node(Expr expr, int kind, int pos, boolean ref, boolean cond) {
        Node(Expr expr, int kind, int pos) {
            this(expr, kind, pos, false, false);
        }
    }

    static final class Failure extends Exception {
        final int position;
        final String expected;

        Failure(int position, String expected, String found) {
            super("selector error at position " + position + ": expected " + expected + " but found " + found);
            this.position = position;
            this.expected = expected;
        }

        InvalidSelectorException jms() {
            InvalidSelectorException e = new InvalidSelectorException(getMessage(), "invalid-selector");
            e.setLinkedException(this);
            return e;
        }
    }

    private final int[] cp;     // the text as code points: positions count them, as Python does
    private final List<Token> tokens;
    private int i;
    final Set<String> reads = new LinkedHashSet<>();

    SelectorParser(String text) throws Failure {
        this.cp = text.codePoints().toArray();
        this.tokens = tokenize();
    }

    private String str(int from, int to) {
        return new String(cp, from, to - from);
    }

    // -- lexer ---------------------------------------------------------------------------------------------
    private static boolean isSpace(int c) {
        return Character.isWhitespace(c) || Character.isSpaceChar(c);
    }

    private static boolean identStart(int c) {
        return Character.isLetter(c) || c == '_' || c == '$';
    }

    private static boolean identPart(int c) {
        return Character.isLetterOrDigit(c) || c == '_' || c == '$';
    }

    private static boolean digit(int c) {
        return c >= '0' && c <= '9';
    }

    private String foundAt(int j) {
        return j >= cp.length ? "end of input" : "'" + str(j, j + 1) + "'";
    }

    private List<Token> tokenize() throws Failure {
        List<Token> out = new ArrayList<>();
        int n = cp.length;
        int p = 0;
        outer:
        while (p < n) {
            int c = cp[p];
            if (isSpace(c)) {
                p++;
                continue;
            }
            int start = p;
            if (c == '\'') {
                StringBuilder value = new StringBuilder();
                p++;
                while (true) {
                    int j = p;
                    while (j < n && cp[j] != '\'') {
                        j++;
                    }
                    if (j >= n) {
                        throw new Failure(n, "' to close the string opened at position " + start, "end of input");
                    }
                    value.append(str(p, j));
                    if (j + 1 < n && cp[j + 1] == '\'') {
                        value.append('\'');
                        p = j + 2;
                        continue;
                    }
                    p = j + 1;
                    break;
                }
                out.add(new Token(TokenKind.STRING, value.toString(), start, str(start, p)));
                continue;
            }
            if (digit(c) || (c == '.' && p + 1 < n && digit(cp[p + 1]))) {
                Token t = number(p);
                out.add(t);
                p = start + t.text().codePointCount(0, t.text().length());
                continue;
            }
            if (identStart(c)) {
                while (p < n && identPart(cp[p])) {
                    p++;
                }
                String word = str(start, p);
                String upper = word.toUpperCase(Locale.ROOT);
                out.add(RESERVED.contains(upper) ? new Token(TokenKind.KEYWORD, upper, start, word)
                        : new Token(TokenKind.IDENT, word, start, word));
                continue;
            }
            for (String op : OPERATORS) {
                if (startsWith(p, op)) {
                    out.add(new Token(TokenKind.OP, op, start, op));
                    p += op.length();
                    continue outer;
                }
            }
            throw new Failure(p, "an expression or operator", "'" + str(p, p + 1) + "'");
        }
        out.add(new Token(TokenKind.EOF, null, n, ""));
        return out;
    }

    private boolean startsWith(int p, String op) {
        if (p + op.length() > cp.length) {
            return false;
        }
        for (int k = 0; k < op.length(); k++) {
            if (cp[p + k] != op.charAt(k)) {
                return false;
            }
        }
        return true;
    }

    private Token number(int p) throws Failure {
        int start = p;
        int n = cp.length;
        while (p < n && digit(cp[p])) {
            p++;
        }
        boolean isFloat = false;
        if (p < n && cp[p] == '.') {
            isFloat = true;
            p++;
            while (p < n && digit(cp[p])) {
                p++;
            }
        }
        if (p < n && (cp[p] == 'e' || cp[p] == 'E')) {
            int j = p + 1;
            if (j < n && (cp[j] == '+' || cp[j] == '-')) {
                j++;
            }
            if (j < n && digit(cp[j])) {
                isFloat = true;
                p = j;
                while (p < n && digit(cp[p])) {
                    p++;
                }
            } else {
                throw new Failure(j, "the digits of an exponent", foundAt(j));
            }
        }
        String digits = str(start, p);
        if (!isFloat && p < n && (cp[p] == 'l' || cp[p] == 'L')) {
            p++;
        }
        if (p < n && identPart(cp[p])) {
            boolean hex = digits.equals("0") && (cp[p] == 'x' || cp[p] == 'X');
            throw new Failure(p, hex ? "a decimal number (hexadecimal is not supported)" : "an operator after a number",
                    "'" + str(p, p + 1) + "'");
        }
        if (isFloat) {
            return new Token(TokenKind.FLOAT, Double.parseDouble(digits), start, str(start, p));
        }
        if (digits.length() > 1 && digits.charAt(0) == '0') {
            throw new Failure(start, "a decimal integer without leading zeros (octal is not supported)",
                    "'" + str(start, p) + "'");
        }
        return new Token(TokenKind.INT, new BigInteger(digits), start, str(start, p));
    }

    // -- token helpers -------------------------------------------------------------------------------------
    private Token peek() {
        return tokens.get(i);
    }

    private Token peekAt(int k) {
        return tokens.get(Math.min(i + k, tokens.size() - 1));
    }

    private Token advance() {
        Token t = tokens.get(i);
        if (t.kind() != TokenKind.EOF) {
            i++;
        }
        return t;
    }

    private boolean atKeyword(String... words) {
        Token t = peek();
        if (t.kind() != TokenKind.KEYWORD) {
            return false;
        }
        for (String w : words) {
            if (w.equals(t.value())) {
                return true;
            }
        }
        return false;
    }

    private boolean atOp(String... ops) {
        Token t = peek();
        if (t.kind() != TokenKind.OP) {
            return false;
        }
        for (String o : ops) {
            if (o.equals(t.value())) {
                return true;
            }
        }
        return false;
    }

    private Failure error(int pos, String expected, String found) {
        return new Failure(pos, expected, found);
    }

    // -- grammar ------------------------------------------------------------------------------------------
    /** The whole selector; null for the empty selector (selects everything). */
    Expr parse() throws Failure {
        if (peek().kind() == TokenKind.EOF) {
            return null;
        }
        Node node = orExpr();
        if (peek().kind() != TokenKind.EOF) {
            throw error(peek().pos(), "AND, OR or end of input", peek().describe());
        }
        return condition(node).expr();
    }

    private Node condition(Node node) throws Failure {
        if (node.cond()) {
            return node;
        }
        if (node.ref() && (node.kind() == BOOL || node.kind() == ANY)) {
            return new Node(new Expr.Cond(node.expr()), BOOL, node.pos(), false, true);
        }
        throw error(node.pos(), "a condition", KIND_NAMES[node.kind()]);
    }

    private interface Operand {
        Node parse() throws Failure;
    }

    private Node orExpr() throws Failure {
        return logic("OR", this::andExpr);
    }

    private Node andExpr() throws Failure {
        return logic("AND", this::notExpr);
    }

    private Node logic(String word, Operand operand) throws Failure {
        Node first = operand.parse();
        if (!atKeyword(word)) {
            return first;
        }
        List<Expr> items = new ArrayList<>();
        items.add(condition(first).expr());
        while (atKeyword(word)) {
            advance();
            items.add(condition(operand.parse()).expr());
        }
        Expr e = word.equals("OR") ? new Expr.Or(List.copyOf(items)) : new Expr.And(List.copyOf(items));
        return new Node(e, BOOL, first.pos(), false, true);
    }

    private Node notExpr() throws Failure {
        if (atKeyword("NOT")) {
            Token t = advance();
            Node inner = condition(notExpr());
            return new Node(new Expr.Not(inner.expr()), BOOL, t.pos(), false, true);
        }
        return predicate();
    }

    private Node predicate() throws Failure {
        Node left = additive();
        Token t = peek();
        if (t.kind() == TokenKind.OP && Set.of("=", "<>", "<", ">", "<=", ">=").contains((String) t.value())) {
            advance();
            Node right = additive();
            checkComparison((String) t.value(), left, right);
            return new Node(new Expr.Cmp((String) t.value(), left.expr(), right.expr()), BOOL, left.pos(), false, true);
        }
        boolean negate = false;
        if (atKeyword("NOT")) {
            Token next = peekAt(1);
            if (next.kind() == TokenKind.KEYWORD && Set.of("BETWEEN", "LIKE", "IN").contains((String) next.value())) {
                advance();
                negate = true;
            } else {
                throw error(next.pos(), "BETWEEN, LIKE or IN after NOT", next.describe());
            }
        }
        Node node;
        if (atKeyword("BETWEEN")) {
            return between(left, negate);
        } else if (atKeyword("LIKE")) {
            node = like(left);
        } else if (atKeyword("IN")) {
            node = in(left);
        } else if (atKeyword("IS") && !negate) {
            return isNull(left);
        } else {
            return left;
        }
        if (negate) {
            node = new Node(new Expr.Not(node.expr()), BOOL, node.pos(), false, true);
        }
        return node;
    }

    private void checkComparison(String op, Node left, Node right) throws Failure {
        if (op.equals("=") || op.equals("<>")) {
            if (left.kind() != ANY && right.kind() != ANY && left.kind() != right.kind()) {
                throw error(right.pos(), KIND_NAMES[left.kind()], KIND_NAMES[right.kind()]);
            }
            return;
        }
        for (Node side : new Node[] {left, right}) {
            if (side.kind() != NUM && side.kind() != ANY) {
                throw error(side.pos(), "a numeric expression (strings and booleans allow only = and <>)",
                        KIND_NAMES[side.kind()]);
            }
        }
    }

    private Node numeric(Node node) throws Failure {
        if (node.kind() != NUM && node.kind() != ANY) {
            throw error(node.pos(), "a numeric expression", KIND_NAMES[node.kind()]);
        }
        return node;
    }

    private Node between(Node left, boolean negate) throws Failure {
        advance();
        numeric(left);
        Node low = numeric(additive());
        if (!atKeyword("AND")) {
            throw error(peek().pos(), "AND", peek().describe());
        }
        advance();
        Node high = numeric(additive());
        return new Node(new Expr.Between(left.expr(), low.expr(), high.expr(), negate), BOOL, left.pos(), false, true);
    }

    private void reference(Node node, String what, int... kinds) throws Failure {
        boolean ok = false;
        for (int k : kinds) {
            ok |= node.kind() == k;
        }
        if (!node.ref() || !ok) {
            throw error(node.pos(), what, node.ref() ? "an identifier of another type" : KIND_NAMES[node.kind()]);
        }
    }

    private Token expectString(String expected) throws Failure {
        if (peek().kind() != TokenKind.STRING) {
            throw error(peek().pos(), expected, peek().describe());
        }
        return advance();
    }

    private Node like(Node left) throws Failure {
        advance();
        reference(left, "a string identifier before LIKE", STR, ANY);
        Token pattern = expectString("a string literal pattern");
        Integer escape = null;
        if (atKeyword("ESCAPE")) {
            advance();
            Token t = expectString("a single-character string literal");
            String v = (String) t.value();
            if (v.codePointCount(0, v.length()) != 1) {
                throw error(t.pos(), "a single-character string literal", t.describe());
            }
            escape = v.codePointAt(0);
        }
        return new Node(new Expr.Like(left.expr(), likeSegments((String) pattern.value(), escape)), BOOL, left.pos(),
                false, true);
    }

    /** Literal runs and wildcards; the escape escapes only '%', '_' and itself (spec/selector.md §3). */
    static List<Expr.Segment> likeSegments(String pattern, Integer escape) {
        int[] p = pattern.codePoints().toArray();
        List<Expr.Segment> out = new ArrayList<>();
        StringBuilder literal = new StringBuilder();
        int n = p.length;
        for (int k = 0; k < n; k++) {
            int c = p[k];
            if (escape != null && c == escape && k + 1 < n && (p[k + 1] == '%' || p[k + 1] == '_' || p[k + 1] == escape)) {
                literal.appendCodePoint(p[k + 1]);
                k++;
                continue;
            }
            if (c == '%' || c == '_') {
                if (literal.length() > 0) {
                    out.add(new Expr.Segment(Expr.Segment.Kind.LIT, literal.codePoints().toArray()));
                    literal.setLength(0);
                }
                if (c == '_') {
                    out.add(new Expr.Segment(Expr.Segment.Kind.ONE, new int[0]));
                } else if (out.isEmpty() || out.get(out.size() - 1).kind() != Expr.Segment.Kind.ANY) {
                    out.add(new Expr.Segment(Expr.Segment.Kind.ANY, new int[0]));
                }
            } else {
                literal.appendCodePoint(c);
            }
        }
        if (literal.length() > 0) {
            out.add(new Expr.Segment(Expr.Segment.Kind.LIT, literal.codePoints().toArray()));
        }
        return List.copyOf(out);
    }

    private Node in(Node left) throws Failure {
        advance();
        reference(left, "an identifier before IN", STR, NUM, ANY);
        if (!atOp("(")) {
            throw error(peek().pos(), "'('", peek().describe());
        }
        advance();
        Integer kind = left.kind() != ANY ? left.kind() : null;
        Set<Object> items = new HashSet<>();
        boolean allLongs = true;
        while (true) {
            Node item = literalItem(kind);
            kind = item.kind();
            Object v = ((Expr.Lit) item.expr()).value();
            allLongs &= v instanceof Long;
            items.add(v);
            if (atOp(",")) {
                advance();
                continue;
            }
            if (atOp(")")) {
                advance();
                break;
            }
            throw error(peek().pos(), "',' or ')'", peek().describe());
        }
        return new Node(new Expr.In(left.expr(), kind == STR, Set.copyOf(items), allLongs), BOOL, left.pos(), false, true);
    }

    private Node literalItem(Integer kind) throws Failure {
        Token t = peek();
        Node node = null;
        if (t.kind() == TokenKind.STRING) {
            advance();
            node = new Node(new Expr.Lit(t.value()), STR, t.pos());
        } else if (t.kind() == TokenKind.INT || t.kind() == TokenKind.FLOAT
                || (t.kind() == TokenKind.OP && (t.value().equals("-") || t.value().equals("+"))
                && (peekAt(1).kind() == TokenKind.INT || peekAt(1).kind() == TokenKind.FLOAT))) {
            node = unary();
        }
        if (node == null || (node.kind() != STR && node.kind() != NUM) || (kind != null && node.kind() != kind)) {
            String expected = kind == null ? "a string or numeric literal" : kind == STR ? "a string literal"
                    : kind == NUM ? "a numeric literal" : "a string or numeric literal";
            throw error(t.pos(), expected, t.describe());
        }
        return node;
    }

    private Node isNull(Node left) throws Failure {
        advance();
        boolean negate = false;
        if (atKeyword("NOT")) {
            advance();
            negate = true;
        }
        if (!atKeyword("NULL")) {
            throw error(peek().pos(), negate ? "NULL" : "NULL or NOT NULL", peek().describe());
        }
        advance();
        reference(left, "an identifier before IS NULL", BOOL, NUM, STR, ANY);
        Node node = new Node(new Expr.IsNull(left.expr()), BOOL, left.pos(), false, true);
        if (negate) {
            node = new Node(new Expr.Not(node.expr()), BOOL, left.pos(), false, true);
        }
        return node;
    }

    private Node additive() throws Failure {
        Node node = multiplicative();
        while (atOp("+", "-")) {
            String op = (String) advance().value();
            Node right = numeric(multiplicative());
            node = new Node(new Expr.Arith(op, numeric(node).expr(), right.expr()), NUM, node.pos());
        }
        return node;
    }

    private Node multiplicative() throws Failure {
        Node node = unary();
        while (atOp("*", "/")) {
            String op = (String) advance().value();
            Node right = numeric(unary());
            node = new Node(new Expr.Arith(op, numeric(node).expr(), right.expr()), NUM, node.pos());
        }
        return node;
    }

    private Node unary() throws Failure {
        if (atOp("+", "-")) {
            Token t = advance();
            Token next = peek();
            if (next.kind() == TokenKind.INT || next.kind() == TokenKind.FLOAT) {
                // the sign folds into the literal: -9223372036854775808 is a long, 9223372036854775808 is not
                advance();
                boolean minus = t.value().equals("-");
                Object v = next.kind() == TokenKind.INT ? (minus ? ((BigInteger) next.value()).negate() : next.value())
                        : (Object) (minus ? -(Double) next.value() : (Double) next.value());
                return number(v, next, t.pos());
            }
            Node operand = numeric(unary());
            return new Node(t.value().equals("-") ? new Expr.Neg(operand.expr()) : new Expr.Pos(operand.expr()), NUM,
                    t.pos());
        }
        return primary();
    }

    private static final BigInteger LONG_MIN = BigInteger.valueOf(Long.MIN_VALUE);
    private static final BigInteger LONG_MAX = BigInteger.valueOf(Long.MAX_VALUE);

    private Node number(Object value, Token t, int pos) throws Failure {
        if (value instanceof BigInteger b) {
            if (b.compareTo(LONG_MIN) < 0 || b.compareTo(LONG_MAX) > 0) {
                throw error(t.pos(), "an integer between -9223372036854775808 and 9223372036854775807", t.describe());
            }
            return new Node(new Expr.Lit(b.longValue()), NUM, pos);
        }
        return new Node(new Expr.Lit(value), NUM, pos);
    }

    private Node primary() throws Failure {
        Token t = peek();
        if (t.is(TokenKind.OP, "(")) {
            advance();
            Node inner = orExpr();
            if (!atOp(")")) {
                throw error(peek().pos(), "')'", peek().describe());
            }
            advance();
            return new Node(inner.expr(), inner.kind(), t.pos(), inner.ref(), inner.cond());
        }
        if (t.kind() == TokenKind.STRING) {
            advance();
            return new Node(new Expr.Lit(t.value()), STR, t.pos());
        }
        if (t.kind() == TokenKind.INT || t.kind() == TokenKind.FLOAT) {
            advance();
            return number(t.value(), t, t.pos());
        }
        if (t.kind() == TokenKind.KEYWORD && (t.value().equals("TRUE") || t.value().equals("FALSE"))) {
            advance();
            return new Node(new Expr.Lit(t.value().equals("TRUE")), BOOL, t.pos(), false, true);
        }
        if (t.kind() == TokenKind.IDENT) {
            advance();
            reads.add((String) t.value());
            return new Node(new Expr.Prop((String) t.value()), ANY, t.pos(), true, false);
        }
        throw error(t.pos(), "an expression", t.describe());
    }
}
