"""Bulk SENDs and Arrow range reads against a real broker (spec/spark.md §6–§8): rows appended as a unit,
refused as a unit, seen by STOMP consumers as ordinary messages, kept across a restart, trimmed by
retention; and a connector that falls back per message when the broker has no Arrow."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import pyarrow as pa
import pytest

import pymq
from pymq.destination import as_destination
from pymq.errors import MessageFormatError, PymqError, QueueFull
from pyspark_pymq._options import ReadOptions, WriteOptions
from pyspark_pymq.source import BatchReader, read_partition
from tests.arrow_rows import ipc, rows
from tests.conftest import RawStomp

pytestmark = pytest.mark.spark


def arrow_seqs(session, dest, **kw) -> list[int]:
    r = session.read_range(dest, arrow=True, **kw)
    assert r.arrow is not None
    return pa.ipc.open_stream(r.arrow).read_all().column("seq").to_pylist()


@pytest.fixture
def retained(broker_factory):
    return broker_factory(retention={"/topic/*": {"ms": 3_600_000}, "/queue/log.*": {"ms": 3_600_000}})


def test_a_bulk_send_is_one_block_of_sequence_numbers(retained):
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        p = s.create_producer(pymq.Topic("t"))
        p.send("before")
        receipt = s.send_arrow("/topic/t", rows(5))
        p.send("after")
        first = int(receipt["pymq-first-seq"])
        assert (receipt["pymq-count"], receipt["pymq-duplicates"]) == ("5", "0")
        # per message and in Arrow, the same order: the block is contiguous
        per_message = s.read_range(pymq.Topic("t")).messages
        assert [m.text for m in per_message] == ["before", "r0", "r1", "r2", "r3", "r4", "after"]
        assert [m.sequence for m in per_message[1:6]] == list(range(first, first + 5))
        assert arrow_seqs(s, pymq.Topic("t")) == [m.sequence for m in per_message]
        # a bulk row is an ordinary message: message id, persistence, priority, typed properties
        m = per_message[1]
        assert m.message_id and m.persistent and m.priority == 4 and isinstance(m, pymq.TextMessage)


def test_duplicates_are_dropped_per_row_and_counted(retained):
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        first = s.send_arrow("/topic/d", rows(3, dedup_id=pa.array(["a", "b", None])))
        again = s.send_arrow("/topic/d", rows(3, start=10, dedup_id=pa.array(["b", "c", "a"])))
        assert (first["pymq-count"], again["pymq-count"], again["pymq-duplicates"]) == ("3", "1", "2")
        assert [m.text for m in s.read_range(pymq.Topic("d")).messages] == ["r0", "r1", "r2", "r11"]


def test_a_bad_frame_is_refused_whole_with_its_row_and_column(retained):
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        with pytest.raises(MessageFormatError, match="row 2, column 'priority'"):
            s.send_arrow("/topic/bad", rows(3, priority=pa.array([1, 2, 12], pa.int32())))
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        assert s.read_range(pymq.Topic("bad")).messages == []          # nothing was appended
        with pytest.raises(PymqError, match="not an Arrow IPC stream"):
            s.send_arrow("/topic/bad", b"garbage")


def test_not_inside_a_transaction(retained):
    raw = RawStomp(retained.port)
    raw.connect()
    raw.send("BEGIN", {"transaction": "tx1"})
    raw.send("SEND", {"destination": "/topic/tx", "transaction": "tx1", "pymq-format": "arrow",
                      "content-type": "application/vnd.apache.arrow.stream"}, rows(1))
    error = raw.read()
    assert error.command == "ERROR" and "cannot be part of a transaction" in error.headers["message"]
    with pymq.connect(retained.url) as conn, pytest.raises(PymqError, match="not transacted"):
        conn.create_session(transacted=True).send_arrow("/topic/tx", rows(1))


def test_stomp_consumers_get_ordinary_messages(retained):
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        topic_consumer = s.create_consumer(pymq.Topic("live"))
        queue_consumer = s.create_consumer(pymq.Queue("work"))
        s.send_arrow("/topic/live", rows(3, group=pa.array(["g", None, "g"])))
        s.send_arrow("/queue/work", rows(2))
        got = [topic_consumer.receive(5) for _ in range(3)]
        assert [m.text for m in got] == ["r0", "r1", "r2"] and got[0].group_id == "g"
        assert [queue_consumer.receive(5).text for _ in range(2)] == ["r0", "r1"]
        # the topic's log holds the same messages for readers
        assert [m.text for m in s.read_range(pymq.Topic("live")).messages] == ["r0", "r1", "r2"]


def test_a_queue_refuses_rows_past_its_depth(broker_factory):
    b = broker_factory(queues={"small": {"max_depth": 3, "overflow": "reject"}})
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        s.send_arrow("/queue/small", rows(2))
        with pytest.raises(QueueFull, match="2 rows were refused|rows were refused"):
            s.send_arrow("/queue/small", rows(2, start=5))
    with pymq.connect(b.url) as conn:
        assert [m.text for m in conn.create_session().read_range(pymq.Queue("small")).messages] == ["r0", "r1"]


def test_bulk_rows_survive_a_restart_and_retention_trims_them(broker_factory, tmp_path):
    settings = {"data_dir": str(tmp_path / "kept"), "retention": {"/topic/*": {"messages": 4}}}
    b = broker_factory(**settings)
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        s.send_arrow("/topic/k", rows(3, delivery_mode=pa.array([2, 1, 2], pa.int32())))
    b.stop()
    b = broker_factory(**settings)
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        # the persistent rows come back (the non-persistent one does not, as for messages sent one by one)
        assert [m.text for m in s.read_range(pymq.Topic("k")).messages] == ["r0", "r2"]
        s.send_arrow("/topic/k", rows(4, start=10))
        seqs = arrow_seqs(s, pymq.Topic("k"))
        assert len(seqs) == 6
        b.call(lambda: b.broker.housekeeping())
        assert [m.text for m in s.read_range(pymq.Topic("k")).messages] == ["r10", "r11", "r12", "r13"]
        s.send_arrow("/topic/k", rows(1, start=20))
    b.stop()
    b = broker_factory(**settings)
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        b.call(lambda: b.broker.housekeeping())
        assert [m.text for m in s.read_range(pymq.Topic("k")).messages] == ["r11", "r12", "r13", "r20"]


def test_arrow_reads_with_a_selector_and_from_a_queue(retained):
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        s.send_arrow("/topic/sel", rows(4, properties=pa.array([[("n", str(i))] for i in range(4)],
                                                                 pa.map_(pa.string(), pa.string())),
                                        property_types=pa.array(["n=i"] * 4)))
        assert len(arrow_seqs(s, pymq.Topic("sel"), selector="n >= 2")) == 2
        p = s.create_producer(pymq.Queue("plain"))
        for i in range(3):
            p.send(f"q{i}")
        r = s.read_range(pymq.Queue("plain"), arrow=True, max_messages=2)
        table = pa.ipc.open_stream(r.arrow).read_all()
        assert table.column("body").to_pylist() == [b"q0", b"q1"] and r.next_seq == table.column("seq")[1].as_py() + 1


def test_the_connector_falls_back_per_message_when_the_broker_has_no_arrow(retained, monkeypatch):
    from pymq_server.broker import segments
    monkeypatch.setattr(segments, "available", lambda: False)
    monkeypatch.setattr(segments, "pa", None)
    url = retained.url
    from pyspark_pymq.sink import _send
    batch = pa.RecordBatch.from_pydict({"value": pa.array(["a", "b", "c"])})
    sent = _send(WriteOptions.parse({"url": url, "topic": "fallback"}), iter([batch]), None, 0)
    assert sent.count == 3
    with pymq.connect(url) as conn:
        r = conn.create_session().read_range(pymq.Topic("fallback"), arrow=True)
        assert r.arrow is None and len(r.messages) == 3               # answered per message
    opts = ReadOptions.parse({"url": url, "topic": "fallback"}, streaming=False)
    got = [v for p in BatchReader(opts).partitions() for b in read_partition(p) for v in b.column("value").to_pylist()]
    assert got == [b"a", b"b", b"c"]


def test_a_queue_schema_is_checked_for_every_row_before_any_is_placed(broker_factory):
    b = broker_factory(queues={"typed": {"schema": {"amount": {"type": "float", "required": True}}}})
    props = pa.map_(pa.string(), pa.string())
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        s.send_arrow("/queue/typed", rows(2, properties=pa.array([[("amount", "1.5")], [("amount", "2")]], props)))
        with pytest.raises(PymqError, match="row 1"):
            s.send_arrow("/queue/typed", rows(2, start=5, properties=pa.array([[("amount", "3")], []], props)))
    with pymq.connect(b.url) as conn:
        assert [m.text for m in conn.create_session().read_range(pymq.Queue("typed")).messages] == ["r0", "r1"]


def test_a_refused_bulk_send_creates_nothing(broker_factory, tmp_path):
    # no permission, or rows the broker does not take: an ERROR naming why, and no queue or topic by use
    from pymq.errors import AccessDenied
    from pymq_server.broker.auth import save_user
    users = str(tmp_path / "users.yaml")
    save_user(users, "bob", "bobpw", [])
    save_user(users, "root", "rootpw", ["admin"])
    broker = broker_factory(users_file=users, default_permissions={"role:admin": ["produce", "consume", "browse"]})
    with pymq.connect(broker.url, username="bob", password="bobpw") as conn:
        with pytest.raises(AccessDenied, match="produce"):
            conn.create_session().send_arrow("/queue/bulk.denied", rows(2))
    with pymq.connect(broker.url, username="root", password="rootpw") as conn:
        with pytest.raises(MessageFormatError, match="column 'nonsense'"):
            conn.create_session().send_arrow("/topic/bulk.bad", rows(2, nonsense=pa.array([1, 2])))
    names = broker.call(lambda: (set(broker.broker.queues), set(broker.broker.topics)))
    assert not any(n.startswith("bulk.") for group in names for n in group), names


def test_the_sink_keeps_a_bulk_send_in_flight_and_rows_stay_in_order(broker_factory, monkeypatch):
    """Many small frames (one bulk SEND in flight while the next is built): every row arrives once, in
    row order; a frame the broker refuses fails the task with its error, the frames before it placed."""
    from pyspark_pymq import sink
    monkeypatch.setattr(sink, "BULK_FRAME_BYTES", 200)              # a frame every batch or two
    assert sink.BULK_FRAMES_IN_FLIGHT >= 2
    b = broker_factory(queues={"ordered": {}, "capped": {"max_depth": 25, "overflow": "reject"}})
    batches = [pa.RecordBatch.from_pydict({"value": pa.array([f"v{i:03d}" for i in range(k, k + 10)])})
               for k in range(0, 100, 10)]
    sent = sink._send(WriteOptions.parse({"url": b.url, "queue": "ordered"}), iter(batches), None, 0)
    assert sent.count == 100
    with pymq.connect(b.url) as conn:
        got = conn.create_session().read_range(pymq.Queue("ordered")).messages
    assert [m.text for m in got] == [f"v{i:03d}" for i in range(100)]
    with pytest.raises(QueueFull, match="rows were refused"):
        sink._send(WriteOptions.parse({"url": b.url, "queue": "capped"}), iter(batches), None, 0)
    with pymq.connect(b.url) as conn:
        kept = [m.text for m in conn.create_session().read_range(pymq.Queue("capped")).messages]
    assert kept == [f"v{i:03d}" for i in range(len(kept))] and 0 < len(kept) <= 25     # a prefix, in order


def test_an_arrow_read_carries_the_columns_it_names_and_nothing_else(retained):
    from pymq.client.blocking import start_range
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        s.send_arrow("/topic/cols", rows(3))
        s.create_producer(pymq.Topic("cols")).send("tail")           # the open tail, built for the read
        whole = pa.ipc.open_stream(s.read_range(pymq.Topic("cols"), arrow=True).arrow).read_all()
        for source in ("log", "queue"):
            if source == "queue":                                     # a queue's answer is built per read
                for text in ("a", "b"):
                    s.create_producer(pymq.Queue("cols")).send(text)
            dest = pymq.Topic("cols") if source == "log" else pymq.Queue("cols")
            r = start_range(s, dest, arrow=True, frames=True, columns=["body", "seq", "group"]).result()
            table = pa.ipc.open_stream(r.arrow).read_all()
            assert table.schema.names == ["seq", "body", "group"]        # spec/spark.md §5's order
            if source == "log":
                assert table.to_pydict() == whole.select(["seq", "body", "group"]).to_pydict()
            else:
                assert table.column("body").to_pylist() == [b"a", b"b"]
        # a name that is no column: ERROR naming the header, and the connection is closed
        with pytest.raises(PymqError, match="pymq-columns"):
            start_range(s, pymq.Topic("cols"), arrow=True, frames=True, columns=["seq", "size"]).result()


def test_the_connector_reads_the_same_rows_with_fewer_columns(retained):
    """A read asks only for the columns of its schema; what Spark gets is the same as from every column
    (the test fails if a projected answer is refused or mapped to the wrong columns)."""
    from pyspark_pymq import _arrow
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        s.send_arrow("/topic/proj", rows(5, group=pa.array(["g", None, "h", "g", None]),
                                         reply_to=pa.array(["/queue/r", None, None, None, None]),
                                         correlation_id=pa.array(["c", None, None, None, "d"]),
                                         properties=pa.array([[("n", "1")]] * 5, pa.map_(pa.string(), pa.string()))))
        whole = pa.ipc.open_stream(s.read_range(pymq.Topic("proj"), arrow=True).arrow).read_next_batch()
    for include in (False, True):
        reader = BatchReader(ReadOptions.parse({"url": retained.url, "topic": "proj",
                                                "includeProperties": str(include).lower()}, streaming=False))
        [part] = reader.partitions()
        got = pa.Table.from_batches(list(read_partition(part)))
        expected = _arrow.wire_to_read(whole, "/topic/proj", "topic", include)
        assert got.to_pydict() == pa.Table.from_batches([expected]).to_pydict()
        assert got.column("key").to_pylist() == [b"g", None, b"h", b"g", None]


def test_a_binary_value_column_is_sent_without_body_types_and_still_makes_bytes_messages(retained):
    from pyspark_pymq._bulk import rows_to_bulk
    batch = pa.RecordBatch.from_pydict({"value": pa.array([b"\x00\xff", b"b"], pa.binary())})
    [(dest, bulk)] = rows_to_bulk(batch, "/topic/bytes", {"delivery_mode": 2, "priority": 4, "time_to_live": 0},
                                  0, None, 1_700_000_000_000)
    assert "body_type" not in bulk.schema.names          # a column of "bytes" says what a missing one says
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, bulk.schema) as w:
        w.write_batch(bulk)
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        s.send_arrow(dest, sink.getvalue().to_pybytes())
        messages = s.read_range(pymq.Topic("bytes")).messages
        table = pa.ipc.open_stream(s.read_range(pymq.Topic("bytes"), arrow=True).arrow).read_all()
    assert [type(m) for m in messages] == [pymq.BytesMessage, pymq.BytesMessage]
    assert [m.body for m in messages] == [b"\x00\xff", b"b"]
    assert table.column("body_type").to_pylist() == ["bytes", "bytes"]
    assert table.column("content_type").to_pylist() == ["application/octet-stream"] * 2


@pytest.mark.parametrize("dest", ["/topic/bytes", "/queue/bytes", "/queue/log.bytes"])
def test_an_arrow_answer_says_its_body_bytes(retained, dest):
    """``pymq-bytes`` on an Arrow range answer is the body bytes of the rows it carries, whatever columns were
    asked for (spec/spark.md §6): a log's sealed segment and open tail, a queue's bulk block and messages,
    and a limit that stops inside them; what the JVM source's split by bytes plans with."""
    from pymq.client.blocking import start_range
    bodies = [b"x" * (10 + i) for i in range(7)]
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        s.send_arrow(dest, ipc(body=pa.array(bodies, pa.binary())))
        p = s.create_producer(as_destination(dest))
        for b in bodies:
            p.send(pymq.BytesMessage(b))
        everything = s.read_range(dest)
        sizes = {m.sequence: len(m.data if isinstance(m, pymq.BytesMessage) else m.text.encode())
                 for m in everything.messages}

        def answer(**kw):
            pending = start_range(s, dest, arrow=True, columns=["seq"], **kw)
            r = pending.result()
            got = pa.ipc.open_stream(r.arrow).read_all().column("seq").to_pylist() if r.arrow else []
            return got, int(pending._browse.end["pymq-bytes"])

        seqs, size = answer(from_seq=0)
        assert seqs == sorted(sizes) and size == sum(sizes.values())
        seqs, size = answer(from_seq=0, max_bytes=40)               # stops after the row crossing 40 bytes
        assert size == sum(sizes[q] for q in seqs) and size >= 40 and size - sizes[seqs[-1]] < 40
        tail = sorted(sizes)[5:11]
        seqs, size = answer(from_seq=tail[0], to_seq=tail[-1] + 1)  # from inside the block into the messages
        assert seqs == tail and size == sum(sizes[q] for q in tail)

