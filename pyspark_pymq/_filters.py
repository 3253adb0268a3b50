"""Spark filters of a batch read, pushed to the broker (``pushFilters``, Spark >= 4.1).

Three kinds of push-down, each exact for the filters it claims:

* ``offset`` comparisons narrow the sequence range each destination is read over;
* ``destination`` / ``destinationType`` equalities drop whole destinations on the driver;
* conditions on JMS headers become a message selector (spec/selector.md), evaluated by the broker, so
  messages that do not match never cross the network.

A claimed filter is not evaluated again by Spark, so a claim must give exactly Spark's answer, NULLs
included: a JMS selector's three-valued logic agrees with SQL's for ``=``, ``<>``, ``IN``, ``LIKE``,
``IS [NOT] NULL`` and numeric comparisons, which is all that is translated.  ``timestamp`` conditions
are pushed widened to whole milliseconds and returned to Spark as well (Spark timestamps are in
microseconds).  Everything else stays with Spark.
"""
from __future__ import annotations

import datetime as _dt
import math
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

    terms: list[str] = field(default_factory=list)
    offset_from: int | None = None          # inclusive
    offset_to: int | None = None            # exclusive
    destinations: set[str] | None = None    # None: every destination
    kinds: set[str] | None = None           # destinationType values kept

    def selector(self, base: str | None) -> str | None:
        terms = ([f"({base})"] if base else []) + self.terms
        return " AND ".join(terms) if terms else None

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
    """A selector term exactly equivalent to ``f`` (a header filter), or None."""
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


def _micros(value: Any) -> int | None:
    if isinstance(value, _dt.datetime) and value.tzinfo is not None:
        delta = value - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return None                              # a naive value's zone is unknown here: leave it to Spark


def _timestamp_term(f: Filter) -> str | None:
    """A selector term that keeps every row ``f`` keeps (wider where microseconds fall inside a ms)."""
    us = _micros(getattr(f, "value", None))
    if us is None:
        return None
    lo, hi = math.floor(us / 1000), math.ceil(us / 1000)
    if isinstance(f, (GreaterThan, GreaterThanOrEqual)):
        return f"JMSTimestamp >= {lo}"
    if isinstance(f, (LessThan, LessThanOrEqual)):
        return f"JMSTimestamp <= {hi}"
    if isinstance(f, (EqualTo, EqualNullSafe)):
        return f"JMSTimestamp BETWEEN {lo} AND {hi}"
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
        if column == "timestamp" and not isinstance(f, Not):
            term = _timestamp_term(f)
            if term is not None:
                push.terms.append(term)
            remaining.append(f)
            continue
        if isinstance(f, Not):
            if isinstance(inner, EqualNullSafe):     # NOT (NULL <=> v) is TRUE in SQL, UNKNOWN in JMS
                remaining.append(f)
                continue
            term = _header_term(inner)
            if term is not None:
                push.terms.append(f"NOT ({term})")
            else:
                remaining.append(f)
            continue
        term = _header_term(f)
        if term is not None:
            push.terms.append(f"({term})")
        else:
            remaining.append(f)
    return push, remaining
