"""Arrow message batches on the broker side (spec/spark.md §5–§8), without a broker: segments sealed from
messages, bulk batches checked and completed column-wise, rows materialized back into messages."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import pyarrow as pa
import pytest
from pymq_server.broker import bulk_rows, segments, slices
from pymq_server.broker.message import BrokerMessage, message_from_request
from pymq_server.broker.requests import parse_send

from pymq.errors import InvalidHeader, MessageFormatError


def sent(seq: int, body: bytes = b"x", **headers) -> BrokerMessage:
    h = {"content-type": "text/plain;charset=utf-8", **{k.replace("_", "-"): v for k, v in headers.items()}}
    request = parse_send({"destination": "/topic/t", **{k: v for k, v in h.items() if v is not None}}, body)
    return message_from_request(request, key=seq + 1000, message_id=f"ID:n-{seq + 1000}", seq=seq,
                                destination="/topic/t", now=1_700_000_000_000)


def ipc(batch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def test_a_sealed_segment_holds_what_the_messages_hold_and_materializes_back():
    messages = [sent(10, b"a", JMSXGroupID="g", correlation_id="c", reply_to="/queue/r", type="k",
                     pymq_types="n=i", n="3", region="eu", pymq_dedup_id="d1", priority="7", expires="5"),
                sent(11, b"\xff", content_type="application/octet-stream", persistent="false"),
                sent(13, b"{}", content_type="application/x-pymq-map+json")]
    batch = segments.from_messages(messages)
    assert batch.schema == segments.LOG_SCHEMA
    seg = segments.Segment(batch, messages)
    assert (len(seg), seg.first, seg.last, seg.index(12), seg.index(13), seg.index(99)) == (3, 10, 13, 2, 2, 3)
    rows = batch.to_pylist()
    assert [r["body_type"] for r in rows] == ["text", "bytes", "map"]
    assert rows[0]["properties"] == [("n", "3"), ("region", "eu")]
    assert (rows[0]["group"], rows[0]["property_types"], rows[0]["dedup_id"], rows[0]["priority"]) == \
        ("g", "n=i", "d1", 7)
    assert (rows[1]["delivery_mode"], rows[0]["expires"], rows[0]["timestamp"]) == (1, 5, 1_700_000_000_000)
    back = segments.materialize(batch, "/topic/t", [m.key for m in messages], BrokerMessage)
    for original, again in zip(messages, back):
        assert again.frame_headers() == original.frame_headers()
        assert (again.body, again.persistent, again.priority, again.expires, again.key) == \
            (original.body, original.persistent, original.priority, original.expires, original.key)
        assert again.selector_values() == original.selector_values()


def test_a_bulk_batch_is_completed_column_wise():
    rows = pa.RecordBatch.from_pydict({
        "body": pa.array(["a", "b", "c"], pa.string()),
        "priority": pa.array([None, 9, 0], pa.int8()),
        "body_type": pa.array(["text", None, "map"]),
        "properties": pa.array([[("k", "v")], None, []], pa.map_(pa.string(), pa.string())),
        "expires": pa.array([None, 7, 0], pa.int64()),
    })
    batch = bulk_rows.read_bulk(ipc(rows))
    done = bulk_rows.complete_bulk(batch, first_seq=100, first_key=5, node_id="n1", now=1000, persistent=True,
                                  priority=4, ttl=50)
    assert done.schema == segments.LOG_SCHEMA
    got = done.to_pylist()
    assert [r["seq"] for r in got] == [100, 101, 102]
    assert [r["message_id"] for r in got] == ["ID:n1-5", "ID:n1-6", "ID:n1-7"]
    assert [r["priority"] for r in got] == [4, 9, 0]
    assert [r["expires"] for r in got] == [1050, 7, 0]            # a null takes the destination's TTL
    assert [r["timestamp"] for r in got] == [1000] * 3
    assert [r["body_type"] for r in got] == ["text", "bytes", "map"]
    assert [r["content_type"] for r in got] == ["text/plain;charset=utf-8", "application/octet-stream",
                                                "application/x-pymq-map+json"]
    assert [r["body"] for r in got] == [b"a", b"b", b"c"] and [r["delivery_mode"] for r in got] == [2] * 3
    [m] = segments.materialize(done, "/queue/q", [5], BrokerMessage, 0, 1)
    assert m.headers["k"] == "v" and m.message_id == "ID:n1-5" and m.seq == 100 and m.expires == 1050


@pytest.mark.parametrize("columns, text", [
    ({"value": pa.array([b"x"])}, "column 'value' has no meaning"),
    ({"body": pa.array([b"x"]), "seq": pa.array([1])}, "column 'seq' has no meaning"),
    ({"priority": pa.array([1], pa.int32())}, "needs a 'body' column"),
    ({"body": pa.array([1.5])}, "column 'body' must be of Arrow type"),
    ({"body": pa.array([b"x", b"y"]), "priority": pa.array([1, 10], pa.int32())}, "row 1, column 'priority'"),
    ({"body": pa.array([b"x", b"y"]), "delivery_mode": pa.array([2, 0], pa.int32())}, "row 1, column 'delivery_mode'"),
    ({"body": pa.array([b"x"]), "expires": pa.array([-1])}, "row 0, column 'expires'"),
    ({"body": pa.array([b"x"]), "body_type": pa.array(["json"])}, "row 0, column 'body_type'"),
    ({"body": pa.array([b"x"]), "reply_to": pa.array(["replies"])}, "row 0, column 'reply_to'"),
    ({"body": pa.array([b"x", b"y"]), "properties": pa.array([[("a", "1")], [("b", "1"), ("priority", "2")]],
                                                              pa.map_(pa.string(), pa.string()))},
     "row 1, column 'properties': 'priority'"),
    ({"body": pa.array([b"x"]), "properties": pa.array([[("a,b", "1")]], pa.map_(pa.string(), pa.string()))},
     "row 0, column 'properties'"),
    ({"body": pa.array([b"x"]), "property_types": pa.array(["n=q"])}, "row 0, column 'property_types'"),
    ({"body": pa.array([b"x"]), "correlation_id": pa.array(["a\nb"])}, "line break"),
])
def test_a_bad_bulk_batch_is_refused_precisely(columns, text):
    with pytest.raises(MessageFormatError, match=text):
        bulk_rows.read_bulk(ipc(pa.RecordBatch.from_pydict(columns)))


def test_not_arrow_and_too_many_rows():
    with pytest.raises(MessageFormatError, match="not an Arrow IPC stream"):
        bulk_rows.read_bulk(b"definitely not arrow")
    with pytest.raises(MessageFormatError, match="at most 2 rows"):
        bulk_rows.read_bulk(ipc(pa.RecordBatch.from_pydict({"body": pa.array([b"1", b"2", b"3"])})), max_rows=2)


def test_ipc_stream_of_slices_and_expiry():
    batch = segments.from_messages([sent(i, str(i).encode(), expires=str(5 if i == 2 else 0)) for i in range(5)])
    data = segments.ipc_stream(segments.LOG_SCHEMA, [batch.slice(1, 2), batch.slice(4, 1)])
    reader = pa.ipc.open_stream(data)
    assert [b.column("seq").to_pylist() for b in reader] == [[1, 2], [4]]
    assert bulk_rows.unexpired(batch, 4) is batch
    assert bulk_rows.unexpired(batch, 5).column("seq").to_pylist() == [0, 1, 3, 4]
    stored = segments.read_ipc(segments.ipc_stream(segments.LOG_SCHEMA, [batch]))
    assert stored.equals(batch)


def test_a_range_answer_is_views_of_the_segment_not_a_copy():
    """The pieces of an Arrow answer (what the link writes to the socket) hold the segment's body bytes as
    views of its own buffer (no copy in the broker), and joined they are the one IPC stream of the rows."""
    batch = segments.from_messages([sent(i, bytes([65 + i % 26]) * 1000) for i in range(100)])
    bodies = batch.column(8).buffers()[2]
    pieces = segments.ipc_pieces(segments.LOG_SCHEMA, [batch.slice(10, 50), batch.slice(70, 5)])
    assert pieces.size == sum(p.size if isinstance(p, pa.Buffer) else len(p) for p in pieces)
    inside = [p for p in pieces if isinstance(p, pa.Buffer)
              and bodies.address <= p.address and p.address + p.size <= bodies.address + bodies.size]
    assert [p.address - bodies.address for p in inside] == [10 * 1000, 70 * 1000]   # the slices' bodies
    assert sum(p.size for p in inside) >= 55 * 1000
    got = list(pa.ipc.open_stream(pieces.join()))
    assert [b.column("seq").to_pylist() for b in got] == [list(range(10, 60)), list(range(70, 75))]
    assert got[0].column("body").to_pylist() == batch.slice(10, 50).column("body").to_pylist()
    empty = segments.ipc_pieces(segments.LOG_SCHEMA, [])
    assert list(pa.ipc.open_stream(empty.join())) == [] and empty.size == len(empty.join())


def test_both_read_paths_give_the_same_rows():
    """The connector reads a range either as MESSAGE frames (the decoder) or as an Arrow batch (the wire
    form): the same messages must give the same Spark rows either way."""
    from pyspark_pymq._arrow import WIRE_FIELDS, check_wire_schema, wire_to_read
    from pyspark_pymq._decode import IMPLEMENTATIONS
    assert [(f.name, f.type) for f in segments.LOG_SCHEMA] == WIRE_FIELDS
    check_wire_schema(segments.LOG_SCHEMA)
    messages = [sent(10, "héllo".encode(), JMSXGroupID="g", correlation_id="c", reply_to="/queue/r", type="k",
                     pymq_types="n=i", n="3", region="eu", priority="7", expires="1800000000000"),
                sent(11, b"\xff", content_type="application/octet-stream", persistent="false"),
                sent(12, b"plain", content_type=None), sent(13, b"\xfe", content_type=None),
                sent(14, b"{}", content_type="application/x-pymq-map+json", reply_to="nowhere")]
    for m in messages:
        if m.headers.get("content-type") is None:
            m.headers.pop("content-type", None)
    frames = [({"subscription": "s1", "browser": "true", **m.frame_headers()}, m.body) for m in messages]
    arrow = wire_to_read(segments.from_messages(messages), "/topic/t", "topic", True)
    for impl in IMPLEMENTATIONS.values():
        decoded = impl.frames_to_batch(frames, "/topic/t", "topic", True)
        assert decoded.schema == arrow.schema
        for name in decoded.schema.names:
            assert decoded.column(name).equals(arrow.column(name)), name
    with pytest.raises(MessageFormatError, match="not a pymq message batch"):
        check_wire_schema(pa.schema([("seq", pa.int64())]))


def test_the_collector_is_paused_while_bulk_rows_are_placed_and_restored_after():
    import gc
    assert gc.isenabled()
    with bulk_rows.collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(MessageFormatError), bulk_rows.collector_paused():
        raise MessageFormatError("a refused row")             # a placement rule refusing mid-frame
    assert gc.isenabled()
    gc.disable()                                              # someone else paused it: left paused
    try:
        with bulk_rows.collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


# -- the shortcut of select (nothing skipped) agrees with the row-by-row rules ----------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

NOW = 1_700_000_000_000


@st.composite
def _segment_reads(draw):
    n = draw(st.integers(1, 30))
    expiring = draw(st.booleans())
    rows = []
    seq = draw(st.integers(1, 5))
    stamp = NOW - 10_000
    for _ in range(n):
        seq += draw(st.integers(1, 3))                 # gaps allowed
        stamp += draw(st.integers(-50, 100))           # producers' stamps, not always in order
        expires = draw(st.sampled_from([0, NOW - 1, NOW, NOW + 1, NOW + 5000])) if expiring else 0
        rows.append((seq, stamp, expires, b"b" * draw(st.integers(0, 12))))
    start = draw(st.integers(0, n - 1))
    stop = draw(st.integers(start + 1, n))
    want = draw(st.none() | st.integers(0, n + 1))
    budget = draw(st.none() | st.integers(-3, 200))
    from_ts = draw(st.none() | st.integers(NOW - 10_100, NOW - 9_000))
    return rows, start, stop, want, budget, from_ts, draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(_segment_reads())
def test_select_answers_as_the_row_by_row_rules_do(read):
    rows, start, stop, want, budget, from_ts, first = read
    batch = segments.from_messages([
        message_from_request(parse_send({"destination": "/topic/t", "timestamp": str(stamp), "expires": str(exp)},
                                        body), key=seq, message_id=f"ID:n-{seq}", seq=seq, destination="/topic/t",
                             now=NOW)
        for seq, stamp, exp, body in rows])
    seg = segments.Segment(batch)
    got = slices.select(seg, start, stop, want, budget, from_ts, NOW, first)
    reference = slices._select_filtered(seg, batch.slice(start, stop - start), start, stop - start, want, budget,
                                          from_ts, NOW, first)
    assert got[1:] == reference[1:]
    assert (got[0] is None) == (reference[0] is None)
    if got[0] is not None:
        assert got[0].column(0).to_pylist() == reference[0].column(0).to_pylist()


def test_a_segment_that_never_expires_is_read_without_looking_at_its_rows(monkeypatch):
    seg = segments.Segment(segments.from_messages([sent(i, b"x" * 10) for i in range(1, 101)]))
    assert seg.first_expiry() is None

    def no_pass(*args, **kwargs):
        raise AssertionError("a compute pass over the rows")
    monkeypatch.setattr(slices, "_select_filtered", no_pass)
    piece, kept, size, examined, full = slices.select(seg, 10, 100, 50, 95, None, NOW, False)
    # 95 bytes reach the budget on the 10th row (which is still kept): rows 11..20
    assert (kept, size, examined, full, piece.column(0).to_pylist()) == (10, 100, 20, False, list(range(11, 21)))


def test_pymq_columns_names_columns_of_the_message_batch():
    assert segments.parse_columns("body, seq,seq") == ("seq", "body")        # §5's order, once each
    assert segments.LOG_COLUMNS == tuple(segments.LOG_SCHEMA.names)
    schema, positions = segments.projected(("seq", "body"))
    assert schema.names == ["seq", "body"] and positions == [0, 8]
    assert segments.projected(None) == (segments.LOG_SCHEMA, None)
    for bad in ("seq,bodies", "", "seq,"):
        with pytest.raises(InvalidHeader) as err:
            segments.parse_columns(bad)
        assert err.value.header == "pymq-columns"
