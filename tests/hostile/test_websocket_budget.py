"""The WebSocket adapter under the TCP adapter's read budget (issue 24 item 7), on a loop the test drives.

Landed main decoded everything a socket read held in one go and handed every WebSocket frame's payload to
the STOMP adapter at once; one-byte fragments made each byte a wsproto frame and a call, and while the
STOMP side had paused (its own budget, a CONNECT being checked) each byte was joined onto what it held
(quadratic).  A client sending one-byte fragments held a TCP bystander to 24 round trips in 10 s (991
against a TCP flooder); bench/fairness.py --flooder ws-fragments measures it (bench/README.md).  Here:
what one loop turn decodes is bounded by ``read_budget`` charged per byte read and per frame decoded, the
rest waits with the socket paused, nothing is decoded while the STOMP side is paused, and every byte
arrives once, in order.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pymq_server.config import BrokerConfig
from pymq_server.net import websocket
from tests.hostile.test_watchdog import FakeLoop

BUDGET = 16 * 1024
UPGRADE = (b"GET /stomp HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
           b"Sec-WebSocket-Protocol: v12.stomp\r\n\r\n")


def fragments(payload: bytes) -> bytes:
    """One binary message of one-byte fragments, masked with a zero key (7 bytes a payload byte)."""
    out = bytearray()
    for i, byte in enumerate(payload):
        out += bytes([(0x80 if i == len(payload) - 1 else 0) | (0x2 if i == 0 else 0x0), 0x81, 0, 0, 0, 0, byte])
    return bytes(out)


class Socket:
    """The socket's transport: records pauses and what was written."""

    def __init__(self):
        self.reading = True
        self.written = bytearray()
        self.closed = False

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True

    def write(self, data):
        self.written += data

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default


class Stomp:
    """Stands in for the STOMP adapter: records each payload with the loop turn it came in."""

    def __init__(self, broker, loop, *args):
        self.loop = loop
        self.parts: list[tuple[float, bytes]] = []
        self.transport = None
        self.pause_after: int | None = None
        self.session = SimpleNamespace(conn=SimpleNamespace(body_missing=0))     # the scanner's, as told

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.parts.append((self.loop.turn, bytes(data)))
        if self.pause_after is not None and sum(len(p) for _, p in self.parts) >= self.pause_after:
            self.pause_after = None
            self.transport.pause_reading()          # as the adapter does: budget, CONNECT, output

    def connection_lost(self, exc):
        pass


class TurnLoop(FakeLoop):
    """A fake loop whose turns the test runs: what call_soon schedules runs in the next turn, as in asyncio
    (a callback scheduled during a turn waits for the one after)."""

    def __init__(self):
        super().__init__()
        self.turn = 0
        self.ready: list = []

    def call_soon(self, fn, *args):
        handle = SimpleNamespace(fn=fn, args=args, cancelled=False)
        handle.cancel = lambda: setattr(handle, "cancelled", True)
        self.ready.append(handle)
        return handle

    def run_turn(self):
        self.turn += 1
        ready, self.ready = self.ready, []
        for handle in ready:
            if not handle.cancelled:
                handle.fn(*handle.args)


@pytest.fixture
def upgraded(monkeypatch):
    monkeypatch.setattr(websocket, "StompServerProtocol", Stomp)
    loop = TurnLoop()
    broker = SimpleNamespace(config=BrokerConfig(read_budget=BUDGET))
    conn = websocket.WebSocketConnection(broker, loop, "/stomp", websocket.origins(None))
    sock = Socket()
    conn.connection_made(sock)
    conn.data_received(UPGRADE)
    assert sock.written.startswith(b"HTTP/1.1 101")
    return conn, sock, loop



def _drain_within(loop, conn, sock, per_turn: int, payload: bytes) -> None:
    """Run turns until the socket is read again: at most ``per_turn`` frames decoded in any turn, and every
    byte of ``payload`` handed on once, in order."""
    turns = 0
    while not sock.reading:
        loop.run_turn()
        turns += 1
        assert turns < 1000
    counts: dict[float, int] = {}
    for turn, _ in conn.stomp.parts:
        counts[turn] = counts.get(turn, 0) + 1
    assert max(counts.values()) <= per_turn, counts
    assert b"".join(p for _, p in conn.stomp.parts) == payload

def test_one_byte_fragments_are_decoded_within_the_budget_a_turn(upgraded):
    conn, sock, loop = upgraded
    payload = bytes(range(256)) * 40                     # 10 KiB: 70 KiB of one-byte fragments
    conn.data_received(fragments(payload))
    per_turn = BUDGET // getattr(websocket, "FRAME_COST", 64) + 1          # frames decoded a turn, at most
    first = len(conn.stomp.parts)
    assert 0 < first <= per_turn, first                  # landed main: all 10,240 in this call
    assert not sock.reading                              # the rest waits in hand, the socket unread
    _drain_within(loop, conn, sock, per_turn, payload)


def test_nothing_is_decoded_while_the_stomp_side_pauses(upgraded):
    conn, sock, loop = upgraded
    conn.stomp.pause_after = 100
    payload = b"x" * 3000
    conn.data_received(fragments(payload))
    assert sum(len(p) for _, p in conn.stomp.parts) == 100          # not one byte past the pause
    for _ in range(5):
        loop.run_turn()
    assert sum(len(p) for _, p in conn.stomp.parts) == 100
    assert not sock.reading
    conn.stomp.transport.resume_reading()
    for _ in range(50):
        loop.run_turn()
    assert b"".join(p for _, p in conn.stomp.parts) == payload
    assert sock.reading


def test_whole_frames_go_through_at_the_tcp_rate(upgraded):
    """Large frames cost their bytes: a 64 KiB message in one frame is handed over within four turns."""
    conn, sock, loop = upgraded
    payload = b"y" * 65536
    frame = bytes([0x82, 0x80 | 127]) + len(payload).to_bytes(8, "big") + b"\0\0\0\0" + payload
    conn.data_received(frame)
    for _ in range(4):
        if sock.reading:
            break
        loop.run_turn()
    loop.run_turn()
    assert b"".join(p for _, p in conn.stomp.parts) == payload


def test_the_rest_of_a_large_body_is_decoded_uncharged(upgraded):
    """spec/stomp.md §10: the rest of a large body whose head was read goes in whatever the budget (the TCP
    adapter's rule, tcp.unbudgeted): a 1 MiB frame of it is decoded in the turn it was read, where its bytes
    charged made 64 turns of 16 KiB; what follows it is charged as usual."""
    conn, sock, loop = upgraded
    payload = bytes(range(256)) * 4096
    conn.stomp.session.conn.body_missing = len(payload) + 1
    frame = bytes([0x82, 0x80 | 127]) + len(payload).to_bytes(8, "big") + b"\0\0\0\0" + payload
    conn.data_received(frame + fragments(b"z" * 2000))
    assert b"".join(p for _, p in conn.stomp.parts[:1]) == payload and conn.stomp.parts[0][0] == 0
    assert conn._spent <= BUDGET + websocket.FEED and not sock.reading       # the fragments after it wait


def test_a_large_body_sent_in_one_byte_fragments_is_still_bounded_a_turn(upgraded):
    """Its bytes are not charged, but each WebSocket frame decoded still is (FRAME_COST): a body declared
    large and sent a byte a frame costs the loop no more a turn than any other one-byte fragments."""
    conn, sock, loop = upgraded
    conn.stomp.session.conn.body_missing = 1 << 30
    payload = bytes(range(256)) * 40
    conn.data_received(fragments(payload))
    per_turn = BUDGET // websocket.FRAME_COST + 1
    assert 0 < len(conn.stomp.parts) <= per_turn and not sock.reading
    _drain_within(loop, conn, sock, per_turn, payload)
