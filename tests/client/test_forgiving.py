"""The SDK forgives small mistakes (issue 28.2) and deletes temporary destinations (issue 27.6), in both
shells (blocking ``pymq`` and ``pymq.aio``), over stomp:// and vm://, against a real broker.

* ``create_session`` reads the JMS constants as JMS 2.0 does (``create_session(pymq.CLIENT_ACKNOWLEDGE)``
  made a transacted session, ``create_session(pymq.SESSION_TRANSACTED)`` a non-transacted one) and
  refuses what it cannot mean, creating nothing;
* an invalid selector raises InvalidSelector and closes nothing (it closed the connection);
* ``recover()`` after a message was dead-lettered redelivers what is still held and never closes the
  connection (it raised UnknownMessage, then ConnectionClosed for every call), and acknowledging a
  redelivered message never acknowledges prefetched ones the application has not seen;
* ``JMSXDeliveryCount`` is 1 on a first delivery and counts up;
* ``TemporaryQueue.delete()`` / ``TemporaryTopic.delete()``: refused while the connection consumes from
  it, refused to another connection (broker side), and what it held is gone.

Each scenario is written once per shell (the aio one awaits), and runs in both over both transports.
"""
from __future__ import annotations

import asyncio
import uuid

import pytest

import pymq
import pymq.aio
from pymq.errors import AccessDenied, DestinationError, IllegalStateError, InvalidSelector, PymqError
from pymq.protocol.frame import Frame
from pymq_server.embedded import stop_embedded
from tests.conftest import wait_for

SHELLS = ["blocking", "aio"]


@pytest.fixture(params=["stomp", "vm"])
def url(request, broker, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if request.param == "stomp":
        yield broker.url
        return
    name = f"forgive-{uuid.uuid4().hex[:8]}"
    yield f"vm://{name}"
    stop_embedded(name)


def q() -> pymq.Queue:
    return pymq.Queue(f"q-{uuid.uuid4().hex[:8]}")


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(asyncio.wait_for(coro, 60))


# -- create_session -----------------------------------------------------------------------------------------

MODES = [
    ((pymq.CLIENT_ACKNOWLEDGE,), {}, pymq.CLIENT_ACKNOWLEDGE),
    ((pymq.SESSION_TRANSACTED,), {}, pymq.SESSION_TRANSACTED),
    ((pymq.AUTO_ACKNOWLEDGE,), {}, pymq.AUTO_ACKNOWLEDGE),
    ((pymq.DUPS_OK_ACKNOWLEDGE,), {}, pymq.DUPS_OK_ACKNOWLEDGE),
    ((), {}, pymq.AUTO_ACKNOWLEDGE),
    ((True,), {}, pymq.SESSION_TRANSACTED),
    ((False,), {}, pymq.AUTO_ACKNOWLEDGE),
    ((False, pymq.CLIENT_ACKNOWLEDGE), {}, pymq.CLIENT_ACKNOWLEDGE),
    ((True, pymq.CLIENT_ACKNOWLEDGE), {}, pymq.SESSION_TRANSACTED),       # JMS: the mode is ignored
    ((), {"ack_mode": pymq.SESSION_TRANSACTED}, pymq.SESSION_TRANSACTED),
    ((), {"ack_mode": pymq.DUPS_OK_ACKNOWLEDGE}, pymq.DUPS_OK_ACKNOWLEDGE),
    ((pymq.CLIENT_ACKNOWLEDGE, pymq.CLIENT_ACKNOWLEDGE), {}, pymq.CLIENT_ACKNOWLEDGE),
    ((2,), {}, pymq.CLIENT_ACKNOWLEDGE),                                   # the constant's JMS value
]
REFUSED = [
    ((False, pymq.SESSION_TRANSACTED), {}, "both not transacted and transacted"),
    ((pymq.CLIENT_ACKNOWLEDGE, pymq.DUPS_OK_ACKNOWLEDGE), {}, "two different session modes"),
    ((7,), {}, "unknown acknowledge mode"),
    (("client",), {}, "not 'client'"),
    ((None, "x"), {}, "not 'x'"),
    ((False, True), {}, "not True"),
]


def _check_mode(session, mode) -> None:  # noqa: ANN001
    assert session.ack_mode is mode
    assert session.transacted is (mode is pymq.SESSION_TRANSACTED)


@pytest.mark.parametrize("shell", SHELLS)
def test_create_session_reads_the_jms_constants(url, shell):
    if shell == "blocking":
        with pymq.connect(url) as conn:
            for args, kwargs, mode in MODES:
                _check_mode(conn.create_session(*args, **kwargs), mode)
            for args, kwargs, words in REFUSED:
                before = list(conn._sessions)
                with pytest.raises(IllegalStateError, match=words):
                    conn.create_session(*args, **kwargs)
                assert conn._sessions == before          # nothing created
            # the session made from the constant behaves as CLIENT_ACKNOWLEDGE, not as a transaction
            s = conn.create_session(pymq.CLIENT_ACKNOWLEDGE)
            dest = q()
            s.create_producer(dest).send("one")            # visible at once: no transaction holds it
            c = s.create_consumer(dest)
            first = c.receive(5)
            assert first is not None and first.text == "one"
            s.recover()
            again = c.receive(5)
            assert again is not None and again.redelivered
            again.acknowledge()
            t = conn.create_session(pymq.SESSION_TRANSACTED)
            t.create_producer(dest).send("held")
            assert c.receive(0.3) is None                  # not before the commit
            t.commit()
            late = c.receive(5)
            assert late is not None and late.text == "held"
        return

    async def main() -> None:
        async with pymq.aio.connect(url) as conn:
            for args, kwargs, mode in MODES:
                _check_mode(conn.create_session(*args, **kwargs), mode)
            for args, kwargs, words in REFUSED:
                before = list(conn._sessions)
                with pytest.raises(IllegalStateError, match=words):
                    conn.create_session(*args, **kwargs)
                assert conn._sessions == before
            s = conn.create_session(pymq.CLIENT_ACKNOWLEDGE)
            dest = q()
            await s.create_producer(dest).send("one")
            c = await s.create_consumer(dest)
            first = await c.receive(5)
            assert first is not None and first.text == "one"
            await s.recover()
            again = await c.receive(5)
            assert again is not None and again.redelivered
            again.acknowledge()
            t = conn.create_session(pymq.SESSION_TRANSACTED)
            await t.create_producer(dest).send("held")
            assert await c.receive(0.3) is None
            await t.commit()
            late = await c.receive(5)
            assert late is not None and late.text == "held"
    run(main())


# -- invalid selectors ---------------------------------------------------------------------------------------

BAD = "colour = 'red' AND"


@pytest.mark.parametrize("shell", SHELLS)
def test_an_invalid_selector_raises_and_closes_nothing(url, shell):
    topic = pymq.Topic(f"t-{uuid.uuid4().hex[:6]}")
    if shell == "blocking":
        with pymq.connect(url, client_id=f"c-{uuid.uuid4().hex[:6]}") as conn:
            s = conn.create_session()
            dest = q()
            c = s.create_consumer(dest)
            for attempt in (lambda: s.create_consumer(dest, BAD),
                            lambda: s.create_durable_consumer(topic, "d", BAD),
                            lambda: s.create_shared_consumer(topic, "sh", BAD),
                            lambda: s.create_browser(dest, BAD).messages(),
                            lambda: s.read_range(dest, selector=BAD)):
                with pytest.raises(InvalidSelector) as info:
                    attempt()
                assert info.value.position == 18
                assert conn.status is pymq.ConnectionStatus.OPEN and not s.closed and not c.closed
            assert len(conn._subscriptions) == 1           # only the good consumer is registered
            s.create_producer(dest).send("still here")
            got = c.receive(5)
            assert got is not None and got.text == "still here"
        return

    async def main() -> None:
        async with pymq.aio.connect(url, client_id=f"c-{uuid.uuid4().hex[:6]}") as conn:
            s = conn.create_session()
            dest = q()
            c = await s.create_consumer(dest)
            for attempt in (lambda: s.create_consumer(dest, BAD),
                            lambda: s.create_durable_consumer(topic, "d", BAD),
                            lambda: s.create_shared_consumer(topic, "sh", BAD),
                            lambda: s.create_browser(dest, BAD).messages(),
                            lambda: s.read_range(dest, selector=BAD)):
                with pytest.raises(InvalidSelector) as info:
                    await attempt()
                assert info.value.position == 18
                assert conn.status is pymq.ConnectionStatus.OPEN and not s.closed and not c.closed
            assert len(conn._subscriptions) == 1
            await s.create_producer(dest).send("still here")
            got = await c.receive(5)
            assert got is not None and got.text == "still here"
    run(main())


# -- recover() after a dead letter, and JMSXDeliveryCount ------------------------------------------------------

def _record(m) -> tuple[str, bool, object]:  # noqa: ANN001
    return (m.text, m.redelivered, m.get_property("JMSXDeliveryCount"))


def _check_rounds(rounds, dead) -> None:  # noqa: ANN001
    """One message received per round then ``recover()``, on a queue with max_deliveries 2 and three
    messages: each is seen once new and once redelivered (count 1 then 2), in order, then dead-lettered;
    nothing is seen a third time, and all three end in the dead-letter queue."""
    assert rounds == [("m0", False, 1), ("m0", True, 2), ("m1", False, 1), ("m1", True, 2),
                      ("m2", False, 1), ("m2", True, 2), None], rounds
    assert sorted(dead) == ["m0", "m1", "m2"]


@pytest.mark.parametrize("shell", SHELLS)
def test_recover_after_a_dead_letter_keeps_the_connection(url, shell):
    name = f"dl-{uuid.uuid4().hex[:6]}"
    if shell == "blocking":
        with pymq.connect(url) as conn:
            conn.queue_manager().create(name, max_deliveries=2)
            s = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
            producer = s.create_producer(pymq.Queue(name))
            for i in range(3):
                producer.send(f"m{i}")
            c = s.create_consumer(pymq.Queue(name))
            rounds = []
            for _ in range(7):
                m = c.receive(2 if len(rounds) < 6 else 0.5)
                rounds.append(m and _record(m))
                s.recover()                                # never raises, never closes
                assert conn.status is pymq.ConnectionStatus.OPEN
            dlq = s.create_consumer(pymq.Queue(f"DLQ.{name}"))
            dead = [m.text for m in iter(lambda: dlq.receive(2), None)]
            _check_rounds(rounds, dead)
        return

    async def main() -> None:
        async with pymq.aio.connect(url) as conn:
            await conn.queue_manager().create(name, max_deliveries=2)
            s = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
            producer = s.create_producer(pymq.Queue(name))
            for i in range(3):
                await producer.send(f"m{i}")
            c = await s.create_consumer(pymq.Queue(name))
            rounds = []
            for _ in range(7):
                m = await c.receive(2 if len(rounds) < 6 else 0.5)
                rounds.append(m and _record(m))
                await s.recover()
                assert conn.status is pymq.ConnectionStatus.OPEN
            dlq = await s.create_consumer(pymq.Queue(f"DLQ.{name}"))
            dead = []
            while (m := await dlq.receive(2)) is not None:
                dead.append(m.text)
            _check_rounds(rounds, dead)
    run(main())


@pytest.mark.parametrize("shell", SHELLS)
def test_acknowledging_a_redelivered_message_leaves_the_unseen_ones(url, shell):
    """CLIENT_ACKNOWLEDGE: after recover() the redelivered message comes before what was prefetched;
    acknowledging it must not acknowledge those (a cumulative ACK did, so a crash lost them unread)."""
    dest = q()

    def check(left: list[str]) -> None:
        assert left == ["m1", "m2"], left

    if shell == "blocking":
        with pymq.connect(url) as conn:
            s = conn.create_session(pymq.CLIENT_ACKNOWLEDGE)
            producer = s.create_producer(dest)
            for i in range(3):
                producer.send(f"m{i}")
            c = s.create_consumer(dest)
            assert wait_for(lambda: c.buffered == 3)          # m1 and m2 prefetched behind m0
            assert c.receive(5).text == "m0"
            s.recover()
            again = c.receive(5)
            assert again.text == "m0" and again.redelivered
            again.acknowledge()
        with pymq.connect(url) as conn:                    # the first connection is gone, unacked returned
            c = conn.create_session().create_consumer(dest)
            check([m.text for m in iter(lambda: c.receive(2), None)])
        return

    async def main() -> None:
        async with pymq.aio.connect(url) as conn:
            s = conn.create_session(pymq.CLIENT_ACKNOWLEDGE)
            producer = s.create_producer(dest)
            for i in range(3):
                await producer.send(f"m{i}")
            c = await s.create_consumer(dest)
            for _ in range(200):
                if c.buffered == 3:
                    break
                await asyncio.sleep(0.01)
            assert c.buffered == 3
            assert (await c.receive(5)).text == "m0"
            await s.recover()
            again = await c.receive(5)
            assert again.text == "m0" and again.redelivered
            await s.acknowledge()
        async with pymq.aio.connect(url) as conn:
            c = await conn.create_session().create_consumer(dest)
            left = []
            while (m := await c.receive(2)) is not None:
                left.append(m.text)
            check(left)
    run(main())


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("listener", [False, True], ids=["receive", "listener"])
def test_jmsx_delivery_count_is_one_on_a_first_delivery(url, shell, listener):
    dest = q()

    def counts(seen: list) -> None:  # noqa: ANN001
        assert [(m.get_property("JMSXDeliveryCount"), m.delivery_count, m.redelivered) for m in seen] == \
            [(1, 1, False), (2, 2, True), (3, 3, True)]
        assert "JMSXDeliveryCount" in seen[0].properties

    if shell == "blocking":
        with pymq.connect(url) as conn:
            s = conn.create_session(pymq.CLIENT_ACKNOWLEDGE)
            s.create_producer(dest).send("x")
            c = s.create_consumer(dest)
            seen: list = []
            if listener:
                c.set_message_listener(seen.append)
                for n in (1, 2, 3):
                    assert wait_for(lambda n=n: len(seen) == n)
                    if n < 3:
                        s.recover()
            else:
                for n in (1, 2, 3):
                    seen.append(c.receive(5))
                    if n < 3:
                        s.recover()
            counts(seen)
        return

    async def main() -> None:
        async with pymq.aio.connect(url) as conn:
            s = conn.create_session(pymq.CLIENT_ACKNOWLEDGE)
            await s.create_producer(dest).send("x")
            c = await s.create_consumer(dest)
            seen: list = []
            if listener:
                c.set_message_listener(seen.append)
                for n in (1, 2, 3):
                    for _ in range(500):
                        if len(seen) == n:
                            break
                        await asyncio.sleep(0.01)
                    if n < 3:
                        await s.recover()
            else:
                for n in (1, 2, 3):
                    seen.append(await c.receive(5))
                    if n < 3:
                        await s.recover()
            counts(seen)
    run(main())


# -- deleting temporary destinations ----------------------------------------------------------------------------

@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_temporary_delete(url, shell, kind):
    """Another connection cannot delete it (the broker refuses: access-denied) and it goes on working;
    refused while this connection consumes from it; then deleted with what it held, and unusable after."""
    service = q()

    def make(session):  # noqa: ANN001, ANN202
        return session.create_temporary_queue() if kind == "queue" else session.create_temporary_topic()

    def refusal() -> Frame:
        return Frame("UNSUBSCRIBE", {"id": "x", "pymq-delete-temporary": asked.reply_to.stomp_name})

    if shell == "blocking":
        with pymq.connect(url) as conn:
            s = conn.create_session()
            temp = make(s)
            c = s.create_consumer(temp)
            s.create_producer(service).send(s.create_text_message("ask", reply_to=temp))
            with pymq.connect(url) as other:        # learns the global name from a reply-to
                asked = other.create_session().create_consumer(service).receive(5)
                assert asked.reply_to.name.startswith("tmp.")
                with pytest.raises(IllegalStateError, match="only the connection that created it"):
                    asked.reply_to.delete()         # a name from a message: not this SDK's to delete
                with pytest.raises(AccessDenied, match="only the connection that created"):
                    other._request(refusal())       # the broker's own check
            _blocking_delete(conn, s, temp, c, url, kind)
        return

    async def main() -> None:
        nonlocal asked
        async with pymq.aio.connect(url) as conn:
            s = conn.create_session()
            temp = make(s)
            c = await s.create_consumer(temp)
            await s.create_producer(service).send(s.create_text_message("ask", reply_to=temp))
            async with pymq.aio.connect(url) as other:
                asked = await (await other.create_session().create_consumer(service)).receive(5)
                assert asked.reply_to.name.startswith("tmp.")
                with pytest.raises(IllegalStateError, match="only the connection that created it"):
                    asked.reply_to.delete()
                with pytest.raises(AccessDenied, match="only the connection that created"):
                    await other._request(refusal())
            await _aio_delete(conn, s, temp, c, url, kind)
    asked = None
    run(main())


def _blocking_delete(conn, s, temp, c, url: str, kind: str) -> None:  # noqa: ANN001
    with pymq.connect(url) as sender:
        s.create_producer(temp).send("before")
        assert c.receive(5).text == "before"
        probe = q()                                  # the global name reaches another connection
        s.create_producer(probe).send(s.create_text_message("reply here", reply_to=temp))
        ss = sender.create_session()
        global_name = ss.create_consumer(probe).receive(5).reply_to
        ss.create_producer(global_name).send("from outside")
        assert c.receive(5).text == "from outside"
        ss.create_producer(global_name).send("left waiting")        # held when it is deleted
        assert wait_for(lambda: c.buffered == 1)
        with pytest.raises(IllegalStateError, match="open consumer"):
            temp.delete()
        c.close()
        temp.delete()
        assert conn.status is pymq.ConnectionStatus.OPEN
        with pytest.raises(DestinationError, match="was deleted"):
            s.create_producer(temp).send("after")
        with pytest.raises(DestinationError, match="was deleted"):
            s.create_consumer(temp)
        # the broker deleted it: a send to its global name is refused (an ERROR, which ends that connection)
        with pytest.raises(PymqError):
            ss.create_producer(global_name).send("too late", delivery_mode=pymq.PERSISTENT)
        assert wait_for(lambda: sender.closed)
        fresh = s.create_temporary_queue() if kind == "queue" else s.create_temporary_topic()
        assert fresh != temp


async def _aio_delete(conn, s, temp, c, url: str, kind: str) -> None:  # noqa: ANN001
    async with pymq.aio.connect(url) as sender:
        await s.create_producer(temp).send("before")
        assert (await c.receive(5)).text == "before"
        probe = q()
        await s.create_producer(probe).send(s.create_text_message("reply here", reply_to=temp))
        ss = sender.create_session()
        global_name = (await (await ss.create_consumer(probe)).receive(5)).reply_to
        await ss.create_producer(global_name).send("from outside")
        assert (await c.receive(5)).text == "from outside"
        await ss.create_producer(global_name).send("left waiting")
        for _ in range(500):
            if c.buffered == 1:
                break
            await asyncio.sleep(0.01)
        assert c.buffered == 1
        with pytest.raises(IllegalStateError, match="open consumer"):
            temp.delete()
        await c.close()
        temp.delete()
        assert conn.status is pymq.ConnectionStatus.OPEN
        with pytest.raises(DestinationError, match="was deleted"):
            await s.create_producer(temp).send("after")
        with pytest.raises(DestinationError, match="was deleted"):
            await s.create_consumer(temp)
        with pytest.raises(PymqError):
            await ss.create_producer(global_name).send("too late", delivery_mode=pymq.PERSISTENT)
        for _ in range(500):
            if sender.closed:
                break
            await asyncio.sleep(0.01)
        assert sender.closed
        fresh = s.create_temporary_queue() if kind == "queue" else s.create_temporary_topic()
        assert fresh != temp
