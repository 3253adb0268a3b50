"""AUTO_ACKNOWLEDGE with coalesced acknowledgements (issue 30), against a real broker: a burst of messages
is acknowledged by few cumulative ACKs, a listener that raises still gets its message back (and only that
one), and a connection that dies while an ACK is held back gets back exactly what no ACK covered — never
an acknowledged message.  The ledger's rules frame by frame are in test_core.py."""
from __future__ import annotations

import threading
import uuid

import pytest

import pymq
import pymq.aio
from pymq.client import _core
from pymq_server.embedded import stop_embedded
from tests.conftest import wait_for


@pytest.fixture(params=["stomp", "vm"])
def url(request, broker):
    if request.param == "stomp":
        yield broker.url
        return
    name = f"autoack-{uuid.uuid4().hex[:8]}"
    yield f"vm://{name}"
    stop_embedded(name)


def _queue() -> pymq.Queue:
    return pymq.Queue(f"autoack-{uuid.uuid4().hex[:8]}")


def _send(conn: pymq.Connection, queue: pymq.Queue, count: int) -> None:
    producer = conn.create_session().create_producer(queue)
    for i in range(count):
        producer.send(pymq.TextMessage(f"n{i}"), delivery_mode=pymq.NON_PERSISTENT)


def _spy_acks(conn: pymq.Connection) -> list[dict[str, str]]:
    """The headers of every ACK/NACK the connection sends (``command`` added), in order."""
    sent: list[dict[str, str]] = []
    send_on = conn._send_on

    def spy(frame, link):
        if frame.command in ("ACK", "NACK"):
            sent.append({"command": frame.command, **frame.headers})
        return send_on(frame, link)

    conn._send_on = spy  # type: ignore[method-assign]
    return sent


def test_a_burst_is_acknowledged_by_few_cumulative_acks(url):
    queue = _queue()
    n = 300
    with pymq.connect(url) as conn:
        _send(conn, queue, n)
        acks = _spy_acks(conn)
        consumer = conn.create_session().create_consumer(queue)
        got = [consumer.receive(5) for _ in range(n)]
        assert [m.text for m in got] == [f"n{i}" for i in range(n)]
        assert not any(m.redelivered for m in got)
        assert 1 <= len(acks) < n // 4, len(acks)        # one per message before coalescing
    with pymq.connect(url) as conn:                      # all acknowledged: nothing comes back
        assert conn.create_session().create_consumer(queue).receive(0.3) is None


def test_a_listener_that_raises_gets_its_message_again_and_only_that_one(url):
    queue = _queue()
    n = 40
    with pymq.connect(url) as conn:
        _send(conn, queue, n)
        acks = _spy_acks(conn)
        seen: list[tuple[str, bool]] = []
        done = threading.Event()

        def on_message(message: pymq.Message) -> None:
            assert isinstance(message, pymq.TextMessage)
            seen.append((message.text, message.redelivered))
            if message.text == "n7" and not message.redelivered:
                raise RuntimeError("the application failed on this one")
            if len(seen) == n + 1:
                done.set()

        conn.create_session().create_consumer(queue).set_message_listener(on_message)
        assert done.wait(10), seen
        assert sorted(seen) == sorted([(f"n{i}", False) for i in range(n)] + [("n7", True)])
        assert [a["command"] for a in acks].count("NACK") == 1
    with pymq.connect(url) as conn:
        assert conn.create_session().create_consumer(queue).receive(0.3) is None


def test_aio_a_listener_that_raises_gets_its_message_again(url):
    import asyncio

    async def main() -> None:
        queue = _queue()
        async with pymq.aio.connect(url) as conn:
            producer = conn.create_session().create_producer(queue)
            for i in range(20):
                await producer.send(pymq.TextMessage(f"n{i}"), delivery_mode=pymq.NON_PERSISTENT)
            seen: list[tuple[str, bool]] = []
            done = asyncio.Event()

            def on_message(message: pymq.Message) -> None:
                assert isinstance(message, pymq.TextMessage)
                seen.append((message.text, message.redelivered))
                if message.text == "n3" and not message.redelivered:
                    raise RuntimeError("the application failed on this one")
                if len(seen) == 21:
                    done.set()

            consumer = await conn.create_session().create_consumer(queue)
            consumer.set_message_listener(on_message)
            await asyncio.wait_for(done.wait(), 10)
            assert sorted(seen) == sorted([(f"n{i}", False) for i in range(20)] + [("n3", True)])
        async with pymq.aio.connect(url) as conn:
            consumer = await conn.create_session().create_consumer(queue)
            assert await consumer.receive(0.3) is None

    asyncio.run(main())


def test_a_connection_lost_while_an_ack_is_held_returns_what_no_ack_covered(broker, monkeypatch):
    """The client dies (its socket shut, no DISCONNECT) after taking messages whose ACK it held back:
    those, and everything delivered after the last ACK, come again (flagged redelivered); nothing an ACK
    covered comes again."""
    monkeypatch.setattr(_core, "AUTO_ACK_HOLD_S", 3600.0)   # held by count only: the test decides
    queue = _queue()
    n, taken = 300, _core.AUTO_ACK_BATCH + 6
    conn = pymq.connect(broker.url)
    try:
        _send(conn, queue, n)
        acks = _spy_acks(conn)
        consumer = conn.create_session().create_consumer(queue, prefetch=1000)
        conn.start()
        assert wait_for(lambda: consumer.buffered >= taken + 10), consumer.buffered
        got = [consumer.receive(5) for _ in range(taken)]
        assert [m.text for m in got] == [f"n{i}" for i in range(taken)]
        # one cumulative ACK for the first batch; the last six taken are held (more is buffered)
        assert [a["command"] for a in acks] == ["ACK"], acks
        conn._transport._shutdown()                        # the crash: the held ACK never leaves
        assert wait_for(lambda: conn.closed), "the connection did not notice its socket closed"
    finally:
        conn.close()
    acked = _core.AUTO_ACK_BATCH                           # the ACK named the 64th message: n0..n63
    with pymq.connect(broker.url) as again:
        c2 = again.create_session().create_consumer(queue)
        back = []
        while (m := c2.receive(2)) is not None:
            back.append(m)
    assert [m.text for m in back] == [f"n{i}" for i in range(acked, n)]
    assert all(m.redelivered for m in back[: taken - acked])      # taken, not acknowledged


@pytest.mark.parametrize("api", ["blocking", "aio"])
def test_a_message_taken_while_more_wait_is_acknowledged_without_another_receive(broker, api):
    """The application takes one message of a burst and then does something else for a long time: the
    ACK held back for it still goes within AUTO_ACK_HOLD_S (the shell's timer), so a connection lost
    afterwards does not bring it back (and a producer its queue blocked is not kept waiting)."""
    queue = _queue()
    with pymq.connect(broker.url) as conn:
        _send(conn, queue, 20)

    if api == "blocking":
        conn = pymq.connect(broker.url)
        try:
            acks = _spy_acks(conn)
            consumer = conn.create_session().create_consumer(queue)
            assert wait_for(lambda: consumer.buffered >= 5), consumer.buffered
            assert consumer.receive(5).text == "n0"          # held: more is buffered
            assert wait_for(lambda: acks, timeout=5), "the held ACK was never sent"
            conn._transport._shutdown()                       # the crash: the socket goes, no DISCONNECT
            assert wait_for(lambda: conn.closed)
        finally:
            conn.close()
    else:
        import asyncio

        async def main() -> None:
            conn = await pymq.aio.connect(broker.url)
            try:
                acks = _spy_acks(conn)
                consumer = await conn.create_session().create_consumer(queue)
                for _ in range(500):
                    if consumer.buffered >= 5:
                        break
                    await asyncio.sleep(0.01)
                assert (await consumer.receive(5)).text == "n0"
                for _ in range(500):                          # the loop runs the timer meanwhile
                    if acks:
                        break
                    await asyncio.sleep(0.01)
                assert acks, "the held ACK was never sent"
                await asyncio.sleep(0.1)                      # its loop turn writes it
                conn._transport._transport.abort()            # the crash: the socket goes, no DISCONNECT
            finally:
                await conn.close()

        asyncio.run(main())
    with pymq.connect(broker.url) as again:
        c2 = again.create_session().create_consumer(queue)
        back = []
        while (m := c2.receive(2)) is not None:
            back.append(m.text)
    assert back == [f"n{i}" for i in range(1, 20)]


def _crash(conn: pymq.Connection) -> None:
    """The client dies: its socket shut, no DISCONNECT (a held ACK never leaves)."""
    conn._transport._shutdown()
    assert wait_for(lambda: conn.closed), "the connection did not notice its socket closed"
    conn.close()


def _left_in(broker, queue: pymq.Queue) -> list[tuple[str, bool]]:
    """What a new connection reads from ``queue``: (text, redelivered) of each message."""
    with pymq.connect(broker.url) as again:
        consumer = again.create_session().create_consumer(queue)
        back = []
        while (m := consumer.receive(1)) is not None:
            back.append((m.text, m.redelivered))
    return back


def _flush_by_send(conn, session, consumer):  # noqa: ANN001
    # a reply: persistent, so it returns once the broker took it (the ACK before it was taken first)
    session.create_producer(_queue()).send("the reply")


def _flush_by_receive_elsewhere(conn, session, consumer):  # noqa: ANN001
    assert session.create_consumer(_queue()).receive(0.2) is None    # waits on an empty queue
    _sync(conn)


def _flush_by_stop(conn, session, consumer):  # noqa: ANN001
    conn.stop()
    _sync(conn)


def _flush_by_recover(conn, session, consumer):  # noqa: ANN001
    session.recover()
    _sync(conn)


def _flush_by_consumer_close(conn, session, consumer):  # noqa: ANN001
    consumer.close()


def _sync(conn: pymq.Connection) -> None:
    """A receipted frame on another session: every frame sent before it has reached the broker."""
    conn.create_session().create_producer(_queue()).send("sync")


FLUSH_POINTS = {"send": _flush_by_send, "receive-waits": _flush_by_receive_elsewhere, "stop": _flush_by_stop,
                "recover": _flush_by_recover, "close": _flush_by_consumer_close}


@pytest.mark.parametrize("point", FLUSH_POINTS)
def test_a_held_ack_is_sent_before_the_session_goes_on(broker, monkeypatch, point):
    """spec/stomp.md §5: AUTO_ACKNOWLEDGE holds an ACK back while more is buffered, but sends it before the
    session sends anything (a reply made after processing a message never reaches the broker before that
    message's ACK), before a receive of the session waits on an empty queue, and on stop, recover and
    close: a crash right after each does not bring back the message taken before it."""
    monkeypatch.setattr(_core, "AUTO_ACK_HOLD_S", 3600.0)   # no timer: only the flush point sends it
    queue = _queue()
    conn = pymq.connect(broker.url)
    try:
        _send(conn, queue, 10)
        acks = _spy_acks(conn)
        session = conn.create_session()
        consumer = session.create_consumer(queue)
        assert wait_for(lambda: consumer.buffered >= 5), consumer.buffered
        assert consumer.receive(5).text == "n0"
        assert acks == [], "the ACK of n0 was not held back (more is buffered)"
        FLUSH_POINTS[point](conn, session, consumer)
        assert [a["command"] for a in acks] == ["ACK"], acks
    finally:
        _crash(conn)
    back = _left_in(broker, queue)
    assert [text for text, _ in back] == [f"n{i}" for i in range(1, 10)], back
    assert all(redelivered for _, redelivered in back), back       # delivered before the crash


def test_aio_a_reply_never_overtakes_the_ack_of_its_request(broker, monkeypatch):
    """The same rule in pymq.aio: the SEND of a reply goes after the held ACK of the message taken."""
    import asyncio

    monkeypatch.setattr(_core, "AUTO_ACK_HOLD_S", 3600.0)
    queue = _queue()

    async def main() -> list[str]:
        conn = await pymq.aio.connect(broker.url)
        order: list[str] = []
        send_on, send = conn._send_on, conn._send

        def spy_on(frame, link):  # noqa: ANN001
            order.append(frame.command)
            return send_on(frame, link)

        def spy(frame):  # noqa: ANN001
            order.append(frame.command)
            return send(frame)

        conn._send_on, conn._send = spy_on, spy  # type: ignore[method-assign]
        try:
            session = conn.create_session()
            producer = session.create_producer(queue)
            for i in range(10):
                await producer.send(f"n{i}", delivery_mode=pymq.NON_PERSISTENT)
            consumer = await session.create_consumer(queue)
            for _ in range(500):
                if consumer.buffered >= 5:
                    break
                await asyncio.sleep(0.01)
            assert (await consumer.receive(5)).text == "n0"
            order.clear()
            await session.create_producer(_queue()).send("the reply", delivery_mode=pymq.NON_PERSISTENT)
            return order
        finally:
            await conn.close()

    assert asyncio.run(main())[:2] == ["ACK", "SEND"]


def test_coalescing_off_acknowledges_each_message_as_it_is_taken(broker, monkeypatch):
    """``coalesce_acks=False``: one ACK per message, each sent when receive returns it, so a crash brings
    back only what was never taken (ActiveMQ's optimizeAcknowledge off)."""
    monkeypatch.setattr(_core, "AUTO_ACK_HOLD_S", 3600.0)
    queue = _queue()
    conn = pymq.connect(broker.url, coalesce_acks=False)
    try:
        _send(conn, queue, 30)
        acks = _spy_acks(conn)
        consumer = conn.create_session().create_consumer(queue)
        assert wait_for(lambda: consumer.buffered >= 20), consumer.buffered
        got = [consumer.receive(5).text for _ in range(10)]
        assert got == [f"n{i}" for i in range(10)]
        assert [a["command"] for a in acks] == ["ACK"] * 10, acks
        _sync(conn)
    finally:
        _crash(conn)
    assert [text for text, _ in _left_in(broker, queue)] == [f"n{i}" for i in range(10, 30)]


def test_dups_ok_keeps_its_looser_batching(broker, monkeypatch):
    """DUPS_OK_ACKNOWLEDGE may bring a message back: its held ACK does not go before a SEND."""
    queue = _queue()
    with pymq.connect(broker.url) as conn:
        _send(conn, queue, 10)
        acks = _spy_acks(conn)
        session = conn.create_session(pymq.DUPS_OK_ACKNOWLEDGE)
        consumer = session.create_consumer(queue)
        assert wait_for(lambda: consumer.buffered >= 5), consumer.buffered
        assert consumer.receive(5).text == "n0"
        session.create_producer(_queue()).send("the reply")
        assert acks == [], acks
