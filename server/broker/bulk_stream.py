"""A bulk SEND's Arrow IPC stream (spec/spark.md §7), read one IPC message at a time with its metadata
checked before pyarrow builds anything from it.

pyarrow's stream reader trusts a record batch's metadata for what it allocates and builds before any
validation runs: a compressed buffer is inflated to the length its first eight bytes declare (an 8.5 KB
frame became a 256 MiB row: issue 24), a field node's null count decides whether a map's keys are taken as
non-null (pyarrow aborts the process building a map whose key node says otherwise), and a record batch's
length is how many rows everything downstream believes.  So each message passes here first:

* the schema message only, then record batch messages only (a dictionary batch, a tensor: refused);
* a batch's row count within the frame's row limit, and every field node's length and null count within
  ``0 <= null_count <= length <= 2**31 - 1``; top-level nodes as long as the batch; a map's entries and
  keys without nulls; exactly the field nodes and buffers the schema's columns have;
* every buffer within the message's body; with body compression (LZ4 frame or ZSTD, per buffer), the
  uncompressed lengths the buffers declare added up over the whole stream and bounded by ``max_bytes``
  (the broker's ``max_frame_size``) *before* pyarrow decompresses anything.  Without compression a
  buffer is a view of the frame, so the frame's own size bounds it.

Then pyarrow reads the batch (``read_record_batch``) and bulk_rows validates its values in full.

The metadata is a flatbuffer (Arrow's ``Message.fbs``); :class:`_Table` reads the few fields needed, every
position checked against the metadata's bounds (pyarrow's reader has verified the flatbuffer already;
this reader does not rely on it).  Hand-written because nothing well-kept gives these figures: pyarrow
exposes neither a message's compression nor its buffers' declared lengths, and the ``flatbuffers`` runtime
would still need accessors written for Arrow's schema (about as long as this).  Pure functions, no broker
state.
"""
from __future__ import annotations

import struct
from typing import Any

from pymq.errors import MessageFormatError

#: Arrow's MessageHeader union: the kinds of IPC message
_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3
#: BodyCompression.codec values Arrow defines; method 0 is BUFFER (each buffer compressed on its own)
_CODECS = {0: "lz4", 1: "zstd"}
#: a node longer than this cannot be an Arrow array with int32 offsets (and keeps every size
#: computation pyarrow makes from it far inside int64)
MAX_NODE_LENGTH = (1 << 31) - 1


def _refuse(what: str) -> MessageFormatError:
    return MessageFormatError(f"the bulk SEND's body is not an Arrow IPC stream the broker takes: {what}")


class _Table:
    """One flatbuffer table: its fields by slot number, each read checked against the buffer's bounds."""

    __slots__ = ("buf", "pos", "vtable", "vsize")

    def __init__(self, buf: memoryview, pos: int) -> None:
        self.buf = buf
        self.pos = pos
        self.vtable = pos - _read(buf, "<i", pos)
        self.vsize = _read(buf, "<H", self.vtable)

    def _slot(self, slot: int) -> int:
        """The field's position, or 0 when absent."""
        entry = 4 + 2 * slot
        if entry + 2 > self.vsize:
            return 0
        offset = _read(self.buf, "<H", self.vtable + entry)
        return self.pos + offset if offset else 0

    def scalar(self, slot: int, fmt: str, default: int) -> int:
        at = self._slot(slot)
        return _read(self.buf, fmt, at) if at else default

    def _target(self, slot: int) -> int:
        at = self._slot(slot)
        return at + _read(self.buf, "<I", at) if at else 0

    def table(self, slot: int) -> _Table | None:
        at = self._target(slot)
        return _Table(self.buf, at) if at else None

    def structs(self, slot: int) -> list[tuple[int, int]] | None:
        """A vector of 16-byte structs of two int64 (FieldNode, Buffer), or None when absent."""
        at = self._target(slot)
        if not at:
            return None
        count = _read(self.buf, "<I", at)
        start = at + 4
        if start + 16 * count > len(self.buf):
            raise _refuse("a metadata vector runs past its message")
        return [struct.unpack_from("<qq", self.buf, start + 16 * i) for i in range(count)]


def _read(buf: memoryview, fmt: str, pos: int) -> int:
    # struct counts a negative position from the end: a position is checked here, not by struct
    if pos < 0 or pos + struct.calcsize(fmt) > len(buf):
        raise _refuse("its metadata points outside itself")
    return struct.unpack_from(fmt, buf, pos)[0]


def _layout(field: Any) -> tuple[int, int]:
    """(field nodes, buffers) a column of the bulk types has in a record batch message."""
    import pyarrow as pa
    if pa.types.is_map(field.type):
        # map (validity, offsets), its entries struct (validity), key and value (validity, offsets, data)
        return 4, 2 + 1 + 3 + 3
    if pa.types.is_binary(field.type) or pa.types.is_string(field.type) \
            or pa.types.is_large_binary(field.type) or pa.types.is_large_string(field.type):
        return 1, 3
    return 1, 2


def check_batch_message(metadata: Any, body: Any, schema: Any, rows_left: int, bytes_left: int,
                        max_rows: int) -> tuple[int, int]:
    """Check a record batch message's metadata (module docstring) against ``schema`` (already checked to
    be of the bulk columns); (its rows, the bytes its buffers will take once read), both within what is
    left of the frame's limits."""
    buf = memoryview(metadata)
    try:
        message = _Table(buf, _read(buf, "<I", 0))
        kind = message.scalar(1, "<B", 0)
        if kind == _DICTIONARY_BATCH:
            raise MessageFormatError("a bulk SEND's columns are not dictionary-encoded (a dictionary batch "
                                     "came)")
        if kind != _RECORD_BATCH:
            raise _refuse(f"an IPC message of kind {kind} where record batches go")
        batch = message.table(2)
        if batch is None:
            raise _refuse("a record batch message without its record batch")
        rows = batch.scalar(0, "<q", 0)
        nodes = batch.structs(1) or []
        buffers = batch.structs(2) or []
        compression = batch.table(3)
        if batch.structs(4):
            raise _refuse("variadic buffers (view types) are not bulk columns")
        codec = None
        if compression is not None:
            codec = compression.scalar(0, "<b", 0)
            if codec not in _CODECS or compression.scalar(1, "<b", 0) != 0:
                raise _refuse(f"body compression {codec} is not LZ4 frame or ZSTD per buffer")
    except struct.error:
        raise _refuse("its metadata is cut short") from None
    if rows < 0 or rows > rows_left:
        raise MessageFormatError(f"a bulk SEND carries at most {max_rows} rows, this one {max_rows - rows_left} "
                                 f"and a batch of {rows} more")
    expected_nodes = expected_buffers = 0
    tops = []
    for field in schema:
        n, b = _layout(field)
        tops.append(expected_nodes)
        expected_nodes += n
        expected_buffers += b
    if len(nodes) != expected_nodes or len(buffers) != expected_buffers:
        raise _refuse(f"a record batch of {len(schema)} columns has {len(nodes)} field nodes and {len(buffers)} "
                      f"buffers, not {expected_nodes} and {expected_buffers}")
    for i, (length, nulls) in enumerate(nodes):
        if not 0 <= length <= MAX_NODE_LENGTH or not 0 <= nulls <= length:
            raise _refuse(f"field node {i} says {length} values of which {nulls} null")
    for index, field in zip(tops, schema, strict=True):
        if nodes[index][0] != rows:
            raise _refuse(f"column '{field.name}' has {nodes[index][0]} values in a batch of {rows} rows")
        if _layout(field)[0] == 4 and (nodes[index + 1][1] or nodes[index + 2][1]):
            raise MessageFormatError(f"column '{field.name}': a map's entries and keys are never null",
                                     column=field.name)
    size = 0 if body is None else len(body)
    view = memoryview(body) if size else memoryview(b"")
    decoded = 0
    for offset, length in buffers:
        if offset < 0 or length < 0 or offset + length > size:
            raise _refuse(f"a buffer ({offset}, {length}) outside its message's {size}-byte body")
        if codec is None or length == 0:
            decoded += length
            continue
        if length < 8:
            raise _refuse("a compressed buffer shorter than its 8-byte uncompressed length")
        declared = struct.unpack_from("<q", view, offset)[0]
        if declared == -1:                     # left uncompressed by the writer: the rest is the buffer
            decoded += length - 8
        elif declared < 0:
            raise _refuse(f"a compressed buffer declares {declared} bytes")
        else:
            decoded += declared
    if decoded > bytes_left:
        raise MessageFormatError(f"a bulk SEND's buffers would take more than max_frame_size once "
                                 f"decompressed ({decoded} bytes declared, {bytes_left} left)")
    return rows, decoded


def read_stream(body: Any, max_rows: int, max_bytes: int) -> tuple[Any, _Batches]:
    """(schema, record batches) of a bulk SEND's body, every batch's metadata checked before pyarrow
    reads it (module docstring); the schema is handed to ``check_schema`` before any batch is read."""
    import pyarrow as pa
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(body))
        first = reader.read_next_message()
        if first.type != "schema":
            raise _refuse(f"it starts with a {first.type} message, not a schema")
        schema = pa.ipc.read_schema(first)
        _decode_names(schema)
    except StopIteration:
        raise _refuse("it has no schema") from None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowKeyError, OSError,
            ValueError) as exc:
        raise _refuse(str(exc)) from None
    return schema, _Batches(reader, schema, max_rows, max_bytes)


def _decode_names(fields: Any) -> None:
    """Every field name of the schema, nested ones included, is UTF-8 (pyarrow reads them as bytes and
    decodes them when first asked, so a bad one would surface wherever that is)."""
    for field in fields:
        try:
            field.name  # noqa: B018 - decoding is the check
        except UnicodeDecodeError:
            raise _refuse("a field name is not UTF-8") from None
        kind = field.type
        if kind.num_fields:
            _decode_names(kind.field(i) for i in range(kind.num_fields))


class _Batches:
    """The record batches after the schema, read (and checked) when iterated: the caller checks the
    schema first, so a batch of columns the broker does not take is never read."""

    def __init__(self, reader: Any, schema: Any, max_rows: int, max_bytes: int) -> None:
        self.reader, self.schema, self.rows_left, self.bytes_left = reader, schema, max_rows, max_bytes
        self.max_rows = max_rows

    def __iter__(self) -> Any:
        import pyarrow as pa
        while True:
            try:
                message = self.reader.read_next_message()
            except StopIteration:
                return
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, ValueError) as exc:
                raise _refuse(str(exc)) from None
            if message.type != "record batch":      # refused: the check says why (a dictionary batch...)
                check_batch_message(message.metadata, None, self.schema, 0, 0, self.max_rows)
            rows, decoded = check_batch_message(message.metadata, message.body, self.schema, self.rows_left,
                                                self.bytes_left, self.max_rows)
            self.rows_left -= rows
            self.bytes_left -= decoded
            try:
                yield pa.ipc.read_record_batch(message, self.schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowIndexError,
                    pa.ArrowKeyError, pa.ArrowMemoryError, pa.ArrowCapacityError, OSError, ValueError,
                    IndexError) as exc:
                raise _refuse(str(exc)) from None
