"""Spark filters of a batch read, pushed into the read (``pushFilters``, Spark >= 4.1).

Three kinds of push-down, each exact for the filters it claims:

* ``offset`` comparisons narrow the sequence range each destination is read over;
* ``destination`` / ``destinationType`` equalities drop whole destinations on the driver;
* conditions on JMS headers become one pyarrow expression (:func:`expression`) that each task evaluates
  on the Arrow batches it reads, before Spark sees them.  Not a selector for the broker: a broker answers
  a range read in Arrow by slicing its log's segments (spec/spark.md §6), and a selector would make it
  evaluate every message one by one instead.

A claimed filter is not evaluated again by Spark, so a claim must give exactly Spark's answer, NULLs
included: only ``=``, ``<=>``, ``IN``, ``LIKE``-style prefix/suffix/contains, ``IS [NOT] NULL`` and
numeric comparisons on header columns are claimed, each translated with SQL's three-valued logic
(checked against a reference evaluator of Spark's semantics).  Everything else stays with Spark.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)

#: read column -> selector identifier, for columns whose selector value equals the column value
_STRING_HEADERS = {"messageId": "JMSMessageID", "correlationId": "JMSCorrelationID", "type": "JMSType",
                   "replyTo": "JMSReplyTo", "key": "JMSXGroupID"}
_MODE_NAMES = {1: "NON_PERSISTENT", 2: "PERSISTENT"}


@dataclass
class Pushdown:
    """What the broker does for a batch read: a selector, a sequence window, a destination subset."""

    filters: list = field(default_factory=list)   # header filters claimed: evaluated by :func:`expression`
    offset_from: int | None = None          # inclusive
    offset_to: int | None = None            # exclusive
    destinations: set[str] | None = None    # None: every destination
    kinds: set[str] | None = None           # destinationType values kept

    def keeps(self, destination: str, kind: str) -> bool:
        return ((self.destinations is None or destination in self.destinations)
                and (self.kinds is None or kind in self.kinds))

    def narrow(self, start: int, end: int) -> tuple[int, int]:
        if self.offset_from is not None:
            start = max(start, self.offset_from)
        if self.offset_to is not None:
            end = min(end, self.offset_to)
        return start, max(start, end)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _string(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):          # key is BINARY; group ids are UTF-8 text
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def _column(f: Filter) -> str | None:
    path: tuple[str, ...] = getattr(f, "attribute", ())
    return path[0] if len(path) == 1 else None


def _header_term(f: Filter) -> str | None:
    """The JMS selector form of ``f`` (a header filter), or None when this module does not claim ``f``:
    the claimed filters are exactly those with an exact selector form (JMS's NULL logic agrees with SQL's
    for them), which the tests use to check the expression form against Spark's semantics."""
    column = _column(f)
    value: Any = getattr(f, "value", None)
    if column in _STRING_HEADERS:
        ident = _STRING_HEADERS[column]
        if isinstance(f, (EqualTo, EqualNullSafe)):
            if value is None:
                return f"{ident} IS NULL" if isinstance(f, EqualNullSafe) else None
            text = _string(value)
            return None if text is None else f"{ident} = {_quote(text)}"
        if isinstance(f, In):
            texts = [_string(v) for v in value if v is not None]
            if not texts or len(texts) != len(value) or any(t is None for t in texts):
                return None
            return f"{ident} IN ({', '.join(_quote(t) for t in texts if t is not None)})"
        if isinstance(f, (StringStartsWith, StringEndsWith, StringContains)) and isinstance(value, str):
            pattern = {StringStartsWith: "{}%", StringEndsWith: "%{}", StringContains: "%{}%"}[type(f)]
            return f"{ident} LIKE {_quote(pattern.format(_escape_like(value)))} ESCAPE '\\'"
        if isinstance(f, IsNull):
            return f"{ident} IS NULL"
        if isinstance(f, IsNotNull):
            return f"{ident} IS NOT NULL"
        return None
    if column == "priority":
        return _numeric_term("JMSPriority", f)
    if column == "deliveryMode":
        if isinstance(f, (EqualTo, EqualNullSafe)) and type(value) is int:
            name = _MODE_NAMES.get(value)
            return f"JMSDeliveryMode = '{name}'" if name else "FALSE"
        if isinstance(f, In) and value and all(type(v) is int for v in value):
            names = sorted({_MODE_NAMES[v] for v in value if v in _MODE_NAMES})
            return f"JMSDeliveryMode IN ({', '.join(_quote(n) for n in names)})" if names else "FALSE"
        if isinstance(f, IsNotNull):
            return "TRUE"                   # never NULL
        return None
    return None


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _numeric_term(ident: str, f: Filter) -> str | None:
    ops = {EqualTo: "=", EqualNullSafe: "=", GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<",
           LessThanOrEqual: "<="}
    value: Any = getattr(f, "value", None)
    if type(f) in ops and type(value) is int:
        return f"{ident} {ops[type(f)]} {value}"
    if isinstance(f, In) and value and all(type(v) is int for v in value):
        return f"{ident} IN ({', '.join(str(v) for v in value)})"
    if isinstance(f, IsNotNull):
        return "TRUE"
    return None


def _offset(f: Filter, push: Pushdown) -> bool:
    v: Any = getattr(f, "value", None)
    if type(v) is not int:
        if isinstance(f, In) and v and all(type(x) is int for x in v):
            lo, hi = min(v), max(v) + 1
            push.offset_from = lo if push.offset_from is None else max(push.offset_from, lo)
            push.offset_to = hi if push.offset_to is None else min(push.offset_to, hi)
            return False                     # a window, not the set itself: Spark still checks
        return False
    bounds = {EqualTo: (v, v + 1), EqualNullSafe: (v, v + 1), GreaterThan: (v + 1, None),
              GreaterThanOrEqual: (v, None), LessThan: (None, v), LessThanOrEqual: (None, v + 1)}.get(type(f))
    if bounds is None:
        return False
    lo, hi = bounds
    if lo is not None:
        push.offset_from = lo if push.offset_from is None else max(push.offset_from, lo)
    if hi is not None:
        push.offset_to = hi if push.offset_to is None else min(push.offset_to, hi)
    return True


def _members(f: Filter) -> set | None:
    value: Any = getattr(f, "value", None)
    if isinstance(f, (EqualTo, EqualNullSafe)) and isinstance(value, str):
        return {value}
    if isinstance(f, In) and all(isinstance(v, str) for v in value):
        return set(value)
    return None


def translate(filters: list[Filter]) -> tuple[Pushdown, list[Filter]]:
    """The push-down for ``filters`` and the filters Spark must still evaluate."""
    push = Pushdown()
    remaining: list[Filter] = []
    for f in filters:
        inner = f.child if isinstance(f, Not) else f
        column = _column(inner)
        if column in ("offset", "destination", "destinationType", "partition") and isinstance(f, IsNotNull):
            continue                             # never NULL
        if column == "offset" and not isinstance(f, Not):
            if not _offset(f, push):
                remaining.append(f)
            continue
        if column in ("destination", "destinationType") and not isinstance(f, Not):
            members = _members(f)
            if members is None:
                remaining.append(f)
                continue
            if column == "destination":
                push.destinations = members if push.destinations is None else push.destinations & members
            else:
                push.kinds = members if push.kinds is None else push.kinds & members
            continue
        if isinstance(f, Not) and isinstance(inner, EqualNullSafe):
            remaining.append(f)                      # kept with Spark (rare, and easy to get wrong)
            continue
        if _header_term(inner) is not None:
            push.filters.append(f)
        else:
            remaining.append(f)
    return push, remaining


# -- the Arrow form ---------------------------------------------------------------------------------------

def expression(filters: list[Filter]):
    """One pyarrow expression over the read schema that keeps exactly the rows every filter keeps (the
    filters ``translate`` took as selector terms; SQL's three-valued logic: a row whose value is unknown
    is not kept, and NOT unknown stays unknown).  None for no filters."""
    terms = [_arrow_term(f) for f in filters]
    if not terms:
        return None
    out = terms[0]
    for term in terms[1:]:
        out = out & term
    return out


def _arrow_term(f: Filter):
    import pyarrow as pa
    import pyarrow.compute as pc
    if isinstance(f, Not):
        return ~_arrow_term(f.child)
    column = _column(f)
    value: Any = getattr(f, "value", None)
    col = pc.field(column)
    unknown = pa.scalar(None, pa.bool_())
    if column in _STRING_HEADERS:
        binary = column == "key"

        def scalar(v: Any) -> Any:
            text = _string(v)           # None (not text) is a null scalar in both columns
            if binary:
                return pa.scalar(None if text is None else text.encode("utf-8"), pa.binary())
            return pa.scalar(text, pa.string())

        if isinstance(f, EqualNullSafe) and value is None:
            return col.is_null()
        if isinstance(f, (EqualTo, EqualNullSafe)):
            # with a non-null value, <=> on a NULL is false and = is unknown; both drop the row, and the
            # selector's NOT (x = v) is unknown for a NULL, as SQL's NOT (x = v) is
            return col == scalar(value)
        if isinstance(f, In):
            members = pa.array([scalar(v).as_py() for v in value], pa.binary() if binary else pa.string())
            return pc.if_else(col.is_valid(), col.isin(members), unknown)
        if isinstance(f, StringStartsWith):
            return pc.starts_with(col, pattern=value)
        if isinstance(f, StringEndsWith):
            return pc.ends_with(col, pattern=value)
        if isinstance(f, StringContains):
            return pc.match_substring(col, pattern=value)
        if isinstance(f, IsNull):
            return col.is_null()
        return col.is_valid()                     # IsNotNull
    if isinstance(f, IsNotNull):
        return pc.scalar(True)                    # priority and deliveryMode are never NULL
    if column == "deliveryMode" and isinstance(f, (EqualTo, EqualNullSafe)) and value not in _MODE_NAMES:
        return pc.scalar(False)
    if isinstance(f, In):
        return col.isin(pa.array(list(value), pa.int32()))
    op = {EqualTo: "equal", EqualNullSafe: "equal", GreaterThan: "greater", GreaterThanOrEqual: "greater_equal",
          LessThan: "less", LessThanOrEqual: "less_equal"}[type(f)]
    return getattr(pc, op)(col, pa.scalar(value, pa.int64()))
