"""A queue's ``max_depth`` at its exact edge (spec/placement.md rule 4; issue 31): the message that finds the
queue exactly full drops the oldest (``drop-oldest``) and the one that fills it pauses its producer
(``block``) — not one message later."""
from __future__ import annotations

import pymq
from tests.conftest import RawStomp, wait_for


def _send(c: RawStomp, destination: str, body: bytes, receipt: str) -> None:
    c.send("SEND", {"destination": destination, "receipt": receipt}, body)
    assert c.read(10).command == "RECEIPT"


def test_drop_oldest_drops_when_the_queue_is_exactly_full(broker_factory):
    b = broker_factory(queues={"edge": {"max_depth": 3, "overflow": "drop-oldest"}})
    c = RawStomp(b.port)
    assert c.connect().command == "CONNECTED"
    for i in range(1, 5):
        _send(c, "/queue/edge", b"m%d" % i, f"r{i}")
    q = b.call(lambda: b.broker.queues["edge"])
    assert b.call(lambda: (q.depth, q.stats.dropped)) == (3, 1)
    with pymq.connect(b.url) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue("edge"))
        assert [consumer.receive(5).text for _ in range(3)] == ["m2", "m3", "m4"]


def test_block_pauses_the_producer_that_fills_the_queue(broker_factory):
    b = broker_factory(queues={"full": {"max_depth": 2, "overflow": "block"}})
    c = RawStomp(b.port)
    assert c.connect().command == "CONNECTED"
    _send(c, "/queue/full", b"a", "r1")
    assert b.call(lambda: b.broker.queues["full"].upkeep.blocked) == set()
    _send(c, "/queue/full", b"b", "r2")                  # depth 2 of 2: this producer waits now
    q = b.call(lambda: b.broker.queues["full"])
    assert b.call(lambda: len(q.upkeep.blocked)) == 1
    with pymq.connect(b.url) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue("full"))
        assert consumer.receive(5).text == "a"
        assert wait_for(lambda: b.call(lambda: len(q.upkeep.blocked)) == 0)
