"""An auto-ack delivery taken as the message arrives (the delivery side's common case, reached sooner), and a
fan-out's message ending once (placement.Placement._enter, queue.MessageQueue._pass).

Driven through real sessions and the real TCP adapter over a recording transport, in one process: what is
checked is what a client and an operator see (frames, queue statistics, the memory flow's figures)."""
from __future__ import annotations

import asyncio
from typing import Any

from pymq.protocol.scanner import encode_frame
from pymq_server.app import BrokerServer
from pymq_server.broker import flow as flow_module
from pymq_server.config import BrokerConfig
from pymq_server.net.tcp import StompServerProtocol

from tests.fake_transport import RecordingTransport


async def _broker(data_dir: str, **extra: Any) -> BrokerServer:
    config = BrokerConfig.from_dict(dict(host="127.0.0.1", port=0, data_dir=data_dir, sync_policy="never",
                                         storage={"devices": {"memory": {"kind": "memory"}}}, **extra))
    server = BrokerServer(config)
    await server.start_core()
    return server


def _connect(server: BrokerServer, loop: asyncio.AbstractEventLoop) -> tuple[StompServerProtocol, RecordingTransport]:
    proto = StompServerProtocol(server.broker, loop)
    transport = RecordingTransport()
    proto.connection_made(transport)   # type: ignore[arg-type]
    proto.data_received(encode_frame("CONNECT", {"accept-version": "1.2", "host": "/", "login": "guest",
                                                 "passcode": "guest"}, b"", "1.2"))
    return proto, transport


async def _until(condition: Any, what: str, limit: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not condition():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.001)


def test_a_fan_out_to_auto_ack_subscribers_ends_its_message_once(tmp_path, monkeypatch):
    """Four auto-ack subscribers each take and complete their copy as it is placed: the message ends once (its
    bytes uncounted once, the store told once), not once per subscriber (before: the memory flow's held bytes
    and messages went negative by three a message, so a topic's traffic hid the memory limit)."""
    gone: list[str] = []
    real = flow_module.MemoryFlow.message_gone

    def counting(self, message) -> None:   # type: ignore[no-untyped-def]
        gone.append(message.message_id)
        real(self, message)

    monkeypatch.setattr(flow_module.MemoryFlow, "message_gone", counting)

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
    gone: list[str] = []
    real = flow_module.MemoryFlow.message_gone

    def counting(self, message) -> None:   # type: ignore[no-untyped-def]
        gone.append(message.message_id)
        real(self, message)

    monkeypatch.setattr(flow_module.MemoryFlow, "message_gone", counting)

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
