"""One recursive-descent parser for the JMS selector grammar, extended by dialects.

The parser turns text into the tuple tree of :mod:`._ir` and checks static types on the way (a string
literal under ``*`` or a number where a condition belongs is an error, with its position).  A
:class:`Dialect` changes the language without copying the grammar: it names the error label, turns on
double-quoted strings and extra operator spellings, resolves bare words (JMS: every word is a message
property; the storage-rule dialect: a fixed keyword table), and may add postfix methods such as
``HEADER('x').contains('y')``.  The grammar itself (precedence, predicates, the type checks) lives here
only, so every dialect gets the same three-valued logic and the same errors.

Invariant: every node handed to an evaluator satisfies the static rules of spec/selector.md, and the
set of names the selector reads is known after parsing (``ParseResult.reads``).

Cost is bounded before anything is compiled (:class:`SelectorLimits`, spec/selector.md §7): the length
is checked before lexing, the number of terms before parsing, and the nesting depth while parsing —
both the parser's own recursion (parentheses, NOT, signs) and the height of the tree it builds, since
both evaluators walk that tree recursively.  The depth limit is what bounds their stack use.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable, Mapping

from pymq.errors import ConfigError, InvalidSelector

from ._ir import IR, LONG_MAX, LONG_MIN, MAX_HEIGHT, like_segments
from ._lexer import LONG_RANGE, Token, tokenize

# static kinds: what the parser knows about a node's value before any message is seen
BOOL, NUM, STR, ANY = "bool", "num", "str", "any"
_KIND_NAMES = {BOOL: "a boolean expression", NUM: "a numeric expression", STR: "a string expression", ANY: "a value"}


@dataclass(frozen=True, slots=True)
class SelectorLimits:
    """What one selector (or storage rule) may cost; over a limit it is an InvalidSelector.

    The defaults are far above any selector written by hand or generated from a UI, and low enough
    that compiling and evaluating stays cheap and the evaluators' recursion stays far from the stack's
    end (spec/selector.md §7).
    """

    #: characters of selector text, checked before anything else
    max_length: int = 16_384
    #: nesting: parentheses, NOT and signs inside each other, and the height of the expression tree
    #: (``a + b + c`` is two levels of ``+``; ``a AND b AND c`` is one)
    max_depth: int = 64
    #: identifiers and literals (IN list items included)
    max_terms: int = 2_048
    #: characters of one LIKE pattern: its matching tables grow with the square of its length
    max_like_length: int = 1_024

    def __post_init__(self) -> None:
        for name in ("max_length", "max_depth", "max_terms", "max_like_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"selector {name} must be a positive integer, got {value!r}")
        if self.max_depth > MAX_HEIGHT:
            # the evaluators recurse once per level; MAX_HEIGHT is what their stacks are sized for
            raise ConfigError(f"selector max_depth may not exceed {MAX_HEIGHT}, got {self.max_depth}")


DEFAULT_LIMITS = SelectorLimits()

#: token kinds that are terms (what max_terms counts)
_TERMS = frozenset({"ident", "string", "int", "float"})


@dataclass(slots=True)
class Node:
    """A parsed expression: its IR, its static kind, where it starts, and what it is."""

    ir: IR
    kind: str
    pos: int
    ref: bool = False      # a value reference (identifier, dialect keyword): IS NULL / LIKE / IN take these
    cond: bool = False     # evaluates to a truth value already (comparison, logic, boolean literal)
    height: int = 1        # of the IR tree: what the evaluators recurse over


@dataclass(frozen=True, slots=True)
class ParseResult:
    ir: IR | None          # None: the empty selector, which selects everything
    reads: frozenset[str]  # top-level names of the value mapping the selector looks at


class Dialect:
    """The JMS message selector language; subclasses add keywords (see ``_rules.StorageRuleDialect``)."""

    label = "selector"
    double_quotes = False
    #: extra operator spellings -> (token kind, value), e.g. {"&&": ("keyword", "AND")}
    aliases: Mapping[str, tuple[str, str]] = {}
    #: upper-case word -> handler(parser, token) -> Node; a bare word found here is not an identifier
    keywords: Mapping[str, Callable[[Parser, Token], Node]] = {}

    def identifier(self, parser: Parser, token: Token) -> Node:
        """A bare word that is neither reserved nor a dialect keyword: JMS reads it as a property."""
        parser.reads.add(token.value)
        return Node(("prop", token.value), ANY, token.pos, ref=True)

    def postfix(self, parser: Parser, node: Node) -> Node:
        """Called after every primary: a dialect may consume ``.method(...)`` here."""
        return node


JMS = Dialect()


@dataclass
class Parser:
    text: str
    dialect: Dialect = JMS
    limits: SelectorLimits = DEFAULT_LIMITS
    tokens: list[Token] = field(init=False)
    i: int = 0
    reads: set[str] = field(default_factory=set)
    nesting: int = 0       # parentheses, NOT and signs open around the current position

    def __post_init__(self) -> None:
        d = self.dialect
        limits = self.limits
        if len(self.text) > limits.max_length:
            raise self.error(limits.max_length, f"at most {limits.max_length} characters",
                             f"{len(self.text)} characters")
        self.tokens = tokenize(self.text, label=d.label, double_quotes=d.double_quotes, aliases=d.aliases)
        terms = 0
        for tok in self.tokens:
            if tok.kind in _TERMS:
                terms += 1
                if terms > limits.max_terms:
                    raise self.error(tok.pos, f"at most {limits.max_terms} identifiers and literals",
                                     f"{tok.describe()}, the {terms}th")

    # -- cost ----------------------------------------------------------------------------------------

    def node(self, ir: IR, kind: str, pos: int, *children: Node, ref: bool = False,
             cond: bool = False, at: int | None = None) -> Node:
        """A node over ``children``; its tree may not grow higher than ``max_depth`` (an error points
        at ``at``, the operator, or else at the node's start)."""
        height = 1 + max([c.height for c in children], default=0)
        if height > self.limits.max_depth:
            raise self.error(pos if at is None else at,
                             f"expressions nested at most {self.limits.max_depth} deep",
                             f"an operator nesting them {height} deep")
        return Node(ir, kind, pos, ref, cond, height)

    def enter(self, tok: Token) -> None:
        """One more parenthesis, NOT or sign open: the parser recurses, so this is bounded first."""
        self.nesting += 1
        if self.nesting > self.limits.max_depth:
            raise self.error(tok.pos, f"expressions nested at most {self.limits.max_depth} deep",
                             f"{tok.describe()} opening level {self.nesting}")

    def leave(self) -> None:
        self.nesting -= 1

    # -- token helpers --------------------------------------------------------------------------------

    @property
    def peek(self) -> Token:
        return self.tokens[self.i]

    def peek_at(self, k: int) -> Token:
        return self.tokens[min(self.i + k, len(self.tokens) - 1)]

    def advance(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind != "eof":
            self.i += 1
        return tok

    def at_keyword(self, *words: str) -> bool:
        tok = self.tokens[self.i]
        return tok.kind == "keyword" and tok.value in words

    def at_op(self, *ops: str) -> bool:
        tok = self.tokens[self.i]
        return tok.kind == "op" and tok.value in ops

    def expect_op(self, op: str) -> Token:
        if not self.at_op(op):
            raise self.error(self.peek.pos, f"'{op}'", self.peek.describe())
        return self.advance()

    def expect_string(self, expected: str = "a string literal") -> Token:
        if self.peek.kind != "string":
            raise self.error(self.peek.pos, expected, self.peek.describe())
        return self.advance()

    def error(self, pos: int, expected: str, found: str) -> InvalidSelector:
        return InvalidSelector(f"{self.dialect.label} error at position {pos}: expected {expected} but found {found}",
                               position=pos, expected=expected)

    # -- grammar --------------------------------------------------------------------------------------

    def parse(self) -> ParseResult:
        if self.peek.kind == "eof":
            return ParseResult(None, frozenset())
        node = self.or_expr()
        if self.peek.kind != "eof":
            raise self.error(self.peek.pos, "AND, OR or end of input", self.peek.describe())
        return ParseResult(self.condition(node).ir, frozenset(self.reads))

    def condition(self, node: Node) -> Node:
        """``node`` where a truth value is required: conditions pass, references are coerced."""
        if node.cond:
            return node
        if node.ref and node.kind in (BOOL, ANY):
            return self.node(("cond", node.ir), BOOL, node.pos, node, cond=True)
        raise self.error(node.pos, "a condition", _KIND_NAMES[node.kind])

    def or_expr(self) -> Node:
        return self._logic("OR", self.and_expr)

    def and_expr(self) -> Node:
        return self._logic("AND", self.not_expr)

    def _logic(self, word: str, operand: Callable[[], Node]) -> Node:
        first = operand()
        if not self.at_keyword(word):
            return first
        operands = [self.condition(first)]
        while self.at_keyword(word):
            self.advance()
            operands.append(self.condition(operand()))
        return self.node((word.lower(), tuple(o.ir for o in operands)), BOOL, first.pos, *operands,
                         cond=True)

    def not_expr(self) -> Node:
        if self.at_keyword("NOT"):
            tok = self.advance()
            self.enter(tok)
            inner = self.condition(self.not_expr())
            self.leave()
            return self.node(("not", inner.ir), BOOL, tok.pos, inner, cond=True)
        return self.predicate()

    def predicate(self) -> Node:
        left = self.additive()
        tok = self.peek
        if tok.kind == "op" and tok.value in ("=", "<>", "<", ">", "<=", ">="):
            self.advance()
            right = self.additive()
            self._check_comparison(tok.value, left, right)
            return self.node(("cmp", tok.value, left.ir, right.ir), BOOL, left.pos, left, right, cond=True,
                             at=tok.pos)
        negate = False
        if self.at_keyword("NOT"):
            if self.peek_at(1).kind == "keyword" and self.peek_at(1).value in ("BETWEEN", "LIKE", "IN"):
                self.advance()
                negate = True
            else:
                nxt = self.peek_at(1)
                raise self.error(nxt.pos, "BETWEEN, LIKE or IN after NOT", nxt.describe())
        if self.at_keyword("BETWEEN"):
            return self._between(left, negate)
        elif self.at_keyword("LIKE"):
            node = self._like(left)
        elif self.at_keyword("IN"):
            node = self._in(left)
        elif self.at_keyword("IS") and not negate:
            return self._is_null(left)
        else:
            return left
        if negate:
            node = self.node(("not", node.ir), BOOL, node.pos, node, cond=True)
        return node

    def _check_comparison(self, op: str, left: Node, right: Node) -> None:
        if op in ("=", "<>"):
            if left.kind != ANY and right.kind != ANY and left.kind != right.kind:
                raise self.error(right.pos, _KIND_NAMES[left.kind], _KIND_NAMES[right.kind])
            return
        # JMS: strings and booleans compare only with = and <>
        for side in (left, right):
            if side.kind not in (NUM, ANY):
                raise self.error(side.pos, "a numeric expression (strings and booleans allow only = and <>)",
                                 _KIND_NAMES[side.kind])

    def _numeric(self, node: Node) -> Node:
        if node.kind not in (NUM, ANY):
            raise self.error(node.pos, "a numeric expression", _KIND_NAMES[node.kind])
        return node

    def _between(self, left: Node, negate: bool) -> Node:
        self.advance()
        self._numeric(left)
        low = self._numeric(self.additive())
        if not self.at_keyword("AND"):
            raise self.error(self.peek.pos, "AND", self.peek.describe())
        self.advance()
        high = self._numeric(self.additive())
        op = "notbetween" if negate else "between"
        return self.node((op, left.ir, low.ir, high.ir), BOOL, left.pos, left, low, high, cond=True)

    def _reference(self, node: Node, what: str, kinds: tuple[str, ...]) -> Node:
        if not node.ref or node.kind not in kinds:
            found = "an identifier of another type" if node.ref else _KIND_NAMES[node.kind]
            raise self.error(node.pos, what, found)
        return node

    def _like(self, left: Node) -> Node:
        self.advance()
        self._reference(left, "a string identifier before LIKE", (STR, ANY))
        pattern = self.expect_string("a string literal pattern")
        if len(pattern.value) > self.limits.max_like_length:
            raise self.error(pattern.pos, f"a LIKE pattern of at most {self.limits.max_like_length} "
                                          f"characters", f"one of {len(pattern.value)}")
        escape = None
        if self.at_keyword("ESCAPE"):
            self.advance()
            tok = self.expect_string("a single-character string literal")
            if len(tok.value) != 1:
                raise self.error(tok.pos, "a single-character string literal", tok.describe())
            escape = tok.value
        return self.node(("like", left.ir, like_segments(pattern.value, escape)), BOOL, left.pos, left,
                         cond=True)

    def _in(self, left: Node) -> Node:
        self.advance()
        self._reference(left, "an identifier before IN", (STR, NUM, ANY))
        self.expect_op("(")
        kind = left.kind if left.kind != ANY else None
        items = []
        while True:
            item = self.literal_item(kind)
            kind = item.kind
            items.append(item.ir[1])
            if self.at_op(","):
                self.advance()
                continue
            if self.at_op(")"):
                self.advance()
                break
            raise self.error(self.peek.pos, "',' or ')'", self.peek.describe())
        return self.node(("in", left.ir, kind, tuple(items)), BOOL, left.pos, left, cond=True)

    def literal_item(self, kind: str | None) -> Node:
        """One element of an IN list: a string or (signed) number literal, or a dialect constant."""
        tok = self.peek
        node = None
        if tok.kind == "string":
            self.advance()
            node = Node(("lit", tok.value), STR, tok.pos)
        elif tok.kind in ("int", "float") or (tok.kind == "op" and tok.value in ("-", "+")
                                              and self.peek_at(1).kind in ("int", "float")):
            node = self.unary()
        elif tok.kind == "ident" and tok.value.upper() in self.dialect.keywords:
            candidate = self.dialect.keywords[tok.value.upper()](self, self.advance())
            if candidate.ir[0] == "lit":
                node = candidate
        if node is None or node.kind not in (STR, NUM) or (kind is not None and node.kind != kind):
            expected = {STR: "a string literal", NUM: "a numeric literal"}.get(kind or "",
                                                                              "a string or numeric literal")
            raise self.error(tok.pos, expected, tok.describe())
        return node

    def _is_null(self, left: Node) -> Node:
        self.advance()
        negate = False
        if self.at_keyword("NOT"):
            self.advance()
            negate = True
        if not self.at_keyword("NULL"):
            raise self.error(self.peek.pos, "NULL" if negate else "NULL or NOT NULL", self.peek.describe())
        self.advance()
        self._reference(left, "an identifier before IS NULL", (BOOL, NUM, STR, ANY))
        node = self.node(("isnull", left.ir), BOOL, left.pos, left, cond=True)
        if negate:
            node = self.node(("not", node.ir), BOOL, left.pos, node, cond=True)
        return node

    def additive(self) -> Node:
        node = self.multiplicative()
        while self.at_op("+", "-"):
            tok = self.advance()
            right = self._numeric(self.multiplicative())
            node = self.node(("arith", tok.value, self._numeric(node).ir, right.ir), NUM, node.pos, node,
                             right, at=tok.pos)
        return node

    def multiplicative(self) -> Node:
        node = self.unary()
        while self.at_op("*", "/"):
            tok = self.advance()
            right = self._numeric(self.unary())
            node = self.node(("arith", tok.value, self._numeric(node).ir, right.ir), NUM, node.pos, node,
                             right, at=tok.pos)
        return node

    def unary(self) -> Node:
        if self.at_op("+", "-"):
            tok = self.advance()
            nxt = self.peek
            if nxt.kind in ("int", "float"):
                # fold the sign into the literal: -9223372036854775808 is a long, 9223372036854775808 is not
                self.advance()
                value = -nxt.value if tok.value == "-" else nxt.value
                return self.postfix(self._number(value, nxt, tok.pos))
            self.enter(tok)
            operand = self._numeric(self.unary())
            self.leave()
            return self.node(("neg" if tok.value == "-" else "pos", operand.ir), NUM, tok.pos, operand)
        return self.primary()

    def _number(self, value: int | float, tok: Token, pos: int) -> Node:
        if tok.kind == "int" and not LONG_MIN <= value <= LONG_MAX:
            raise self.error(tok.pos, LONG_RANGE, tok.describe())
        return Node(("lit", value), NUM, pos)

    def primary(self) -> Node:
        tok = self.peek
        if tok.kind == "op" and tok.value == "(":
            self.advance()
            self.enter(tok)
            inner = self.or_expr()
            self.expect_op(")")
            self.leave()
            node = Node(inner.ir, inner.kind, tok.pos, ref=inner.ref, cond=inner.cond, height=inner.height)
        elif tok.kind == "string":
            self.advance()
            node = Node(("lit", tok.value), STR, tok.pos)
        elif tok.kind in ("int", "float"):
            self.advance()
            node = self._number(tok.value, tok, tok.pos)
        elif tok.kind == "keyword" and tok.value in ("TRUE", "FALSE"):
            self.advance()
            node = Node(("lit", tok.value == "TRUE"), BOOL, tok.pos, cond=True)
        elif tok.kind == "ident":
            self.advance()
            handler = self.dialect.keywords.get(tok.value.upper())
            node = handler(self, tok) if handler else self.dialect.identifier(self, tok)
        else:
            raise self.error(tok.pos, "an expression", tok.describe())
        return self.postfix(node)

    def postfix(self, node: Node) -> Node:
        return self.dialect.postfix(self, node)


def parse(text: str, dialect: Dialect = JMS, limits: SelectorLimits = DEFAULT_LIMITS) -> ParseResult:
    """Parse ``text`` in ``dialect`` within ``limits``; raises :class:`pymq.errors.InvalidSelector`."""
    if not isinstance(text, str):
        raise InvalidSelector(f"{dialect.label} error at position 0: expected a string but found "
                              f"{type(text).__name__}", position=0, expected="a string")
    return Parser(text, dialect, limits).parse()
