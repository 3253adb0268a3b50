"""STOMP over WebSocket (RFC 6455; subprotocols ``v12.stomp``, ``v11.stomp``, ``v10.stomp``).

A WebSocket listener is an asyncio server like the STOMP ones (plain or TLS) whose connections speak HTTP
until the upgrade, then WebSocket framing.  wsproto (python-hyper's sans-IO WebSocket and handshake
state machine, on h11) does both; everything STOMP is the TCP adapter's: each accepted WebSocket gets the
same :class:`~pymq_server.net.tcp.StompServerProtocol` a TCP connection gets, in front of a
:class:`WebSocketTransport` that turns its writes into WebSocket messages.  So authentication, the CONNECT
deadline, heart-beats, frame/header limits, the bounds on unauthenticated input, read budgets,
write-buffer backpressure and memory flow control are one implementation for both transports.

Bytes in are *streamed*: wsproto hands over each piece of a text or binary message as it arrives, and
the piece goes straight to the STOMP session, which applies its limits to it exactly as to TCP bytes — a
WebSocket message is never buffered whole, so its size is no limit of its own (a client may put one
frame per message, several, or split one).  Text messages are valid UTF-8 by RFC 6455 (wsproto closes
with 1007 otherwise) and their bytes are the UTF-8 encoding.  Permessage-deflate is not offered (a
compressed message could expand past every limit).

The read budget is the TCP adapter's (``read_budget`` per connection per event-loop turn, spec/stomp.md
§10 "Fairness"), charged on what the broker does: every byte read from the socket, and
:data:`FRAME_COST` more for every WebSocket frame decoded (a frame is parsed in Python whatever it
carries: a client sending one-byte fragments cost the broker far more per byte than a TCP client, and on
issue 24's main held a TCP bystander to 24 round trips in 10 s).  The rest of a large body whose head was
read is decoded uncharged, as the TCP adapter hands it over whatever the budget (``tcp.unbudgeted``, the
one rule); its frames still cost :data:`FRAME_COST` each.  What is read over the budget waits for
the next turn with the socket not read; while the STOMP side pauses reading (flow control, a CONNECT
being checked, a full outgoing buffer, its own budget) no frame is decoded at all, so the socket read
that was in hand is all that waits.

Bytes out: each write (the TCP adapter gathers a loop turn's frames, or writes one slice of a large body)
becomes one message: a text message when it is valid UTF-8, which browser clients expect, and a binary one
otherwise.  Writes go to the socket's own transport, so its write-buffer limits and pause/resume are the
TCP ones.

Before the upgrade: the request must complete within ``connect_timeout_ms`` and its head is bounded by
h11 (16 KiB); a path other than ``websocket.path`` gets 404, an ``Origin`` outside
``websocket.allowed_origins`` 403, a request that is not a WebSocket upgrade 426 (400 when malformed).

Browser pages (spec/stomp.md §11): unless ``allowed_origins`` says otherwise only pages served from this
machine may connect, and a page from elsewhere — allowed or not by that list — is never judged to be on
loopback: its connection's ``login_host`` is its origin, so a loopback-only user (``guest`` without a
users file, an administrator) cannot be used by any web page the broker's own user happens to open.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections import deque
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Event, Ping, RejectConnection, RejectData,
                            Request, TextMessage)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from pymq_server.net.tcp import StompServerProtocol, unbudgeted

log = logging.getLogger("pymq.net.websocket")

SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")
_NORMAL_CLOSURE = 1000
#: what decoding one WebSocket frame costs against the read budget, beyond its bytes (measured with
#: bench/fairness.py --flooder ws-fragments: about what a frame costs wsproto over 64 bytes of STOMP)
FRAME_COST = 64
#: socket bytes handed to wsproto at a time (it parses them lazily, a frame per event taken)
FEED = 4096


class WebSocketTransport(asyncio.Transport):
    """What a :class:`StompServerProtocol` writes to, closes and pauses: the socket's transport, with each
    write sent as one WebSocket message."""

    def __init__(self, connection: WebSocketConnection) -> None:
        super().__init__()
        self._connection = connection
        self._socket: asyncio.Transport = connection.transport  # type: ignore[assignment]
        self._closing = False

    # -- the STOMP adapter's calls, forwarded to the socket ----------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "websocket":
            return self._connection
        if name == "foreign_origin":            # a page served from elsewhere (see the module docstring)
            return self._connection.foreign_origin
        return self._socket.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._closing or self._socket.is_closing()

    def pause_reading(self) -> None:
        self._connection.pause("stomp")

    def resume_reading(self) -> None:
        self._connection.resume("stomp")

    def is_reading(self) -> bool:
        return not self._connection.pauses

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._socket.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._socket.get_write_buffer_limits()

    def get_write_buffer_size(self) -> int:
        return self._socket.get_write_buffer_size()

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("a WebSocket has no half-close; use close()")

    # -- writing -----------------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        data = bytes(data)
        if data.isascii():
            message: TextMessage | BytesMessage = TextMessage(data=data.decode("ascii"))
        else:
            try:
                message = TextMessage(data=data.decode("utf-8"))
            except UnicodeDecodeError:          # a binary body, or a slice that cuts a character
                message = BytesMessage(data=data)
        self._connection.send(message)

    def writelines(self, list_of_data) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        """A close message after what is queued, then the socket (asyncio sends its buffer first)."""
        if self._closing:
            return
        self._closing = True
        self._connection.close(_NORMAL_CLOSURE)

    def abort(self) -> None:
        self._closing = True
        self._socket.abort()


class WebSocketConnection(asyncio.Protocol):
    """One socket of the WebSocket listener: the HTTP upgrade, then STOMP over WebSocket messages."""

    def __init__(self, broker, loop: asyncio.AbstractEventLoop, path: str,
                 allowed_origins: OriginRule) -> None:
        self.broker = broker
        self.loop = loop
        self.path = path
        self.allowed_origins = allowed_origins
        self.ws = WSConnection(ConnectionType.SERVER)
        self.transport: asyncio.Transport | None = None
        self.stomp: StompServerProtocol | None = None
        self.subprotocol: str | None = None
        self.foreign_origin: str | None = None     # the Origin of a page not served from this machine
        self._deadline: asyncio.TimerHandle | None = None
        self._closed = False
        # input after the upgrade, under the read budget (see the module docstring)
        self.pauses: set[str] = set()             # why the socket is not read: stomp, budget
        self._budget = broker.config.read_budget
        self._spent = 0                           # charged this loop turn
        self._input: deque[bytes | memoryview] = deque()     # read, not yet handed to wsproto
        self._events: Iterator[Event] | None = None          # wsproto's, left mid-way when the budget ran out
        self._turn: asyncio.Handle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # the upgrade must come in time: a socket that never sends a request holds nothing for long
        self._deadline = self.loop.call_later(self.broker.config.connect_timeout_ms / 1000, self._too_slow)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        if self.stomp is None:
            # the upgrade request (h11 bounds its head); what follows it in the same read is taken below
            if self._feed(data):
                self._take()
            return
        self._input.append(data)
        self._take()

    def _feed(self, data: bytes | memoryview) -> bool:
        try:
            self.ws.receive_data(bytes(data))
        except RemoteProtocolError as exc:     # not a WebSocket upgrade, or a malformed one
            self._reject(exc.event_hint, str(exc))
            return False
        except LocalProtocolError:             # bytes after the connection closed
            return False
        return True

    def _take(self) -> None:
        """Decode and hand over what was read, within this turn's budget; the rest waits (socket paused)."""
        while not self._closed:
            if self.stomp is not None and (self.pauses - {"budget"} or self._spent >= self._budget):
                break
            if self._events is None:
                self._events = self.ws.events()
            event = next(self._events, None)
            if event is None:
                self._events = None
                if not self._input:
                    break
                data = self._input.popleft()
                # the rest of a large body whose head was read is decoded uncharged, in one piece as far
                # as it was read (tcp.unbudgeted, the TCP adapter's rule); the frames carrying it still cost
                # FRAME_COST each, and the bytes past it (its frames' heads, what follows) count as usual
                stomp = self.stomp
                missing = unbudgeted(stomp.session) if stomp is not None and stomp.session is not None else 0
                size = FEED + missing
                if len(data) > size:
                    view = data if isinstance(data, memoryview) else memoryview(data)
                    self._input.appendleft(view[size:])
                    data = view[:size]
                self._spent += len(data) - missing if len(data) > missing else 0
                if not self._feed(data):
                    return
                continue
            self._spent += FRAME_COST
            self._handle(event)
        if self._closed or self.stomp is None:
            return
        if self._input or self._spent >= self._budget:
            self.pause("budget")
            if self._turn is None:
                self._turn = self.loop.call_soon(self._next_turn)
        else:
            self.resume("budget")

    def _next_turn(self) -> None:
        self._turn = None
        self._spent = 0
        self._take()

    def _handle(self, event: Event) -> None:
        if isinstance(event, (TextMessage, BytesMessage)):
            chunk = event.data.encode("utf-8") if isinstance(event, TextMessage) else bytes(event.data)
            if chunk and self.stomp is not None:
                self.stomp.data_received(chunk)
        elif isinstance(event, Request):
            self._upgrade(event)
        elif isinstance(event, Ping):
            self.send(event.response())
        elif isinstance(event, CloseConnection):
            if self.ws.state is ConnectionState.REMOTE_CLOSING:
                self.send(event.response())
            self._close_socket()

    def pause(self, reason: str) -> None:
        """Stop reading the socket for ``reason`` (``stomp``: the STOMP adapter asked; ``budget``)."""
        if not self.pauses and self.transport is not None and not self._closed:
            self.transport.pause_reading()
        self.pauses.add(reason)

    def resume(self, reason: str) -> None:
        if reason not in self.pauses:
            return
        self.pauses.discard(reason)
        if reason == "stomp" and self._turn is None and not self._closed:
            # what waited while the STOMP side could not take it: on, in a turn of its own
            self._turn = self.loop.call_soon(self._next_turn)
        if not self.pauses and self.transport is not None and not self._closed:
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.transport = None
        self._input.clear()
        self._events = None
        if self._turn is not None:
            self._turn.cancel()
            self._turn = None
        if self._deadline is not None:
            self._deadline.cancel()
        if self.stomp is not None:
            self.stomp.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.stomp is not None:
            self.stomp.pause_writing()

    def resume_writing(self) -> None:
        if self.stomp is not None:
            self.stomp.resume_writing()

    # -- the upgrade -------------------------------------------------------------------------------
    def _upgrade(self, request: Request) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if request.target.split("?", 1)[0] != self.path:
            self._reject(RejectConnection(status_code=404), f"no WebSocket endpoint at {request.target}")
            return
        origin = next((value.decode("latin-1") for name, value in request.extra_headers
                       if name.lower() == b"origin"), None)
        if origin is not None and not self.allowed_origins.allows(origin):
            log.info("websocket from %s refused: origin %s is not in websocket.allowed_origins",
                     self._peer(), origin)
            self._reject(RejectConnection(status_code=403),
                         f"origin {origin} may not connect (websocket.allowed_origins)")
            return
        if origin is not None and not loopback_origin(origin):
            self.foreign_origin = origin
        # the client's preference order; none offered (or none of ours) is still STOMP
        self.subprotocol = next((p for p in request.subprotocols if p in SUBPROTOCOLS), None)
        self.send(AcceptConnection(subprotocol=self.subprotocol))
        self.stomp = StompServerProtocol(self.broker, self.loop)
        self.stomp.connection_made(WebSocketTransport(self))

    def _reject(self, hint: Event | None, reason: str) -> None:
        """Answer a failed upgrade over HTTP: with wsproto's suggested response when it made one."""
        if not isinstance(hint, RejectConnection):
            hint = None
        status = hint.status_code if hint is not None else 400
        headers = list(hint.headers) if hint is not None else []
        if "Connection: Upgrade" in reason or "'Upgrade: websocket'" in reason:
            status, reason = 426, f"this endpoint speaks STOMP over WebSocket (subprotocols " \
                                  f"{', '.join(SUBPROTOCOLS)})"
            headers.append((b"Upgrade", b"websocket"))
        body = (reason + "\n").encode("utf-8")
        headers += [(b"Content-Type", b"text/plain; charset=utf-8"), (b"Content-Length", str(len(body)).encode())]
        try:
            self.send(RejectConnection(status_code=status, headers=headers, has_body=True))
            self.send(RejectData(data=body, body_finished=True))
        except LocalProtocolError:
            pass
        self._close_socket()

    def _too_slow(self) -> None:
        self._deadline = None
        if self.stomp is None and not self._closed:
            log.info("websocket from %s: no upgrade request in time, closing", self._peer())
            self._close_socket()

    # -- for the transport ---------------------------------------------------------------------------
    def send(self, event) -> None:
        if self._closed or self.transport is None or self.transport.is_closing():
            return
        try:
            data = self.ws.send(event)
        except LocalProtocolError:       # the WebSocket is already closing: nothing more may go out
            return
        if data:
            self.transport.write(data)

    def close(self, code: int) -> None:
        if self.ws.state is ConnectionState.OPEN:
            self.send(CloseConnection(code=code))
        self._close_socket()

    def _close_socket(self) -> None:
        self._closed = True                 # nothing read after this reaches the session
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return peer[0] if isinstance(peer, tuple) else "?"


class OriginRule:
    """``websocket.allowed_origins`` as the listener applies it: a set of origins, any (``*``), or, unset,
    the pages of this machine (loopback origins)."""

    def __init__(self, allowed: list[str] | None) -> None:
        self.any = allowed is not None and "*" in allowed
        self.listed = None if allowed is None else frozenset(o.rstrip("/").lower() for o in allowed)

    def allows(self, origin: str) -> bool:
        if self.any:
            return True
        if self.listed is None:
            return loopback_origin(origin)
        return origin.rstrip("/").lower() in self.listed


def refusal_response() -> bytes:
    """What a socket over ``max_connections`` gets at accept: 503, before its upgrade request is read."""
    body = b"the broker has as many connections as it accepts (max_connections); try again later\n"
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)) + body


def origins(allowed: list[str] | None) -> OriginRule:
    """The ``websocket.allowed_origins`` setting as the listener compares it."""
    return OriginRule(allowed)


def loopback_origin(origin: str) -> bool:
    """Whether a page's ``Origin`` is served from this machine: ``http(s)://`` with the host ``localhost``
    (or a name under it) or a loopback address.  ``null`` (a file, a sandboxed frame) is not."""
    try:
        parts = urlsplit(origin.strip())
        host = parts.hostname
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
