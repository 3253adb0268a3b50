"""The delivery side of bulk rows defends itself too (issue 24, defence in depth): a row of a queue's bulk
block that cannot be made into a message — every row passed the bulk SEND's checks, so this is a fault
those checks did not foresee, injected here — is moved to the dead-letter queue with the reason; the
consumer is not closed, the other rows are delivered, the queue drains.  On the landed main every
consumer got ``internal broker error`` and was closed, again and again: a poisoned queue."""
from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

import pymq
from pymq_server.broker import segments
from tests.arrow_rows import ipc


@pytest.fixture
def unreadable_poison_rows(monkeypatch):
    """Rows whose body is ``poison`` cannot be made into messages (a fault injected into the broker)."""
    real = segments.materialize

    def materialize(batch, destination, keys, make, start=0, stop=None):
        part = batch.slice(start, (batch.num_rows if stop is None else stop) - start)
        if b"poison" in part.column("body").to_pylist():
            raise ValueError("this row cannot be read (injected)")
        return real(batch, destination, keys, make, start, stop)

    monkeypatch.setattr(segments, "materialize", materialize)


def test_a_row_that_cannot_become_a_message_is_dead_lettered_with_why(broker, unreadable_poison_rows):
    with pymq.connect(broker.url, timeout=20) as conn:
        s = conn.create_session()
        receipt = s.send_arrow("/queue/rows", ipc(body=pa.array([b"a", b"poison", b"c"]),
                                                 body_type=pa.array(["text"] * 3)), timeout=20)
        assert receipt["pymq-count"] == "3"
        # a browse shows the row's stand-in and says why (nothing is hidden from an operator)
        browsed = list(s.create_browser(pymq.Queue("rows")))
        assert [m.properties.get("pymq-unreadable-row") is not None for m in browsed] == [False, True, False]
        consumer = s.create_consumer(pymq.Queue("rows"))
        got = [consumer.receive(timeout=20) for _ in range(2)]
        assert [m.text for m in got] == ["a", "c"]
        dead = s.create_consumer(pymq.Queue("DLQ.rows")).receive(timeout=20)
        assert dead is not None
        reason = dead.properties["pymq-dead-letter-reason"]
        assert reason.startswith("the bulk row could not be made into a message") and "injected" in reason
        # the consumer was not closed, and the queue is empty
        s.create_producer(pymq.Queue("rows")).send("after")
        assert consumer.receive(timeout=20).text == "after"
        assert int(conn.queue_manager().metrics("rows")["depth"]) == 0
