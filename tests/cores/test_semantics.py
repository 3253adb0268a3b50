"""Groups and durable subscriptions live at the destination's owner; flow control crosses the channel
(spec/cores.md §3)."""
from __future__ import annotations

import asyncio
import socket

import pytest

from tests.cores.conftest import owned_by, start_broker, stop_broker
from tests.cores.test_forwarding import _drain_messages, _receipt


def test_message_groups_are_kept_by_the_owner_across_homes(broker):
    dest = owned_by(1, prefix="/queue/groups.")[0]
    consumers = [broker.connect(0), broker.connect(1)]
    for i, c in enumerate(consumers):
        c.send("SUBSCRIBE", {"destination": dest, "id": "g", "ack": "auto", "receipt": f"s{i}"})
        _receipt(c, f"s{i}")
    p = broker.connect(0)
    for i in range(40):
        p.send("SEND", {"destination": dest, "JMSXGroupID": "AB"[i % 2], "seq": str(i)}, b"x")
    p.send("SEND", {"destination": dest, "seq": "end", "receipt": "p"}, b"x")
    _receipt(p, "p")
    seen: dict[str, list[tuple[int, int]]] = {"A": [], "B": []}
    total = 0
    for who, c in enumerate(consumers):
        while True:
            try:
                m = c.read(1.5)
            except TimeoutError:
                break
            total += 1
            if m.headers["seq"] != "end":
                seen[m.headers["JMSXGroupID"]].append((who, int(m.headers["seq"])))
    assert total == 41
    for group, got in seen.items():
        assert len({who for who, _ in got}) == 1, (group, got)       # one consumer per group
        assert [s for _, s in got] == sorted(s for _, s in got)     # in order


def test_a_durable_subscription_lives_at_the_topic_owner(broker):
    topic = owned_by(1, prefix="/topic/durable.")[0]
    sub = {"destination": topic, "id": "d", "durable-subscription-name": "keep", "ack": "client-individual"}
    first = broker.connect(0, **{"client-id": "app-1"})
    first.send("SUBSCRIBE", {**sub, "receipt": "s"})
    _receipt(first, "s")
    first.send("DISCONNECT", {"receipt": "bye"})
    _receipt(first, "bye")
    p = broker.connect(1)
    for i in range(5):
        p.send("SEND", {"destination": topic, "seq": str(i)}, b"kept")
    p.send("SEND", {"destination": topic, "seq": "5", "receipt": "p"}, b"kept")
    _receipt(p, "p")
    # back on the owner itself this time: the subscription and its messages were there all along
    again = broker.connect(1, **{"client-id": "app-1"})
    again.send("SUBSCRIBE", sub)
    got = _drain_messages(again, 6)
    assert [m.headers["seq"] for m in got] == [str(i) for i in range(6)]


def test_producer_flow_control_at_the_owner_holds_the_home_producer(tmp_path):
    cfg = tmp_path / "broker.yaml"
    cfg.write_text("queue_defaults: {max_depth: 10, overflow: block}\n")
    cluster = start_broker(str(tmp_path / "data"), "--config", str(cfg))
    try:
        dest = owned_by(1, prefix="/queue/blocked.")[0]
        p = cluster.connect(0)
        for i in range(40):
            p.send("SEND", {"destination": dest, "seq": str(i)}, b"x" * 100)
        p.send("SEND", {"destination": dest, "seq": "40", "receipt": "last"}, b"x")
        with pytest.raises(TimeoutError):
            p.read(1.0)                     # the owner's queue is full: the producer is held, no receipt
        c = cluster.connect(1)
        c.send("SUBSCRIBE", {"destination": dest, "id": "s"})
        got = _drain_messages(c, 41)
        assert [m.headers["seq"] for m in got] == [str(i) for i in range(41)]
        _receipt(p, "last")
    finally:
        stop_broker(cluster)


def test_a_full_channel_holds_the_homes_that_wrote_to_it(monkeypatch):
    """The mechanism in-process: a channel over a socket nobody reads fills, the home forwarding to it
    is held and so is the output of the shadows writing to that worker's clients; once the peer reads,
    both are released."""
    from pymq_server.cores import mesh as mesh_mod
    from pymq_server.cores.envelope import Kind

    class Home:
        drained: list = []

        def channel_drained(self, owner):
            self.drained.append(owner)

    class Shadow:
        def __init__(self):
            self.calls = []

        def hold_output(self, reason):
            self.calls.append(("hold", reason))

        def release_output(self, reason):
            self.calls.append(("release", reason))

    async def scenario():
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        m = mesh_mod.Mesh(0, 2, "/nonexistent", "pymq", loop, 1024 * 1024)
        _, channel = await loop.create_unix_connection(lambda: mesh_mod.Channel(m, 1), sock=a)
        channel.transport.set_write_buffer_limits(high=64 * 1024, low=16 * 1024)
        home = Home()
        towards_1, towards_2 = Shadow(), Shadow()
        m.shadows[(1, "w1c1")] = towards_1      # a shadow here of a connection whose home is worker 1
        m.shadows[(2, "w2c1")] = towards_2      # ... of worker 2: another channel, untouched
        for _ in range(2000):
            channel.send(Kind.FRAME, 0, f"c{_ % 7}", b"x" * 1000)
            if _ % 50 == 0:
                await asyncio.sleep(0)
            if channel.full:
                channel.hold(home)
                break
        assert channel.full and home.drained == []
        assert towards_1.calls == [("hold", "channel")] and towards_2.calls == []
        b.setblocking(False)
        for _ in range(2000):
            try:
                while b.recv(1 << 20):
                    pass
            except BlockingIOError:
                pass
            await asyncio.sleep(0.01)
            if home.drained:
                break
        assert home.drained == [1] and not channel.full
        assert towards_1.calls == [("hold", "channel"), ("release", "channel")] and towards_2.calls == []
        channel.transport.close()
        b.close()

    asyncio.run(scenario())
