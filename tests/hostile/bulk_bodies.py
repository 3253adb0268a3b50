"""Hostile bulk SEND bodies (spec/spark.md §7): Arrow IPC streams whose buffers say what is not so.

pyarrow builds an array from buffers it is given with only a basic check (a variable-width column's
first and last offsets), and its IPC writer writes those buffers as they are: that is how an adversary
makes a stream whose middle offsets run backwards or point past the data, or whose utf8 values are not
UTF-8, and how these helpers make them.
"""
from __future__ import annotations

import struct

ARROW_STREAM = "application/vnd.apache.arrow.stream"


def stream(batch) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def variable(offsets: list[int], data: bytes, arrow_type=None, validity: bytes | None = None,
             null_count: int = 0):
    """A binary (or ``arrow_type``) array made straight from ``offsets`` and ``data``, unchecked."""
    import pyarrow as pa

    arrow_type = pa.binary() if arrow_type is None else arrow_type
    return pa.Array.from_buffers(arrow_type, len(offsets) - 1,
                                 [None if validity is None else pa.py_buffer(validity),
                                  pa.py_buffer(struct.pack(f"<{len(offsets)}i", *offsets)), pa.py_buffer(data)],
                                 null_count=null_count)


def body_column(offsets: list[int], data: bytes = b"abcdefghijkl", arrow_type=None) -> bytes:
    """A bulk SEND body of one ``body`` column with these offsets over ``data``."""
    import pyarrow as pa

    return stream(pa.RecordBatch.from_arrays([variable(offsets, data, arrow_type)], names=["body"]))


#: issue 24's body: 3 rows, the second offset 2**31 - 256 (receipted, then SIGSEGV at the first delivery)
SEGFAULT_BODY_OFFSETS = [0, 2**31 - 256, 8, 12]


def segfault_body() -> bytes:
    return body_column(SEGFAULT_BODY_OFFSETS)


def bulk_send_headers(destination: str, receipt: str | None = None) -> dict[str, str]:
    h = {"destination": destination, "pymq-format": "arrow", "content-type": ARROW_STREAM}
    if receipt is not None:
        h["receipt"] = receipt
    return h


# -- the stream's metadata, rewritten in place ---------------------------------------------------------------

def messages(data: bytes) -> list[tuple[int, int, int]]:
    """(metadata start, metadata length, body length) of each IPC message of a stream (continuation
    marker framing, as pyarrow writes it), up to the end-of-stream marker."""
    out = []
    pos = 0
    while pos + 8 <= len(data):
        marker, length = struct.unpack_from("<Ii", data, pos)
        assert marker == 0xFFFFFFFF
        if length == 0:
            break
        start = pos + 8
        out.append((start, length, _body_length(data[start:start + length])))
        pos = start + length + out[-1][2]
    return out


class _Table:
    """A flatbuffer table of an IPC message's metadata (a reader of its own, so that crafting a body does
    not depend on the broker's reader it is meant to test)."""

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf, self.pos = buf, pos
        self.vtable = pos - struct.unpack_from("<i", buf, pos)[0]

    def _slot(self, slot: int) -> int:
        size = struct.unpack_from("<H", self.buf, self.vtable)[0]
        if 4 + 2 * slot + 2 > size:
            return 0
        offset = struct.unpack_from("<H", self.buf, self.vtable + 4 + 2 * slot)[0]
        return self.pos + offset if offset else 0

    def scalar(self, slot: int, fmt: str, default: int) -> int:
        at = self._slot(slot)
        return struct.unpack_from(fmt, self.buf, at)[0] if at else default

    def _target(self, slot: int) -> int:
        at = self._slot(slot)
        return at + struct.unpack_from("<I", self.buf, at)[0]

    def table(self, slot: int) -> _Table:
        return _Table(self.buf, self._target(slot))


def _message_table(meta: bytes) -> _Table:
    return _Table(meta, struct.unpack_from("<I", meta, 0)[0])


def _body_length(meta: bytes) -> int:
    return _message_table(meta).scalar(3, "<q", 0)


def _batch_fields(data: bytes, message: int = 1):
    """(metadata start, the RecordBatch table) of the stream's ``message``-th IPC message."""
    start, length, _ = messages(data)[message]
    table = _message_table(bytes(data[start:start + length])).table(2)
    return start, table


def with_rows(data: bytes, rows: int, message: int = 1) -> bytes:
    """The stream with its record batch's declared length (row count) set to ``rows``."""
    start, batch = _batch_fields(data, message)
    at = batch._slot(0)
    out = bytearray(data)
    struct.pack_into("<q", out, start + at, rows)
    return bytes(out)


def with_node(data: bytes, node: int, length: int | None = None, null_count: int | None = None,
              message: int = 1) -> bytes:
    """The stream with field node ``node`` of its record batch saying other values."""
    start, batch = _batch_fields(data, message)
    at = batch._target(1) + 4 + 16 * node
    out = bytearray(data)
    old_length, old_nulls = struct.unpack_from("<qq", out, start + at)
    struct.pack_into("<qq", out, start + at, old_length if length is None else length,
                     old_nulls if null_count is None else null_count)
    return bytes(out)


def body_of(data: bytes, message: int = 1) -> tuple[int, int]:
    """(start, length) of the ``message``-th IPC message's body within the stream."""
    start, length, body = messages(data)[message]
    return start + length, body


def bomb(rows: int = 1, size: int = 256 * 1024 * 1024) -> bytes:
    """A ZSTD-compressed bulk body whose one row inflates to ``size`` bytes of zeros (issue 24: 8.5 KB on
    the wire for 256 MiB)."""
    import pyarrow as pa

    body = pa.array([b"\0" * size] + [b""] * (rows - 1), pa.binary())
    batch = pa.RecordBatch.from_arrays([body], names=["body"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


# -- mutated bodies ------------------------------------------------------------------------------------------

#: values an adversary writes over an offset, a length or a count
EDGES = (0, 1, 7, 8, 255, 2**31 - 256, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, -1, -8, -2**31, -2**63)


def seed_bodies() -> list[bytes]:
    """Valid bulk bodies covering every bulk column type, the mutations' starting points."""
    import pyarrow as pa

    n = 5
    full = pa.RecordBatch.from_pydict({
        "body": pa.array([b"alpha", b"", b"\x00\xff", None, b"omega"]),
        "timestamp": pa.array([1, None, 3, 4, 5], pa.int64()),
        "expires": pa.array([0, 0, None, 0, 9_999_999_999_999], pa.int64()),
        "priority": pa.array([0, 9, None, 4, 5], pa.int8()),
        "delivery_mode": pa.array([1, 2, None, 2, 1], pa.int32()),
        "body_type": pa.array(["text", "bytes", None, "map", "bytes"]),
        "group": pa.array(["g", None, "g", "h", None]),
        "correlation_id": pa.array([None, "c", None, None, "é"]),
        "type": pa.array(["t"] * n),
        "reply_to": pa.array(["/queue/r", None, "/topic/t", None, "/temp-queue/x"]),
        "properties": pa.array([[("a", "1")], [], None, [("b", "2"), ("c", "3")], [("d", "")]],
                               pa.map_(pa.string(), pa.string())),
        "property_types": pa.array(["a=i", None, None, "b=i,c=f", None]),
        "dedup_id": pa.array(["d1", "d2", None, "d4", "d5"]),
    })
    text = pa.RecordBatch.from_pydict({"body": pa.array(["x" * 40, "yé", "", "z"], pa.string())})
    large = pa.RecordBatch.from_pydict({"body": pa.array([b"abc", b"de"], pa.large_binary()),
                                        "group": pa.array(["a", "b"])})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, full.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_batch(full)
    return [stream(full), stream(text), stream(large), sink.getvalue().to_pybytes()]


def mutate(data: bytes, rng) -> bytes:
    """One random mutation of ``data``: a bit flip, an edge value over an aligned int32 or int64, a cut,
    a raised row count or field node, bytes duplicated or removed."""
    out = bytearray(data)
    kind = rng.randrange(10)
    if kind >= 8:
        # a byte of the record batch's body (values, offsets, bitmaps) rather than of the framing: what a
        # corrupted buffer looks like, and often still valid Arrow (so the rows go on to be delivered)
        try:
            start, length = body_of(data)
        except Exception:
            return bytes(out)
        if 0 < length and start + length <= len(out):
            out[start + rng.randrange(length)] = rng.randrange(256)
        return bytes(out)
    if kind == 0 and out:
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    elif kind in (1, 2) and len(out) >= 8:
        width = 4 if kind == 1 else 8
        i = rng.randrange(0, len(out) - width + 1, width)
        value = rng.choice(EDGES)
        struct.pack_into("<i" if width == 4 else "<q", out, i, max(min(value, 2**(8 * width - 1) - 1),
                                                                    -2**(8 * width - 1)))
    elif kind == 3:
        del out[rng.randrange(len(out) + 1):]
    elif kind == 4:
        try:
            return with_rows(data, rng.choice(EDGES + (rng.randrange(2, 10**6),)))
        except (AssertionError, IndexError, struct.error, Exception):
            return bytes(out)
    elif kind == 5:
        try:
            node = rng.randrange(6)
            return with_node(data, node, length=rng.choice((None,) + EDGES), null_count=rng.choice((None,) + EDGES))
        except Exception:
            return bytes(out)
    elif kind == 6 and out:
        i = rng.randrange(len(out))
        out[i:i] = out[i:i + rng.randrange(1, 64)]
    elif out:
        i = rng.randrange(len(out))
        del out[i:i + rng.randrange(1, 16)]
    return bytes(out)


def with_buffer(data: bytes, index: int, offset: int | None = None, length: int | None = None,
                message: int = 1) -> bytes:
    """The stream with buffer ``index`` of its record batch at another (offset, length) of the body."""
    start, batch = _batch_fields(data, message)
    at = batch._target(2) + 4 + 16 * index
    out = bytearray(data)
    old_offset, old_length = struct.unpack_from("<qq", out, start + at)
    struct.pack_into("<qq", out, start + at, old_offset if offset is None else offset,
                     old_length if length is None else length)
    return bytes(out)
