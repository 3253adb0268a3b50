"""The read schema, and Arrow record batches to messages (writes).

Spark moves Python data source rows as Arrow, and its Arrow schema must match the Spark schema exactly
(int32 for INT, int64 for BIGINT, timestamps in microseconds), so :data:`READ_FIELDS` is the one
definition of both.  Reads are decoded into it by ``pyspark_pymq._decode`` (MESSAGE frames, compiled
with a pure twin).

The sink side turns each row into the message it describes: ``value`` (a string column gives a
TextMessage, binary a BytesMessage; ``bodyType`` can say otherwise), ``key`` (JMSXGroupID),
``properties``, ``priority``, ``timeToLive``, ``expiration``, ``deliveryMode``, ``correlationId``,
``type``, ``replyTo``, ``dedupId`` and ``destination`` (or ``topic``).
"""
from __future__ import annotations

import base64
import functools
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pymq.destination import Topic, as_destination
from pymq.errors import MessageFormatError, PymqError
from pymq.message import BytesMessage, MapMessage, Message, TextMessage, now_ms

_TS = pa.timestamp("us", tz="UTC")

#: (name, Spark DDL type, Arrow type) of every column a read returns, in order
READ_FIELDS: list[tuple[str, str, pa.DataType]] = [
    ("destination", "STRING", pa.string()),
    ("destinationType", "STRING", pa.string()),
    ("partition", "INT", pa.int32()),
    ("offset", "BIGINT", pa.int64()),
    ("messageId", "STRING", pa.string()),
    ("correlationId", "STRING", pa.string()),
    ("key", "BINARY", pa.binary()),
    ("value", "BINARY", pa.binary()),
    ("bodyType", "STRING", pa.string()),
    ("timestamp", "TIMESTAMP", _TS),
    ("timestampType", "INT", pa.int32()),
    ("expiration", "TIMESTAMP", _TS),
    ("priority", "INT", pa.int32()),
    ("deliveryMode", "INT", pa.int32()),
    ("redelivered", "BOOLEAN", pa.bool_()),
    ("deliveryCount", "INT", pa.int32()),
    ("replyTo", "STRING", pa.string()),
    ("type", "STRING", pa.string()),
]
#: ``timestampType`` (Kafka's column): 0, CreateTime — ``timestamp`` is JMSTimestamp, stamped by the producer
#: when it sent the message (by the broker on arrival when the SEND had none).  pymq has no other kind.
CREATE_TIME = 0
PROPERTIES_FIELD = ("properties", "MAP<STRING, STRING>", pa.map_(pa.string(), pa.string()))


def read_fields(include_properties: bool) -> list[tuple[str, str, pa.DataType]]:
    return READ_FIELDS + [PROPERTIES_FIELD] if include_properties else list(READ_FIELDS)


def read_ddl(include_properties: bool) -> str:
    return ", ".join(f"`{name}` {ddl}" for name, ddl, _ in read_fields(include_properties))


def arrow_schema(include_properties: bool) -> pa.Schema:
    return pa.schema([pa.field(name, typ) for name, _, typ in read_fields(include_properties)])


_SCHEMAS = {False: arrow_schema(False), True: arrow_schema(True)}
# -- writes ---------------------------------------------------------------------------------------------

#: sink columns and the Spark types each accepts (by Spark's ``typeName()``)
WRITE_COLUMNS: dict[str, tuple[str, ...]] = {
    "value": ("binary", "string"),
    "destination": ("string",),
    "topic": ("string",),            # Kafka's spelling of ``destination``: a bare name is a topic
    "key": ("binary", "string"),
    "properties": ("map",),
    "priority": ("byte", "short", "integer", "long"),
    "timeToLive": ("byte", "short", "integer", "long"),
    "deliveryMode": ("byte", "short", "integer", "long", "string"),
    "correlationId": ("string",),
    "type": ("string",),
    "replyTo": ("string",),
    "bodyType": ("string",),
    "dedupId": ("string",),
    "expiration": ("timestamp", "timestamp_ntz"),
}
#: columns of the read schema that a sink accepts and ignores, so a read DataFrame can be written back
IGNORED_COLUMNS = frozenset({"destinationType", "partition", "offset", "messageId", "timestamp",
                             "timestampType", "redelivered", "deliveryCount"})
PROPERTY_VALUE_TYPES = ("string", "boolean", "byte", "short", "integer", "long", "float", "double")

_MODES = {1: 1, 2: 2, "persistent": 2, "non_persistent": 1, "non-persistent": 1, "1": 1, "2": 2}


def _map_message(raw: Any) -> MapMessage:
    text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw or "{}"
    data = json.loads(text)
    if not isinstance(data, dict):
        raise MessageFormatError("a map body must be a JSON object")
    return MapMessage({k: base64.b64decode(v["$bytes"]) if isinstance(v, dict) and "$bytes" in v else v
                       for k, v in data.items()})


def _body(value: Any, body_type: str | None, text_column: bool) -> Message:
    if body_type is None:
        # the column's type decides, so a null value is an empty body of the same kind as its neighbours
        body_type = "text" if text_column else "bytes"
    if body_type == "text":
        return TextMessage(value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else value or "")
    if body_type == "bytes":
        return BytesMessage(value.encode("utf-8") if isinstance(value, str) else value or b"")
    if body_type == "map":
        return _map_message(value)
    raise MessageFormatError(f"bodyType must be 'text', 'bytes' or 'map', got {body_type!r}")


def _expirations_ms(batch: pa.RecordBatch) -> list[int | None]:
    """The ``expiration`` column as ms since the epoch (a naive timestamp is read as UTC)."""
    column = batch.column(batch.schema.names.index("expiration"))
    per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[column.type.unit]
    raw = column.cast(pa.int64()).to_pylist()
    if per_ms is None:
        return [None if v is None else v * 1000 for v in raw]
    return [None if v is None else v // per_ms for v in raw]


def batch_to_messages(batch: pa.RecordBatch, default_destination: str | None, defaults: dict,
                      first_row: int) -> Iterator[tuple[int, str, Message, dict]]:
    """(row index in the partition, destination, message, send arguments) for each row of ``batch``."""
    names = batch.schema.names
    cols = {name: batch.column(i).to_pylist() for i, name in enumerate(names) if name in WRITE_COLUMNS}
    n = batch.num_rows
    none: list[Any] = [None] * n
    values, dests, keys, props = (cols.get(c, none) for c in ("value", "destination", "key", "properties"))
    if "topic" in cols:
        dests = [t if t is None or t.startswith("/") else Topic.prefix + t for t in cols["topic"]]
    prios, ttls, modes = (cols.get(c, none) for c in ("priority", "timeToLive", "deliveryMode"))
    corrs, types, replies, body_types, dedups = (cols.get(c, none) for c in
                                                 ("correlationId", "type", "replyTo", "bodyType", "dedupId"))
    text_column = pa.types.is_string(batch.schema.field("value").type) or \
        pa.types.is_large_string(batch.schema.field("value").type)
    expirations = _expirations_ms(batch) if "expiration" in names else none
    now = now_ms()
    checked: dict[str, str] = {}
    for i in range(n):
        row = first_row + i
        column = "value"
        try:
            message = _body(values[i], body_types[i], text_column)
            column = "destination"
            dest = default_destination or dests[i]
            if not dest:
                raise MessageFormatError("no destination: the row's 'destination' is null and no "
                                         "'destination' option was given")
            if dest not in checked:
                checked[dest] = as_destination(dest).stomp_name
            column = "key"
            if keys[i] is not None:
                key = keys[i]
                message.group_id = key.decode("utf-8") if isinstance(key, (bytes, bytearray)) else key
            column = "properties"
            if props[i]:
                for name, value in props[i]:
                    if value is not None:
                        message.set_property(name, value)
            column = "correlationId"
            message.correlation_id = corrs[i]
            column = "type"
            message.type = types[i]
            column = "replyTo"
            if replies[i] is not None:
                message.reply_to = as_destination(replies[i])
            column = "dedupId"
            if dedups[i] is not None:
                message.dedup_id = dedups[i]
            column = "deliveryMode"
            mode = modes[i]
            if mode is not None:
                spelled = mode.strip().lower() if isinstance(mode, str) else mode
                if spelled not in _MODES:
                    raise MessageFormatError(f"deliveryMode must be 1, 2, 'persistent' or 'non_persistent', "
                                             f"got {mode!r}")
                mode = _MODES[spelled]
            ttl, expiration = ttls[i], expirations[i]
            if ttl is None and expiration is not None:
                # a read's absolute JMSExpiration, sent as the time left (the SDK stamps the send time);
                # a row already past it gets 1 ms, so it expires on arrival instead of living forever
                ttl = max(1, expiration - now)
            args = {"delivery_mode": defaults["delivery_mode"] if mode is None else mode,
                    "priority": defaults["priority"] if prios[i] is None else int(prios[i]),
                    "time_to_live": defaults["time_to_live"] if ttl is None else int(ttl)}
            column = "priority"
            if not 0 <= args["priority"] <= 9:
                raise MessageFormatError(f"priority must be between 0 and 9, got {args['priority']}")
            column = "timeToLive"
            if args["time_to_live"] < 0:
                raise MessageFormatError(f"timeToLive must be >= 0 ms, got {args['time_to_live']}")
        except (PymqError, ValueError, UnicodeDecodeError) as exc:
            # names the row and the column, so a failed task says which input was wrong
            raise MessageFormatError(f"row {row} of this partition, column '{column}': {exc}", row=row,
                                     column=column) from None
        yield row, checked[dest], message, args


# -- Arrow range reads (spec/spark.md §5, §6) -------------------------------------------------------------

#: the columns of a message batch on the wire, as a range read in Arrow answers (spec/spark.md §5)
WIRE_FIELDS: list[tuple[str, pa.DataType]] = [
    ("seq", pa.int64()), ("message_id", pa.string()), ("timestamp", pa.int64()), ("expires", pa.int64()),
    ("priority", pa.int32()), ("delivery_mode", pa.int32()), ("body_type", pa.string()),
    ("content_type", pa.string()), ("body", pa.binary()), ("group", pa.string()), ("correlation_id", pa.string()),
    ("type", pa.string()), ("reply_to", pa.string()), ("properties", pa.map_(pa.string(), pa.string())),
    ("property_types", pa.string()), ("dedup_id", pa.string()),
]
WIRE_NAMES = [name for name, _ in WIRE_FIELDS]


#: the columns of the message batch a read asks the broker for (``pymq-columns``, spec/spark.md §6): what
#: the read schema is made of; ``content_type``, ``property_types`` and ``dedup_id`` (and ``properties``
#: without ``includeProperties``) stay in the broker, about a fifth of the bytes of a small message
READ_WIRE_COLUMNS = ("seq", "message_id", "timestamp", "expires", "priority", "delivery_mode", "body_type",
                     "body", "group", "correlation_id", "type", "reply_to")


def wire_columns(include_properties: bool) -> tuple[str, ...]:
    return READ_WIRE_COLUMNS + ("properties",) if include_properties else READ_WIRE_COLUMNS


def check_wire_schema(schema: pa.Schema, include_properties: bool = True) -> None:
    """A range read's answer must be the message batch of spec/spark.md §5, column for column: all of them,
    or (a broker that took ``pymq-columns``) the ones :func:`wire_columns` asks for, in §5's order."""
    got = [(f.name, f.type) for f in schema]
    wanted = set(wire_columns(include_properties))
    if got != WIRE_FIELDS and got != [(n, t) for n, t in WIRE_FIELDS if n in wanted]:
        raise MessageFormatError(f"the broker's Arrow answer is not a pymq message batch (spec/spark.md §5): "
                                 f"got columns {', '.join(f'{n} {t}' for n, t in got)}")


def wire_to_read(batch: pa.RecordBatch, destination: str, kind: str, include_properties: bool) -> pa.RecordBatch:
    """A message batch of the wire (spec/spark.md §5; every column, or those of :func:`wire_columns`) as the
    read schema, column-wise: constants for the destination, ms to µs for times, 0 expiry to null, the
    group's UTF-8 as the binary key.  Range reads carry no delivery state, so ``redelivered`` is false
    and ``deliveryCount`` 1, as in the per-message path."""
    n = batch.num_rows
    col = batch.column
    expires = col("expires")
    never = pc.equal(expires, 0)
    expiration = pc.if_else(never, pa.scalar(None, pa.int64()), pc.multiply(expires, 1000)) \
        if pc.any(never).as_py() else pc.multiply(expires, 1000)
    columns = [
        _constant(destination, "string", n),
        _constant(kind, "string", n),
        _constant(0, "int32", n),
        col("seq"),
        col("message_id"),
        col("correlation_id"),
        col("group").cast(pa.binary()),
        col("body"),
        col("body_type"),
        pc.multiply(col("timestamp"), 1000).cast(_TS),
        _constant(CREATE_TIME, "int32", n),
        expiration.cast(_TS),
        col("priority"),
        col("delivery_mode"),
        _constant(False, "bool", n),
        _constant(1, "int32", n),
        _destinations_only(col("reply_to")),
        col("type"),
    ]
    if include_properties:
        columns.append(col("properties"))
    return pa.RecordBatch.from_arrays(columns, schema=_SCHEMAS[include_properties])


@functools.lru_cache(maxsize=64)
def _constant(value: Any, type_name: str, n: int) -> pa.Array:
    """A column of ``n`` copies of ``value``: Arrow arrays are immutable, so every fetch of a task (same
    destination, same size: ``fetchSize`` rows) shares one instead of building it again."""
    return pa.repeat(pa.scalar(value, pa.type_for_alias(type_name)), n)


def _destinations_only(reply_to: pa.Array) -> pa.Array:
    """``replyTo`` keeps STOMP destinations only, as the per-message decoder does (spec/spark.md §4)."""
    if reply_to.null_count == len(reply_to):
        return reply_to
    ok = pc.or_(pc.or_(pc.starts_with(reply_to, "/queue/"), pc.starts_with(reply_to, "/topic/")),
                pc.starts_with(reply_to, "/temp-queue/"))
    if pc.all(pc.fill_null(ok, True)).as_py():
        return reply_to
    return pc.if_else(ok, reply_to, pa.scalar(None, pa.string()))
