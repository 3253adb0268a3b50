"""Reference evaluator of compiled selectors (the pure-Python twin of ``_ext/selector.pyx``).

``build(ir)`` turns the tuple tree of :mod:`._ir` into a :class:`Program` of nested closures, built once
per selector; ``Program.evaluate(values)`` returns ``True``, ``False`` or ``None`` (unknown) and
``Program.matches(values)`` is true only for ``True``.  The value rules of spec/selector.md live in
:func:`compare`, :func:`arith` and :func:`number` and nowhere else; the Cython twin must agree with them
on every input (tests/selector/test_differential.py checks this with hypothesis).

Value classes: ``None`` is NULL; ``bool`` is boolean (never a number, although Python makes it an int);
``int`` within signed 64 bits and ``float`` are numbers; ``str`` is a string; anything else (bytes, an int
outside 64 bits, ...) is a value of no JMS type, which compares as unknown and is not NULL. An
:class:`~._ir.UntypedNumber` (a header with no declared type whose text reads as a number) is both: its
number wherever a number is wanted, its text in ``=``/``<>`` against a string and in string predicates.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pymq.errors import InvalidSelector

from ._ir import IR, LONG_MAX, LONG_MIN, MAX_HEIGHT, LikeGroup, UntypedNumber, like_plan

IMPLEMENTATION = "py"

Fn = Callable[[Mapping[str, object]], object]


def number(v: object) -> int | float | None:
    """``v`` as a JMS number, or None when it is not one."""
    t = type(v)
    if t is int:
        return v if LONG_MIN <= v <= LONG_MAX else None  # type: ignore[operator,return-value]
    if t is float:
        return v  # type: ignore[return-value]
    if t is UntypedNumber:
        return v.number  # type: ignore[attr-defined,no-any-return]
    if t is bool or v is None:
        return None
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return int(v) if LONG_MIN <= v <= LONG_MAX else None
    if isinstance(v, float):
        return float(v)
    return None


def _class(v: object) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, str):
        return "str"
    return "other"


def compare(op: str, a: object, b: object) -> bool | None:
    """A comparison under JMS rules: NULL or unlike types give unknown; numbers promote int to float."""
    if a is None or b is None:
        return None
    if (op == "=" or op == "<>") and (type(a) is UntypedNumber and isinstance(b, str)
                                      or type(b) is UntypedNumber and isinstance(a, str)):
        # an untyped value against a string (or another untyped value): their texts, as strings compare
        return (a == b) if op == "=" else (a != b)
    x = number(a)
    y = number(b)
    if x is not None and y is not None:
        if type(x) is float or type(y) is float:
            x, y = float(x), float(y)
        if op == "=":
            return x == y
        if op == "<>":
            return x != y
        if op == "<":
            return x < y
        if op == ">":
            return x > y
        if op == "<=":
            return x <= y
        return x >= y
    if x is not None or y is not None:
        return None                      # a number against a non-number
    ca, cb = _class(a), _class(b)
    if ca != cb or ca == "other":
        return None
    if op == "=":
        return a == b
    if op == "<>":
        return a != b
    return None                          # strings and booleans are not ordered


def arith(op: str, a: object, b: object) -> int | float | None:
    """Arithmetic: NULL or a non-number gives NULL; '/' is real division, by zero NULL; int overflow NULL."""
    x = number(a)
    if x is None:
        return None
    y = number(b)
    if y is None:
        return None
    if op == "/":
        divisor = float(y)
        if divisor == 0.0:
            return None
        return float(x) / divisor
    if type(x) is int and type(y) is int:
        r = x + y if op == "+" else x - y if op == "-" else x * y
        return r if LONG_MIN <= r <= LONG_MAX else None
    fx, fy = float(x), float(y)
    return fx + fy if op == "+" else fx - fy if op == "-" else fx * fy


def negate(a: object) -> int | float | None:
    x = number(a)
    if x is None:
        return None
    if type(x) is int:
        return -x if -x <= LONG_MAX else None
    return -x


def _and(parts: Sequence[Fn]) -> Fn:
    def ev(values: Mapping[str, object]) -> object:
        result: bool | None = True
        for part in parts:
            r = part(values)
            if r is False:
                return False
            if r is None:
                result = None
        return result
    return ev


def _or(parts: Sequence[Fn]) -> Fn:
    def ev(values: Mapping[str, object]) -> object:
        result: bool | None = False
        for part in parts:
            r = part(values)
            if r is True:
                return True
            if r is None:
                result = None
        return result
    return ev


def _compile(node: IR, height: int = 1) -> Fn:
    if height > MAX_HEIGHT:
        raise InvalidSelector(f"selector error at position 0: expected expressions nested at most "
                              f"{MAX_HEIGHT} deep but found a deeper tree", position=0,
                              expected=f"expressions nested at most {MAX_HEIGHT} deep")
    op = node[0]
    if op == "lit":
        value = node[1]
        return lambda values: value
    if op == "prop":
        name = node[1]
        return lambda values: values.get(name)
    if op == "field":
        key, name = node[1], node[2]

        def field(values: Mapping[str, object]) -> object:
            inner = values.get(key)
            return None if inner is None else inner.get(name)  # type: ignore[attr-defined]
        return field
    if op == "cond":
        inner = _compile(node[1], height + 1)

        def cond(values: Mapping[str, object]) -> object:
            v = inner(values)
            return v if v is True or v is False else None
        return cond
    if op == "not":
        inner = _compile(node[1], height + 1)

        def not_(values: Mapping[str, object]) -> object:
            v = inner(values)
            return None if v is None else not v
        return not_
    if op == "and":
        return _and([_compile(n, height + 1) for n in node[1]])
    if op == "or":
        return _or([_compile(n, height + 1) for n in node[1]])
    if op == "cmp":
        cop, left, right = node[1], _compile(node[2], height + 1), _compile(node[3], height + 1)
        return lambda values: compare(cop, left(values), right(values))
    if op == "arith":
        aop, left, right = node[1], _compile(node[2], height + 1), _compile(node[3], height + 1)
        return lambda values: arith(aop, left(values), right(values))
    if op == "neg":
        inner = _compile(node[1], height + 1)
        return lambda values: negate(inner(values))
    if op == "pos":
        inner = _compile(node[1], height + 1)
        return lambda values: number(inner(values))
    if op == "between":
        h = height + 1
        e, lo, hi = _compile(node[1], h), _compile(node[2], h), _compile(node[3], h)

        def between(values: Mapping[str, object]) -> object:
            v = e(values)
            a = compare(">=", v, lo(values))
            if a is False:
                return False
            b = compare("<=", v, hi(values))
            if b is False:
                return False
            return True if a is True and b is True else None
        return between
    if op == "notbetween":
        h = height + 1
        e, lo, hi = _compile(node[1], h), _compile(node[2], h), _compile(node[3], h)

        def notbetween(values: Mapping[str, object]) -> object:
            v = e(values)
            a = compare("<", v, lo(values))
            if a is True:
                return True
            b = compare(">", v, hi(values))
            if b is True:
                return True
            return False if a is False and b is False else None
        return notbetween
    if op == "in":
        return _in(_compile(node[1], height + 1), node[2], node[3])
    if op == "like":
        inner, matcher = _compile(node[1], height + 1), _LikeMatcher(like_plan(node[2]))

        def like(values: Mapping[str, object]) -> object:
            v = inner(values)
            if not isinstance(v, str):
                return None
            return matcher(v)
        return like
    if op == "isnull":
        inner = _compile(node[1], height + 1)
        return lambda values: inner(values) is None
    if op == "contains":
        inner, needle = _compile(node[1], height + 1), node[2]

        def contains(values: Mapping[str, object]) -> object:
            v = inner(values)
            return isinstance(v, str) and needle in v
        return contains
    raise ValueError(f"unknown selector node {op!r}")


def _group_at(group: LikeGroup, v: str, at: int) -> bool:
    """Group ``group`` matches ``v`` at offset ``at`` (the caller checked that it fits)."""
    for offset, text in group[1]:
        if not v.startswith(text, at + offset):
            return False
    return True


def _group_masks(group: LikeGroup) -> tuple[dict[str, int], int]:
    """Bit-parallel (shift-and) tables of a group: bit ``j`` of ``masks[c]`` is set when position ``j``
    accepts ``c``; ``wild`` has the '_' positions, which accept anything."""
    length, pieces = group
    wild = (1 << length) - 1
    for offset, text in pieces:
        for j in range(len(text)):
            wild &= ~(1 << (offset + j))
    masks: dict[str, int] = {}
    for offset, text in pieces:
        for j, ch in enumerate(text):
            masks[ch] = masks.get(ch, wild) | (1 << (offset + j))
    return masks, wild


class _LikeMatcher:
    """A LIKE plan ready to match: the first group anchored at the start, the last at the end, each
    middle group at its leftmost place.  A middle group is found with ``str.find`` when it is one
    literal, else by shift-and over the value (one pass, no backtracking): time linear in the value,
    times ⌈group length / 64⌉ machine words in the compiled twin."""

    __slots__ = ("plan", "tables")

    def __init__(self, plan: tuple[LikeGroup, ...]) -> None:
        self.plan = plan
        self.tables = [_group_masks(g) if _needs_scan(g) else None for g in plan]

    def find(self, k: int, v: str, start: int, stop: int) -> int:
        """The leftmost offset in ``[start, stop - length]`` where group ``k`` matches ``v``, or -1."""
        length, pieces = self.plan[k]
        if stop - start < length:
            return -1
        if not pieces:
            return start
        table = self.tables[k]
        if table is None:                      # one literal covering the whole group
            return v.find(pieces[0][1], start, stop)
        masks, wild = table
        state = 0
        top = 1 << (length - 1)
        for i in range(start, stop):
            state = ((state << 1) | 1) & masks.get(v[i], wild)
            if state & top:
                return i - length + 1
        return -1

    def __call__(self, v: str) -> bool:
        plan = self.plan
        n = len(v)
        first = plan[0]
        if len(plan) == 1:
            return n == first[0] and _group_at(first, v, 0)
        last = plan[-1]
        tail = n - last[0]
        if first[0] > tail or not _group_at(first, v, 0) or not _group_at(last, v, tail):
            return False
        at = first[0]
        for k in range(1, len(plan) - 1):
            found = self.find(k, v, at, tail)
            if found < 0:
                return False
            at = found + plan[k][0]
        return True


def _needs_scan(group: LikeGroup) -> bool:
    """A group that is not a single literal filling it (it has '_' or several pieces)."""
    length, pieces = group
    return bool(pieces) and not (len(pieces) == 1 and pieces[0][0] == 0 and len(pieces[0][1]) == length)


def like_match(plan: tuple[LikeGroup, ...], v: str) -> bool:
    """``v`` matches the LIKE pattern whose plan (:func:`._ir.like_plan`) is ``plan``."""
    return _LikeMatcher(plan)(v)


def _in(inner: Fn, kind: str, items: tuple[object, ...]) -> Fn:
    if kind == "str":
        strings = frozenset(items)

        def in_str(values: Mapping[str, object]) -> object:
            v = inner(values)
            if not isinstance(v, str):
                return None
            return v in strings
        return in_str
    # numbers: the same promotion as '=' (int against int exactly, otherwise as floats)
    exact = frozenset(items) if all(type(i) is int for i in items) else None
    floats = frozenset(float(i) for i in items)  # type: ignore[arg-type]  # the parser made them numbers

    def in_num(values: Mapping[str, object]) -> object:
        x = number(inner(values))
        if x is None:
            return None
        if exact is not None and type(x) is int:
            return x in exact
        return float(x) in floats
    return in_num


class Program:
    """A compiled selector: evaluate it against a mapping of identifier -> value."""

    __slots__ = ("_fn", "ir")

    def __init__(self, ir: IR | None) -> None:
        self.ir = ir
        self._fn: Fn = (lambda values: True) if ir is None else _compile(ir)

    def evaluate(self, values: Mapping[str, object]) -> bool | None:
        """The three-valued result: True, False or None (unknown)."""
        return self._fn(values)  # type: ignore[return-value]

    def matches(self, values: Mapping[str, object]) -> bool:
        """True only when the selector evaluates to TRUE (unknown and FALSE do not select)."""
        return self._fn(values) is True


def build(ir: IR | None) -> Program:
    return Program(ir)


def first_match(programs: Sequence[Program], values: Mapping[str, object]) -> int:
    """Index of the first program that matches ``values``, or -1."""
    for i, program in enumerate(programs):
        if program._fn(values) is True:
            return i
    return -1


def all_matches(programs: Sequence[Program], values: Mapping[str, object]) -> list[int]:
    """Indexes of every program that matches ``values``, in order."""
    return [i for i, program in enumerate(programs) if program._fn(values) is True]
