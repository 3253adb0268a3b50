"""JMS: after ``recover()`` / ``rollback()`` the redelivered messages come first, in their original order
(also inside a message group), before what the consumer had already prefetched — in both SDKs, over
stomp:// and vm://.  Messages prefetched but never given to the application are not returned, so they
are not marked redelivered and their delivery count does not grow.

Also the acknowledgement rules of listeners (the client core's ledger): a CLIENT_ACKNOWLEDGE listener that
calls ``message.acknowledge()`` acknowledges the message it is handling, and ``recover()``/``commit()``
inside a listener include it; closing a consumer forgets its unacknowledged deliveries, so a later
``acknowledge()``/``rollback()`` does not name messages the broker already took back.
"""
from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

import pymq
import pymq.aio
from pymq_server.embedded import stop_embedded
from tests.conftest import wait_for


@pytest.fixture(params=["stomp", "vm"])
def url(request, broker):
    if request.param == "stomp":
        yield broker.url
        return
    name = f"order-{uuid.uuid4().hex[:8]}"
    yield f"vm://{name}"
    stop_embedded(name)


def _queue() -> pymq.Queue:
    return pymq.Queue(f"order-{uuid.uuid4().hex[:8]}")


def _send(conn: pymq.Connection, queue: pymq.Queue, count: int, group: str | None = None) -> None:
    producer = conn.create_session().create_producer(queue)
    for i in range(count):
        message = pymq.TextMessage(f"n{i}")
        if group is not None:
            message.group_id = group
        producer.send(message)


def _texts(messages: list[pymq.Message]) -> list[tuple[str, bool]]:
    return [(m.text, m.redelivered) for m in messages if isinstance(m, pymq.TextMessage)]


EXPECTED = [("n0", True), ("n1", True), ("n2", False), ("n3", False), ("n4", False)]


@pytest.mark.parametrize("group", [None, "g1"])
@pytest.mark.parametrize("how", ["recover", "rollback"])
def test_blocking_redelivered_messages_come_first_in_order(url, how, group):
    with pymq.connect(url) as conn:
        queue = _queue()
        _send(conn, queue, 5, group)
        session = conn.create_session(transacted=how == "rollback", ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(queue)
        first = [consumer.receive(5), consumer.receive(5)]
        assert _texts([m for m in first if m]) == [("n0", False), ("n1", False)]
        assert wait_for(lambda: consumer.buffered == 3)          # n2..n4 prefetched locally
        session.recover() if how == "recover" else session.rollback()
        again = [consumer.receive(5) for _ in range(5)]
        assert _texts([m for m in again if m]) == EXPECTED
        assert [m.delivery_count for m in again if m] == [2, 2, 1, 1, 1]
        assert consumer.receive(0.2) is None                     # nothing twice
        session.acknowledge() if how == "recover" else session.commit()


@pytest.mark.parametrize("group", [None, "g1"])
@pytest.mark.parametrize("how", ["recover", "rollback"])
def test_aio_redelivered_messages_come_first_in_order(url, how, group):
    async def main() -> None:
        async with pymq.aio.connect(url) as conn:
            queue = _queue()
            producer = conn.create_session().create_producer(queue)
            for i in range(5):
                message = pymq.TextMessage(f"n{i}")
                if group is not None:
                    message.group_id = group
                await producer.send(message)
            session = conn.create_session(transacted=how == "rollback", ack_mode=pymq.CLIENT_ACKNOWLEDGE)
            consumer = await session.create_consumer(queue)
            assert _texts([m for m in [await consumer.receive(5), await consumer.receive(5)] if m]) == \
                [("n0", False), ("n1", False)]
            for _ in range(200):
                if consumer.buffered == 3:
                    break
                await asyncio.sleep(0.01)
            assert consumer.buffered == 3
            await (session.recover() if how == "recover" else session.rollback())
            again = [await consumer.receive(5) for _ in range(5)]
            assert _texts([m for m in again if m]) == EXPECTED
            assert [m.delivery_count for m in again if m] == [2, 2, 1, 1, 1]
            assert await consumer.receive(0.2) is None
            await (session.acknowledge() if how == "recover" else session.commit())
    asyncio.run(main())


def test_twice_recovered_messages_keep_their_order(url):
    with pymq.connect(url) as conn:
        queue = _queue()
        _send(conn, queue, 4)
        session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(queue)
        assert [m.text for m in (consumer.receive(5), consumer.receive(5)) if isinstance(m, pymq.TextMessage)] \
            == ["n0", "n1"]
        session.recover()
        assert [m.text for m in (consumer.receive(5),) if isinstance(m, pymq.TextMessage)] == ["n0"]
        session.recover()                       # n0 again (third delivery), then n1, n2, n3
        got = [consumer.receive(5) for _ in range(4)]
        assert [(m.text, m.delivery_count) for m in got if isinstance(m, pymq.TextMessage)] == \
            [("n0", 3), ("n1", 2), ("n2", 1), ("n3", 1)]
        session.acknowledge()


def test_listener_acknowledge_covers_the_message_it_handles(url):
    """CLIENT_ACKNOWLEDGE: message.acknowledge() inside the listener acknowledges that message too (it
    was recorded only after the listener returned, so it stayed unacknowledged and came back)."""
    queue = _queue()
    with pymq.connect(url) as conn:
        _send(conn, queue, 1)
        session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        got: list[str] = []

        def on_message(message: pymq.Message) -> None:
            message.acknowledge()
            got.append(message.text if isinstance(message, pymq.TextMessage) else "?")

        session.create_consumer(queue).set_message_listener(on_message)
        assert wait_for(lambda: got == ["n0"])
    with pymq.connect(url) as conn:
        assert conn.create_session().create_consumer(queue).receive(0.5) is None


def test_recover_inside_a_listener_redelivers_the_current_message(url):
    queue = _queue()
    with pymq.connect(url) as conn:
        _send(conn, queue, 2)
        session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        seen: list[tuple[str, bool]] = []
        done = threading.Event()

        def on_message(message: pymq.Message) -> None:
            assert isinstance(message, pymq.TextMessage)
            seen.append((message.text, message.redelivered))
            if len(seen) == 1:
                session.recover()               # the message in hand comes back first
            elif len(seen) == 3:
                message.acknowledge()
                done.set()

        session.create_consumer(queue).set_message_listener(on_message)
        assert done.wait(10), seen
        assert seen == [("n0", False), ("n0", True), ("n1", False)]


def test_commit_inside_a_transacted_listener_includes_the_current_message(url):
    queue = _queue()
    with pymq.connect(url) as conn:
        _send(conn, queue, 1)
        session = conn.create_session(transacted=True)
        done = threading.Event()

        def on_message(message: pymq.Message) -> None:
            session.commit()
            done.set()

        session.create_consumer(queue).set_message_listener(on_message)
        assert done.wait(10)
    with pymq.connect(url) as conn:
        assert conn.create_session().create_consumer(queue).receive(0.5) is None


@pytest.mark.parametrize("how", ["acknowledge", "rollback"])
def test_a_closed_consumers_deliveries_are_forgotten(url, how):
    """After a consumer closes, the broker has taken its unacknowledged messages back: acknowledging or
    rolling back must not name them (the broker would answer with an ERROR and close the connection)."""
    with pymq.connect(url) as conn:
        queue, other = _queue(), _queue()
        _send(conn, queue, 1)
        _send(conn, other, 1)
        session = conn.create_session(transacted=how == "rollback", ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        first = session.create_consumer(queue)
        assert first.receive(5) is not None
        second = session.create_consumer(other)
        assert second.receive(5) is not None
        first.close()                           # its message goes back to the queue, redelivered later
        session.acknowledge() if how == "acknowledge" else session.rollback()
        assert not conn.closed and conn.error is None
        again = session.create_consumer(queue).receive(5)
        assert isinstance(again, pymq.TextMessage) and again.text == "n0" and again.redelivered
        session.acknowledge() if how == "acknowledge" else session.commit()
