"""STOMP over WebSocket (RFC 6455) with a Python WebSocket client (aiohttp's): subprotocols, messages
exchanged with the SDK over TCP, frames split and batched across WebSocket messages, text and binary
payloads, and the TCP limits — frame size, CONNECT deadline, heart-beats, authentication, write-buffer
backpressure — applying unchanged (the WebSocket listener reuses the TCP adapter)."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import WSMsgType

import pymq
from pymq.protocol.scanner import FrameScanner, encode_frame
from tests.conftest import wait_for

WS = {"websocket": {"port": 0}}


def ws_url(broker, path: str = "/stomp") -> str:
    return f"http://127.0.0.1:{broker.server.websocket_port}{path}"


class WsClosed(Exception):
    def __init__(self, code) -> None:
        super().__init__(f"websocket closed ({code})")
        self.code = code


class WsStomp:
    """A STOMP client over one aiohttp WebSocket, reading frames with the project's scanner."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.scanner = FrameScanner(max_frame_size=64 * 1024 * 1024, version="1.2")
        self.frames: list = []
        self.kinds: list = []         # the WebSocket message type of each message received
        self.beats = 0

    async def send_raw(self, data: bytes, binary: bool = False) -> None:
        if binary:
            await self.ws.send_bytes(data)
        else:
            await self.ws.send_str(data.decode("utf-8"))

    async def send(self, command: str, headers: dict | None = None, body: bytes = b"",
                   binary: bool = False) -> None:
        await self.send_raw(encode_frame(command, headers or {}, body, "1.2"), binary)

    async def connect(self, login: str = "guest", passcode: str = "guest", **headers):
        await self.send("CONNECT", {"accept-version": "1.2", "host": "/", "login": login, "passcode": passcode,
                                    **headers})
        return await self.read()

    async def read(self, timeout: float = 5.0):
        deadline = time.monotonic() + timeout
        while not self.frames:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame")
            try:
                msg = await asyncio.wait_for(self.ws.receive(), remaining)
            except asyncio.TimeoutError:
                raise TimeoutError("no frame") from None
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                data = msg.data.encode("utf-8") if msg.type is WSMsgType.TEXT else msg.data
                self.kinds.append(msg.type)
                if data == b"\n":
                    self.beats += 1
                self.frames.extend(self.scanner.feed(data))
            else:
                raise WsClosed(self.ws.close_code)
        return self.frames.pop(0)

    async def read_until_closed(self, timeout: float = 5.0) -> list:
        out = []
        try:
            while True:
                out.append(await self.read(timeout))
        except WsClosed:
            return out


def no_sessions_left(broker, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker.call(lambda: len(broker.broker.sessions)) == 0:
            return True
        time.sleep(0.05)
    return False


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def _open(url: str, protocols=("v12.stomp", "v11.stomp", "v10.stomp"), **kw):
    session = aiohttp.ClientSession()
    try:
        ws = await session.ws_connect(url, protocols=protocols, autoping=True, **kw)
    except BaseException:
        await session.close()
        raise
    return session, ws


@pytest.mark.parametrize("offered, chosen", [
    (("v12.stomp",), "v12.stomp"), (("v11.stomp",), "v11.stomp"), (("v10.stomp",), "v10.stomp"),
    (("v10.stomp", "v12.stomp"), "v10.stomp"),           # the client's preference order
    ((), None),                                           # no subprotocol offered: still STOMP
])
def test_subprotocol_negotiation(broker_factory, offered, chosen):
    broker = broker_factory(**WS)

    async def go():
        session, ws = await _open(ws_url(broker), offered)
        async with session:
            assert ws.protocol == chosen
            client = WsStomp(ws)
            connected = await client.connect()
            assert connected.command == "CONNECTED" and connected.headers["version"] == "1.2"
            await ws.close()
    run(go())


def test_websocket_and_sdk_exchange_messages(broker_factory):
    broker = broker_factory(**WS)

    async def go():
        session, ws = await _open(ws_url(broker))
        async with session:
            client = WsStomp(ws)
            assert (await client.connect()).command == "CONNECTED"
            await client.send("SUBSCRIBE", {"id": "q", "destination": "/queue/from-sdk", "ack": "client-individual"})
            await client.send("SUBSCRIBE", {"id": "t", "destination": "/topic/news", "receipt": "r-sub"})
            assert (await client.read()).headers["receipt-id"] == "r-sub"
            await asyncio.to_thread(sdk_side)
            got = {}
            for _ in range(2):
                frame = await client.read()
                got[frame.headers["subscription"]] = frame
            assert got["q"].body == "héllo from the SDK".encode() and got["q"].headers["greeting"] == "yes"
            assert got["t"].body == b"breaking"
            await client.send("ACK", {"id": got["q"].headers["ack"]})
            await client.send("SEND", {"destination": "/queue/from-ws", "content-type": "text/plain",
                                       "receipt": "r-send", "color": "blue"}, "hi from a websocket".encode())
            assert (await client.read()).headers["receipt-id"] == "r-send"
            await client.send("DISCONNECT", {"receipt": "bye"})
            assert (await client.read()).headers["receipt-id"] == "bye"
        return client

    def sdk_side():
        with pymq.connect(broker.url) as conn:
            s = conn.create_session()
            s.create_producer(pymq.Queue("from-sdk")).send(pymq.TextMessage("héllo from the SDK",
                                                                             properties={"greeting": "yes"}))
            s.create_producer(pymq.Topic("news")).send("breaking")

    run(go())
    with pymq.connect(broker.url) as conn:
        m = conn.create_session().create_consumer(pymq.Queue("from-ws")).receive(5)
        assert m.text == "hi from a websocket" and m.properties["color"] == "blue"
    q = broker.broker.queues["from-sdk"]
    assert broker.call(lambda: (q.depth, q.acquired)) == (0, 0)      # the ACK over WebSocket counted


def test_frames_split_across_and_batched_in_websocket_messages(broker_factory):
    broker = broker_factory(**WS)

    async def go():
        session, ws = await _open(ws_url(broker))
        async with session:
            client = WsStomp(ws)
            await client.connect()
            two = (encode_frame("SEND", {"destination": "/queue/split", "n": "1"}, b"one", "1.2")
                   + encode_frame("SEND", {"destination": "/queue/split", "n": "2", "receipt": "r2"}, b"two", "1.2"))
            await client.send_raw(two)                                   # two frames, one message
            assert (await client.read()).headers["receipt-id"] == "r2"
            frame = encode_frame("SEND", {"destination": "/queue/split", "n": "3", "receipt": "r3"}, b"three",
                                 "1.2")
            for part in (frame[:5], frame[5:20], frame[20:]):           # one frame, three messages
                await client.send_raw(part, binary=True)
            assert (await client.read()).headers["receipt-id"] == "r3"
            raw = bytes(range(256))                                      # not UTF-8: a binary message
            await client.send("SEND", {"destination": "/queue/split", "n": "4", "receipt": "r4"}, raw, binary=True)
            assert (await client.read()).headers["receipt-id"] == "r4"
            await client.send("SUBSCRIBE", {"id": "s", "destination": "/queue/split"})
            bodies = [(await client.read()).body for _ in range(4)]
            assert bodies == [b"one", b"two", b"three", raw]
            # text while the payload is UTF-8 (what browsers expect), binary for the raw body
            assert WSMsgType.TEXT in client.kinds and client.kinds[-1] is WSMsgType.BINARY
            await ws.close()
    run(go())


def test_frame_size_limit_is_the_tcp_one(broker_factory):
    broker = broker_factory(max_frame_size=4096, **WS)

    async def go():
        session, ws = await _open(ws_url(broker))
        async with session:
            client = WsStomp(ws)
            await client.connect()
            await client.send("SEND", {"destination": "/queue/big"}, b"x" * 10_000)
            frames = await client.read_until_closed()
            assert frames[-1].command == "ERROR" and frames[-1].headers["pymq-code"] == "frame-too-large"
    run(go())
    assert no_sessions_left(broker)
    assert "big" not in broker.broker.queues or broker.broker.queues["big"].depth == 0


def test_a_large_body_goes_in_at_once_and_small_frames_within_the_budget(broker_factory, monkeypatch):
    """spec/stomp.md §10, the TCP adapter's rule over a real WebSocket: the rest of a large SEND whose head
    was read is decoded uncharged (4 MiB took at least 256 budget turns of 16 KiB, each pausing the socket),
    while the small frames after it in the same message are still charged: at most ``read_budget`` plus one
    feed a turn, so they still take turns of their own."""
    from pymq_server.net import websocket
    broker = broker_factory(**WS)
    spent: list[int] = []                       # what each budget turn charged, recorded as it ends
    next_turn = websocket.WebSocketConnection._next_turn

    def recording(self):
        spent.append(self._spent)
        next_turn(self)
    monkeypatch.setattr(websocket.WebSocketConnection, "_next_turn", recording)
    big = bytes(range(256)) * (16 * 1024)       # 4 MiB, not UTF-8
    small = b"".join(encode_frame("SEND", {"destination": "/queue/ws-budget", "n": str(i)}, b"s" * 200, "1.2")
                     for i in range(500))
    last = encode_frame("SEND", {"destination": "/queue/ws-budget", "receipt": "r-last"}, b"", "1.2")

    async def go():
        session, ws = await _open(ws_url(broker))
        async with session:
            client = WsStomp(ws)
            assert (await client.connect()).command == "CONNECTED"
            spent.clear()
            await client.send_raw(encode_frame("SEND", {"destination": "/queue/ws-budget"}, big, "1.2") + small
                                  + last, binary=True)                  # one WebSocket message
            assert (await client.read(30)).headers["receipt-id"] == "r-last"
            await ws.close()
    run(go())
    q = broker.broker.queues["ws-budget"]
    assert broker.call(lambda: q.depth) == 502
    turns = len(spent)
    assert turns < 64, turns                    # without the rule: over 256 (4 MiB / 16 KiB)
    budget = broker.broker.config.read_budget
    assert max(spent) <= budget + websocket.FEED, spent
    # the small frames were charged, the body not (the last turn's charge is not recorded: under a budget)
    assert len(small) <= sum(spent) + budget < len(small) + 64 * 1024, spent


def _ws_frame_head(opcode: int, length: int, mask: bytes = b"\x00\x00\x00\x00") -> bytes:
    """A client's (masked) WebSocket frame header announcing ``length`` payload bytes (RFC 6455 §5.2)."""
    import struct
    if length < 126:
        return bytes([0x80 | opcode, 0x80 | length]) + mask
    if length < 65536:
        return bytes([0x80 | opcode, 0x80 | 126]) + struct.pack("!H", length) + mask
    return bytes([0x80 | opcode, 0x80 | 127]) + struct.pack("!Q", length) + mask


def test_a_partial_websocket_message_is_checked_as_it_arrives(broker_factory):
    """The STOMP limits see WebSocket bytes as they come, not once a message is whole: a message that
    announces 1 GiB and starts with a CONNECT larger than max_connect_frame_size gets the TCP answer
    (ERROR frame-too-large) after the first few KiB, and nothing waits for the rest."""
    import base64
    import os
    import socket
    broker = broker_factory(**WS)
    with socket.create_connection(("127.0.0.1", broker.server.websocket_port), timeout=10) as sock:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(f"GET /stomp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                     f"Sec-WebSocket-Protocol: v12.stomp\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 101") and b"v12.stomp" in head
        # 1 GiB announced (zero mask: the payload goes as it is); 100 KiB of one CONNECT header sent
        sock.sendall(_ws_frame_head(0x2, 1 << 30) + b"CONNECT\nx:" + b"y" * 100_000)
        answer = b""
        deadline = time.monotonic() + 10
        while b"frame-too-large" not in answer and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            answer += chunk
        assert b"ERROR" in answer and b"frame-too-large" in answer, answer[:500]
    assert no_sessions_left(broker)


def test_connect_deadline_and_heartbeats_apply(broker_factory):
    broker = broker_factory(connect_timeout_ms=300, heartbeat_send_ms=100, heartbeat_recv_ms=100,
                            heartbeat_grace=2.0, **WS)

    async def go():
        session, ws = await _open(ws_url(broker))
        async with session:                                  # never sends CONNECT
            frames = await WsStomp(ws).read_until_closed(5)
            assert frames and frames[-1].command == "ERROR" and "CONNECT" in frames[-1].headers["message"]
        session, ws = await _open(ws_url(broker))
        async with session:
            client = WsStomp(ws)
            connected = await client.connect(**{"heart-beat": "100,100"})
            assert connected.headers["heart-beat"] == "100,100"
            started = time.monotonic()
            frames = await client.read_until_closed(5)        # we never beat: the broker gives up
            assert frames[-1].command == "ERROR" and frames[-1].headers["pymq-code"] == "heartbeat-timeout"
            assert client.beats >= 1                          # and it did beat to us meanwhile
            assert time.monotonic() - started < 5
    run(go())


def test_authentication_is_the_brokers(broker_factory, tmp_path):
    from pymq_server.broker.auth import save_user
    users = tmp_path / "users.yaml"
    save_user(str(users), "webuser", "s3cret", ["app"])
    broker = broker_factory(users_file=str(users), **WS)

    async def go():
        session, ws = await _open(ws_url(broker))
        async with session:
            client = WsStomp(ws)
            refused = await client.connect("webuser", "wrong")
            assert refused.command == "ERROR" and refused.headers["pymq-code"] == "authentication-failed"
        session, ws = await _open(ws_url(broker))
        async with session:
            client = WsStomp(ws)
            ok = await client.connect("webuser", "s3cret")
            assert ok.command == "CONNECTED" and ok.headers["user-name"] == "webuser"
            await ws.close()
    run(go())


def test_a_websocket_that_does_not_read_costs_bounded_broker_memory(broker_factory):
    """Deliveries to a browser that stopped reading pause at the write-buffer high-water mark (the TCP
    adapter's rule); the rest wait in their queue, counted, not in a buffer."""
    high = 64 * 1024
    broker = broker_factory(write_buffer_high=high, write_buffer_low=16 * 1024, **WS)
    count, size = 3000, 4096

    async def go():
        session, ws = await _open(ws_url(broker))
        async with session:
            client = WsStomp(ws)
            await client.connect()
            await client.send("SUBSCRIBE", {"id": "s", "destination": "/queue/slow", "receipt": "r"})
            assert (await client.read()).headers["receipt-id"] == "r"
            await asyncio.to_thread(flood)
            # the broker filled the browser's buffer and paused its deliveries (the session is not writable)
            assert await asyncio.to_thread(wait_for, lambda: broker.call(
                lambda: any(not s.writable for s in broker.broker.sessions.values())), 10)
            buffered = broker.call(lambda: [s.link.transport.get_write_buffer_size()
                                            for s in broker.broker.sessions.values()])
            queue = broker.broker.queues["slow"]
            waiting = broker.call(lambda: queue.ready.count)
            # spec/stomp.md §10, as for TCP: write_buffer_high plus one loop turn's gathered output
            assert len(buffered) == 1 and buffered[0] <= 2 * high + 2 * (size + 512), buffered
            assert waiting > 0                                # the rest waits in the queue
            received = 0
            while received < count:                           # reading again drains everything
                frame = await client.read(10)
                assert frame.command == "MESSAGE"
                received += 1
            await ws.close()

    def flood():
        with pymq.connect(broker.url) as conn:
            p = conn.create_session().create_producer(pymq.Queue("slow"))
            for _ in range(count):
                p.send(b"m" * size, delivery_mode=pymq.NON_PERSISTENT)

    run(go())


def test_plain_http_and_other_paths(broker_factory):
    broker = broker_factory(websocket={"port": 0, "path": "/ws/stomp"})

    async def go():
        async with aiohttp.ClientSession() as session:
            async with session.get(ws_url(broker, "/ws/stomp")) as resp:     # not an upgrade
                assert resp.status == 426 and "STOMP over WebSocket" in await resp.text()
                assert resp.headers["Upgrade"] == "websocket"
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:      # an upgrade, elsewhere
                await session.ws_connect(ws_url(broker, "/stomp"), protocols=("v12.stomp",))
            assert info.value.status == 404
            ws = await session.ws_connect(ws_url(broker, "/ws/stomp?client=1"), protocols=("v12.stomp",))
            client = WsStomp(ws)
            assert (await client.connect()).command == "CONNECTED"
            await ws.close()
    run(go())


def test_a_socket_that_never_upgrades_is_closed(broker_factory):
    import socket
    broker = broker_factory(connect_timeout_ms=300, **WS)
    with socket.create_connection(("127.0.0.1", broker.server.websocket_port), timeout=5) as sock:
        sock.sendall(b"GET /stomp HTTP/1.1\r\nHost: x\r\n")              # and never the rest
        started = time.monotonic()
        assert sock.recv(1024) == b""                                        # closed by the broker
        assert time.monotonic() - started < 5


def test_allowed_origins(broker_factory, tmp_path):
    from pymq_server.broker.auth import save_user
    users = tmp_path / "users.yaml"
    save_user(str(users), "webuser", "s3cret", ["app"])
    broker = broker_factory(users_file=str(users),
                            websocket={"port": 0, "allowed_origins": ["https://app.example.com"]})

    async def go():
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await session.ws_connect(ws_url(broker), protocols=("v12.stomp",),
                                         origin="https://evil.example.net")
            assert info.value.status == 403
            for origin in ("https://app.example.com", None):   # the listed page; a non-browser client
                ws = await session.ws_connect(ws_url(broker), protocols=("v12.stomp",), origin=origin)
                assert (await WsStomp(ws).connect("webuser", "s3cret")).command == "CONNECTED"
                await ws.close()
    run(go())
    assert no_sessions_left(broker)


async def _origin_login(broker, origin, login=None, passcode=None):
    """Upgrade with ``origin`` and CONNECT: the HTTP status of a refused upgrade, else the STOMP answer."""
    async with aiohttp.ClientSession() as session:
        try:
            ws = await session.ws_connect(ws_url(broker), protocols=("v12.stomp",), origin=origin)
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status
        client = WsStomp(ws)
        headers = {"accept-version": "1.2", "host": "/"}
        if login is not None:
            headers.update(login=login, passcode=passcode)
        await client.send("CONNECT", headers)
        frame = await client.read()
        await ws.close()
        return frame.command if frame.command == "CONNECTED" else frame.headers.get("pymq-code")


def test_by_default_only_pages_of_this_machine_may_connect(broker_factory):
    """Landed main allowed any origin by default, and with no users file a page from anywhere logged in as
    ``guest``, an administrator, through the browser of anyone on the broker's machine."""
    broker = broker_factory(**WS)

    async def go():
        assert await _origin_login(broker, "https://evil.example.net") == 403
        assert await _origin_login(broker, "null") == 403                      # a file, a sandboxed frame
        for origin in ("http://localhost:8080", "http://127.0.0.1", "https://[::1]:9000", None):
            assert await _origin_login(broker, origin) == "CONNECTED", origin
    run(go())
    assert no_sessions_left(broker)


def test_a_page_from_elsewhere_never_logs_in_as_a_loopback_only_user(broker_factory, tmp_path):
    """Even with ``allowed_origins: ['*']``: the connection comes from 127.0.0.1, but the page does not."""
    broker = broker_factory(websocket={"port": 0, "allowed_origins": ["*"]})

    async def go():
        assert await _origin_login(broker, "https://evil.example.net") == "authentication-failed"
        assert await _origin_login(broker, "https://evil.example.net", "guest", "guest") == "authentication-failed"
        assert await _origin_login(broker, "http://localhost:3000", "guest", "guest") == "CONNECTED"
    run(go())
    from pymq_server.broker.auth import save_user
    users = tmp_path / "users.yaml"
    save_user(str(users), "webuser", "s3cret", ["app"])
    remote = broker_factory(users_file=str(users), websocket={"port": 0, "allowed_origins": ["*"]})

    async def users_file():
        # a user not bound to loopback logs in from any allowed page
        assert await _origin_login(remote, "https://evil.example.net", "webuser", "s3cret") == "CONNECTED"
    run(users_file())
