"""The compiled form of a selector: the one thing the parser hands to both evaluators.

A selector compiles once into a tree of plain tuples (strings, numbers, booleans, nested tuples), so it
can be printed, compared in tests and rebuilt by either evaluator (`_evaluator_py`, the reference, and
the Cython `_evaluator_c`).  Every node evaluates to a Python value; condition nodes evaluate to the
three-valued truth ``True`` / ``False`` / ``None`` (unknown).  The parser has already checked the static
types, so an evaluator never meets, for example, a string literal under ``*``.

Nodes (``e``, ``a``, ``b`` are nodes):

=====================================  =========================================================
``("lit", v)``                         a literal: str, int (signed 64-bit), float or bool
``("prop", name)``                     ``values.get(name)``; absent means NULL (``None``)
``("field", key, name)``               ``values[key].get(name)``: a value in a nested mapping
``("cond", e)``                        a value used as a condition: True/False if it is a bool, else unknown
``("not", e)``                         Kleene NOT
``("and", (e, ...))`` ``("or", ...)``  Kleene AND / OR over two or more conditions
``("cmp", op, a, b)``                  op in ``= <> < > <= >=``
``("arith", op, a, b)``                op in ``+ - * /``
``("neg", e)`` ``("pos", e)``          unary minus / plus (plus only checks that ``e`` is a number)
``("between", e, lo, hi)``             ``e >= lo AND e <= hi``, ``e`` evaluated once
``("notbetween", e, lo, hi)``          ``e < lo OR e > hi`` (JMS's definition; differs from NOT BETWEEN on NaN)
``("in", e, kind, (v, ...))``          kind ``"str"`` or ``"num"``; the literals of the list
``("like", e, segments)``              segments: ``("lit", text)``, ``("one", "")``, ``("any", "")``;
                                       matched through :func:`like_plan`, never a regular expression
``("isnull", e)``                      True when ``e`` is NULL, else False (never unknown)
``("contains", e, text)``              True when ``e`` is a str containing ``text``, else False
=====================================  =========================================================

The semantics (type rules, NULL, overflow) are specified in spec/selector.md; this module only holds
what both evaluators share and must not disagree on: the value classes and the LIKE plan.
"""
from __future__ import annotations

from typing import Any

#: the highest tree either evaluator builds; both recurse once per level (the Cython one on the C
#: stack), so this is what bounds their stack use.  SelectorLimits.max_depth may not exceed it.
MAX_HEIGHT = 64

LONG_MIN = -(2 ** 63)
LONG_MAX = 2 ** 63 - 1

CMP_OPS = ("=", "<>", "<", ">", "<=", ">=")
ARITH_OPS = ("+", "-", "*", "/")


#: one fixed-length run of a LIKE pattern between two '%': (length in code points, the literal pieces as
#: (offset, text)); the '_' positions are the gaps between pieces.
LikeGroup = tuple[int, tuple[tuple[int, str], ...]]
#: a node of the tree: (operator, operands...); what each position holds depends on the operator
IR = tuple[Any, ...]


def like_plan(segments: tuple[tuple[str, str], ...]) -> tuple[LikeGroup, ...]:
    """The groups a LIKE pattern matches, split at each '%': ``len(plan) == 1`` means no '%' at all.

    Both evaluators match a plan the same way, without backtracking across '%' and without a regular
    expression: the first group is anchored at the start, the last at the end, and each middle group
    takes its leftmost place after the one before.  A group has a fixed length, so its leftmost place
    ends earliest and leaves the most room for the rest: greedy is exact here, and every character of
    the value is looked at by one group search only.
    """
    groups: list[LikeGroup] = []
    pieces: list[tuple[int, str]]
    length, pieces = 0, []
    for kind, text in segments:
        if kind == "any":
            groups.append((length, tuple(pieces)))
            length, pieces = 0, []
        elif kind == "one":
            length += 1
        else:
            pieces.append((length, text))
            length += len(text)
    groups.append((length, tuple(pieces)))
    return tuple(groups)


def like_segments(pattern: str, escape: str | None) -> tuple[tuple[str, str], ...]:
    """Split a LIKE pattern into literal runs and wildcards.

    The escape character escapes only '%', '_' and itself; anywhere else (including the end of the
    pattern) it stands for itself, which keeps every pattern valid and agrees with Artemis' tests
    (``'%D7xlJIQn%_' ESCAPE '%'``: the first '%' is a wildcard, the last pair a literal '_').
    """
    segments: list[tuple[str, str]] = []
    literal: list[str] = []

    def flush() -> None:
        if literal:
            segments.append(("lit", "".join(literal)))
            literal.clear()

    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if escape is not None and c == escape and i + 1 < n and pattern[i + 1] in ("%", "_", escape):
            literal.append(pattern[i + 1])
            i += 2
            continue
        if c == "%":
            flush()
            if not segments or segments[-1] != ("any", ""):   # '%%' is one '%'
                segments.append(("any", ""))
        elif c == "_":
            flush()
            segments.append(("one", ""))
        else:
            literal.append(c)
        i += 1
    flush()
    return tuple(segments)


# -- header values with no declared type (spec/selector.md §3, "Untyped values") ---------------------------
#: the longest text read as a number: longer ones are strings (a long has 20 characters with its sign, a
#: double's shortest repr 24; Python refuses int() of over 4,300 digits, and nobody's number is that long)
UNTYPED_MAX = 64
_DIGITS = frozenset("0123456789")


class UntypedNumber(str):
    """A header value no type was declared for (a plain STOMP header: no ``pymq-types``) whose text reads
    as a number. It is its text (``=``, ``<>`` against strings, ``LIKE``, ``IN`` a string list) and its
    number (ordering, arithmetic, ``BETWEEN``, ``=`` against a number, ``IN`` a number list): the way
    ActiveMQ compares STOMP headers. Both evaluators recognise the exact type."""

    number: int | float

    def __new__(cls, text: str, number: int | float) -> UntypedNumber:
        self = super().__new__(cls, text)
        self.number = number
        return self

    def __reduce__(self) -> tuple[object, ...]:
        return (UntypedNumber, (str(self), self.number))


def read_number(text: str) -> int | float | None:
    """The number an untyped value's text reads as, or None (spec/selector.md §3).

    ``[+-]? digits`` is a long (a double when it leaves signed 64 bits); with a decimal point
    (``1.5``, ``1.``, ``.5``) and/or an exponent (``1e3``, ``2.5E-3``) a double. ASCII only; no
    spaces, no ``_``, no hexadecimal, no ``NaN``/``Infinity``, no suffix; at most :data:`UNTYPED_MAX`
    characters."""
    n = len(text)
    if n == 0 or n > UNTYPED_MAX:
        return None
    i = 1 if text[0] in "+-" else 0
    start = i
    while i < n and text[i] in _DIGITS:
        i += 1
    whole = i - start
    if i == n:
        if whole == 0:
            return None
        value = int(text)
        return value if LONG_MIN <= value <= LONG_MAX else float(value)
    fraction = 0
    if text[i] == ".":
        i += 1
        mark = i
        while i < n and text[i] in _DIGITS:
            i += 1
        fraction = i - mark
    if whole == 0 and fraction == 0:
        return None
    if i < n and text[i] in "eE":
        i += 1
        if i < n and text[i] in "+-":
            i += 1
        mark = i
        while i < n and text[i] in _DIGITS:
            i += 1
        if i == mark:
            return None
    if i != n:
        return None
    return float(text)


def untyped(text: str) -> str:
    """A header value with no declared type, as the evaluators take it: an :class:`UntypedNumber` when it
    reads as a number, else the text itself."""
    number = read_number(text)
    return text if number is None else UntypedNumber(text, number)
