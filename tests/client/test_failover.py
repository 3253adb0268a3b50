"""Failover in both shells (issue 26.2, spec/ha.md §4) against real brokers, never fakes.

A takeover is emulated as the server side will do it until its HA lands: broker A (a ``pymq-server``
process) is killed with SIGKILL and broker B starts on A's data directory at the URL's second address — the
same store in a new process.  A lost link without a takeover goes through the fault-injecting TCP proxy of
tests/storage/services.py (``cut``, and ``hold_replies``: the broker acts on a frame whose receipt never
comes back).

Every scenario is written once, as a coroutine over ``Sdk``: for ``pymq.aio`` it awaits the call, for the
blocking ``pymq`` it runs the call in a worker thread (``asyncio.to_thread``), so each test drives both
shells through their own public API.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pymq
import pymq.aio
import pymq.errors
from pymq.client._failover import Failover
from pymq.errors import ConnectFailed, ConnectionClosed, TransactionInDoubt, TransactionRolledBack, UnknownDestination
from tests.storage.services import TcpProxy

FAST = "initialReconnectDelay=50&maxReconnectDelay=400&jitter=0"


def free_port() -> int:
    """A port for a broker that starts later at an address a URL names from the start (B of a Pair): the
    one place a port is picked before its server binds it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A port where nothing answers, for as long as the block runs: bound and never listening (a connect
    is refused), so no other process can take it meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


class Sdk:
    """One shell, driven from a coroutine: ``await sdk.call(fn, *args)`` runs an SDK call."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def connect(self, url: str, **kwargs: Any) -> Any:
        if self.name == "aio":
            return await pymq.aio.connect(url, **kwargs)
        return await asyncio.to_thread(pymq.connect, url, **kwargs)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.name == "aio":
            result = fn(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result
        return await asyncio.to_thread(fn, *args, **kwargs)


@pytest.fixture(params=["blocking", "aio"])
def sdk(request) -> Sdk:
    return Sdk(request.param)


def run(coro) -> Any:  # noqa: ANN001
    return asyncio.run(asyncio.wait_for(coro, 150))


async def until(predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


class Pair:
    """Broker A on ``data``; ``takeover()`` kills it with SIGKILL and starts B on the same directory at the
    port reserved for it (the URL names both from the start)."""

    def __init__(self, start: Callable[..., Any], data: Path) -> None:
        self.start, self.data = start, data
        self.a = start(data)
        self.b_port = free_port()
        self.b: Any = None

    @property
    def url(self) -> str:
        return f"failover:(stomp://127.0.0.1:{self.a.port},stomp://127.0.0.1:{self.b_port})?{FAST}"

    def takeover(self) -> None:
        os.kill(self.a.proc.pid, signal.SIGKILL)
        self.a.proc.wait(10)
        self.b = self.start(self.data, "--port", str(self.b_port))


@pytest.fixture
def pair(broker_processes, tmp_path) -> Pair:
    return Pair(broker_processes, tmp_path / "store")


@pytest.fixture
def proxied(broker_processes, tmp_path):  # noqa: ANN201
    broker = broker_processes(tmp_path / "one")
    proxy = TcpProxy("127.0.0.1", broker.port)
    yield broker, proxy
    proxy.close()


@pytest.fixture
def proxied_no_reclaim(broker_processes, tmp_path):  # noqa: ANN201
    """A broker that never gives temporary names back (``temporary_reclaim_ms: 0``): a reconnecting client
    offers no token, so nothing closes a half-open link of its own early (spec/ha.md §4.7), as with clients
    that do not offer one (Java, Go, TypeScript today)."""
    config = tmp_path / "no-reclaim.yaml"
    config.write_text("temporary_reclaim_ms: 0\n")
    broker = broker_processes(tmp_path / "one", config=str(config))
    proxy = TcpProxy("127.0.0.1", broker.port)
    yield broker, proxy
    proxy.close()


def body(m) -> str:  # noqa: ANN001
    return m.text


# -- a takeover: kill -9 of A, B on its store ------------------------------------------------------------------

def test_a_takeover_loses_nothing_acknowledged(sdk, pair):
    """Persistent sends go on across the takeover with no application code: every receipted one is
    received, and so is every windowed one (``sync_send=False``, a second connection); sends in flight at
    the kill are re-sent with their dedup ids; a CLIENT_ACKNOWLEDGE listener, a durable subscriber with a
    selector and a temporary queue's consumer keep running on the new broker; the open transaction fails at
    commit as rolled back and leaves nothing; the transport listener hears interrupted then resumed, the
    exception listener nothing."""
    queue, topic = pymq.Queue(f"orders-{uuid.uuid4().hex[:6]}"), pymq.Topic(f"ticks-{uuid.uuid4().hex[:6]}")
    total, kill_after = 400, 120

    async def scenario() -> None:
        conn = await sdk.connect(pair.url, client_id=f"fo-{uuid.uuid4().hex[:6]}", heartbeat=(500, 500))
        windowed = await sdk.connect(pair.url, sync_send=False, heartbeat=(500, 500))
        events: list = []
        failures: list = []
        conn.set_transport_listener(events.append)
        conn.exception_listener = failures.append
        windowed.exception_listener = failures.append
        got, ticks = [], []

        def on_order(m) -> None:  # noqa: ANN001
            got.append((body(m), m.redelivered, len(events)))
            m.acknowledge()

        consume = conn.create_session(pymq.CLIENT_ACKNOWLEDGE)
        c = await sdk.call(consume.create_consumer, queue)
        c.set_message_listener(on_order)
        durable = conn.create_session()
        d = await sdk.call(durable.create_durable_consumer, topic, "ticks", "n >= 0")
        d.set_message_listener(lambda m: ticks.append(m.get_property("n")))
        temp_session = conn.create_session()
        temp = temp_session.create_temporary_queue()
        temp_consumer = await sdk.call(temp_session.create_consumer, temp)
        tx = conn.create_session(pymq.SESSION_TRANSACTED)
        tx_producer = tx.create_producer(queue)
        await sdk.call(tx_producer.send, "in the lost transaction")

        produce = conn.create_session()
        producer = produce.create_producer(queue)
        tick_producer = produce.create_producer(topic)
        window_producer = windowed.create_session().create_producer(queue)
        acked, kill = [], None
        for i in range(total):
            if i == kill_after:                               # the kill runs while the sends go on
                kill = asyncio.ensure_future(asyncio.to_thread(pair.takeover))
            await sdk.call(producer.send, f"m{i}")            # persistent: returns once receipted
            acked.append(f"m{i}")
            await sdk.call(window_producer.send, f"w{i}")     # windowed: re-sent until receipted
            if i % 20 == 0:
                await sdk.call(tick_producer.send, produce.create_message(properties={"n": i}))
        await kill
        every = set(acked) | {f"w{i}" for i in range(total)}
        assert await until(lambda: {b for b, _, _ in got} >= every, 60), \
            f"lost: {sorted(every - {b for b, _, _ in got})[:10]}"
        every_tick = set(range(0, total, 20))
        assert await until(lambda: set(ticks) >= every_tick, 30), sorted(every_tick - set(ticks))
        with pytest.raises(TransactionRolledBack):
            await sdk.call(tx.commit)
        await sdk.call(tx_producer.send, "after")              # the next transaction starts clean
        await sdk.call(tx.commit)
        await sdk.call(produce.create_producer(temp).send, "to the temporary queue")
        echoed = await sdk.call(temp_consumer.receive, 10)
        assert echoed is not None and echoed.text == "to the temporary queue"

        assert [e.kind for e in events] == ["interrupted", "resumed"], events
        assert events[1].broker == f"127.0.0.1:{pair.b_port}" and failures == []
        assert conn.status is pymq.ConnectionStatus.OPEN and windowed.status is pymq.ConnectionStatus.OPEN
        assert await until(lambda: "after" in [b for b, _, _ in got])
        bodies = [b for b, _, _ in got]
        assert "in the lost transaction" not in bodies
        duplicates = {b for b in bodies if bodies.count(b) > 1}
        # a message received twice was delivered before the takeover and its acknowledgement did not reach
        # the old broker (it comes again, redelivered): never a second copy of a send
        assert all(any(b == dup and seen == 0 for b, _, seen in got) for dup in duplicates), duplicates
        flagged = sum(1 for b, redelivered, _ in got if b in duplicates and redelivered)
        resent = conn._failover.resent + windowed._failover.resent
        print(f"\n{sdk.name}: {len(every)} receipted or windowed, {len(set(bodies) & every)} received, "
              f"{len(duplicates)} received twice {sorted(duplicates)} ({flagged} of their copies flagged redelivered), "
              f"{resent} SENDs re-sent after the takeover")
        await sdk.call(windowed.close)
        await sdk.call(conn.close)

    run(scenario())


def _publish_kinds(broker, topic: pymq.Topic, texts: list[str]) -> None:  # noqa: ANN001
    """Persistent messages to ``topic`` over a direct connection, each with property kind = its first letter."""
    with pymq.connect(broker.url) as direct:
        session = direct.create_session()
        producer = session.create_producer(topic)
        for text in texts:
            producer.send(session.create_text_message(text, properties={"kind": text[0]}))


def test_subscriptions_come_back_by_name_with_their_selectors_and_ack_modes(sdk, pair):
    """Across a takeover a durable subscription and a shared durable one (CLIENT_ACKNOWLEDGE) and a shared
    non-durable one (AUTO_ACKNOWLEDGE) are subscribed again by their names with their selectors: what the
    first two had delivered and not acknowledged comes back redelivered (the stored subscriptions of those
    names, not new ones), the third's acknowledged message does not come again, and afterwards each gets
    only what its selector picks."""
    topic = pymq.Topic(f"kinds-{uuid.uuid4().hex[:6]}")

    async def scenario() -> None:
        conn = await sdk.connect(pair.url, client_id=f"subs-{uuid.uuid4().hex[:6]}", heartbeat=(500, 500))
        events: list = []
        conn.set_transport_listener(events.append)
        client_ack = conn.create_session(pymq.CLIENT_ACKNOWLEDGE)
        durable = await sdk.call(client_ack.create_durable_consumer, topic, "d", "kind = 'a'")
        shared_durable = await sdk.call(client_ack.create_shared_durable_consumer, topic, "sd", "kind = 'b'")
        auto = conn.create_session()
        shared = await sdk.call(auto.create_shared_consumer, topic, "sn", "kind = 'c'")
        await asyncio.to_thread(_publish_kinds, pair.a, topic, ["a1", "b1", "c1"])
        for consumer, text in ((durable, "a1"), (shared_durable, "b1"), (shared, "c1")):
            got = await sdk.call(consumer.receive, 10)
            assert got is not None and got.text == text and not got.redelivered
        await asyncio.to_thread(pair.takeover)
        assert await until(lambda: [e.kind for e in events] == ["interrupted", "resumed"], 60), events
        for consumer, text in ((durable, "a1"), (shared_durable, "b1")):
            again = await sdk.call(consumer.receive, 10)
            assert again is not None and again.text == text and again.redelivered
        await sdk.call(client_ack.acknowledge)
        await asyncio.to_thread(_publish_kinds, pair.b, topic, ["a2", "b2", "c2", "c3", "b3", "a3"])
        for consumer, texts in ((durable, ["a2", "a3"]), (shared_durable, ["b2", "b3"]), (shared, ["c2", "c3"])):
            got = [await sdk.call(consumer.receive, 10) for _ in texts]
            assert [m.text if m is not None else None for m in got] == texts
            assert not any(m.redelivered for m in got)
            assert await sdk.call(consumer.receive, 0.3) is None     # nothing its selector would not pick
        await sdk.call(client_ack.acknowledge)
        await sdk.call(conn.close)

    run(scenario())


# -- a lost link without a takeover (the fault proxy) ------------------------------------------------------------

def _depth(broker, queue: pymq.Queue) -> int:  # noqa: ANN001
    with pymq.connect(broker.url) as direct:
        try:
            return int(direct.queue_manager().metrics(queue)["depth"])
        except UnknownDestination:
            return 0                                          # not made yet


def _send_direct(broker, destination: pymq.Destination, text: str) -> None:  # noqa: ANN001
    with pymq.connect(broker.url) as direct:
        direct.create_session().create_producer(destination).send(text)


def _publish_direct(broker, topic: pymq.Topic, values: list[int]) -> None:  # noqa: ANN001
    with pymq.connect(broker.url) as direct:
        session = direct.create_session()
        producer = session.create_producer(topic)
        for n in values:
            producer.send(session.create_message(properties={"n": n}))


async def depth(broker, queue: pymq.Queue) -> int:  # noqa: ANN001
    """The queue's depth, asked over a direct connection (not the proxy), off the event loop."""
    return await asyncio.to_thread(_depth, broker, queue)


async def depth_reaches(broker, queue: pymq.Queue, want: int, timeout: float = 20.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await depth(broker, queue) == want:
            return True
        await asyncio.sleep(0.05)
    return False


def test_a_resent_send_the_broker_holds_is_not_a_second_copy(sdk, proxied, monkeypatch):
    """SENDs the broker took but whose receipts were lost with the link are sent again on the next link with
    their dedup ids, and the broker drops the copies: each message once.  Without the dedup ids (the control
    run, Failover.stamp disabled) the same cut duplicates them, so the check can fail."""
    broker, proxy = proxied

    async def scenario() -> tuple[int, int]:
        queue = pymq.Queue(f"dedup-{uuid.uuid4().hex[:6]}")
        conn = await sdk.connect(f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}", sync_send=False,
                                 heartbeat=(0, 0))
        s = conn.create_session()
        producer = s.create_producer(queue)
        proxy.hold_replies()                                  # the broker acts, its receipts are dropped
        for i in range(50):
            await sdk.call(producer.send, f"m{i}")             # windowed: returns at once
        assert await depth_reaches(broker, queue, 50)
        proxy.cut()
        proxy.restore()
        assert await until(lambda: conn._failover.resent == 50 and not conn._failover.window)
        await sdk.call(producer.send, "last")                 # after the re-sent ones, on the same link
        assert await depth_reaches(broker, queue, 51) or await depth_reaches(broker, queue, 101)
        held = await depth(broker, queue)
        c = await sdk.call(s.create_consumer, queue)
        texts = []
        while (m := await sdk.call(c.receive, 2)) is not None:
            texts.append(m.text)
        await sdk.call(conn.close)
        assert texts[-1] == "last" and sorted(set(texts) - {"last"}) == sorted(f"m{i}" for i in range(50))
        return held, len(texts)

    assert run(scenario()) == (51, 51)
    monkeypatch.setattr(Failover, "stamp", lambda self, frame: frame)
    held, received = run(scenario())
    assert held == 101 and received == 101                    # without dedup ids: every one twice


def test_commit_cut_off_is_in_doubt_and_never_sent_again(sdk, proxied):
    """The broker applies a COMMIT whose receipt is lost with the link: commit() raises TransactionInDoubt
    (spec/ha.md §4.5), COMMIT is not sent again, the transaction's messages are there once, and the next
    transaction works."""
    broker, proxy = proxied
    queue = pymq.Queue(f"doubt-{uuid.uuid4().hex[:6]}")

    async def scenario() -> None:
        conn = await sdk.connect(f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}", heartbeat=(0, 0))
        tx = conn.create_session(pymq.SESSION_TRANSACTED)
        producer = tx.create_producer(queue)
        for i in range(3):
            await sdk.call(producer.send, f"t{i}")
        proxy.hold_replies()
        commit = asyncio.ensure_future(sdk.call(tx.commit))
        assert await depth_reaches(broker, queue, 3)  # applied by the broker
        proxy.cut()
        proxy.restore()
        with pytest.raises(TransactionInDoubt):
            await commit
        await sdk.call(producer.send, "next")
        await sdk.call(tx.commit)
        assert await depth_reaches(broker, queue, 4)
        await sdk.call(conn.close)

    run(scenario())


def test_a_transaction_open_at_the_loss_rolls_back_at_commit(sdk, proxied):
    """What a transaction did before the link was lost is gone (the broker rolled it back): sends and
    receives go on in it, but commit() rolls it all back and raises TransactionRolledBack; the message it
    received comes back redelivered, and the next transaction commits."""
    broker, proxy = proxied
    queue, out = pymq.Queue(f"tx-in-{uuid.uuid4().hex[:6]}"), pymq.Queue(f"tx-out-{uuid.uuid4().hex[:6]}")

    async def scenario() -> None:
        conn = await sdk.connect(f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}", heartbeat=(0, 0))
        plain = conn.create_session()
        await sdk.call(plain.create_producer(queue).send, "work")
        tx = conn.create_session(pymq.SESSION_TRANSACTED)
        c = await sdk.call(tx.create_consumer, queue)
        producer = tx.create_producer(out)
        first = await sdk.call(c.receive, 5)
        assert first is not None and first.text == "work" and not first.redelivered
        await sdk.call(producer.send, "before the loss")
        proxy.cut()
        proxy.restore()
        assert await until(lambda: conn._link == 1 and conn.status is pymq.ConnectionStatus.OPEN)
        await sdk.call(producer.send, "after the loss")
        with pytest.raises(TransactionRolledBack):
            await sdk.call(tx.commit)
        assert await depth(broker, out) == 0                         # nothing of it is visible
        again = await sdk.call(c.receive, 5)
        assert again is not None and again.text == "work" and again.redelivered
        await sdk.call(producer.send, "next")
        await sdk.call(tx.commit)
        assert await depth(broker, out) == 1 and await depth(broker, queue) == 0
        await sdk.call(conn.close)

    run(scenario())


def test_acknowledging_a_message_of_the_lost_link_does_nothing(sdk, proxied):
    """CLIENT_ACKNOWLEDGE: a message received before the loss cannot be acknowledged on the new link: its ack
    id was the old link's, and the broker numbers each link's deliveries anew, so on the new link the same
    id names another delivery (here: a message of another queue nobody has received yet, which a stale ACK
    would acknowledge unread).  acknowledge() sends nothing for it, the connection stays open, and the
    message comes again, redelivered (spec/ha.md §4.5)."""
    broker, proxy = proxied
    first, second = pymq.Queue(f"unseen-{uuid.uuid4().hex[:6]}"), pymq.Queue(f"stale-{uuid.uuid4().hex[:6]}")

    async def scenario() -> None:
        conn = await sdk.connect(f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}", heartbeat=(0, 0))
        s = conn.create_session(pymq.CLIENT_ACKNOWLEDGE)
        unseen = await sdk.call(s.create_consumer, first)     # subscribed first: on a new link it is served first
        c = await sdk.call(s.create_consumer, second)
        await sdk.call(s.create_producer(second).send, "once")
        old = await sdk.call(c.receive, 5)
        proxy.cut()
        await asyncio.to_thread(_send_direct, broker, first, "unread")
        proxy.restore()
        assert await until(lambda: conn._link == 1 and conn.status is pymq.ConnectionStatus.OPEN)
        assert await until(lambda: unseen.buffered == 1 and c.buffered == 1)
        old.acknowledge()                                      # names the lost link: nothing is sent
        again = await sdk.call(c.receive, 5)
        assert again is not None and again.text == "once" and again.redelivered
        assert conn.status is pymq.ConnectionStatus.OPEN
        await sdk.call(conn.close)
        assert await depth(broker, first) == 1                 # the unread message was not acknowledged
        assert await depth(broker, second) == 1                # nor the stale one: it comes again

    run(scenario())


def test_the_exception_listener_hears_only_when_every_attempt_is_spent(sdk, proxied):
    """maxReconnectAttempts=3 and the broker gone for good: interrupted, three attempts, then the
    connection closes and the exception listener hears it once; calls raise the connection-closed error."""
    broker, proxy = proxied

    async def scenario() -> None:
        url = f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}&maxReconnectAttempts=3"
        conn = await sdk.connect(url, heartbeat=(0, 0))
        events: list = []
        failures: list = []
        conn.set_transport_listener(events.append)
        conn.exception_listener = failures.append
        s = conn.create_session()
        producer = s.create_producer(pymq.Queue("gone"))
        proxy.cut()                                            # and never restored
        assert await until(lambda: conn.status is pymq.ConnectionStatus.CLOSED, 30)
        assert [e.kind for e in events] == ["interrupted"] and len(failures) == 1
        with pytest.raises(ConnectionClosed):
            await sdk.call(producer.send, "nowhere")
        await sdk.call(conn.close)

    run(scenario())


def test_the_first_connect_goes_through_the_group(sdk, broker_processes, tmp_path):
    """At the first connect each broker is tried in turn (a dead first one is passed over); with none
    answering, connect() fails after one pass (startupMaxReconnectAttempts=0)."""
    live = broker_processes(tmp_path / "live")

    async def scenario(dead: int, other: int) -> None:
        conn = await sdk.connect(f"failover:(stomp://127.0.0.1:{dead},stomp://127.0.0.1:{live.port})?{FAST}")
        assert conn.status is pymq.ConnectionStatus.OPEN and conn._failover.current == 1
        await sdk.call(conn.close)
        with pytest.raises(ConnectFailed):
            await sdk.connect(f"stomp://127.0.0.1:{dead},stomp://127.0.0.1:{other}")

    with refused_port() as dead, refused_port() as other:
        run(scenario(dead, other))


@pytest.fixture
def beating(broker_processes, tmp_path):  # noqa: ANN201
    """A broker that offers 200 ms heart-beats, behind the proxy."""
    config = tmp_path / "beat.yaml"
    config.write_text("heartbeat_send_ms: 200\nheartbeat_recv_ms: 200\n")
    broker = broker_processes(tmp_path / "beat", config=str(config))
    proxy = TcpProxy("127.0.0.1", broker.port)
    yield broker, proxy
    proxy.close()


def test_a_missed_heartbeat_is_a_lost_link(sdk, beating):
    """The broker goes silent (its bytes dropped, the socket open): the heart-beat watch ends the link,
    the SDK reconnects (the attempts time out while the broker stays silent) and resumes when it speaks."""
    broker, proxy = beating
    queue = pymq.Queue(f"beat-{uuid.uuid4().hex[:6]}")

    async def scenario() -> None:
        conn = await sdk.connect(f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}", heartbeat=(200, 200),
                                 timeout=2)
        events: list = []
        conn.set_transport_listener(events.append)
        proxy.hold_replies()
        assert await until(lambda: [e.kind for e in events] == ["interrupted"], 10)
        assert type(events[0].error).__name__ == "HeartbeatTimeout"
        proxy.cut()
        proxy.restore()
        assert await until(lambda: [e.kind for e in events] == ["interrupted", "resumed"], 30)
        s = conn.create_session()
        await sdk.call(s.create_producer(queue).send, "alive")
        assert (await sdk.call((await sdk.call(s.create_consumer, queue)).receive, 5)).text == "alive"
        assert (await sdk.call(conn.queue_manager().metrics, queue))["depth"] == 0   # admin works on the new link
        await sdk.call(conn.close)

    run(scenario())


def test_a_client_id_the_broker_still_holds_is_tried_again(sdk, proxied_no_reclaim):
    """A half-open link (the client's side gone, the broker's open and silent, as after a partition): the
    broker holds the connection's client id until the link's heart-beat deadline, so the reconnections
    before it are refused with ``illegal-state``; the SDK tries again with its back-off (spec/ha.md §4.3)
    rather than giving up, and resumes once the broker lets the old link go — with its consumer back."""
    broker, proxy = proxied_no_reclaim
    queue = pymq.Queue(f"held-{uuid.uuid4().hex[:6]}")
    client_id = f"held-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        conn = await sdk.connect(f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}", client_id=client_id,
                                 heartbeat=(1000, 1000))
        events: list = []
        failures: list = []
        conn.set_transport_listener(events.append)
        conn.exception_listener = failures.append
        s = conn.create_session()
        c = await sdk.call(s.create_consumer, queue)
        proxy.sever()
        proxy.restore()                                        # reconnections reach the broker at once
        with pytest.raises(pymq.errors.IllegalStateError):     # what each attempt hears meanwhile
            await sdk.connect(broker.url, client_id=client_id)
        assert await until(lambda: [e.kind for e in events] == ["interrupted", "resumed"], 30), events
        assert events[1].attempts > 1 and failures == []       # refused at least once, never final
        await asyncio.to_thread(_send_direct, broker, queue, "after")
        got = await sdk.call(c.receive, 10)
        assert got is not None and got.text == "after"
        await sdk.call(conn.close)

    run(scenario())


def test_a_durable_subscription_the_broker_still_holds_is_tried_again(sdk, proxied_no_reclaim):
    """Without a client id a durable subscription belongs to the user, and the half-open link still holds
    it: the new link's re-subscription is refused with ``illegal-state``, and the SDK takes that as a link
    lost (it tries again with the back-off going on, spec/ha.md §4.3), not as the end of the connection;
    once the broker drops the old link the subscription comes back under its name, with what was published
    to it meanwhile."""
    broker, proxy = proxied_no_reclaim
    topic = pymq.Topic(f"held-{uuid.uuid4().hex[:6]}")
    name = f"held-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        conn = await sdk.connect(f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}", heartbeat=(1000, 1000))
        events: list = []
        failures: list = []
        conn.set_transport_listener(events.append)
        conn.exception_listener = failures.append
        s = conn.create_session()
        d = await sdk.call(s.create_durable_consumer, topic, name, "n > 1")
        proxy.sever()
        await asyncio.to_thread(_publish_direct, broker, topic, [1, 2])   # kept for the subscription by name
        proxy.restore()
        got = await sdk.call(d.receive, 20)                    # waits through the refused attempts
        assert got is not None and got.get_property("n") == 2
        refused = [e for e in events if e.kind == "interrupted" and getattr(e.error, "code", "") == "illegal-state"]
        assert refused and failures == [], (events, failures)  # refused at least once, never final
        assert await until(lambda: events[-1].kind == "resumed") and conn.status is pymq.ConnectionStatus.OPEN
        await sdk.call(conn.close)

    run(scenario())


def test_a_re_claim_ends_the_half_open_link_at_once(sdk, proxied):
    """The same half-open link with a broker that re-claims temporary names (spec/ha.md §4.7): the SDK's
    CONNECT offers the lost link's token, so the broker closes that link at once (only this client was ever
    sent the token) and the first attempt resumes, with the client id and the durable subscription free and
    what was published to it meanwhile — no ``illegal-state`` and no wait for the heart-beat deadline."""
    broker, proxy = proxied
    topic = pymq.Topic(f"held-{uuid.uuid4().hex[:6]}")
    name, client_id = f"held-{uuid.uuid4().hex[:6]}", f"held-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        conn = await sdk.connect(f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}", client_id=client_id,
                                 heartbeat=(60_000, 60_000))     # the old link's deadline: over a minute
        events: list = []
        conn.set_transport_listener(events.append)
        s = conn.create_session()
        d = await sdk.call(s.create_durable_consumer, topic, name, "n > 1")
        proxy.sever()
        await asyncio.to_thread(_publish_direct, broker, topic, [1, 2])
        proxy.restore()
        got = await sdk.call(d.receive, 20)                    # long before that deadline
        assert got is not None and got.get_property("n") == 2
        assert await until(lambda: [e.kind for e in events] == ["interrupted", "resumed"]), events
        assert events[1].temporaries == ()                     # (a refused re-subscription: another interrupted)
        await sdk.call(conn.close)

    run(scenario())


async def _requester(sdk: Sdk, url: str, service: pymq.Queue, events: list) -> tuple:  # noqa: ANN001
    """A failover requester: a temporary queue it reads replies from, one named only in a reply-to and one
    never used; a request sent for each of the first two."""
    conn = await sdk.connect(url, heartbeat=(0, 0))
    conn.set_transport_listener(events.append)
    s = conn.create_session()
    replies = s.create_temporary_queue()
    only_named = s.create_temporary_queue()
    s.create_temporary_topic()                                # never used: the broker never held it
    c = await sdk.call(s.create_consumer, replies)
    producer = s.create_producer(service)
    await sdk.call(producer.send, s.create_text_message("before", reply_to=replies))
    await sdk.call(producer.send, s.create_text_message("named", reply_to=only_named))
    return conn, s, replies, only_named, c, producer


async def _responder(broker, service: pymq.Queue):  # noqa: ANN001, ANN202
    """The responder: its connection, session, consumer of ``service``, and the first of the requester's two
    requests (its ``reply-to`` names the requester's temporary queue by its global name)."""
    responder = await asyncio.to_thread(pymq.connect, broker.url)
    rs = responder.create_session()
    requests = await asyncio.to_thread(rs.create_consumer, service)
    old = await asyncio.to_thread(requests.receive, 5)
    await asyncio.to_thread(requests.receive, 5)
    assert old is not None and old.reply_to.name.startswith("tmp.")
    return responder, rs, requests, old


def test_temporary_destinations_keep_their_names_across_a_lost_link(sdk, proxied):
    """A plain reconnect re-claims the temporaries' global names (spec/ha.md §4.7): replies the responder
    addresses to the name it got before the loss reach the requester's consumer on the new link, the one sent
    while the link was down too (the broker kept the lost link's queue for the re-claim), and the
    ``resumed`` event names no temporary (none got a new name)."""
    broker, proxy = proxied
    service = pymq.Queue(f"svc-{uuid.uuid4().hex[:6]}")

    async def scenario() -> None:
        events: list = []
        conn, s, replies, _, c, producer = await _requester(
            sdk, f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}", service, events)
        responder, rs, requests, old = await _responder(broker, service)
        proxy.cut()
        await asyncio.to_thread(rs.create_producer(old.reply_to).send, "sent while the link was down")
        proxy.restore()
        assert await until(lambda: [e.kind for e in events] == ["interrupted", "resumed"])
        assert events[1].temporaries == ()
        await asyncio.to_thread(rs.create_producer(old.reply_to).send, "answer to the old name")
        got = [await sdk.call(c.receive, 5), await sdk.call(c.receive, 5)]
        assert [m.text if m is not None else None for m in got] == ["sent while the link was down",
                                                                    "answer to the old name"]
        await sdk.call(producer.send, s.create_text_message("after", reply_to=replies))
        new = await asyncio.to_thread(requests.receive, 5)
        assert new is not None and new.reply_to == old.reply_to
        await asyncio.to_thread(responder.close)
        await sdk.call(conn.close)

    run(scenario())


def test_temporaries_whose_names_were_not_re_claimed_are_named_when_it_resumes(sdk, broker_processes, tmp_path):
    """A broker that re-claims nothing (``temporary_reclaim_ms: 0``: no token to offer) gives the new link new
    global names: a reply to the old name is refused (unknown-destination), one to the new name arrives, and
    the ``resumed`` event names the temporaries the lost link held (the one subscribed to and the one named
    only in a reply-to), not one never used."""
    config = tmp_path / "no-reclaim.yaml"
    config.write_text("temporary_reclaim_ms: 0\n")
    broker = broker_processes(tmp_path / "one", config=str(config))
    proxy = TcpProxy("127.0.0.1", broker.port)
    service = pymq.Queue(f"svc-{uuid.uuid4().hex[:6]}")

    async def scenario() -> None:
        events: list = []
        conn, s, replies, only_named, c, producer = await _requester(
            sdk, f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}", service, events)
        responder, rs, requests, old = await _responder(broker, service)
        proxy.cut()
        proxy.restore()
        assert await until(lambda: [e.kind for e in events] == ["interrupted", "resumed"])
        assert set(events[1].temporaries) == {replies, only_named}
        with pytest.raises(UnknownDestination):               # the old global name is gone with its link
            await asyncio.to_thread(_send_direct, broker, old.reply_to, "lost")
        await sdk.call(producer.send, s.create_text_message("after", reply_to=replies))
        new = await asyncio.to_thread(requests.receive, 5)
        assert new is not None and new.text == "after" and new.reply_to != old.reply_to
        await asyncio.to_thread(rs.create_producer(new.reply_to).send, "answer")
        got = await sdk.call(c.receive, 5)
        assert got is not None and got.text == "answer"
        await asyncio.to_thread(responder.close)
        await sdk.call(conn.close)

    try:
        run(scenario())
    finally:
        proxy.close()


def test_the_core_offers_the_last_token_and_names_only_temporaries_that_got_new_names():
    """The client core alone (no broker): each failover CONNECT offers the token of the last CONNECTED; the
    ``resumed`` event names the lost link's temporaries when a link since the last one was refused the
    re-claim (``pymq-reclaimed: false``, e.g. past the broker's window) or was not answered about it (a
    broker without tokens), and none when each re-claimed them."""
    from pymq.client._core import ConnectionCore, ConnectionSettings
    from pymq.protocol.frame import Frame

    core = ConnectionCore(ConnectionSettings("failover:(stomp://127.0.0.1:1,stomp://127.0.0.1:2)"))
    core._opened(Frame("CONNECTED", {"version": "1.2", "pymq-reclaim-token": "c1.0123456789abcdef.T1"}), "1.2", None)
    assert core._connect_headers(None, None)["pymq-reclaim"] == "c1.0123456789abcdef.T1"
    core._made_temporary("/temp-queue/replies")
    for answer, token, named in [({"pymq-reclaimed": "true"}, "T1", ()),
                                 ({"pymq-reclaimed": "false", "pymq-reclaim-refused": "late"}, "T2",
                                  (pymq.TemporaryQueue("replies"),)),
                                 ({}, "", (pymq.TemporaryQueue("replies"),))]:
        core._interrupt()
        headers = {"version": "1.2", **answer}
        if token:
            headers["pymq-reclaim-token"] = token
        core._relinked(Frame("CONNECTED", headers))
        assert core._temporaries_resumed() == named, answer
        core._made_temporary("/temp-queue/replies")       # the re-subscription makes it again on the new link
        assert core._connect_headers(None, None).get("pymq-reclaim") == (token or None)
    single = ConnectionCore(ConnectionSettings("stomp://127.0.0.1:1"))
    single._opened(Frame("CONNECTED", {"version": "1.2", "pymq-reclaim-token": "c1.0123456789abcdef.T1"}), "1.2", None)
    assert "pymq-reclaim" not in single._connect_headers(None, None)     # no failover: nothing to re-claim


def test_a_full_window_holds_the_sender_until_receipts_come(sdk, proxied, monkeypatch):
    """With failover every SEND asks for a receipt; those nobody waits for stay in a bounded window, and a
    send waits while it is full (spec/ha.md §4.4) — here until the link is replaced and the re-sent ones
    are receipted."""
    import pymq.client._failover as failover_module
    monkeypatch.setattr(failover_module, "WINDOW_COUNT", 5)
    broker, proxy = proxied
    queue = pymq.Queue(f"window-{uuid.uuid4().hex[:6]}")

    async def scenario() -> None:
        conn = await sdk.connect(f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}", heartbeat=(0, 0),
                                 sync_send=False)
        producer = conn.create_session().create_producer(queue)
        proxy.hold_replies()
        for i in range(5):
            await sdk.call(producer.send, f"m{i}")
        sixth = asyncio.ensure_future(sdk.call(producer.send, "m5"))
        assert await depth_reaches(broker, queue, 5)
        assert not sixth.done() and len(conn._failover.window) == 5
        proxy.cut()
        proxy.restore()
        await asyncio.wait_for(sixth, 20)
        assert await depth_reaches(broker, queue, 6)          # the re-sent five were dropped as copies
        await sdk.call(conn.close)

    run(scenario())


def test_calls_wait_for_the_next_link_at_most_the_timeout_option(sdk, proxied):
    """``timeout`` (ms): how long a send waits while the connection reconnects before it raises."""
    broker, proxy = proxied

    async def scenario() -> None:
        conn = await sdk.connect(f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}&timeout=300",
                                 heartbeat=(0, 0))
        producer = conn.create_session().create_producer(pymq.Queue("later"))
        proxy.cut()                                            # not restored during the send
        assert await until(lambda: conn.status is pymq.ConnectionStatus.RECONNECTING)
        with pytest.raises(pymq.errors.TimeoutError):
            await sdk.call(producer.send, "waits 300 ms, then raises")
        proxy.restore()
        assert await until(lambda: conn.status is pymq.ConnectionStatus.OPEN, 20)
        await sdk.call(conn.close)

    run(scenario())


def test_close_during_a_reconnection_ends_it(sdk, proxied):
    """While reconnecting the connection can still be used locally (start/stop, a new session) and closed:
    close() ends the reconnection at once (no task left behind in pymq.aio), and the exception listener
    hears nothing, since nothing failed."""
    broker, proxy = proxied

    async def scenario() -> None:
        before = asyncio.all_tasks()
        conn = await sdk.connect(f"failover:(stomp://127.0.0.1:{proxy.port})?{FAST}", heartbeat=(0, 0))
        failures: list = []
        conn.exception_listener = failures.append
        proxy.cut()                                            # never restored: attempts go on forever
        assert await until(lambda: conn.status is pymq.ConnectionStatus.RECONNECTING)
        await sdk.call(conn.stop)
        await sdk.call(conn.start)
        conn.create_session(pymq.SESSION_TRANSACTED)
        await asyncio.wait_for(sdk.call(conn.close), 10)
        assert conn.status is pymq.ConnectionStatus.CLOSED and failures == []
        if sdk.name == "aio":
            await asyncio.sleep(0)
            assert asyncio.all_tasks() - before == set()

    run(scenario())
