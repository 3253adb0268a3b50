"""A bulk SEND's body read by the broker (server/broker/bulk_stream.py, bulk_rows.read_bulk) from hostile
IPC streams, in process: each is refused with a MessageFormatError before pyarrow builds or inflates
anything from it, or accepted and then made into rows, messages and Arrow answers without any other
exception (issue 24).  tests/hostile/test_bulk_bodies.py sends the same bodies to real brokers."""
from __future__ import annotations

import random
import resource

import pytest

pa = pytest.importorskip("pyarrow")

from pymq.errors import MessageFormatError
from pymq_server.broker import bulk_rows, segments
from pymq_server.broker.message import BrokerMessage
from tests.hostile import bulk_bodies as bb


def _map_body() -> bytes:
    return bb.stream(pa.RecordBatch.from_pydict({
        "body": pa.array([b"ab", b"c"]),
        "properties": pa.array([[("k", "v")], []], pa.map_(pa.string(), pa.string()))}))


def _use(batch) -> int:
    """Everything the broker does with an accepted batch's rows; how many rows."""
    rows = bulk_rows.complete_bulk(batch, first_seq=1, first_key=1, node_id="n", now=5, persistent=True,
                                   priority=4, ttl=0)
    segments.materialize(rows, "/queue/q", range(1, rows.num_rows + 1), BrokerMessage)
    segment = segments.Segment(rows)
    segment.body_ends()
    segment.body_sizes()
    segment.first_expiry()
    segments.ipc_pieces(segments.LOG_SCHEMA, [rows]).join()
    return rows.num_rows


@pytest.mark.parametrize("case, body, text", [
    ("raised-row-count", lambda: bb.with_rows(bb.body_column([0, 1, 2, 3]), 1000), "3 values in a batch of 1000"),
    ("row-count-over-the-limit", lambda: bb.with_rows(bb.body_column([0, 1, 2, 3]), 2**62), "at most"),
    ("negative-row-count", lambda: bb.with_rows(bb.body_column([0, 1, 2, 3]), -1), "at most"),
    ("null-count-over-length", lambda: bb.with_node(bb.body_column([0, 1, 2, 3]), 0, null_count=4),
     "3 values of which 4 null"),
    ("node-length-huge", lambda: bb.with_node(bb.body_column([0, 1, 2, 3]), 0, length=2**62), "field node 0"),
    ("map-keys-with-nulls", lambda: bb.with_node(_map_body(), 3, null_count=1), "never null"),
    ("map-entries-with-nulls", lambda: bb.with_node(_map_body(), 2, null_count=1), "never null"),
    ("buffer-past-the-body", lambda: bb.with_buffer(bb.body_column([0, 1, 2, 3]), 2, length=4096), "outside"),
    ("buffer-at-a-negative-offset", lambda: bb.with_buffer(bb.body_column([0, 1, 2, 3]), 1, offset=-8),
     "outside"),
    ("zstd-bomb", lambda: bb.bomb(), "max_frame_size"),
    ("cut-short", lambda: bb.body_column([0, 1, 2, 3])[:-30], "not an Arrow IPC stream"),
    ("dictionary-column", lambda: bb.stream(pa.RecordBatch.from_pydict(
        {"body": pa.array([b"a"]), "group": pa.array(["g"]).dictionary_encode()})), "column 'group' must be"),
    ("nested-column", lambda: bb.stream(pa.RecordBatch.from_pydict(
        {"body": pa.array([b"a"]), "group": pa.array([["g"]])})), "column 'group' must be"),
])
def test_hostile_metadata_is_refused_before_pyarrow_reads_it(case, body, text):
    with pytest.raises(MessageFormatError, match=text):
        bulk_rows.read_bulk(body())


def test_a_bomb_is_refused_before_it_is_inflated():
    data = bb.bomb(size=512 * 1024 * 1024)
    assert len(data) < 64 * 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss          # KiB on Linux
    with pytest.raises(MessageFormatError, match="max_frame_size"):
        bulk_rows.read_bulk(data)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024
    # the same body within a larger limit is read (the check counts what the buffers declare)
    small = bb.bomb(size=1024 * 1024)
    with pytest.raises(MessageFormatError, match="max_frame_size"):
        bulk_rows.read_bulk(small, max_bytes=1024 * 1024)
    assert bulk_rows.read_bulk(small, max_bytes=2 * 1024 * 1024).column("body")[0].as_py() == b"\0" * 2**20


def test_compressed_bodies_within_the_limit_are_taken():
    for data in bb.seed_bodies():
        assert _use(bulk_rows.read_bulk(data)) > 0


def test_buffers_longer_than_their_values_are_valid_arrow_and_taken():
    # an offsets buffer one byte longer than n + 1 offsets: valid Arrow, and not a whole number of int32
    # (the broker's views of it raised TypeError: a generic internal error for the SEND)
    data = bb.with_buffer(bb.body_column([0, 1, 2, 3]), 1, length=17)
    batch = bulk_rows.read_bulk(data)
    assert batch.column("body").to_pylist() == [b"a", b"b", b"c"]
    assert _use(batch) == 3
    text = bb.stream(pa.RecordBatch.from_pydict({"body": pa.array([b"x"]), "group": pa.array(["g"])}))
    assert _use(bulk_rows.read_bulk(bb.with_buffer(text, 4, length=9))) == 1


def test_mutated_bodies_are_refused_or_used_whole():
    """Random mutations of valid bodies (bit flips, edge values over offsets and lengths, cuts, raised row
    counts and field nodes): a MessageFormatError, or rows the broker can use all the way; nothing else."""
    rng = random.Random(24)
    seeds = bb.seed_bodies()
    refused = accepted = 0
    for _ in range(1500):
        data = rng.choice(seeds)
        for _ in range(rng.randrange(1, 4)):
            data = bb.mutate(data, rng)
        try:
            batch = bulk_rows.read_bulk(data)
        except MessageFormatError:
            refused += 1
            continue
        _use(batch)
        accepted += 1
    assert refused and accepted


@pytest.mark.parametrize("column, value", [
    ("group", pa.array(["g\0"])), ("correlation_id", pa.array(["c\0"])), ("type", pa.array(["\0"])),
    ("dedup_id", pa.array(["d\0"])), ("reply_to", pa.array(["/queue/r\0"])),
    ("properties", pa.array([[("k", "v\0")]], pa.map_(pa.string(), pa.string()))),
    ("properties", pa.array([[("k\0", "v")]], pa.map_(pa.string(), pa.string()))),
])
def test_a_nul_in_a_column_that_becomes_a_header_is_refused(column, value):
    """A row's text columns become MESSAGE headers, and a STOMP header cannot carry NUL: such a row made
    every MESSAGE of it malformed (its consumers were closed, the queue poisoned)."""
    body = bb.stream(pa.RecordBatch.from_pydict({"body": pa.array([b"x"]), column: value}))
    with pytest.raises(MessageFormatError, match=f"column '{column}'.*NUL"):
        bulk_rows.read_bulk(body)
