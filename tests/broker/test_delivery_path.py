"""The delivery side's common case reached sooner, with the same outcome (dispatch.py, queue.py, outlet.py).

* An auto-ack delivery is acknowledged the instant it is acquired: a queue whose auto-ack consumer takes each
  message as it arrives never has a message waiting, so its time-weighted average depth is 0 however long the
  MESSAGE takes to write (MessageQueue.complete(entry, now) skips the depth figures' update that would count
  the write's time at the old depth).
* Dispatcher.offer's plain case (no exclusive receiver, no group) and its ruled case (_offer_ruled) choose
  what dispatch would (tests/broker/test_hand_new.py plays random runs; here the cases one by one, with the
  round-robin turn an exclusive receiver must leave alone).
"""
from __future__ import annotations

from types import SimpleNamespace

from pymq_server.broker.dispatch import Dispatcher
from pymq_server.broker.consumer import AUTO, CLIENT_INDIVIDUAL, Consumer
from pymq_server.broker.message import BrokerMessage, now_ms
from pymq_server.broker.outlet import FrameOutlet
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.states import COMPLETED
from pymq_server.config import QueueConfig

from tests.fake_transport import RecordingTransport


class SteppingHost:
    """A queue's host whose monotonic clock moves one second at every reading."""

    now_ms = staticmethod(now_ms)
    pager = None

    def __init__(self) -> None:
        self.t = 100.0
        self.flow = SimpleNamespace(entries=0, high=False)    # flow.MemoryFlow's entry count, never high

    def clock(self) -> float:
        self.t += 1.0
        return self.t

    def message_gone(self, message) -> None:
        pass

    def release_reference(self, message, queue) -> None:
        pass

    def delivered(self, message, queue, deliveries) -> None:
        pass


class Link:
    def __init__(self) -> None:
        self.sent: list = []

    def send_message(self, conn, consumer, entry, ack) -> None:
        self.sent.append((consumer.id, entry.message.seq, ack))


class Outlet(FrameOutlet):
    """A session's output half with a recording link (FrameOutlet.deliver as a connection runs it)."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self.version = "1.2"
        self.link = Link()     # type: ignore[assignment]
        self.conn = None       # type: ignore[assignment]
        self.deliveries = SimpleNamespace(next_token=0, tokens={})   # type: ignore[assignment]
        self.consumers = {}


def _message(n: int, group: str | None = None) -> BrokerMessage:
    headers = {"n": str(n)} if group is None else {"n": str(n), "JMSXGroupID": group}
    return BrokerMessage(n, f"ID:t-{n}", "/queue/q", n, headers, b"x", False, 4, 0, 0)


def _queue(**config) -> tuple[MessageQueue, SteppingHost]:
    host = SteppingHost()
    return MessageQueue(host, "q", "/queue/q", config=QueueConfig(**config)), host   # type: ignore[arg-type]


def test_an_idle_auto_ack_consumer_leaves_nothing_waiting_in_the_average_depth():
    queue, host = _queue()
    outlet = Outlet()
    consumer = Consumer(outlet, "s1", queue, AUTO, 0)      # type: ignore[arg-type]
    queue.add_consumer(consumer)
    for n in range(1, 6):
        entry = queue.enqueue(_message(n))
        assert entry.state is COMPLETED
    assert outlet.link.sent == [("s1", n, None) for n in range(1, 6)]
    stats = queue.stats
    assert queue.depth == 0 and stats.delivered == stats.acknowledged == 5 and stats.peak_depth == 1
    # each message was counted while it was delivered (the peak) and for no time at all: the clock moved at
    # every reading, so counting the acknowledgement at the clock's time would give a positive average
    assert stats.average_depth(0, host.clock()) == 0.0


def test_an_acknowledgement_after_the_depth_moved_counts_the_time_in_flight():
    queue, host = _queue()
    outlet = Outlet()
    consumer = Consumer(outlet, "s1", queue, CLIENT_INDIVIDUAL, 1)    # type: ignore[arg-type]
    queue.add_consumer(consumer)
    first = queue.enqueue(_message(1))
    queue.enqueue(_message(2))             # waits (prefetch 1): the depth moved after the first was acquired
    area = queue.stats._depth_area
    queue.complete(first, first.acquired_at)   # a stale instant: the clock's time is taken instead
    assert queue.stats._depth_area > area
    assert queue.stats.average_depth(queue.depth, host.clock()) > 0


class WithoutOffer(Dispatcher):
    """Every new entry through the ready index and dispatch: the rule itself."""

    __slots__ = ()

    def offer(self, entry, now) -> bool:
        return False


def _run(shortcut: bool) -> tuple[list, int]:
    queue, _ = _queue()
    if not shortcut:
        queue.dispatcher.__class__ = WithoutOffer
    outlet = Outlet()
    for name in "abc":
        queue.add_consumer(Consumer(outlet, name, queue, CLIENT_INDIVIDUAL, 10))   # type: ignore[arg-type]
    for n, group in ((1, None), (2, "g"), (3, None), (4, "g"), (5, None), (6, "h")):
        queue.enqueue(_message(n, group))           # plain and grouped (ruled) in turn
    assert queue.ready.count == 0
    # an exclusive receiver takes everything and leaves the round-robin turn where it was
    x = Consumer(outlet, "x", queue, CLIENT_INDIVIDUAL, 10, exclusive=True)   # type: ignore[arg-type]
    queue.add_consumer(x)
    turn = queue.dispatcher._rr
    queue.enqueue(_message(7))
    queue.enqueue(_message(8))
    assert [sub for sub, *_ in outlet.link.sent[-2:]] == ["x", "x"] and queue.dispatcher._rr == turn
    queue.remove_consumer(x)
    for n in (9, 10, 11):
        queue.enqueue(_message(n))
    return outlet.link.sent, queue.dispatcher._rr


def test_offer_s_plain_and_ruled_cases_choose_as_dispatch_does():
    sent, turn = _run(shortcut=True)
    assert [sub for sub, *_ in sent[:6]] == ["a", "b", "c", "b", "c", "a"]   # g stays with b, the turn goes on
    assert (sent, turn) == _run(shortcut=False)


def test_a_selector_consumer_is_asked_on_the_plain_case():
    class Odd:
        def matches(self, values) -> bool:
            return int(values["n"]) % 2 == 1

    queue, _ = _queue()
    outlet = Outlet()
    odd = Consumer(outlet, "odd", queue, CLIENT_INDIVIDUAL, 10, selector=Odd())    # type: ignore[arg-type]
    queue.add_consumer(odd)
    assert queue.enqueue(_message(1)).consumer is odd
    second = queue.enqueue(_message(2))
    assert second.consumer is None and queue.ready.count == 1      # refused: it waits for dispatch


def test_a_topic_message_s_shared_header_lines_are_encoded_once_for_every_subscriber(tmp_path, monkeypatch):
    """One MESSAGE frame's shared bytes (destination, message-id, the message's headers, content-length) are
    encoded once per message and escaping; each subscriber's frame adds only its subscription and ack lines."""
    import asyncio

    from pymq.protocol.scanner import encode_frame
    from pymq_server.app import BrokerServer
    from pymq_server.broker import message as message_module
    from pymq_server.config import BrokerConfig
    from pymq_server.net.tcp import StompServerProtocol

    encoded: list[dict] = []
    real = message_module.encode_headers

    def counting(headers, *args):
        encoded.append(dict(headers))
        return real(headers, *args)

    monkeypatch.setattr(message_module, "encode_headers", counting)

    async def run() -> list[bytes]:
        config = BrokerConfig.from_dict(dict(host="127.0.0.1", port=0, data_dir=str(tmp_path), sync_policy="never",
                                             storage={"devices": {"memory": {"kind": "memory"}}}))
        server = BrokerServer(config)
        await server.start_core()
        loop = asyncio.get_running_loop()
        links = []
        for i, ack in enumerate(("auto", "client-individual", "client", "auto")):
            proto = StompServerProtocol(server.broker, loop)
            transport = RecordingTransport()
            proto.connection_made(transport)   # type: ignore[arg-type]
            proto.data_received(encode_frame("CONNECT", {"accept-version": "1.2", "host": "/", "login": "guest",
                                                         "passcode": "guest"}, b"", "1.2"))
            proto.data_received(encode_frame("SUBSCRIBE", {"destination": "/topic/t", "id": f"s{i}", "ack": ack},
                                             b"", "1.2"))
            links.append((proto, transport))
        deadline = loop.time() + 10
        while not all(p.session.user is not None and p.session.consumers for p, _ in links):
            assert loop.time() < deadline, "the subscriptions were not made"
            await asyncio.sleep(0.01)
        producer = links[0][0]
        producer.data_received(encode_frame("SEND", {"destination": "/topic/t", "k": "v:1", "persistent": "false"},
                                            b"hello", "1.2"))
        while sum(t.data.count(b"MESSAGE\n") for _, t in links) < 4:
            assert loop.time() < deadline, "the MESSAGE frames were not written"
            await asyncio.sleep(0.01)
        frames = [bytes(t.data[t.data.index(b"MESSAGE\n"):]) for _, t in links]
        for proto, _ in links:
            proto.connection_lost(None)
        await server.stop()
        return frames

    frames = asyncio.run(run())
    assert len(encoded) == 1 and encoded[0]["k"] == "v:1"      # one encoding for four subscribers
    shared = set()
    for i, frame in enumerate(frames):
        lines = frame.split(b"\n\n", 1)[0].split(b"\n")
        own = [line for line in lines if line.startswith((b"subscription:", b"ack:"))]
        assert own[0] == b"subscription:s%d" % i
        shared.add(tuple(line for line in lines if line not in own))
    assert len(shared) == 1           # byte-identical shared header lines, in the same order
    assert b"k:v\\c1" in frames[0] and frames[0].endswith(b"\n\nhello\x00")


def _fan_out(n: int, monkeypatch) -> tuple[list[MessageQueue], SteppingHost, list]:
    """Placement._enter's fan-out of one topic message to ``n`` subscription queues (nobody reading them), with
    the calls of Backlog.takes recorded; the host's clock readings are counted from the message on."""
    from pymq_server.broker.backlog import Backlog
    from pymq_server.broker.placement import Placement

    asked: list = []
    real = Backlog.takes

    def takes(self, entry, sole):
        asked.append(sole)
        return real(self, entry, sole)

    monkeypatch.setattr(Backlog, "takes", takes)
    host = SteppingHost()
    queues = [MessageQueue(host, f"sub:{i}", "/topic/t", kind="subscription", config=QueueConfig(),  # type: ignore[arg-type]
                           durable=False) for i in range(n)]
    host.t = 0.0
    message = BrokerMessage(1, "ID:t-1", "/topic/t", 1, {}, b"x", False, 4, 0, 0)
    placement = SimpleNamespace(flow=SimpleNamespace(message_gone=lambda m: None))
    Placement._enter(placement, message, queues, [], None, False)      # type: ignore[arg-type]
    assert message.refs == n and all(q.ready.count == 1 for q in queues)
    return queues, host, asked


def test_a_topic_message_s_fan_out_reads_the_clock_once_for_every_subscription(monkeypatch):
    """Placement._enter reads the clock once a message and gives every subscription's entry that instant (their
    host is the broker's, one clock), rather than each queue's enqueue reading it again."""
    queues, host, _ = _fan_out(20, monkeypatch)
    assert host.t == 1.0                                            # one reading for 20 entries
    assert {e.enqueued_at for q in queues for e in q.ready} == {1.0}


def test_an_empty_backlog_is_not_asked_about_a_shared_message(monkeypatch):
    """Paging frees nothing for a message other queues hold too, so an empty backlog never takes one: the queue
    does not ask Backlog.takes once per subscription of a fan-out; a sole message is still asked about."""
    _, _, asked = _fan_out(20, monkeypatch)
    assert asked == []
    queue, _ = _queue()
    queue.enqueue(_message(1), sole=True)
    assert asked == [True]


def test_an_entry_s_fields_are_set_once_by_its_constructor():
    """Entry takes its storage reference and its earlier deliveries as it is made (enqueue, the backlog's read
    back): each field is set once per entry, and a topic message makes one entry per subscription."""
    from pymq_server.broker.entry import Entry

    queue, _ = _queue()
    entry = Entry(_message(1), queue, 5.0, True, 3)
    assert (entry.stored, entry.deliveries, entry.enqueued_at) == (True, 3, 5.0)
    made = queue.enqueue(_message(2), stored=True, deliveries=0)
    assert made.stored and made.deliveries == 0
