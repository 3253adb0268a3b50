"""Filter push-down: whatever is pushed (selector, offset window, destinations), the rows kept are exactly
the rows Spark's own evaluation keeps, NULLs included (checked against a reference evaluator)."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
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

from pymq.selector import compile_selector
from pyspark_pymq._filters import translate

UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
DESTS = ["/queue/a", "/topic/b", "/topic/c"]
TEXT = st.text(alphabet="ab%_'\\", max_size=4)


def sql(f, row):
    """Spark's value of filter ``f`` on ``row``: True, False or None (NULL)."""
    if isinstance(f, Not):
        r = sql(f.child, row)
        return None if r is None else not r
    v = row[f.attribute[0]]
    if isinstance(f, IsNull):
        return v is None
    if isinstance(f, IsNotNull):
        return v is not None
    if isinstance(f, EqualNullSafe):
        return v == f.value if (v is not None and f.value is not None) else (v is None and f.value is None)
    if v is None:
        return None
    if isinstance(f, In):
        if v in f.value:
            return True
        return None if None in f.value else False
    ops = {EqualTo: lambda a, b: a == b, GreaterThan: lambda a, b: a > b, GreaterThanOrEqual: lambda a, b: a >= b,
           LessThan: lambda a, b: a < b, LessThanOrEqual: lambda a, b: a <= b,
           StringStartsWith: lambda a, b: a.startswith(b), StringEndsWith: lambda a, b: a.endswith(b),
           StringContains: lambda a, b: b in a}
    if f.value is None:
        return None
    return ops[type(f)](v, f.value)


def selector_values(row):
    values = {"JMSPriority": row["priority"], "JMSMessageID": row["messageId"],
              "JMSDeliveryMode": "PERSISTENT" if row["deliveryMode"] == 2 else "NON_PERSISTENT",
              "JMSTimestamp": (row["timestamp"] - EPOCH) // dt.timedelta(milliseconds=1)}
    for column, ident in (("correlationId", "JMSCorrelationID"), ("type", "JMSType"), ("replyTo", "JMSReplyTo")):
        if row[column] is not None:
            values[ident] = row[column]
    if row["key"] is not None:
        values["JMSXGroupID"] = row["key"].decode()
    return values


rows_st = st.fixed_dictionaries({
    "priority": st.integers(0, 9), "deliveryMode": st.sampled_from([1, 2]),
    "messageId": st.sampled_from(["ID:n-1", "ID:n-2", "ID:n_%"]),
    "correlationId": st.one_of(st.none(), TEXT), "type": st.one_of(st.none(), TEXT),
    "replyTo": st.one_of(st.none(), st.sampled_from(["/queue/r", "/topic/r"])),
    "key": st.one_of(st.none(), TEXT.map(str.encode)), "offset": st.integers(0, 40),
    "destination": st.sampled_from(DESTS),
    "timestamp": st.integers(0, 5000).map(lambda ms: EPOCH + dt.timedelta(milliseconds=ms)),
})


def _value_for(column):
    return {
        "priority": st.integers(-1, 10), "deliveryMode": st.integers(0, 3), "offset": st.integers(-1, 41),
        "messageId": st.sampled_from(["ID:n-1", "ID:n_%", "x"]), "correlationId": TEXT, "type": TEXT,
        "replyTo": st.sampled_from(["/queue/r", "/topic/x"]), "key": TEXT.map(str.encode),
        "destination": st.sampled_from(DESTS + ["/queue/zz"]),
        "timestamp": st.integers(-10, 5_000_000).map(lambda us: EPOCH + dt.timedelta(microseconds=us)),
    }[column]


@st.composite
def filters_st(draw):
    column = draw(st.sampled_from(["priority", "deliveryMode", "offset", "messageId", "correlationId", "type",
                                   "replyTo", "key", "destination", "timestamp"]))
    kind = draw(st.sampled_from([EqualTo, EqualNullSafe, GreaterThan, GreaterThanOrEqual, LessThan,
                                 LessThanOrEqual, In, IsNull, IsNotNull, StringStartsWith, StringEndsWith,
                                 StringContains]))
    attr = (column,)
    if kind in (IsNull, IsNotNull):
        f = kind(attr)
    elif kind is In:
        f = In(attr, tuple(draw(st.lists(st.one_of(_value_for(column), st.none()), min_size=1, max_size=3))))
    elif kind in (StringStartsWith, StringEndsWith, StringContains):
        if column not in ("messageId", "correlationId", "type", "replyTo", "destination"):
            kind = EqualTo
        f = kind(attr, draw(TEXT if kind is not EqualTo else _value_for(column)))
    else:
        f = kind(attr, draw(_value_for(column)))
    return Not(f) if draw(st.booleans()) else f


@settings(max_examples=400, deadline=None)
@given(st.lists(filters_st(), min_size=1, max_size=3), st.lists(rows_st, min_size=1, max_size=8))
def test_each_claimed_filter_has_an_exact_selector_form(filters, rows):
    """What is claimed is what a JMS selector can say exactly (the claim's definition)."""
    from pyspark_pymq._filters import _header_term
    push, remaining = translate(filters)
    terms = []
    for f in push.filters:
        term = _header_term(f.child if isinstance(f, Not) else f)
        terms.append(f"NOT ({term})" if isinstance(f, Not) else f"({term})")
    compiled = compile_selector(" AND ".join(terms)) if terms else None
    for row in rows:
        spark_keeps = all(sql(f, row) is True for f in filters)
        kind = "topic" if row["destination"].startswith("/topic/") else "queue"
        lo, hi = push.narrow(0, 10**9)
        ours = (push.keeps(row["destination"], kind) and lo <= row["offset"] < hi
                and (compiled is None or compiled.matches(selector_values(row)) is True)
                and all(sql(f, row) is True for f in remaining))
        assert ours == spark_keeps, (filters, row, terms, remaining)


def test_what_is_pushed_where():
    ts = dt.datetime(2024, 1, 1, 0, 0, 0, 1500, tzinfo=UTC)
    claimed = [EqualTo(("priority",), 7), StringStartsWith(("correlationId",), "o'5_"), Not(EqualTo(("type",), "x"))]
    push, remaining = translate([
        GreaterThanOrEqual(("offset",), 10), LessThan(("offset",), 20), claimed[0],
        In(("destination",), ("/topic/a", "/queue/b")), claimed[1],
        GreaterThan(("timestamp",), ts), claimed[2], GreaterThan(("correlationId",), "m"),
    ])
    assert push.narrow(0, 100) == (10, 20)
    assert push.destinations == {"/topic/a", "/queue/b"}
    assert push.filters == claimed
    # timestamps and string ordering stay with Spark
    assert remaining == [GreaterThan(("timestamp",), ts), GreaterThan(("correlationId",), "m")]


def _batch(rows):
    import pyarrow as pa
    return pa.RecordBatch.from_pylist(rows, schema=pa.schema([
        ("priority", pa.int32()), ("deliveryMode", pa.int32()), ("messageId", pa.string()),
        ("correlationId", pa.string()), ("type", pa.string()), ("replyTo", pa.string()), ("key", pa.binary()),
        ("offset", pa.int64()), ("destination", pa.string()), ("timestamp", pa.timestamp("us", tz="UTC"))]))


@settings(max_examples=400, deadline=None)
@given(st.lists(filters_st(), min_size=1, max_size=3), st.lists(rows_st, min_size=1, max_size=8))
def test_the_arrow_form_keeps_exactly_what_the_selector_form_keeps(filters, rows):
    """Arrow range reads evaluate the taken filters in the task (spec/spark.md §6): same rows as Spark."""
    from pyspark_pymq._filters import expression
    push, remaining = translate(filters)
    kept = _batch(rows)
    expr = expression(push.filters)
    if expr is not None:
        kept = kept.filter(expr)
    got = [r["offset"] for r in kept.to_pylist()]
    lo, hi = push.narrow(0, 10**9)
    ours = [r["offset"] for r in kept.to_pylist()
            if push.keeps(r["destination"], "topic" if r["destination"].startswith("/topic/") else "queue")
            and lo <= r["offset"] < hi and all(sql(f, r) is True for f in remaining)]
    spark = [r["offset"] for r in rows if all(sql(f, r) is True for f in filters)]
    assert ours == spark, (filters, rows, expr, remaining)
    assert len(got) >= len(ours)
