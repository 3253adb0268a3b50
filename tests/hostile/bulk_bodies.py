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
