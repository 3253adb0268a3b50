"""Bulk SEND bodies for tests: an Arrow IPC stream of rows (spec/spark.md §7)."""
from __future__ import annotations


def ipc(**columns) -> bytes:
    """One record batch of ``columns`` (name -> pyarrow array or list) as an IPC stream."""
    import pyarrow as pa

    batch = pa.RecordBatch.from_pydict(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def rows(n: int, start: int = 0, **extra) -> bytes:
    """``n`` text rows ``r<start>...`` with ``extra`` columns."""
    import pyarrow as pa

    return ipc(body=pa.array([f"r{i}".encode() for i in range(start, start + n)]),
               body_type=pa.array(["text"] * n), **extra)
