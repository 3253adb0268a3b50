"""A connection whose destinations are all its worker's runs the one-process path (spec/cores.md §2.4).

In-process: a worker's broker core and its sessions (HomeSession over the real TCP adapter and a transport
that keeps what is written), the mesh not started (no other worker), so what is checked is which code a
frame goes through: after a hand-over, or accepted at the owner, nothing of worker mode is left per frame —
the owner of a destination is asked once per name, not once per frame — and the first name owned elsewhere
makes the connection decide every frame from then on, with what it did before kept whole (a receipt still
waiting, a transaction holding an operation).
"""
from __future__ import annotations

import asyncio
import functools
import socket
import time

import pytest

from pymq.protocol.scanner import encode_frame
from pymq_server.app import BrokerServer
from pymq_server.broker.session import BrokerSession
from pymq_server.config import BrokerConfig
from pymq_server.cores import handover
from pymq_server.cores.envelope import Kind
from pymq_server.cores.home import HomeSession, SpanningSession
from pymq_server.cores.mesh import Mesh
from pymq_server.cores.ownership import Ownership
from pymq_server.net.tcp import StompServerProtocol

from tests.fake_transport import RecordingTransport as Transport

WORKERS = 2


class FakeChannel:
    """The channel to the other worker: keeps the envelopes sent."""

    full = False

    def __init__(self) -> None:
        self.sent: list[tuple[Kind, str, bytes]] = []

    def send(self, kind: Kind, home: int, conn: str, payload: bytes = b"") -> None:
        self.sent.append((kind, conn, payload))


def names(owner: int, count: int, prefix: str = "/queue/onepath.") -> list[str]:
    o = Ownership(0, WORKERS, "pymq")
    return [n for n in (f"{prefix}{i}" for i in range(1000)) if o.owner(n) == owner][:count]


async def settle(condition, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.001)


async def worker(tmp_path, me: int):
    config = BrokerConfig.from_dict(dict(host="127.0.0.1", port=0, data_dir=str(tmp_path / "data"),
                                         sync_policy="never"))
    server = BrokerServer(config)
    await server.start_core()
    loop = asyncio.get_running_loop()
    mesh = Mesh(me, WORKERS, str(tmp_path), "pymq", loop, 1 << 20)
    mesh.broker = server.broker
    return server, mesh, functools.partial(HomeSession, mesh)


async def connect(server, session_type, sock: socket.socket | None = None) -> tuple[StompServerProtocol, Transport]:
    proto = StompServerProtocol(server.broker, asyncio.get_running_loop(), session_type)
    transport = Transport(sock)
    proto.connection_made(transport)
    proto.data_received(encode_frame("CONNECT", {"accept-version": "1.2", "host": "/", "login": "guest",
                                                 "passcode": "guest"}, b"", "1.2"))
    await settle(lambda: any(f.command == "CONNECTED" for f in transport.frames()))
    return proto, transport


def depth(server, queue: str) -> int:
    """Messages held (unacknowledged ones included) by a queue of the default vhost."""
    return server.broker.queues[queue.removeprefix("/queue/")].depth


def count_owner_calls(monkeypatch) -> list[str]:
    asked: list[str] = []
    original = Ownership.owner

    def owner(self, destination):
        asked.append(destination)
        return original(self, destination)
    monkeypatch.setattr(Ownership, "owner", owner)
    return asked


def send(proto: StompServerProtocol, destination: str, count: int, **headers: str) -> None:
    proto.data_received(b"".join(encode_frame("SEND", {"destination": destination, **headers}, b"m%d" % i, "1.2")
                                 for i in range(count)))


def test_a_connection_at_its_destinations_owner_takes_the_one_process_path(tmp_path, monkeypatch):
    async def scenario():
        server, mesh, session_type = await worker(tmp_path, 1)
        (queue,) = names(1, 1)
        asked = count_owner_calls(monkeypatch)
        consumer, ctransport = await connect(server, session_type)
        producer, ptransport = await connect(server, session_type)
        consumer.data_received(encode_frame("SUBSCRIBE", {"destination": queue, "id": "s",
                                                          "ack": "client-individual"}, b"", "1.2"))
        send(producer, queue, 200)
        producer.data_received(encode_frame("SEND", {"destination": queue, "receipt": "r"}, b"last", "1.2"))
        await settle(lambda: sum(f.command == "MESSAGE" for f in ctransport.frames()) == 201)
        consumer.data_received(b"".join(encode_frame("ACK", {"id": f.headers["ack"]}, b"", "1.2")
                                        for f in ctransport.frames() if f.command == "MESSAGE"))
        await settle(lambda: any(f.command == "RECEIPT" for f in ptransport.frames()))
        await settle(lambda: depth(server, queue) == 0)     # every message acknowledged
        for proto in (consumer, producer):
            session = proto.session
            # no method of worker mode on a frame's or a message's way: the class is the local one and the
            # per-frame, per-receipt and backpressure methods are the one-process session's
            assert type(session) is HomeSession
            for name in ("_handle", "_on_send", "write_receipt", "send_frame"):
                assert getattr(type(session), name) is getattr(BrokerSession, name), name
            assert isinstance(type(session).__dict__.get("writable", True), bool)
        # the owner was asked once per name and connection (the subscription's and the producer's first
        # SEND), not for each of the 201 SENDs and 201 ACKs
        assert asked == [queue, queue]
        assert [f.headers["pymq-worker"] for f in ptransport.frames() if f.command == "CONNECTED"] == ["1"]
        await server.stop()
    asyncio.run(scenario())


def test_an_adopted_connection_takes_the_one_process_path(tmp_path, monkeypatch):
    """What a hand-over gives the owner (a HANDOVER state and the bytes read behind the first frame): the
    connection runs as one accepted there, and its frames never meet a worker check."""
    async def scenario():
        server, mesh, session_type = await worker(tmp_path, 1)
        (queue,) = names(1, 1)
        asked = count_owner_calls(monkeypatch)
        consumer, ctransport = await connect(server, session_type)
        consumer.data_received(encode_frame("SUBSCRIBE", {"destination": queue, "id": "s"}, b"", "1.2"))
        doc = {"user": "guest", "roles": [], "subject": None, "version": "1.2", "client_id": None, "vhost": "/",
               "to_client": 0, "to_server": 0, "from": "w0c1"}
        unread = b"".join(encode_frame("SEND", {"destination": queue}, b"a%d" % i, "1.2") for i in range(50))
        adopted = handover.AdoptedProtocol(server.broker, asyncio.get_running_loop(), session_type, doc, unread)
        transport = Transport()
        adopted.connection_made(transport)
        send(adopted, queue, 50, receipt="after")
        await settle(lambda: sum(f.command == "MESSAGE" for f in ctransport.frames()) == 100)
        await settle(lambda: sum(f.command == "RECEIPT" for f in transport.frames()) == 50)
        session = adopted.session
        assert type(session) is HomeSession and session.user.name == "guest" and session.received == 100
        for name in ("_handle", "_on_send", "write_receipt"):
            assert getattr(type(session), name) is getattr(BrokerSession, name), name
        assert asked == [queue, queue]
        assert [f.body for f in ctransport.frames() if f.command == "MESSAGE"][:2] == [b"a0", b"a1"]
        await server.stop()
    asyncio.run(scenario())


def test_the_first_name_owned_elsewhere_makes_it_decide_and_keeps_what_was_done_here(tmp_path):
    """A receipt still waiting for the local store when the connection starts to span workers is given
    first, then the forwarded frame's once its owner confirms it; a transaction that holds an operation
    here cannot take one for the other worker (refused, nothing applied)."""
    async def scenario():
        server, mesh, session_type = await worker(tmp_path, 1)
        (local,) = names(1, 1)
        (remote,) = names(0, 1)
        channel = mesh.channels[0] = FakeChannel()   # type: ignore[assignment]
        producer, ptransport = await connect(server, session_type)
        producer.data_received(
            encode_frame("SEND", {"destination": local, "persistent": "true", "receipt": "r1"}, b"x", "1.2")
            + encode_frame("SEND", {"destination": remote, "receipt": "r2"}, b"y", "1.2"))
        session = producer.session
        assert type(session) is SpanningSession and session._ungated == 1     # r1 waits for the store
        assert [k for k, _, _ in channel.sent] == [Kind.OPEN, Kind.FRAME]     # forwarded (it held a receipt here)
        assert channel.sent[1][2].startswith(b"SEND\ndestination:" + remote.encode())
        await settle(lambda: any(f.command == "RECEIPT" for f in ptransport.frames()))
        # r1 is confirmed by this worker's store alone; r2 waits for its owner
        assert [f.headers["receipt-id"] for f in ptransport.frames() if f.command == "RECEIPT"] == ["r1"]
        session.from_owner(0, Kind.RECEIPT, encode_frame("RECEIPT", {"receipt-id": "r2", "message-id": "m"},
                                                          b"", "1.2"))
        await settle(lambda: sum(f.command == "RECEIPT" for f in ptransport.frames()) == 2)
        assert [f.headers["receipt-id"] for f in ptransport.frames() if f.command == "RECEIPT"] == ["r1", "r2"]

        other, otransport = await connect(server, session_type)
        other.data_received(encode_frame("BEGIN", {"transaction": "t"}, b"", "1.2")
                            + encode_frame("SEND", {"destination": local, "transaction": "t"}, b"1", "1.2")
                            + encode_frame("SEND", {"destination": remote, "transaction": "t"}, b"2", "1.2"))
        errors = [f for f in otransport.frames() if f.command == "ERROR"]
        assert errors and "would span workers" in errors[0].headers["message"], errors
        assert depth(server, local) == 1                # r1's message, nothing of the refused transaction
        await server.stop()
    asyncio.run(scenario())


@pytest.mark.parametrize("first", ["SEND", "SUBSCRIBE"])
def test_a_connection_whose_first_frame_names_another_workers_destination_still_moves(tmp_path, first):
    """The decision is still taken at the first frame: the hand-over is asked for (no channel here, so it
    stays and forwards, which a missing channel refuses as a restarting worker)."""
    async def scenario():
        server, mesh, session_type = await worker(tmp_path, 1)
        (remote,) = names(0, 1)
        moves = []
        original = HomeSession._move
        HomeSession._move = lambda self, owner, frame: (moves.append(owner), original(self, owner, frame))[1]
        a, b = socket.socketpair()
        try:
            proto, transport = await connect(server, session_type, a)   # a plain socket: it could move
            headers = {"destination": remote, **({"id": "s"} if first == "SUBSCRIBE" else {})}
            proto.data_received(encode_frame(first, headers, b"", "1.2"))
            await settle(lambda: any(f.command == "ERROR" for f in transport.frames()))
        finally:
            HomeSession._move = original
            a.close()
            b.close()
        assert moves == [0] and type(proto.session) is SpanningSession
        assert "restarting" in [f for f in transport.frames() if f.command == "ERROR"][0].headers["message"]
        await server.stop()
    asyncio.run(scenario())
