"""Messages as Arrow: sealed segments of retained logs, Arrow range reads and bulk appends (spec/spark.md §5–§8).

One form, the *message batch* of spec/spark.md §5, serves three purposes:

* a retained log keeps its messages in sealed :class:`Segment` s, each an Arrow record batch of
  consecutive sequence numbers built once (at write time: a bulk append *is* a segment; per-message
  appends are sealed :data:`SEGMENT_ROWS` at a time);
* a range read asked in Arrow (``pymq-format: arrow``) is answered with one frame whose body is an Arrow
  IPC stream of slices of those segments (:func:`ipc_pieces`), written to the socket as views of
  the segments' buffers, so serving it touches and copies no row;
* a bulk SEND brings a batch of rows (bulk_rows.py), completed column-wise into a segment
  without a per-message object; one is made per row (:func:`materialize`) only
  where something needs a message: a STOMP consumer, a queue, a durable subscription, a per-message read.

pyarrow is optional for the broker: without it :func:`available` is False, range reads are answered per
message and bulk SENDs are refused with a precise error.  Pure functions and values: no event loop, no
broker state (the retained log, log.py, and the range reader own the segments).
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Any

from pymq.errors import InvalidHeader, MessageFormatError
from pymq.message import MAP_TYPE, RESERVED_HEADERS, content_body_type

try:  # optional: the spark extra installs it
    import pyarrow as pa
    import pyarrow.compute as pc
except ImportError:  # pragma: no cover - exercised by the broker tests without pyarrow
    pa = pc = None

#: rows of a segment sealed from per-message appends (a bulk append keeps its own size)
SEGMENT_ROWS = 4096
#: the content type of an Arrow IPC stream (a range read's answer, a bulk SEND's body)
ARROW_STREAM = "application/vnd.apache.arrow.stream"
#: the header that asks for (range reads) or announces (bulk SENDs) Arrow
FORMAT_HEADER = "pymq-format"
#: headers that are not properties in a segment: the reserved ones, and the group (its own column)
NOT_PROPERTIES = frozenset(RESERVED_HEADERS | {"JMSXGroupID"})
BODY_TYPES = ("text", "bytes", "map")
CONTENT_TYPES = {"text": "text/plain;charset=utf-8", "bytes": "application/octet-stream", "map": MAP_TYPE}


#: the columns of the message batch (spec/spark.md §5), in order: ``LOG_SCHEMA``'s names
LOG_COLUMNS = ("seq", "message_id", "timestamp", "expires", "priority", "delivery_mode", "body_type",
               "content_type", "body", "group", "correlation_id", "type", "reply_to", "properties",
               "property_types", "dedup_id")
#: the header of a range read naming the columns its Arrow answer should carry (spec/spark.md §6)
COLUMNS_HEADER = "pymq-columns"


def parse_columns(text: str) -> tuple[str, ...]:
    """The columns a ``pymq-columns`` header names, in the message batch's order (spec/spark.md §6):
    comma-separated names of §5, at least one; an unknown or empty name is an error naming it."""
    names = [name.strip() for name in text.split(",")]
    for name in names:
        if name not in LOG_COLUMNS:
            raise InvalidHeader(f"header {COLUMNS_HEADER!r} names {name[:32]!r}, which is not a column of the "
                                f"message batch (spec/spark.md §5: {', '.join(LOG_COLUMNS)})", header=COLUMNS_HEADER)
    wanted = set(names)
    return tuple(name for name in LOG_COLUMNS if name in wanted)


def projected(columns: tuple[str, ...] | None) -> tuple[Any, list[int] | None]:
    """(the answer's schema, the positions of its columns in a segment; None: every column)."""
    if columns is None or len(columns) == len(LOG_COLUMNS):
        return LOG_SCHEMA, None
    positions = [LOG_COLUMNS.index(name) for name in columns]
    return pa.schema([LOG_SCHEMA.field(i) for i in positions]), positions


def available() -> bool:
    """True when pyarrow is importable, so the broker serves Arrow reads and takes bulk SENDs."""
    return pa is not None


def _fields() -> list:
    return [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("message_id", pa.string()),
        pa.field("timestamp", pa.int64()),
        pa.field("expires", pa.int64()),
        pa.field("priority", pa.int32()),
        pa.field("delivery_mode", pa.int32()),
        pa.field("body_type", pa.string()),
        pa.field("content_type", pa.string()),
        pa.field("body", pa.binary()),
        pa.field("group", pa.string()),
        pa.field("correlation_id", pa.string()),
        pa.field("type", pa.string()),
        pa.field("reply_to", pa.string()),
        pa.field("properties", pa.map_(pa.string(), pa.string())),
        pa.field("property_types", pa.string()),
        pa.field("dedup_id", pa.string()),
    ]


if pa is not None:
    #: a segment of a retained log, and the answer of every Arrow range read (spec/spark.md §5)
    LOG_SCHEMA = pa.schema(_fields())


def require() -> None:
    if pa is None:
        raise MessageFormatError("this broker has no pyarrow, so it takes no Arrow bulk SEND; send "
                                 "messages one per frame, or install pyarrow on the broker")


# -- segments --------------------------------------------------------------------------------------------

class Segment:
    """Messages of one destination with consecutive sequence numbers (gaps allowed), sealed as one Arrow
    record batch of :data:`LOG_SCHEMA`.  ``messages`` holds the per-message objects the segment was
    sealed from (None for a bulk append: those are made on demand); ``stored`` the storage record of a
    bulk append (released when the whole segment leaves the log)."""

    __slots__ = ("_ends", "_expires", "_first_expiry", "_seqs", "_sizes", "_stamps", "batch", "first_key",
                 "messages", "stored")

    def __init__(self, batch: Any, messages: list | None = None, stored: Any = None,
                 first_key: int | None = None) -> None:
        self.batch = batch
        self._seqs = _int64_view(batch.column(0))
        self._stamps = _int64_view(batch.column(2))
        self._expires = _int64_view(batch.column(3))
        self._sizes: Any = None          # body lengths, made by body_sizes() when first asked
        self._ends: Any = None           # the body column's offsets: body bytes before each row, and after
        self._first_expiry: int | None = -1   # the earliest non-zero expires (None: none), -1 not yet known
        self.messages = messages
        self.stored = stored
        self.first_key = first_key      # a bulk append's rows have keys first_key, first_key + 1, ...

    def __len__(self) -> int:
        return len(self._seqs)

    @property
    def paged(self) -> bool:
        """The rows are out of memory (:meth:`page_out`); their stored record has them."""
        return self.batch is None

    def page_out(self) -> None:
        """Let the rows go from memory, keeping what lookups and retention read without them: the
        sequence numbers, timestamps and expiry, copied out of the batch (24 bytes a row, against the
        100-odd of a row).  Reads take the rows back from the segment's stored record
        (``RetainedLog._resident``)."""
        self.first_expiry()
        self._seqs = _copied(self._seqs)
        self._stamps = _copied(self._stamps)
        self._expires = _copied(self._expires)
        self._sizes = self._ends = None
        self.batch = None

    @property
    def first(self) -> int:
        return self._seqs[0]

    @property
    def last(self) -> int:
        return self._seqs[-1]

    def seq(self, row: int) -> int:
        return self._seqs[row]

    def timestamp(self, row: int) -> int:
        return self._stamps[row]

    def expires(self, row: int) -> int:
        return self._expires[row]

    def index(self, seq: int, lo: int = 0) -> int:
        """The first row whose sequence number is >= ``seq``."""
        return bisect.bisect_left(self._seqs, seq, lo)

    def first_expiry(self) -> int | None:
        """The earliest JMSExpiration of the segment's rows that expire (None when none does): a read at
        a time before it skips no row, and needs no look at the rows (computed once: sealed rows never
        change)."""
        if self._first_expiry == -1:
            expires = self.batch.column(3)
            self._first_expiry = pc.min(pc.filter(expires, pc.greater(expires, 0))).as_py()
        return self._first_expiry

    def body_ends(self) -> Any:
        """The body column's offsets (``n + 1`` of them): ``ends[j] - ends[i]`` is the body bytes of rows
        ``i:j``, so a byte budget is found by bisection, without a pass over the rows."""
        if self._ends is None:
            body = self.batch.column(8)
            self._ends = _view(body.buffers()[1], "i", 4, body.offset, len(body) + 1)
        return self._ends

    def body_sizes(self) -> Any:
        """Each row's body length (computed once, for max-bytes reads)."""
        if self._sizes is None:
            self._sizes = _int32_view(pc.binary_length(self.batch.column(8)))
        return self._sizes


def _int64_view(column) -> memoryview:
    # a zero-copy view of an int64 column without nulls (seq, timestamp, expires are never null here)
    return _view(column.buffers()[1], "q", 8, column.offset, len(column))


def _view(buffer: Any, fmt: str, width: int, offset: int, n: int) -> Any:
    """Values ``offset:offset + n`` of a fixed-width buffer, zero-copy.  A buffer may be longer than its
    values need by any number of bytes (valid Arrow; a bulk SEND's buffers are the sender's): the values
    are cut out as bytes before the cast, which needs a whole number of items."""
    return memoryview(buffer)[width * offset:width * (offset + n)].cast(fmt)  # type: ignore[call-overload]


def all_persistent(batch: Any) -> bool:
    """Every row of ``batch`` (log schema) is persistent: its stored record brings back every row."""
    return bool(pc.all(pc.equal(batch.column(5), 2)).as_py())


def _copied(view: memoryview) -> memoryview:
    # the same int64 values in memory of their own (the batch they viewed may go)
    return memoryview(view.tobytes()).cast("q")


def _int32_view(column) -> memoryview:
    data = column.buffers()[1]
    return _view(data, "i", 4, column.offset, len(column))


def from_messages(messages: Sequence) -> Any:
    """The rows of per-message objects (``BrokerMessage``), as one batch of the log schema.  Built once
    per sealed segment, or per read for a log's open tail and for queues."""
    require()
    h = [m.headers for m in messages]
    columns = [
        pa.array([m.seq for m in messages], pa.int64()),
        pa.array([m.message_id for m in messages], pa.string()),
        pa.array([m.timestamp for m in messages], pa.int64()),
        pa.array([m.expires for m in messages], pa.int64()),
        pa.array([m.priority for m in messages], pa.int32()),
        pa.array([2 if m.persistent else 1 for m in messages], pa.int32()),
        pa.array([_body_type(x.get("content-type"), x.get("transformation"), m.body)
                  for x, m in zip(h, messages, strict=True)], pa.string()),
        pa.array([x.get("content-type") for x in h], pa.string()),
        pa.array([m.body for m in messages], pa.binary()),
        pa.array([m.group_id for m in messages], pa.string()),
        pa.array([x.get("correlation-id") for x in h], pa.string()),
        pa.array([x.get("type") for x in h], pa.string()),
        pa.array([x.get("reply-to") for x in h], pa.string()),
        pa.array([[(k, v) for k, v in x.items() if k not in NOT_PROPERTIES] for x in h],
                 pa.map_(pa.string(), pa.string())),
        pa.array([x.get("pymq-types") for x in h], pa.string()),
        pa.array([x.get("pymq-dedup-id") for x in h], pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=LOG_SCHEMA)


def _body_type(content_type: str | None, transformation: str | None, body: bytes) -> str:
    kind = content_body_type(content_type, transformation)
    if kind is not None:
        return kind
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes"
    return "text"


class IpcPieces(list):
    """An Arrow IPC stream as the pieces the IPC writer produced, in order: small framing (message
    lengths, flatbuffer metadata, padding) as bytes, and the record batches' data buffers as
    ``pyarrow.Buffer`` s that *are* the segments' memory (a slice of a sealed segment is a view of it,
    not a copy).  A link writes the pieces one after the other (``writev``-style), so a range answer
    reaches the socket without the rows ever being copied in the broker; ``size`` is the stream's length
    (the frame's content-length).  The buffers keep their segments' memory alive until written, even if
    retention trims the segment meanwhile."""

    size: int = 0

    def write(self, data: Any) -> int:
        n = data.size if isinstance(data, pa.Buffer) else len(data)
        if n:
            self.append(data)
            self.size += n
        return n

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def closed(self) -> bool:
        return False

    def join(self) -> bytes:
        """The stream as one bytes object (a transport that cannot write pieces: vm://)."""
        return b"".join(self)


def ipc_pieces(schema: Any, batches: Iterable) -> IpcPieces:
    """An Arrow IPC stream (schema, the batches, end marker) as :class:`IpcPieces`: a range read's answer.
    pyarrow hands a Python sink each body buffer as a ``Buffer`` over the batch's own memory (zero-copy;
    checked by tests/spark/test_segments.py), so nothing of the rows is copied here."""
    require()
    pieces = IpcPieces()
    with pa.ipc.new_stream(pa.PythonFile(pieces, mode="w"), schema) as writer:
        for batch in batches:
            if batch.num_rows:
                writer.write_batch(batch)
    return pieces


def ipc_stream(schema: Any, batches: Iterable) -> Any:
    """The same stream as one buffer (a stored segment's form)."""
    return pa.py_buffer(ipc_pieces(schema, batches).join())


def read_ipc(data: Any) -> Any:
    """The one batch of a stored segment (its storage form is an IPC stream of one batch)."""
    require()
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    batches = list(reader)
    if len(batches) != 1 or reader.schema != LOG_SCHEMA:
        raise MessageFormatError("a stored segment is not one Arrow batch of the log schema")
    return batches[0]


# -- materializing rows as messages -----------------------------------------------------------------------

#: the optional text columns of a row and the MESSAGE header each becomes, in the headers' order
_OPTIONAL_HEADERS = (("correlation_id", "correlation-id"), ("reply_to", "reply-to"), ("type", "type"),
                     ("group", "JMSXGroupID"), ("property_types", "pymq-types"), ("dedup_id", "pymq-dedup-id"))


def _rows_of(batch: Any, start: int, stop: int | None) -> tuple[Any, dict[str, list | None]]:
    """Rows ``start:stop`` and the columns row_headers needs as Python lists (None: every row null,
    so the rows need not look at the column at all: most bulk rows leave most columns out)."""
    part = batch.slice(start, (stop if stop is not None else batch.num_rows) - start)
    n = part.num_rows
    cols: dict[str, list | None] = {}
    for name in ("timestamp", "expires", "priority", "delivery_mode", "content_type", "group", "correlation_id",
                 "type", "reply_to", "properties", "property_types", "dedup_id"):
        column = part.column(name)
        cols[name] = None if n and column.null_count == n else column.to_pylist()
    return part, cols


def _headers(cols: dict[str, list | None], n: int) -> list[dict]:
    content, props = cols["content_type"], cols["properties"]
    optional = [(header, values) for column, header in _OPTIONAL_HEADERS
                if (values := cols[column]) is not None]
    modes, priorities = cols["delivery_mode"], cols["priority"]
    stamps, expiries = cols["timestamp"], cols["expires"]
    out = []
    for i in range(n):
        h: dict[str, str] = {}
        if content is not None and content[i] is not None:
            h["content-type"] = content[i]
        for header, values in optional:
            value = values[i]
            if value is not None:
                h[header] = value
        if props is not None:
            for name, value in props[i] or ():
                h[name] = value
        h["persistent"] = "false" if modes[i] == 1 else "true"      # type: ignore[index]
        h["priority"] = str(priorities[i])                            # type: ignore[index]
        h["timestamp"] = str(stamps[i])                               # type: ignore[index]
        h["expires"] = str(expiries[i])                               # type: ignore[index]
        out.append(h)
    return out


def row_headers(batch: Any, start: int = 0, stop: int | None = None) -> list[dict]:
    """The MESSAGE headers (without destination, message-id and pymq-seq) of rows ``start:stop``, as a
    SEND that carried the same values would have left them on the broker's message."""
    part, cols = _rows_of(batch, start, stop)
    return _headers(cols, part.num_rows)


def materialize(batch: Any, destination: str, keys: Sequence[int], make: Any, start: int = 0,
                stop: int | None = None) -> list:
    """Per-message objects for rows ``start:stop`` of a segment: ``make(key, message_id, destination,
    seq, headers, body, persistent, priority, timestamp, expires)`` (the broker passes BrokerMessage).
    The typed values come from the columns themselves, not back from the header text."""
    part, cols = _rows_of(batch, start, stop)
    n = part.num_rows
    seqs = part.column("seq").to_pylist()
    ids = part.column("message_id").to_pylist()
    bodies = part.column("body").to_pylist()
    modes, priorities = cols["delivery_mode"], cols["priority"]
    stamps, expiries = cols["timestamp"], cols["expires"]
    return [make(keys[i], ids[i], destination, seqs[i], headers, bodies[i] or b"", modes[i] != 1,  # type: ignore[index]
                 priorities[i], stamps[i], expiries[i])                                          # type: ignore[index]
            for i, headers in enumerate(_headers(cols, n))]
