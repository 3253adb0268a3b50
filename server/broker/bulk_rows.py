"""Bulk SENDs' rows (spec/spark.md §7): read, checked column by column, and completed into a segment.

A bulk SEND brings a batch of rows as an Arrow IPC stream (:func:`read_bulk`); every value the broker would
not take is refused with a precise MessageFormatError naming the column and the first bad row, before
anything is placed.  :func:`complete_bulk` gives the rows what placement decides for them (sequence
numbers, keys and ids, arrival time, the destination's defaults) column-wise, without a per-message
object: the result is a segment of the log schema (segments.py).  Pure functions: no broker state.
"""
from __future__ import annotations

import bisect
import gc
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pymq.errors import MessageFormatError
from pymq_server.broker import bulk_stream, segments
from pymq_server.broker.message import BrokerMessage
from pymq_server.broker.segments import BODY_TYPES, CONTENT_TYPES, NOT_PROPERTIES, pa, pc

#: rows a bulk SEND may carry (its bytes are bounded by the broker's max_frame_size)
MAX_BULK_ROWS = 1_000_000
#: the bytes a bulk SEND's buffers may take once decompressed, unless told (the default max_frame_size)
MAX_DECODED_BYTES = 64 * 1024 * 1024
_DESTINATION_PREFIXES = ("/queue/", "/topic/", "/temp-queue/")
_INT32, _INT64 = struct.Struct("<i"), struct.Struct("<q")

if pa is not None:
    #: what a bulk SEND may carry: name -> the Arrow types accepted (cast to the log schema's type)
    BULK_COLUMNS: dict[str, tuple] = {
        "body": (pa.binary(), pa.string(), pa.large_binary(), pa.large_string()),
        "timestamp": (pa.int64(), pa.int32()),
        "expires": (pa.int64(), pa.int32()),
        "priority": (pa.int32(), pa.int8(), pa.int16(), pa.int64()),
        "delivery_mode": (pa.int32(), pa.int8(), pa.int16(), pa.int64()),
        "body_type": (pa.string(),),
        "group": (pa.string(),),
        "correlation_id": (pa.string(),),
        "type": (pa.string(),),
        "reply_to": (pa.string(),),
        "properties": (pa.map_(pa.string(), pa.string()),),
        "property_types": (pa.string(),),
        "dedup_id": (pa.string(),),
    }

    #: the accepted variable-width types: the format of their offsets (int32, or int64 for large_*)
    _OFFSETS = {pa.binary(): _INT32, pa.string(): _INT32, pa.map_(pa.string(), pa.string()): _INT32,
                pa.large_binary(): _INT64, pa.large_string(): _INT64}


def read_bulk(body: Any, max_rows: int = MAX_BULK_ROWS, max_bytes: int = MAX_DECODED_BYTES) -> Any:
    """The rows of a bulk SEND's body (an Arrow IPC stream), checked column by column (spec/spark.md §7):
    one batch of the bulk columns, cast to the log schema's types.  A precise MessageFormatError names
    the column (and the first bad row) of anything the broker would not take; nothing is half-read.

    In this order, so that nothing is built from what was not checked: each IPC message's metadata
    (bulk_stream: row counts, field nodes, buffer bounds, declared decompressed sizes within
    ``max_bytes``), the schema (the bulk columns and types only: nothing dictionary-encoded or nested but
    ``properties``), every buffer of every batch (:func:`_check_buffers`), then the values."""
    segments.require()
    schema, batches = bulk_stream.read_stream(body, max_rows, max_bytes)
    names = schema.names
    if len(set(names)) != len(names):
        raise MessageFormatError(f"the bulk batch names a column twice: {', '.join(names)}")
    for field in schema:
        accepted = BULK_COLUMNS.get(field.name)
        if accepted is None:
            raise MessageFormatError(f"column '{field.name}' has no meaning in a bulk SEND; its columns are "
                                     f"{', '.join(BULK_COLUMNS)} (the broker assigns seq and message_id)")
        if field.type not in accepted:
            raise MessageFormatError(f"column '{field.name}' must be of Arrow type "
                                     f"{' or '.join(str(t) for t in accepted)}, not {field.type}")
    if "body" not in names:
        raise MessageFormatError("a bulk SEND needs a 'body' column")
    read = []
    for b in batches:
        _check_buffers(b)
        read.append(b)
    if not read:
        batch = pa.RecordBatch.from_pylist([], schema=schema)
    elif len(read) == 1:
        batch = read[0]
    else:
        batch = pa.Table.from_batches(read, schema).combine_chunks().to_batches()[0]
    _check_bulk(batch)
    return batch


def _check_buffers(batch) -> None:
    """Every buffer of ``batch`` is what its type says, before anything reads a value of it.

    The IPC reader checks only what it needs to hand the batch out (buffer sizes, a variable-width
    column's first and last offsets); a middle offset running backwards or past the data was read by
    pyarrow's kernels as it stood (the first delivery, or recovery, died of SIGSEGV: issue 24).
    ``Array.validate(full=True)`` (pyarrow's own full validation, the well-kept answer for values) checks
    per column: every offset monotone and within its data, UTF-8 of utf8 columns, each null count against
    its validity bitmap, the children of the map column (key nulls, entries' offsets).  We check ourselves
    what it does not: before pyarrow reads a message, its metadata (bulk_stream: row counts, field nodes,
    buffer bounds, declared decompressed sizes, names); here, a variable-width column's first offset is 0
    (the IPC writer always starts there); after, the values' meaning (:func:`_check_bulk`: ranges, names,
    no line break or NUL in a column that becomes a header)."""
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        try:
            column.validate(full=True)
        except (pa.ArrowInvalid, pa.ArrowException) as exc:
            raise MessageFormatError(f"column '{name}' of the bulk SEND is not valid Arrow: {exc}",
                                     column=name) from None
        offset = _OFFSETS.get(column.type)
        if offset is not None and len(column):
            offsets = column.buffers()[1]
            if offsets is not None and offset.unpack_from(offsets, offset.size * column.offset)[0] != 0:
                raise MessageFormatError(f"column '{name}' of the bulk SEND does not start at offset 0",
                                         column=name)


def _first_row(mask) -> int:
    """The first row where ``mask`` (a boolean array, nulls false) is true, or -1."""
    return pc.index(pc.fill_null(mask, False), True).as_py()


def _bad(column: str, row: int, what: str):
    raise MessageFormatError(f"bulk SEND row {row}, column '{column}': {what}", row=row, column=column)


def _within(column, low: int, high: int) -> bool:
    """Every value of an integer column (nulls aside) lies in [low, high]: one pass (min_max), where a
    comparison per bound and a search would make three; only a column that fails is searched for its row."""
    bounds = pc.min_max(column).as_py()
    return bounds["min"] is None or (bounds["min"] >= low and bounds["max"] <= high)


def _no_line_break(column) -> bool:
    """No value of a string column holds a CR, LF or NUL, decided on the column's value bytes at once
    (memchr) instead of a regular expression per row; a column that may hold one is searched row by row."""
    if not len(column):
        return True
    validity, offsets, data = column.buffers()
    if data is None:
        return True
    start = _INT32.unpack_from(offsets, 4 * column.offset)[0]
    end = _INT32.unpack_from(offsets, 4 * (column.offset + len(column)))[0]
    values = memoryview(data)[start:end].tobytes()
    return b"\n" not in values and b"\r" not in values and b"\0" not in values


def _check_bulk(batch) -> None:
    names = batch.schema.names

    def col(name):
        return batch.column(names.index(name)) if name in names else None

    for name, low, high in (("priority", 0, 9), ("delivery_mode", 1, 2), ("timestamp", 0, (2**63 - 1) // 1000),
                            ("expires", 0, (2**63 - 1) // 1000)):
        c = col(name)
        if c is None or _within(c, low, high):
            continue
        row = _first_row(pc.or_(pc.less(c, low), pc.greater(c, high)))
        if row >= 0:
            _bad(name, row, f"must be between {low} and {high}, got {c[row].as_py()}")
    c = col("body_type")
    if c is not None:
        row = _first_row(pc.invert(pc.is_in(c, pa.array(BODY_TYPES))))
        if row >= 0 and c[row].is_valid:
            _bad("body_type", row, f"must be text, bytes or map, got {c[row].as_py()!r}")
    c = col("reply_to")
    if c is not None:
        starts = [pc.starts_with(c, p) for p in _DESTINATION_PREFIXES]
        ok = pc.or_(pc.or_(starts[0], starts[1]), starts[2])
        row = _first_row(pc.and_(pc.invert(ok), pc.is_valid(c)))
        if row >= 0:
            _bad("reply_to", row, f"must be a STOMP destination (/queue/, /topic/, /temp-queue/), got "
                                  f"{c[row].as_py()!r}")
    c = col("properties")
    if c is not None and len(c):
        keys = c.keys                    # every row's property names, flattened (offsets say whose)
        bad = pc.or_(pc.is_in(keys, pa.array(sorted(NOT_PROPERTIES))),
                     pc.or_(pc.match_substring_regex(keys, r"[,=\r\n\x00]"), pc.equal(pc.utf8_length(keys), 0)))
        position = _first_row(bad)
        if position >= 0:
            offsets = c.offsets.to_pylist()
            row = bisect.bisect_right(offsets, position + offsets[0]) - 1
            _bad("properties", row, f"{keys[position].as_py()!r} is not a property name (reserved, empty, or "
                                    f"containing ',', '=', a line break or NUL)")
        if not _no_nul(c.items):
            position = _first_row(pc.match_substring(c.items, "\0"))
            offsets = c.offsets.to_pylist()
            row = bisect.bisect_right(offsets, position + offsets[0]) - 1
            _bad("properties", row, "a property value must not contain NUL (it travels as a STOMP header)")
    c = col("property_types")
    if c is not None:
        ok = pc.match_substring_regex(c, r"^([^,=\r\n]+=[ifb])(,[^,=\r\n]+=[ifb])*$")
        row = _first_row(pc.and_(pc.invert(ok), pc.is_valid(c)))
        if row >= 0:
            _bad("property_types", row, f"must look like 'count=i,ratio=f,flag=b', got {c[row].as_py()!r}")
    for name in ("group", "correlation_id", "type", "dedup_id", "property_types", "reply_to"):
        c = col(name)
        if c is None or _no_line_break(c):
            continue
        row = _first_row(pc.match_substring_regex(c, r"[\r\n\x00]"))
        if row >= 0:
            _bad(name, row, "must not contain a line break or NUL (it travels as a STOMP header)")


def _no_nul(column) -> bool:
    """No value of a string column holds NUL (a STOMP header cannot carry one), decided on its bytes."""
    if not len(column):
        return True
    data = column.buffers()[2]
    if data is None:
        return True
    start = _INT32.unpack_from(column.buffers()[1], 4 * column.offset)[0]
    end = _INT32.unpack_from(column.buffers()[1], 4 * (column.offset + len(column)))[0]
    return b"\0" not in memoryview(data)[start:end].tobytes()


#: columns of one value (a default, all nulls, 0..n-1) are made once and shared: a frame's segment keeps a
#: slice of the shared column (Arrow arrays are immutable), so each frame neither writes them again into
#: fresh memory nor keeps its own copy (measured: these columns were a fifth of the broker's cost of a bulk
#: write into a retained topic, mostly the kernel zeroing the fresh pages). Up to this many rows; a larger
#: frame gets columns of its own
SHARED_ROWS = 1 << 18
_shared: dict[tuple, Any] = {}


def _shared_column(key: tuple, make: Any, n: int) -> Any:
    """The first ``n`` rows of the shared column ``key`` (``make(size)`` builds it; it grows by doubling)."""
    if n > SHARED_ROWS:
        return make(n)
    column = _shared.get(key)
    if column is None or len(column) < n:
        size = min(SHARED_ROWS, max(n, 4096, 2 * len(column) if column is not None else 0))
        column = _shared[key] = make(size)
    return column.slice(0, n)


def _repeated(value: Any, arrow_type: Any, n: int) -> Any:
    """``value`` in every one of ``n`` rows (a few values only: defaults, not arrival times)."""
    return _shared_column(("value", value, str(arrow_type)),
                          lambda size: pa.repeat(pa.scalar(value, arrow_type), size), n)


def _nulls(arrow_type: Any, n: int) -> Any:
    return _shared_column(("nulls", str(arrow_type)), lambda size: pa.nulls(size, arrow_type), n)


def _steps(n: int) -> Any:
    """0, 1, ..., n - 1 (int64)."""
    def make(size: int) -> Any:
        return pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), size)), 1) if size \
            else pa.array([], pa.int64())
    return _shared_column(("steps",), make, n)


def complete_bulk(batch: Any, *, first_seq: int, first_key: int, node_id: str, now: int,
                  persistent: bool, priority: int, ttl: int) -> Any:
    """The segment a bulk SEND becomes: sequence numbers ``first_seq...`` and message ids from keys
    ``first_key...`` in row order, and each missing value from the broker's defaults (arrival time, the
    destination's priority and time to live, the broker's default delivery mode), all column-wise."""
    n = batch.num_rows
    names = batch.schema.names

    def given(name, arrow_type):
        if name not in names:
            return None
        c = batch.column(names.index(name))
        return c if c.type == arrow_type else c.cast(arrow_type)

    def filled(name, arrow_type, default):
        c = given(name, arrow_type)
        if c is None:
            return _repeated(default, arrow_type, n)
        return c.fill_null(default) if c.null_count else c

    def plain(name, arrow_type):
        c = given(name, arrow_type)
        return c if c is not None else _nulls(arrow_type, n)

    steps = _steps(n)
    seqs = pc.add(steps, first_seq)
    keys = pc.add(steps, first_key)
    # the prefix put in front of each key's digits (a join with a column of n prefixes took twice as long)
    ids = pc.binary_replace_slice(pc.cast(keys, pa.string()), start=0, stop=0, replacement=f"ID:{node_id}-")
    stamps = given("timestamp", pa.int64())         # the arrival time differs per frame: not shared
    if stamps is None or stamps.null_count:
        stamps = pa.repeat(pa.scalar(now, pa.int64()), n) if stamps is None else stamps.fill_null(now)
    expires = given("expires", pa.int64())
    if expires is None or expires.null_count:
        default_expiry = now + ttl if ttl else 0
        expires = pa.repeat(pa.scalar(default_expiry, pa.int64()), n) if expires is None \
            else expires.fill_null(default_expiry)
    body_type = filled("body_type", pa.string(), "bytes")
    if "body_type" not in names:
        # every row is bytes (the Spark sink leaves the column out then): one value, no comparisons
        content = _repeated(CONTENT_TYPES["bytes"], pa.string(), n)
    else:
        content = pc.if_else(pc.equal(body_type, "text"), CONTENT_TYPES["text"],
                             pc.if_else(pc.equal(body_type, "map"), CONTENT_TYPES["map"], CONTENT_TYPES["bytes"]))
    body = given("body", pa.binary())
    if body.null_count:
        body = body.fill_null(b"")
    columns = [seqs, ids, stamps, expires, filled("priority", pa.int32(), priority),
               filled("delivery_mode", pa.int32(), 2 if persistent else 1), body_type, content, body,
               plain("group", pa.string()), plain("correlation_id", pa.string()), plain("type", pa.string()),
               plain("reply_to", pa.string()), plain("properties", pa.map_(pa.string(), pa.string())),
               plain("property_types", pa.string()), plain("dedup_id", pa.string())]
    return pa.RecordBatch.from_arrays(columns, schema=segments.LOG_SCHEMA)


def drop_rows(batch: Any, rows: Sequence[int]) -> Any:
    """``batch`` without ``rows`` (duplicates found by the dedup window), order kept."""
    if not rows:
        return batch
    mask = [True] * batch.num_rows
    for r in rows:
        mask[r] = False
    return batch.filter(pa.array(mask))


def unexpired(batch: Any, now: int) -> Any:
    """Rows not expired at ``now`` (0 < expires <= now is expired); the batch itself when none is."""
    expires = batch.column(3)
    gone = pc.and_(pc.greater(expires, 0), pc.less_equal(expires, now))
    if not pc.any(gone).as_py():
        return batch
    return batch.filter(pc.invert(gone))


# -- what a bulk SEND did, and its stored record ------------------------------------------------------------

@dataclass(frozen=True)
class BulkResult:
    """What a bulk SEND did: the RECEIPT's ``pymq-first-seq``, ``pymq-count``, ``pymq-duplicates``."""

    first_seq: int
    count: int
    duplicates: int
    stored: bool            # wrote persistent data: the receipt waits until it is durable

    def receipt_headers(self) -> dict[str, str]:
        return {"pymq-first-seq": str(self.first_seq), "pymq-count": str(self.count),
                "pymq-duplicates": str(self.duplicates)}


#: a stored bulk segment is a message whose body is the SEND's own IPC stream, marked by this header
SEGMENT_HEADER = "pymq-segment"
FIRST_KEY_HEADER = "pymq-first-key"


def segment_record(body: bytes, rows: Any, dropped: Sequence[int], destination: str, key: int, message_id: str,
                   first_key: int, node_id: str, now: int, defaults: tuple[bool, int, int]) -> BrokerMessage:
    """The message object that stands for a bulk segment in storage and in memory accounting.  Its body is
    the SEND's own body, as it came (no second encoding, and only what the producer sent), and its headers
    say how the rows were completed (spec/spark.md §7: sequence block, keys, arrival time, defaults, rows
    dropped as duplicates), so recovery rebuilds the very same rows (:func:`restored_segment`)."""
    persistent, priority, ttl = defaults
    headers = {SEGMENT_HEADER: "arrow", FIRST_KEY_HEADER: str(first_key), "pymq-arrival": str(now),
               "pymq-node": node_id, "pymq-defaults": f"{int(persistent)},{priority},{ttl}",
               "pymq-dropped": ",".join(map(str, dropped)), "content-type": segments.ARROW_STREAM}
    any_persistent = pc.any(pc.equal(rows.column("delivery_mode"), 2)).as_py()
    holder = BrokerMessage(key, message_id, destination, rows.column(0)[0].as_py(), headers, body,
                           bool(any_persistent), 4, now, 0)
    holder.size = rows.nbytes
    return holder


def restored_segment(message: BrokerMessage, max_bytes: int = MAX_DECODED_BYTES) -> tuple[Any, int] | None:
    """(rows, first key) of a stored segment record, or None when ``message`` is not one: the SEND's rows
    completed again as they were (see :func:`segment_record`), its non-persistent rows left out (as with
    messages sent one by one, recovery keeps the persistent ones)."""
    h = message.headers
    if h.get(SEGMENT_HEADER) != "arrow":
        return None
    # read and checked as the SEND was (a record an older broker stored unchecked is refused here, and
    # recovery quarantines it); decompressed within max(the default, the broker's max_frame_size)
    batch = read_bulk(message.body, max_bytes=max(max_bytes, MAX_DECODED_BYTES))
    batch = drop_rows(batch, [int(i) for i in h.get("pymq-dropped", "").split(",") if i])
    persistent, priority, ttl = (int(x) for x in h["pymq-defaults"].split(","))
    first_key = int(h[FIRST_KEY_HEADER])
    rows = complete_bulk(batch, first_seq=message.seq, first_key=first_key, node_id=h["pymq-node"],
                         now=int(h["pymq-arrival"]), persistent=bool(persistent), priority=priority, ttl=ttl)
    return rows.filter(pc.equal(rows.column("delivery_mode"), 2)), first_key


def materialize_rows(rows: Any, destination: str, first_key: int, client: Any) -> list[BrokerMessage]:
    """One message object per row of a completed bulk SEND, for the queues and subscribers that need one
    (made once, shared by every entry that refers to it), stamped with the producing connection."""
    made = segments.materialize(rows, destination, range(first_key, first_key + rows.num_rows), BrokerMessage)
    if client is not None:
        for message in made:
            message.producer = client.id
            message.client_id = client.client_id
            message.user = client.user.name
    return made


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a bulk SEND's rows become messages and are placed:
    tens of thousands of new objects at once would start hundreds of its passes, each walking every
    message the broker holds (about 40 % of a queue's bulk SEND, measured); placing rows makes no cycles,
    so the collector simply runs later.  Left alone when something else paused it already."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
