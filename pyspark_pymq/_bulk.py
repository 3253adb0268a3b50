"""Spark rows to bulk SEND batches (spec/spark.md §7), column-wise: the sink's Arrow path.

``rows_to_bulk`` turns one Arrow batch of the sink's columns (pyspark_pymq/README.md "Writing") into one
message batch per destination, in the bulk columns of spec/spark.md §7, with the same meaning row by row
as the per-message path (``pyspark_pymq._arrow.batch_to_messages``): the same defaults, the same
checks, and an error that names the first bad row and its column (in the per-message path's column
order when one row has several problems).  Nothing here makes a message per row; what is rare (map
bodies, binary text, properties with null values, delivery modes spelled as words) is checked per row
only for the rows that need it.
"""
from __future__ import annotations

import base64
import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pymq.destination import Topic, as_destination
from pymq.errors import MessageFormatError, PymqError
from pymq.message import RESERVED_HEADERS
from pyspark_pymq._arrow import _MODES

#: the per-message path's column order: the first problem of a row is reported in this order
_ORDER = ("value", "destination", "key", "properties", "correlationId", "type", "replyTo", "dedupId",
          "deliveryMode", "priority", "timeToLive")
_NOT_PROPERTIES = sorted(RESERVED_HEADERS)
_TYPE_CODES = {"int8": "i", "int16": "i", "int32": "i", "int64": "i", "bool": "b", "float": "f", "double": "f"}


class _Problems:
    """The first problem found per column; the one reported is the earliest row (ties: _ORDER)."""

    def __init__(self, first_row: int) -> None:
        self.first_row = first_row
        self.found: list[tuple[int, int, str, str]] = []

    def add(self, column: str, row: int, what: str) -> None:
        self.found.append((row, _ORDER.index(column), column, what))

    def mask(self, column: str, bad: pa.Array, what) -> None:
        """Report the first row where ``bad`` is true (nulls are not); ``what(row)`` says why."""
        row = pc.index(pc.fill_null(bad, False), True).as_py()
        if row >= 0:
            self.add(column, row, what(row))

    def raise_first(self) -> None:
        if not self.found:
            return
        row, _, column, what = min(self.found)
        at = self.first_row + row
        raise MessageFormatError(f"row {at} of this partition, column '{column}': {what}", row=at, column=column)


def _col(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    names = batch.schema.names
    return batch.column(names.index(name)) if name in names else None


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def rows_to_bulk(batch: pa.RecordBatch, default_destination: str | None, defaults: dict, first_row: int,
                 dedup_base: str | None, now: int) -> list[tuple[str, pa.RecordBatch]]:
    """(destination, bulk batch) for the rows of ``batch``, destinations in the order they first appear
    and rows in their order within each.  ``defaults``: delivery_mode, priority, time_to_live."""
    n = batch.num_rows
    problems = _Problems(first_row)
    out: dict[str, Any] = {}

    # value -> body and body_type
    value = batch.column(batch.schema.names.index("value"))      # the sink checked that it is there
    text_column = _is_text(value.type)
    body = value.cast(pa.binary()) if value.type != pa.binary() else value
    if body.null_count:
        body = body.fill_null(b"")
    kinds = _col(batch, "bodyType")
    default_kind = "text" if text_column else "bytes"
    body_type: pa.Array | None
    if kinds is None:
        # a column of "bytes" would say what a missing one says (spec/spark.md §7: null is bytes): leave
        # it out, 9 bytes a row less to send, parse and store
        body_type = None if default_kind == "bytes" else pa.repeat(pa.scalar(default_kind), n)
    else:
        problems.mask("value", pc.and_kleene(pc.is_valid(kinds),
                                             pc.invert(pc.is_in(kinds, pa.array(["text", "bytes", "map"])))),
                      lambda r: f"bodyType must be 'text', 'bytes' or 'map', got {kinds[r].as_py()!r}")
        body_type = kinds.fill_null(default_kind) if kinds.null_count else kinds
        if not text_column:
            _check_text_rows(problems, body, body_type)
        body = _check_map_rows(problems, body, body_type)
    out["body"] = body
    if body_type is not None:
        out["body_type"] = body_type

    # destination
    destinations = _destinations(problems, batch, default_destination, n)

    # key -> group
    key = _col(batch, "key")
    if key is not None:
        out["group"] = _utf8(problems, "key", key)

    # properties -> properties, property_types
    props = _col(batch, "properties")
    if props is not None:
        out["properties"], types = _properties(problems, props)
        if types is not None:
            out["property_types"] = types

    for name, wire in (("correlationId", "correlation_id"), ("type", "type")):
        c = _col(batch, name)
        if c is not None:
            out[wire] = c
    reply = _col(batch, "replyTo")
    if reply is not None:
        out["reply_to"] = _named(problems, "replyTo", reply)

    # dedup ids: the column's, else <base>:<row>
    dedup = _col(batch, "dedupId")
    if dedup_base is not None:
        rows = pc.cast(pc.add(_steps(n), first_row), pa.string())
        made = pc.binary_join_element_wise(pa.repeat(pa.scalar(dedup_base + ":"), n), rows, "") if n \
            else pa.array([], pa.string())
        dedup = made if dedup is None else pc.coalesce(dedup, made)
    if dedup is not None:
        out["dedup_id"] = dedup

    out["delivery_mode"] = _modes(problems, _col(batch, "deliveryMode"), defaults["delivery_mode"], n)

    priority = _col(batch, "priority")
    if priority is None:
        out["priority"] = pa.repeat(pa.scalar(defaults["priority"], pa.int32()), n)
    else:
        p = priority.cast(pa.int64()).fill_null(defaults["priority"])
        problems.mask("priority", pc.or_kleene(pc.less(p, 0), pc.greater(p, 9)),
                      lambda r: f"priority must be between 0 and 9, got {p[r].as_py()}")
        out["priority"] = pc.max_element_wise(pc.min_element_wise(p, 9), 0).cast(pa.int32())

    out["expires"] = _expires(problems, batch, defaults["time_to_live"], now, n)
    problems.raise_first()

    bulk = pa.RecordBatch.from_pydict(out)
    if default_destination is not None or n == 0 or destinations is None:   # destinations: None with a default
        return [(default_destination or "", bulk)] if n else []
    distinct = list(dict.fromkeys(destinations.to_pylist()))
    if len(distinct) == 1:
        return [(distinct[0], bulk)]
    return [(d, bulk.filter(pc.equal(destinations, d))) for d in distinct]


def _steps(n: int) -> pa.Array:
    return pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), 1) if n \
        else pa.array([], pa.int64())


def _check_text_rows(problems: _Problems, body: pa.Array, body_type: pa.Array) -> None:
    """Binary values sent as text must be UTF-8 (the per-message path decodes them)."""
    wanted = pc.equal(body_type, "text")
    if not pc.any(wanted).as_py():
        return
    for row in pc.indices_nonzero(wanted).to_pylist():
        try:
            body[row].as_py().decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.add("value", row, str(exc))
            return


def _check_map_rows(problems: _Problems, body: pa.Array, body_type: pa.Array) -> pa.Array:
    """A map body is its JSON wire form (an object, bytes as {"$bytes": base64}); checked per map row."""
    wanted = pc.equal(body_type, "map")
    if not pc.any(wanted).as_py():
        return body
    empty = []
    for row in pc.indices_nonzero(wanted).to_pylist():
        raw = body[row].as_py()
        try:
            data = json.loads(raw.decode("utf-8") if raw else "{}")
            if not isinstance(data, dict):
                raise MessageFormatError("a map body must be a JSON object")
            for v in data.values():
                if isinstance(v, dict) and "$bytes" in v:
                    base64.b64decode(v["$bytes"], validate=True)
        except (ValueError, MessageFormatError) as exc:
            problems.add("value", row, str(exc))
            return body
        if not raw:
            empty.append(row)
    if empty:             # a null or empty map body is the empty map, as the per-message path sends it
        flags = [False] * len(body)
        for row in empty:
            flags[row] = True
        body = pc.if_else(pa.array(flags), pa.scalar(b"{}", pa.binary()), body)
    return body


def _destinations(problems: _Problems, batch: pa.RecordBatch, default: str | None, n: int) -> pa.Array | None:
    if default is not None:
        return None
    column = _col(batch, "destination")
    if column is None:
        topic = _col(batch, "topic")
        bare = pc.invert(pc.starts_with(topic, "/"))
        column = pc.if_else(bare, pc.binary_join_element_wise(pa.repeat(pa.scalar(Topic.prefix), n), topic, ""),
                            topic) if n else topic
    problems.mask("destination", pc.or_kleene(pc.is_null(column), pc.equal(column, "")),
                  lambda r: "no destination: the row's 'destination' is null and no 'destination' option was "
                            "given")
    return _named(problems, "destination", column)


def _named(problems: _Problems, column: str, names: pa.Array) -> pa.Array:
    """STOMP names checked (and normalized) once per distinct value."""
    mapping = {}
    for value in pc.unique(names).to_pylist():
        if value is None or value == "":
            continue
        try:
            mapping[value] = as_destination(value).stomp_name
        except PymqError as exc:
            row = pc.index(names, value).as_py()
            problems.add(column, row, str(exc))
    if all(k == v for k, v in mapping.items()):
        return names
    keys = pa.array(list(mapping), pa.string())
    return pc.take(pa.array(list(mapping.values()), pa.string()), pc.index_in(names, value_set=keys))


def _utf8(problems: _Problems, column: str, values: pa.Array) -> pa.Array:
    if _is_text(values.type):
        return values.cast(pa.string())
    try:
        return values.cast(pa.string())
    except (pa.ArrowInvalid, UnicodeDecodeError):
        for row, v in enumerate(values.to_pylist()):
            if v is not None:
                try:
                    v.decode("utf-8")
                except UnicodeDecodeError as exc:
                    problems.add(column, row, str(exc))
                    break
        return pa.nulls(len(values), pa.string())


def _properties(problems: _Problems, props: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    """Typed map values as text, their types in ``property_types`` (``n=i,ok=b``); names checked."""
    keys, items = props.keys, props.items
    bad = pc.or_kleene(pc.is_in(keys, pa.array(_NOT_PROPERTIES)),
                 pc.or_kleene(pc.match_substring_regex(keys, r"[,=\r\n]"), pc.equal(pc.utf8_length(keys), 0)))
    position = pc.index(pc.fill_null(bad, False), True).as_py()
    if position >= 0:
        offsets = props.offsets.to_pylist()
        row = next(i for i in range(len(props)) if offsets[i] <= position + offsets[0] < offsets[i + 1])
        name = keys[position].as_py()
        why = (f"{name!r} is a header, not a property; use the message attribute" if name in RESERVED_HEADERS
               else f"property name {name!r} must not be empty or contain ',', '=' or line breaks")
        problems.add("properties", row, why)
        return pa.nulls(len(props), pa.map_(pa.string(), pa.string())), None
    code = _TYPE_CODES.get(str(items.type))
    if items.null_count:
        return _properties_per_row(props, code)
    text = items.cast(pa.string()) if code is not None else items
    as_text = pa.MapArray.from_arrays(props.offsets, keys, text, mask=pc.is_null(props))
    if code is None:
        return as_text, None
    tagged = pc.binary_join_element_wise(keys, pa.repeat(pa.scalar("=" + code), len(keys)), "")
    joined = pc.binary_join(pa.ListArray.from_arrays(props.offsets, tagged, mask=pc.is_null(props)), ",")
    return as_text, pc.if_else(pc.equal(joined, ""), pa.scalar(None, pa.string()), joined)


def _properties_per_row(props: pa.Array, code: str | None) -> tuple[pa.Array, pa.Array | None]:
    """Null values are left out, as the per-message path leaves them (rare: done per row)."""
    texts, types = [], []
    for row in props.to_pylist():
        kept = [(k, v) for k, v in row or () if v is not None]
        texts.append(None if row is None else [(k, _text(v)) for k, v in kept])
        types.append(",".join(f"{k}={code}" for k, _ in kept) or None if code else None)
    return pa.array(texts, pa.map_(pa.string(), pa.string())), (pa.array(types, pa.string()) if code else None)


def _text(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def _modes(problems: _Problems, modes: pa.Array | None, default: int, n: int) -> pa.Array:
    if modes is None:
        return pa.repeat(pa.scalar(default, pa.int32()), n)
    spelled = {}
    for value in pc.unique(modes).to_pylist():
        if value is None:
            continue
        key = value.strip().lower() if isinstance(value, str) else value
        if key not in _MODES:
            row = pc.index(modes, value).as_py()
            problems.add("deliveryMode", row, f"deliveryMode must be 1, 2, 'persistent' or 'non_persistent', "
                                              f"got {value!r}")
            return pa.repeat(pa.scalar(default, pa.int32()), n)
        spelled[value] = _MODES[key]
    if not spelled:
        return pa.repeat(pa.scalar(default, pa.int32()), n)
    found = pc.index_in(modes, value_set=pa.array(list(spelled), modes.type))
    return pc.take(pa.array(list(spelled.values()), pa.int32()), found).fill_null(default)


def _expires(problems: _Problems, batch: pa.RecordBatch, default_ttl: int, now: int, n: int) -> pa.Array:
    """Absolute expiry in ms (0 never): timeToLive, else an absolute ``expiration`` (sent as the time
    left, at least 1 ms), else the option's time to live."""
    ttl = _col(batch, "timeToLive")
    ttl = ttl.cast(pa.int64()) if ttl is not None else pa.nulls(n, pa.int64())
    expiration = _col(batch, "expiration")
    if expiration is not None:
        per_ms = {"s": -1000, "ms": 1, "us": 1000, "ns": 1_000_000}[expiration.type.unit]
        raw = expiration.cast(pa.int64())
        ms = pc.multiply(raw, 1000) if per_ms < 0 else pc.divide(raw, per_ms) if per_ms > 1 else raw
        ttl = pc.coalesce(ttl, pc.max_element_wise(pc.subtract(ms, now), 1, skip_nulls=False))
    ttl = ttl.fill_null(default_ttl) if ttl.null_count else ttl
    problems.mask("timeToLive", pc.less(ttl, 0), lambda r: f"timeToLive must be >= 0 ms, got {ttl[r].as_py()}")
    return pc.if_else(pc.greater(ttl, 0), pc.add(ttl, now), 0)
