"""A bulk SEND to a queue is one stored record and one bulk block (spec/spark.md §7.1, spec/storage.md §11).

The rows wait in the queue's backlog as one run and become messages as consumers take them; each row is
still settled on its own (ACK, NACK and redelivery, dead letters, expiry, purge), the record goes with the
last row, and a restart — clean or kill -9 — brings back exactly the rows not settled, with their delivery
counts. Before this (landed main 7e300d3) the broker made and stored one message per row at the SEND.
"""
from __future__ import annotations

import pytest

import yaml

import pymq
from tests.arrow_rows import rows
from tests.conftest import RawStomp, wait_for

pa = pytest.importorskip("pyarrow")

ARROW = {"pymq-format": "arrow", "content-type": "application/vnd.apache.arrow.stream"}


def _queue(b, name):
    return b.call(lambda: b.broker.destinations.queue(name, create=False))


def _held(b):
    """(records the persistent device holds, block records in the catalog, messages the memory flow counts)."""
    def read():
        store = b.broker.store
        meta = [k for k, _ in store.iter_meta() if k.startswith("rows:")]
        return store.persistent_device.status().messages, meta, b.broker.flow.held_messages
    return b.call(read)


def test_a_queue_bulk_send_is_one_record_and_one_block_until_its_last_row_goes(broker_factory):
    b = broker_factory()
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        receipt = s.send_arrow("/queue/blk", rows(500))
        first = int(receipt["pymq-first-seq"])
        q = _queue(b, "blk")
        assert b.call(lambda: (q.depth, q.backlog.count, q.ready.count, [r[0] for r in q.backlog.runs])) == \
            (500, 500, 0, ["block"])
        records, meta, held = _held(b)
        assert (records, meta, held) == (1, [], 1)        # one record, one message object (the block's)
        c = s.create_consumer(pymq.Queue("blk"))
        got = [c.receive(5) for _ in range(500)]
        assert [m.text for m in got] == [f"r{i}" for i in range(500)]
        assert [m.sequence for m in got] == list(range(first, first + 500))
        assert len({m.message_id for m in got}) == 500 and all(m.persistent for m in got)
        assert c.receive(0.2) is None
    assert wait_for(lambda: _held(b) == (0, [], 0)), _held(b)
    assert b.call(lambda: (q.depth, q.stats.added, q.stats.acknowledged)) == (0, 500, 500)


def test_messages_sent_one_by_one_keep_their_place_around_a_block(broker_factory):
    b = broker_factory()
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        p = s.create_producer(pymq.Queue("order"))
        p.send("before")
        s.send_arrow("/queue/order", rows(300))
        p.send("after", delivery_mode=pymq.NON_PERSISTENT)
        s.send_arrow("/queue/order", rows(3, start=1000))
        p.send("last")
        c = s.create_consumer(pymq.Queue("order"))
        texts = [c.receive(5).text for _ in range(306)]
    assert texts == ["before", *[f"r{i}" for i in range(300)], "after", "r1000", "r1001", "r1002", "last"]


def test_each_row_is_settled_alone_nack_dead_letter_and_expiry(broker_factory):
    b = broker_factory(queues={"rows": {"max_deliveries": 2}}, expiry_queue="expired")
    now = int(__import__("time").time() * 1000)
    raw = RawStomp(b.port)
    raw.connect()
    raw.send("SEND", {"destination": "/queue/rows", "receipt": "r", **ARROW},
             rows(4, expires=pa.array([0, now - 1000, 0, 0], pa.int64())))
    assert raw.read(10).command == "RECEIPT"
    raw.send("SUBSCRIBE", {"destination": "/queue/rows", "id": "s", "ack": "client-individual",
                           "activemq.prefetchSize": "1"})
    first = raw.read(10)
    assert first.body == b"r0"
    raw.send("NACK", {"id": first.headers["ack"]})
    again = raw.read(10)                           # the same row again, counted
    assert again.body == b"r0" and again.headers.get("redelivered") == "true"
    raw.send("NACK", {"id": again.headers["ack"]})   # its second failure: to the dead-letter queue
    third = raw.read(10)
    assert third.body == b"r2"                     # r1 expired in the queue: never delivered
    raw.send("ACK", {"id": third.headers["ack"]})
    fourth = raw.read(10)
    assert fourth.body == b"r3"
    raw.send("ACK", {"id": fourth.headers["ack"], "receipt": "a"})
    assert raw.read(10).command == "RECEIPT"
    raw.close()
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        dead = s.create_consumer(pymq.Queue("DLQ.rows")).receive(5)
        assert dead.text == "r0" and dead.get_property("JMSXDeliveryCount") in (2, "2")
        assert s.create_consumer(pymq.Queue("expired")).receive(5).text == "r1"
    q = _queue(b, "rows")
    assert b.call(lambda: (q.depth, q.stats.dead_lettered, q.stats.expired)) == (0, 1, 1)
    # the block's record went with its last row; the copies in DLQ.rows and expired are their own messages
    assert wait_for(lambda: _held(b)[1] == [])


def test_browse_read_range_selectors_groups_and_purge_see_every_row(broker_factory):
    b = broker_factory()
    props = pa.map_(pa.string(), pa.string())
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        s.send_arrow("/queue/mix", rows(10, properties=pa.array([[("n", str(i))] for i in range(10)], props),
                                       property_types=pa.array(["n=i"] * 10),
                                       group=pa.array(["a", "b"] * 5)))
        whole = s.read_range(pymq.Queue("mix")).messages
        assert [m.text for m in whole] == [f"r{i}" for i in range(10)]
        first = whole[0].sequence
        part = s.read_range(pymq.Queue("mix"), from_seq=first + 3, to_seq=first + 6).messages
        assert [m.text for m in part] == ["r3", "r4", "r5"]
        table = pa.ipc.open_stream(s.read_range(pymq.Queue("mix"), from_seq=first + 8, arrow=True).arrow).read_all()
        assert table.column("body").to_pylist() == [b"r8", b"r9"]
        browsed = [m.text for m in s.create_browser(pymq.Queue("mix"))]
        assert browsed == [f"r{i}" for i in range(10)]
        high = s.create_consumer(pymq.Queue("mix"), selector="n >= 8")
        assert sorted(high.receive(5).text for _ in range(2)) == ["r8", "r9"]
        assert high.receive(0.2) is None
        high.close()
        one, two = s.create_consumer(pymq.Queue("mix")), s.create_consumer(pymq.Queue("mix"))
        by = {}
        for c in (one, two):
            while (m := c.receive(0.5)) is not None:
                by.setdefault(m.group_id, set()).add(id(c))
        assert set(by) == {"a", "b"} and all(len(owners) == 1 for owners in by.values())
        s.send_arrow("/queue/gone", rows(50))
    q = _queue(b, "gone")
    assert b.call(lambda: q.purge()) == 50
    assert b.call(lambda: q.depth) == 0
    assert wait_for(lambda: _held(b) == (0, [], 0)), _held(b)


def test_a_selector_finds_its_row_deep_in_a_block(broker_factory):
    # the queue makes rows ready a few hundred at a time; a consumer whose selector matches none of them
    # makes the queue look further (memory has room), as it would have found the row sent one by one
    b = broker_factory()
    props = pa.map_(pa.string(), pa.string())
    n = 5000
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        s.send_arrow("/queue/deep", rows(n, properties=pa.array([[("n", str(i))] for i in range(n)], props),
                                        property_types=pa.array(["n=i"] * n)))
        picky = s.create_consumer(pymq.Queue("deep"), selector="n = 4321")
        assert picky.receive(5).text == "r4321"
        picky.close()
        rest = s.create_consumer(pymq.Queue("deep"))
        texts = [rest.receive(5).text for _ in range(n - 1)]
        assert texts == [f"r{i}" for i in range(n) if i != 4321]
    assert wait_for(lambda: _held(b) == (0, [], 0)), _held(b)


def test_a_row_placed_again_on_its_own_keeps_the_figures_right(broker_factory):
    # a cluster's re-route places a queue's message object again (spec/cluster.md §5); a block's row so
    # placed is stored on its own and counted until its last entry goes, and the block still settles it
    b = broker_factory()
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        s.send_arrow("/queue/again", rows(3))

        def move():
            q = b.broker.destinations.queue("again", create=False)
            entries = q.backlog.take(q)
            q._admit(entries)
            b.broker.router.reroute(entries[0].message, None)
        b.call(move)
        assert _held(b)[2] == 2        # the block's record, and the row's own message
        c = s.create_consumer(pymq.Queue("again"))
        assert sorted(c.receive(5).text for _ in range(4)) == ["r0", "r0", "r1", "r2"]
    assert wait_for(lambda: _held(b) == (0, [], 0)), _held(b)


def test_memory_short_and_a_queue_without_backlog_still_take_blocks(broker_factory):
    # a last-value queue keeps everything in memory (no backlog): its rows are placed one by one
    b = broker_factory(queues={"lv": {"last_value_key": "k"}})
    props = pa.map_(pa.string(), pa.string())
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        s.send_arrow("/queue/lv", rows(4, properties=pa.array([[("k", "x")], [("k", "y")], [("k", "x")],
                                                                [("k", "y")]], props)))
        c = s.create_consumer(pymq.Queue("lv"))
        assert sorted(c.receive(5).text for _ in range(2)) == ["r2", "r3"]
        assert c.receive(0.2) is None
    assert wait_for(lambda: _held(b) == (0, [], 0)), _held(b)


def _config(tmp_path) -> str:
    path = tmp_path / "broker.yaml"
    path.write_text(yaml.safe_dump({"queues": {"blocks": {"max_deliveries": 5}}}))
    return str(path)


def _subscribe(port, prefetch="100"):
    client = RawStomp(port)
    assert client.connect().command == "CONNECTED"
    client.send("SUBSCRIBE", {"destination": "/queue/blocks", "id": "s", "ack": "client-individual",
                              "activemq.prefetchSize": prefetch})
    return client


@pytest.mark.parametrize("stop", ["kill -9", "clean"])
def test_a_restart_brings_back_exactly_the_rows_not_settled_with_their_counts(tmp_path, stop, broker_processes):
    data = tmp_path / "data"
    config = _config(tmp_path)
    bp = broker_processes(data, config=config)
    producer = RawStomp(bp.port)
    producer.connect()
    producer.send("SEND", {"destination": "/queue/blocks", "receipt": "r", **ARROW}, rows(100))
    assert producer.read(10).command == "RECEIPT"
    producer.send("SEND", {"destination": "/queue/blocks", "receipt": "r2", **ARROW},
                  rows(20, start=100, delivery_mode=pa.array([1, 2] * 10, pa.int32())))
    assert producer.read(10).command == "RECEIPT"
    producer.close()
    client = _subscribe(bp.port, prefetch="60")
    frames = [client.read(10) for _ in range(60)]
    assert [f.body for f in frames] == [f"r{i}".encode() for i in range(60)]
    # settle rows 0-29 and 45-49 (out of order); 30-44 and 50-59 stay out, delivered once
    for f in frames[:30] + frames[45:49]:
        client.send("ACK", {"id": f.headers["ack"]})
    client.send("ACK", {"id": frames[49].headers["ack"], "receipt": "done"})   # a receipt: all durable
    out = {int(f.body[1:]) for f in frames[30:45] + frames[50:]}
    receipts = 0
    while True:                 # the RECEIPT, and the rows the credit the ACKs gave back brought
        try:
            frame = client.read(0.5 if receipts else 10)
        except TimeoutError:
            break
        if frame.command == "MESSAGE":
            out.add(int(frame.body[1:]))
        else:
            assert frame.command == "RECEIPT"
            receipts += 1
    assert receipts == 1 and len(out) == 60       # 25 still out, and 35 more
    other = RawStomp(bp.port)      # some other work that writes the log: what a busy broker does
    other.connect()
    other.send("SEND", {"destination": "/queue/elsewhere", "receipt": "w"}, b"w")
    assert other.read(10).command == "RECEIPT"
    other.close()
    if stop == "kill -9":
        bp.kill()
    else:
        client.close()
        assert bp.terminate() == 0
    client.close()
    bp = broker_processes(data, config=config)
    client = _subscribe(bp.port, prefetch="1000")
    expected = [*range(30, 45), *range(50, 100), *range(101, 120, 2)]      # the non-persistent rows are gone
    frames = [client.read(10) for _ in range(len(expected))]
    assert [f.body for f in frames] == [f"r{i}".encode() for i in expected]
    for f in frames:
        # after kill -9 every row may have been delivered (spec/ha.md §3.2): all come flagged; after a clean
        # stop the recorded counts are exact
        was_out = int(f.body[1:]) in out or stop == "kill -9"
        assert (f.headers.get("redelivered") == "true") == was_out, f.headers
        assert f.headers.get("JMSXDeliveryCount", "1") == ("2" if was_out else "1")
    with pytest.raises(TimeoutError):
        client.read(0.5)
    for f in frames:
        client.send("ACK", {"id": f.headers["ack"]})
    client.send("DISCONNECT", {"receipt": "bye"})
    client.read(10)
    client.close()
    assert bp.terminate() == 0
    bp = broker_processes(data, config=config)       # everything settled: nothing comes back
    client = _subscribe(bp.port)
    with pytest.raises(TimeoutError):
        client.read(1.0)
    client.close()
    assert bp.terminate() == 0


# -- a topic's subscriptions: one record, a block in each --------------------------------------------------

def _subscription(b, name):
    return b.call(lambda: b.broker.subscriptions.find(name).queue)


def test_a_topic_bulk_send_is_one_record_and_a_block_in_each_subscription(broker_factory):
    b = broker_factory()
    with pymq.connect(b.url, client_id="keep") as conn:
        s = conn.create_session()
        s.create_durable_subscriber(pymq.Topic("fan"), "d").close()      # durable, nobody connected
        live = s.create_consumer(pymq.Topic("fan"))                       # non-durable, live
        s.send_arrow("/topic/fan", rows(400))
        kept = _subscription(b, "sub:keep:d")
        assert b.call(lambda: (kept.depth, [r[0] for r in kept.backlog.runs])) == (400, ["block"])
        assert _held(b) == (1, [], 1)                                    # one record for both
        assert [live.receive(5).text for _ in range(400)] == [f"r{i}" for i in range(400)]
        assert _held(b)[0] == 1                                          # the durable one still owes it all
        durable = s.create_durable_subscriber(pymq.Topic("fan"), "d")
        assert [durable.receive(5).text for _ in range(400)] == [f"r{i}" for i in range(400)]
        assert durable.receive(0.2) is None and live.receive(0.2) is None
    assert wait_for(lambda: _held(b) == (0, [], 0)), _held(b)


def test_a_retained_topic_keeps_its_segment_after_the_subscribers_have_their_rows(broker_factory):
    b = broker_factory(retention={"/topic/*": {"ms": 3_600_000}})
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        live = s.create_consumer(pymq.Topic("kept"))
        s.send_arrow("/topic/kept", rows(50))
        assert [live.receive(5).text for _ in range(50)] == [f"r{i}" for i in range(50)]
        assert wait_for(lambda: _held(b) == (1, [], 1)), _held(b)          # the log still holds the record
        assert [m.text for m in s.read_range(pymq.Topic("kept")).messages] == [f"r{i}" for i in range(50)]


def test_selector_and_no_local_subscriptions_get_what_they_would_one_by_one(broker_factory):
    b = broker_factory()
    props = pa.map_(pa.string(), pa.string())
    body = rows(20, properties=pa.array([[("n", str(i))] for i in range(20)], props),
                property_types=pa.array(["n=i"] * 20))
    with pymq.connect(b.url) as conn, pymq.connect(b.url) as other:
        s, o = conn.create_session(), other.create_session()
        mine = s.create_consumer(pymq.Topic("sel"), no_local=True)       # the producer's own connection
        theirs = o.create_consumer(pymq.Topic("sel"))
        s.send_arrow("/topic/sel", body)
        assert [theirs.receive(5).text for _ in range(20)] == [f"r{i}" for i in range(20)]
        assert mine.receive(0.3) is None
        picky = o.create_consumer(pymq.Topic("sel"), selector="n >= 15")  # a selector: rows one by one
        s.send_arrow("/topic/sel", body)
        assert [picky.receive(5).text for _ in range(5)] == [f"r{i}" for i in range(15, 20)]
        assert picky.receive(0.2) is None
        assert len([theirs.receive(5) for _ in range(20)]) == 20
    assert wait_for(lambda: _held(b) == (0, [], 0)), _held(b)


def test_a_durable_subscription_comes_back_after_kill_9_with_exactly_its_unsettled_rows(tmp_path, broker_processes):
    data = tmp_path / "data"
    bp = broker_processes(data)
    with pymq.connect(bp.url, client_id="dur") as conn:
        s = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        sub = s.create_durable_subscriber(pymq.Topic("kill"), "k")
        s.send_arrow("/topic/kill", rows(200))
        got = [sub.receive(5) for _ in range(80)]
        got[-1].acknowledge()                          # client mode: what the session consumed, r0..r79
        got += [sub.receive(5) for _ in range(40)]     # r80..r119 out, not acknowledged
        assert [m.text for m in got] == [f"r{i}" for i in range(120)]
        s.create_producer(pymq.Queue("elsewhere")).send("w")   # its receipt's barrier: the ACK is durable
        bp.kill()
    bp = broker_processes(data)
    with pymq.connect(bp.url, client_id="dur") as conn:
        sub = conn.create_session().create_durable_subscriber(pymq.Topic("kill"), "k")
        back = [sub.receive(5) for _ in range(120)]
        assert [m.text for m in back] == [f"r{i}" for i in range(80, 200)]
        assert all(m.redelivered for m in back[:40])  # (later ones too if the prefetch had them out)
        assert sub.receive(0.5) is None
    assert bp.terminate() == 0


def test_an_arrow_range_of_a_queue_slices_its_blocks_and_agrees_with_the_per_message_read(broker_factory):
    # an Arrow range read takes a block's waiting rows as slices of its rows (no message made), with the
    # per-message read's rules: the same rows, the same next sequence number, for every limit
    import time as _time
    b = broker_factory()
    now = int(_time.time() * 1000)
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        p = s.create_producer(pymq.Queue("ranged"))
        p.send("a")
        s.send_arrow("/queue/ranged", rows(30))
        p.send("b")
        s.send_arrow("/queue/ranged", rows(20, start=100, expires=pa.array([now - 1000 if i % 7 == 3 else 0
                                                                           for i in range(20)], pa.int64())))
        p.send("c")
        whole = s.read_range(pymq.Queue("ranged")).messages
        first = whole[0].sequence
        for lo, hi, count, size in [(None, None, None, None), (first + 5, None, None, None),
                                    (first, first + 40, 7, None), (first + 2, None, None, 500),
                                    (first + 31, None, 12, None), (first + 40, None, 3, 1),
                                    (first + 33, first + 45, None, None), (first + 60, None, None, None)]:
            per = s.read_range(pymq.Queue("ranged"), from_seq=lo, to_seq=hi, max_messages=count, max_bytes=size)
            arrow = s.read_range(pymq.Queue("ranged"), from_seq=lo, to_seq=hi, max_messages=count, max_bytes=size,
                                 arrow=True)
            table = pa.ipc.open_stream(arrow.arrow).read_all()
            assert table.column("seq").to_pylist() == [m.sequence for m in per.messages], (lo, hi, count, size)
            assert table.column("body").to_pylist() == [m.body if isinstance(m.body, bytes) else m.text.encode()
                                                        for m in per.messages]
            assert arrow.next_seq == per.next_seq, (lo, hi, count, size)
        assert len(whole) == 3 + 30 + 20 - 3                              # three rows expired
