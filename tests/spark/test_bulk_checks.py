"""The column checks of a bulk SEND (bulk_rows._check_bulk) and its completion, against a plain reference.

The checks decide on a whole column at once (min/max for the integer bounds, one search of the value bytes
for line breaks) and search row by row only a column that fails; these tests hold them to the answer a
comparison and a regular expression per row give, on random and hostile columns: sliced batches (the
value bytes of rows outside the slice must not count), nulls over bytes that hold a line break, bounds
at their edges, and the rows where message ids gain a digit.
"""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymq_server.broker import bulk_rows

from pymq.errors import MessageFormatError

BOUNDS = {"priority": (0, 9), "delivery_mode": (1, 2)}
TEXT = ("group", "correlation_id", "type", "dedup_id")


def reference(batch) -> tuple[str, int] | None:
    """(column, first bad row) by a comparison or a regular expression per row, in _check_bulk's order."""
    for name, (low, high) in BOUNDS.items():
        if name in batch.schema.names:
            for row, value in enumerate(batch.column(name).to_pylist()):
                if value is not None and not low <= value <= high:
                    return name, row
    for name in TEXT:
        if name in batch.schema.names:
            for row, value in enumerate(batch.column(name).to_pylist()):
                if value is not None and ("\n" in value or "\r" in value):
                    return name, row
    return None


def checked(batch) -> tuple[str, int] | None:
    try:
        bulk_rows._check_bulk(batch)
    except MessageFormatError as exc:
        return exc.column, exc.row  # type: ignore[attr-defined]
    return None


texts = st.one_of(st.none(), st.text(alphabet="ab\r\n,=", max_size=4))


@st.composite
def batches(draw):
    n = draw(st.integers(0, 12))
    columns = {"body": pa.array([b"x"] * n)}
    for name in draw(st.sets(st.sampled_from(sorted(BOUNDS)))):
        columns[name] = pa.array(draw(st.lists(st.one_of(st.none(), st.integers(-2, 11)), min_size=n, max_size=n)),
                                 pa.int32())
    for name in draw(st.sets(st.sampled_from(TEXT))):
        columns[name] = pa.array(draw(st.lists(texts, min_size=n, max_size=n)), pa.string())
    batch = pa.RecordBatch.from_pydict(columns)
    start = draw(st.integers(0, n))
    return batch.slice(start, draw(st.integers(0, n - start)))


@settings(max_examples=300, deadline=None)
@given(batches())
def test_the_column_checks_answer_as_a_check_per_row_does(batch):
    assert checked(batch) == reference(batch)


def test_rows_outside_a_slice_do_not_count_and_a_null_hides_its_bytes():
    batch = pa.RecordBatch.from_pydict({"body": pa.array([b"x"] * 4),
                                        "group": pa.array(["a\nb", "ok", "fine", "c\rd"]),
                                        "priority": pa.array([12, 4, 5, -1], pa.int32())})
    assert checked(batch.slice(1, 2)) is None
    assert checked(batch.slice(1, 3)) == ("priority", 2)
    assert checked(batch.slice(0, 2).drop_columns(["priority"])) == ("group", 0)
    # a null row whose value bytes (under the null) hold a line break: not a value, so not refused
    group = batch.column(1)
    masked = pa.Array.from_buffers(pa.string(), 4, [pa.array([False, True, True, False]).buffers()[1],
                                                    *group.buffers()[1:]])
    assert masked.to_pylist() == [None, "ok", "fine", None]
    assert checked(pa.RecordBatch.from_arrays([batch.column(0), masked], ["body", "group"])) is None


@pytest.mark.parametrize("low_high", [(0, 9), (1, 2)])
def test_bounds_are_inclusive(low_high):
    low, high = low_high
    name = "priority" if low_high == (0, 9) else "delivery_mode"
    edge = pa.RecordBatch.from_pydict({"body": pa.array([b"x", b"y"]), name: pa.array([low, high], pa.int32())})
    assert checked(edge) is None
    over = pa.RecordBatch.from_pydict({"body": pa.array([b"x", b"y"]), name: pa.array([low, high + 1], pa.int32())})
    assert checked(over) == (name, 1)


def test_ids_across_a_new_digit_and_the_content_type_without_a_body_type_column():
    batch = pa.RecordBatch.from_pydict({"body": pa.array([b"a", None, b"c", b"d"])})
    done = bulk_rows.complete_bulk(batch, first_seq=7, first_key=98, node_id="n-1", now=5, persistent=True,
                                   priority=4, ttl=0)
    assert done.column("message_id").to_pylist() == ["ID:n-1-98", "ID:n-1-99", "ID:n-1-100", "ID:n-1-101"]
    assert done.column("seq").to_pylist() == [7, 8, 9, 10]
    assert done.column("body_type").to_pylist() == ["bytes"] * 4
    assert done.column("content_type").to_pylist() == ["application/octet-stream"] * 4
    assert done.column("body").to_pylist() == [b"a", b"", b"c", b"d"]
    empty = bulk_rows.complete_bulk(batch.slice(0, 0), first_seq=1, first_key=1, node_id="n", now=5,
                                    persistent=True, priority=4, ttl=0)
    assert empty.num_rows == 0 and pc.sum(empty.column("seq")).as_py() is None


def test_columns_of_one_value_are_shared_between_frames_not_made_again(monkeypatch):
    """A default, all-null or 0..n-1 column is a slice of one shared column: two frames' segments point at
    the same buffer, hold the values a column of their own would, and are accounted by what they use."""
    def frame(n):
        return bulk_rows.complete_bulk(pa.RecordBatch.from_pydict({"body": pa.array([b"x"] * n)}), first_seq=1,
                                       first_key=1, node_id="n", now=5, persistent=True, priority=4, ttl=0)

    def address(batch, name):
        return batch.column(name).buffers()[-1].address

    a, b = frame(10), frame(3000)
    for name in ("content_type", "body_type", "priority", "delivery_mode", "group", "properties"):
        assert address(a, name) == address(b, name), name
    assert address(a, "seq") != address(b, "seq")               # numbered per frame
    assert b.column("content_type").to_pylist() == ["application/octet-stream"] * 3000
    assert b.column("priority").to_pylist() == [4] * 3000 and b.column("group").null_count == 3000
    assert b.column("seq").to_pylist() == list(range(1, 3001))
    assert a.nbytes < 5000                      # its ten rows, not the shared columns (98 KB and more)
    # a frame larger than the shared columns gets its own, with the same values
    monkeypatch.setattr(bulk_rows, "SHARED_ROWS", 100)
    big = frame(150)
    assert address(big, "content_type") != address(a, "content_type")
    assert big.column("content_type").to_pylist() == ["application/octet-stream"] * 150
    assert big.column("seq").to_pylist() == list(range(1, 151))
