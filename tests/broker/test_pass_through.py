"""An auto-ack delivery taken as the message arrives (the delivery side's common case, reached sooner), and a
fan-out's message ending once (placement.Placement._enter, queue.MessageQueue._pass).

Driven through real sessions and the real TCP adapter over a recording transport, in one process: what is
checked is what a client and an operator see (frames, queue statistics, the memory flow's figures)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pymq.protocol.scanner import encode_frame
from pymq_server.app import BrokerServer
from pymq_server.broker import flow as flow_module
from pymq_server.config import BrokerConfig

from tests.fake_transport import connect as _connect
from tests.fake_transport import memory_broker as _broker
from tests.fake_transport import until as _until


def _ends_counted(monkeypatch) -> list[str]:   # type: ignore[no-untyped-def]
    """The ids of the messages that end (MemoryFlow.message_gone), one entry per end, in order."""
    gone: list[str] = []
    real = flow_module.MemoryFlow.message_gone

    def counting(self, message) -> None:   # type: ignore[no-untyped-def]
        gone.append(message.message_id)
        real(self, message)

    monkeypatch.setattr(flow_module.MemoryFlow, "message_gone", counting)
    return gone


def test_a_fan_out_to_auto_ack_subscribers_ends_its_message_once(tmp_path, monkeypatch):
    """Four auto-ack subscribers each take and complete their copy as it is placed: the message ends once (its
    bytes uncounted once, the store told once), not once per subscriber (before: the memory flow's held bytes
    and messages went negative by three a message, so a topic's traffic hid the memory limit)."""
    gone = _ends_counted(monkeypatch)

    async def run() -> tuple[int, int, int, list[int]]:
        server = await _broker(str(tmp_path))
        loop = asyncio.get_running_loop()
        links = []
        for i, ack in enumerate(("auto", "auto", "auto", "auto", "client-individual")):
            proto, transport = _connect(server, loop)
            proto.data_received(encode_frame("SUBSCRIBE", {"destination": "/topic/t", "id": f"s{i}", "ack": ack},
                                             b"", "1.2"))
            links.append((proto, transport))
        await _until(lambda: all(p.session.user is not None and p.session.consumers for p, _ in links),
                     "the subscriptions were not made")
        producer = links[0][0]
        for n in range(10):
            producer.data_received(encode_frame("SEND", {"destination": "/topic/t", "persistent": "false"},
                                                b"m%d" % n, "1.2"))
        await _until(lambda: sum(t.data.count(b"MESSAGE\n") for _, t in links) >= 50, "not all delivered")
        flow = server.broker.flow
        held = (flow.held_messages, flow.held_bytes > 0, len(gone))
        # the client-individual subscriber acknowledges: now the messages end
        tokens = [f.headers["ack"] for f in links[4][1].frames() if f.command == "MESSAGE"]
        links[4][0].data_received(b"".join(encode_frame("ACK", {"id": t}, b"", "1.2") for t in tokens))
        await _until(lambda: len(gone) >= 10, "the acknowledged messages did not end")
        counts = [t.data.count(b"MESSAGE\n") for _, t in links]
        after = (flow.held_messages, flow.held_bytes, flow.entries)
        for proto, _ in links:
            proto.connection_lost(None)
        await server.stop()
        return held, after, counts   # type: ignore[return-value]

    held, after, counts = asyncio.run(run())
    assert held == (10, True, 0)           # held by the one subscriber that has not acknowledged yet
    assert after == (0, 0, 0)
    assert sorted(gone) == sorted(set(gone)) and len(gone) == 10        # each message ended exactly once
    assert counts == [10] * 5


def test_a_fan_out_to_auto_ack_subscribers_only_keeps_the_memory_figures_at_zero(tmp_path, monkeypatch):
    gone = _ends_counted(monkeypatch)

    async def run() -> tuple[int, int, int]:
        server = await _broker(str(tmp_path))
        loop = asyncio.get_running_loop()
        links = []
        for i in range(4):
            proto, transport = _connect(server, loop)
            proto.data_received(encode_frame("SUBSCRIBE", {"destination": "/topic/t", "id": f"s{i}", "ack": "auto"},
                                             b"", "1.2"))
            links.append((proto, transport))
        await _until(lambda: all(p.session.user is not None and p.session.consumers for p, _ in links),
                     "the subscriptions were not made")
        for n in range(20):
            links[0][0].data_received(encode_frame("SEND", {"destination": "/topic/t", "persistent": "false"},
                                                   b"m%d" % n, "1.2"))
        await _until(lambda: sum(t.data.count(b"MESSAGE\n") for _, t in links) >= 80, "not all delivered")
        flow = server.broker.flow
        figures = (flow.held_messages, flow.held_bytes, flow.entries)
        for proto, _ in links:
            proto.connection_lost(None)
        await server.stop()
        return figures

    assert asyncio.run(run()) == (0, 0, 0)
    assert len(gone) == 20 and len(set(gone)) == 20


# -- the pass-through: the same outcome as acquiring and then completing, in fewer steps ------------------------

#: what differs between two runs of one scenario whatever the path: the broker's id prefix and the clock
_VARYING = frozenset({"message-id", "timestamp", "expires", "ack", "pymq-seq"})
_TIMED = frozenset({"average_depth", "average_wait_s", "max_wait_s", "lag_s"})


def _scenario(tmp_path: Any, name: str, passes: bool, monkeypatch: Any) -> dict:
    """Run scenario ``name`` on a fresh broker; ``passes`` false: every consumer takes the general path (acquired,
    then completed), as before the pass-through. Returns what a client and an operator see."""
    from pymq_server.admin.ops import queue_metrics
    from pymq_server.storage import store as store_module

    released: list[str] = []
    real_release = store_module.HoldingStore.release

    def release(self, message, queue) -> None:   # type: ignore[no-untyped-def]
        released.append(queue)
        real_release(self, message, queue)

    monkeypatch.setattr(store_module.HoldingStore, "release", release)
    stored = name in ("persistent-queue", "durable-subscription")
    data_dir = tmp_path / name / str(passes)
    queues = {"lv": {"last_value_key": "k"}, "timed": {"delivery_timeout_ms": 60000}}
    subs: list[tuple[str, dict]] = {
        "queue": [("/queue/q", {})],
        "persistent-queue": [("/queue/q", {})],
        "topic": [("/topic/t", {}), ("/topic/t", {}), ("/topic/t", {"ack": "client-individual"}),
                  ("/topic/t", {"selector": "n > 2"})],
        "durable-subscription": [("/topic/t", {"durable-subscription-name": "d"}), ("/topic/t", {})],
        "expired": [("/queue/q", {})],
        "last-value": [("/queue/lv", {})],
        "delivery-timeout": [("/queue/timed", {})],
        "selector": [("/queue/q", {"selector": "n > 2"}), ("/queue/q", {})],
    }[name]

    async def run() -> dict:
        if stored:       # the file device (the default storage): persistent messages are written and released
            config = BrokerConfig.from_dict(dict(host="127.0.0.1", port=0, data_dir=str(data_dir),
                                                 sync_policy="never", queues=queues))
            server = BrokerServer(config)
            await server.start_core()
        else:
            server = await _broker(str(data_dir), queues=queues)
        loop = asyncio.get_running_loop()
        links = []
        for i, (destination, headers) in enumerate(subs):
            proto, transport = _connect(server, loop, f"c{i}")
            sub = {"destination": destination, "id": f"s{i}", "ack": "auto", **headers}
            proto.data_received(encode_frame("SUBSCRIBE", sub, b"", "1.2"))
            links.append((proto, transport))
        producer, ptransport = _connect(server, loop)
        await _until(lambda: all(p.session.user is not None and p.session.consumers for p, _ in links)
                     and producer.session.user is not None, "the subscriptions were not made")
        if not passes:
            for proto, _ in links:
                for consumer in proto.session.consumers.values():
                    consumer.passes = False
        destination = subs[0][0]
        for n in range(6):
            headers = {"destination": destination, "persistent": "true" if stored else "false", "n": str(n),
                       "k": "a", "receipt": f"r{n}"}
            if name == "expired" and n % 2:
                headers["expires"] = "1"          # long past: never delivered
            producer.data_received(encode_frame("SEND", headers, b"m%d" % n, "1.2"))
        await _until(lambda: ptransport.commands().count("RECEIPT") == 6, "no receipts")
        flow = server.broker.flow
        frames = []
        for _, transport in links:
            frames.append([(f.command, {k: v for k, v in f.headers.items() if k not in _VARYING}, f.body)
                           for f in transport.frames() if f.command == "MESSAGE"])
        held = list(server.broker.queues.values()) + [c.queue for p, _ in links for c in p.session.consumers.values()]
        now = held[0].host.clock()
        metrics = {q.name: queue_metrics(q, now) for q in held}       # queues and subscriptions
        seen = {"frames": frames, "flow": (flow.held_messages, flow.held_bytes, flow.entries),
                "figures": {q: {k: v for k, v in m.items() if k not in _TIMED} for q, m in metrics.items()},
                "released": sorted(released), "sent": [p.session.sent for p, _ in links],
                "waits": {q: m["average_wait_s"] < 5 and m["max_wait_s"] < 5 for q, m in metrics.items()}}
        for proto in [p for p, _ in links] + [producer]:
            proto.connection_lost(None)
        await server.stop()
        return seen

    return asyncio.run(run())


SCENARIOS = ["queue", "persistent-queue", "topic", "durable-subscription", "expired", "last-value",
             "delivery-timeout", "selector"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_pass_through_shows_what_the_general_path_shows(tmp_path, monkeypatch, name):
    """Frames (headers and bodies), every queue's figures (added, delivered, acknowledged, removed, depth, peak,
    expired, in flight ...), the memory flow's figures, the store's released references (a persistent message to a
    durable queue or subscription still goes through the store) and each session's sent count: the same
    whether each auto-ack consumer passes messages through or takes the general path (acquire, then complete)."""
    general = _scenario(tmp_path, name, False, monkeypatch)
    passed = _scenario(tmp_path, name, True, monkeypatch)
    assert passed == general
    assert any(general["frames"])                     # (the scenario delivered something)
    assert general["flow"][2] == sum(m["in_flight"] for m in general["figures"].values())    # entries held: unacked


def test_a_message_passed_through_takes_one_transition_and_neither_acquire_nor_complete(monkeypatch):
    """The fast case (a new message, nothing ready, an auto-ack consumer with credit): one state change READY ->
    COMPLETED (Event.PASS) made before the MESSAGE is written, and the queue side's Python calls per delivery down
    by _acquire's and complete's (the general path, the consumer's ``passes`` off: READY -> ACQUIRED -> COMPLETED,
    acknowledged after the write). A client-individual consumer still takes the general path."""
    import sys

    from pymq_server.broker import queue as queue_module
    from pymq_server.broker.consumer import AUTO, CLIENT_INDIVIDUAL, Consumer
    from pymq_server.broker.entry import Entry
    from tests.broker.test_delivery_path import Outlet, _message, _queue

    class Watched(Entry):
        """An entry that records every state it is given."""

        def __init__(self, *args: Any) -> None:
            self.__dict__["states"] = []
            super().__init__(*args)

        @property       # type: ignore[override]
        def state(self):   # type: ignore[no-untyped-def]
            return self.__dict__["_state"]

        @state.setter
        def state(self, value) -> None:   # type: ignore[no-untyped-def]
            self.__dict__["_state"] = value
            self.__dict__["states"].append(value.value)    # (the plain string: no call into states.py)

    monkeypatch.setattr(queue_module, "Entry", Watched)

    def one(mode: str, passes: bool) -> tuple[list[str], list[str], list[str]]:
        queue, _ = _queue()
        outlet = Outlet()
        at_write: list[str] = []
        record = outlet.link.send_message
        outlet.link.send_message = lambda conn, c, entry, ack: (at_write.append(entry.state.value),   # type: ignore[method-assign]
                                                                 record(conn, c, entry, ack))
        consumer = Consumer(outlet, "s1", queue, mode, 0)      # type: ignore[arg-type]
        consumer.passes = passes and consumer.passes
        queue.add_consumer(consumer)
        calls: list[str] = []

        def profile(frame, event, arg):   # type: ignore[no-untyped-def]
            if event == "call" and "/server/broker/" in frame.f_code.co_filename.replace("\\", "/"):
                calls.append(frame.f_code.co_name)      # the broker's functions (not this test's recorders)
        message = _message(1)      # (built before: its construction is compiled or not, message.py's choice)
        sys.setprofile(profile)
        try:
            entry = queue.enqueue(message)
        finally:
            sys.setprofile(None)
        return entry.states, at_write, calls    # type: ignore[attr-defined]

    states, at_write, calls = one(AUTO, True)
    assert states == ["ready", "completed"] and at_write == ["completed"]
    assert calls.count("_pass") == 1 and "_acquire" not in calls and "complete" not in calls
    general_states, general_at_write, general_calls = one(AUTO, False)
    assert general_states == ["ready", "acquired", "completed"] and general_at_write == ["acquired"]
    assert len(calls) == len(general_calls) - 1        # _acquire and complete, for the one _pass
    # the queue's enqueue and the entry's __init__ (the backlog not asked: it is empty and the
    # message not marked the queue's alone), the offer and its consumer's credit, the depth figures, the pass with
    # its delivery count, the consumer and its session's outlet, the drop
    assert calls == ["enqueue", "__init__", "offer", "can_take", "_depth_delta", "_pass",
                     "_count_delivery", "deliver", "deliver", "_drop"]
    assert set(general_calls) - set(calls) == {"_acquire", "complete"}
    assert one(CLIENT_INDIVIDUAL, True)[0] == ["ready", "acquired"]      # held until its ACK
