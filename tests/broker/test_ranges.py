"""Replayable ranges, retention, cumulative ack up to a sequence number, duplicate detection (§9)."""
from __future__ import annotations

import time
import uuid

import pytest

import pymq
from pymq.errors import PymqError
from tests.conftest import wait_for


def _name():
    return uuid.uuid4().hex[:8]


@pytest.fixture
def retained(broker_factory):
    return broker_factory(retention={"/topic/log.*": {"ms": 60_000}, "/queue/kept.*": {"messages": 5}})


def test_topic_log_replays_ranges_without_subscribers(retained):
    topic = pymq.Topic(f"log.{_name()}")
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        p = s.create_producer(topic)
        for i in range(10):
            p.send(f"m{i}")
        everything = s.read_range(topic)
        seqs = [m.sequence for m in everything.messages]
        assert [m.text for m in everything.messages] == [f"m{i}" for i in range(10)]
        assert seqs == sorted(seqs) and everything.earliest == seqs[0] and everything.latest == seqs[-1]
        assert everything.next_seq == seqs[-1] + 1
        # a bounded read and its continuation give the same messages, once each
        first = s.read_range(topic, from_seq=seqs[0], max_messages=4)
        second = s.read_range(topic, from_seq=first.next_seq, to_seq=seqs[8])
        assert [m.text for m in first.messages] == ["m0", "m1", "m2", "m3"]
        assert [m.text for m in second.messages] == ["m4", "m5", "m6", "m7"]
        assert second.next_seq == seqs[8]
        # reading never removes: the same range again
        assert [m.text for m in s.read_range(topic, from_seq=seqs[2], to_seq=seqs[4]).messages] == ["m2", "m3"]
        # past the end: nothing, and the continuation point does not run ahead of what exists
        tail = s.read_range(topic, from_seq=seqs[-1] + 1)
        assert tail.messages == [] and tail.next_seq == seqs[-1] + 1
        p.send("late")
        assert [m.text for m in s.read_range(topic, from_seq=tail.next_seq).messages] == ["late"]


def test_selector_and_byte_limits_on_ranges(retained):
    topic = pymq.Topic(f"log.{_name()}")
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        p = s.create_producer(topic)
        for i in range(6):
            p.send(pymq.BytesMessage(b"x" * 100, properties={"n": i}))
        odd = s.read_range(topic, selector="n IN (1, 3, 5)")
        assert [m.properties["n"] for m in odd.messages] == [1, 3, 5]
        some = s.read_range(topic, max_bytes=250)
        assert len(some.messages) == 3          # stops once 250 bytes were sent
        bounds = s.bounds(topic)
        assert bounds == (odd.earliest, odd.latest)


def test_from_timestamp(retained):
    topic = pymq.Topic(f"log.{_name()}")
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        p = s.create_producer(topic)
        p.send("old")
        stamped = int(time.time() * 1000)                 # "old" carries this millisecond or an earlier one
        assert wait_for(lambda: int(time.time() * 1000) > stamped)
        cut = int(time.time() * 1000)
        p.send("new")
        assert [m.text for m in s.read_range(topic, from_timestamp=cut).messages] == ["new"]


def test_retention_by_count_trims_the_log_but_not_the_queue(retained):
    queue = pymq.Queue(f"kept.{_name()}")
    with pymq.connect(retained.url) as conn:
        s = conn.create_session()
        p = s.create_producer(queue)
        for i in range(8):
            p.send(str(i))
        retained.call(retained.broker.housekeeping)
        log = s.read_range(queue)
        assert [m.text for m in log.messages] == ["3", "4", "5", "6", "7"]
        c = s.create_consumer(queue)
        assert [c.receive(5).text for _ in range(8)] == [str(i) for i in range(8)]
        # consumed from the queue, still replayable from its log
        assert [m.text for m in s.read_range(queue).messages] == ["3", "4", "5", "6", "7"]


def test_queue_range_without_retention_reads_waiting_messages(broker):
    queue = pymq.Queue(_name())
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        p = s.create_producer(queue)
        for i in range(5):
            p.send(str(i), priority=9 if i == 3 else 4)
        r = s.read_range(queue)
        assert [m.text for m in r.messages] == ["0", "1", "2", "3", "4"]      # sequence order
        s.ack_upto(queue, r.messages[3].sequence)
        assert [m.text for m in s.read_range(queue).messages] == ["3", "4"]
        assert s.bounds(queue)[0] == r.messages[3].sequence


def test_durable_subscription_read_by_range_and_acked_up_to(broker):
    topic = pymq.Topic(_name())
    with pymq.connect(broker.url, client_id="spark-query") as conn:
        s = conn.create_session()
        assert s.read_range(topic, subscription="q1").messages == []    # creates the subscription
        p = s.create_producer(topic)
        for i in range(4):
            p.send(str(i))
        batch = s.read_range(topic, subscription="q1", max_messages=2)
        assert [m.text for m in batch.messages] == ["0", "1"]
        s.ack_upto(topic, batch.next_seq, subscription="q1")
        rest = s.read_range(topic, subscription="q1")
        assert [m.text for m in rest.messages] == ["2", "3"]


def test_range_survives_restart(broker_factory, tmp_path):
    data = str(tmp_path / "d")
    cfg = dict(data_dir=data, retention={"/topic/*": {"ms": 60_000}})
    b1 = broker_factory(**cfg)
    with pymq.connect(b1.url) as conn:
        s = conn.create_session()
        p = s.create_producer(pymq.Topic("events"))
        for i in range(3):
            p.send(f"e{i}")
        p.send("volatile", delivery_mode=pymq.NON_PERSISTENT)
        before = s.read_range(pymq.Topic("events"))
    b1.stop()
    b2 = broker_factory(**cfg)
    with pymq.connect(b2.url) as conn:
        after = conn.create_session().read_range(pymq.Topic("events"))
    assert [m.text for m in after.messages] == ["e0", "e1", "e2"]
    assert [m.sequence for m in after.messages] == [m.sequence for m in before.messages[:3]]


def test_duplicate_detection(broker):
    queue = pymq.Queue(_name())
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        p = s.create_producer(queue)
        for attempt in range(3):
            m = pymq.TextMessage("pay 10")
            m.dedup_id = "payment-42"
            p.send(m)
        other = pymq.TextMessage("pay 20")
        other.dedup_id = "payment-43"
        p.send(other)
        c = s.create_consumer(queue)
        assert [c.receive(5).text, c.receive(5).text] == ["pay 10", "pay 20"]
        assert c.receive(0.3) is None
    assert broker.call(lambda: broker.broker.duplicates) == 2


def test_bad_range_headers(broker):
    from tests.conftest import RawStomp
    c = RawStomp(broker.port)
    c.connect()
    c.send("SUBSCRIBE", {"destination": "/queue/x", "id": "1", "browser": "true", "pymq-from-seq": "-4"})
    err = c.read_until_closed()[-1]
    assert err.headers["pymq-code"] == "invalid-header" and "pymq-from-seq" in err.headers["message"]


def test_subscription_ranges_ignore_the_topic_log(broker_factory):
    """A reader that owns a durable subscription reads and acknowledges that subscription, even on a
    topic that also keeps a retained log (reported by the Spark connector's author)."""
    b = broker_factory(retention={"/topic/*": {"ms": 600000}})
    t = pymq.Topic("orders")
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        s.read_range(t, subscription="q")            # creates the subscription
        p = s.create_producer(t)
        for i in range(4):
            p.send(f"m{i}")
        first = s.read_range(t, subscription="q").messages
        s.ack_upto(t, first[2].sequence, subscription="q")
        assert [m.text for m in s.read_range(t, subscription="q").messages] == ["m2", "m3"]
        assert s.bounds(t, subscription="q")[0] == first[2].sequence
        assert [m.text for m in s.read_range(t).messages] == ["m0", "m1", "m2", "m3"]   # the log is intact


def test_source_queue_reads_the_live_queue_not_its_log(broker_factory):
    b = broker_factory(retention={"/queue/kept.*": {"ms": 600000}})
    q = pymq.Queue("kept.orders")
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        p = s.create_producer(q)
        for i in range(4):
            p.send(f"m{i}")
        live = s.read_range(q, source="queue").messages
        s.ack_upto(q, live[2].sequence)
        assert [m.text for m in s.read_range(q, source="queue").messages] == ["m2", "m3"]
        assert [m.text for m in s.read_range(q).messages] == ["m0", "m1", "m2", "m3"]    # the log
        with pytest.raises(pymq.PymqError, match="pymq-source"):
            s.read_range(q, source="disk")
