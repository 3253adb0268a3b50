"""STOMP over TCP: the asyncio adapter between sockets and broker sessions.

One :class:`StompServerProtocol` per connection.  It owns the transport and the read side and is the
session's *link*; it composes the connection's output (``output.py``: the pieces queued to write and their
backpressure) and its clocks (``watchdog.py``: heart-beats and the peer's deadlines).  What one connection
may cost is bounded at this seam between the socket and the broker (spec/stomp.md §10):

* **Input.**  At most ``read_budget`` bytes are handed to the session per event-loop turn; the rest of
  a read waits (reading paused) for the next turn, so one pipelining client cannot hold the loop (the
  rest of a large body being received goes in at once: it is only copied, and completes one frame).
  Until CONNECTED a frame may be at most ``max_connect_frame_size`` bytes, reading pauses while a
  CONNECT is being checked (what follows it waits in the socket, not in the broker), and the bytes held
  for all connections that have not logged in share one cap, ``max_unauthenticated_bytes``.
* **Output.**  Frames are queued here as pieces: a MESSAGE's body is the message's own bytes object,
  referenced — never copied per subscriber — and handed to the transport in slices only while the
  transport's buffer is under its high-water mark.  While the bytes queued here and in the transport
  pass ``write_buffer_high``, the session gets no deliveries *and reading pauses*: a client that does
  not read cannot make the broker pile up receipts or errors for it either.
* **Time.**  A peer that promised heart-beats is dead ``heartbeat_grace`` × its interval after the last
  byte received (a deadline, not a sample); a frame must complete ``frame_timeout_ms`` after its first
  byte plus one second per ``frame_min_rate`` bytes of it, heart-beats or not.  While reading is paused
  by the broker the peer cannot be judged, and both clocks restart when it resumes.

Writes are gathered per loop iteration (a consumer fed by a burst of SENDs costs one syscall, not one
per message).
"""
from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import cast

from pymq.errors import PymqError, ResourceLimit, error_headers
from pymq.protocol.connection import State, StompConnection, message_head
from pymq.protocol.frame import Frame
from pymq.protocol.scanner import encode_frame
from pymq_server.broker.consumer import Consumer
from pymq_server.broker.entry import Entry
from pymq_server.broker.outlet import BrowseEntry
from pymq_server.broker.session import BrokerSession
from pymq_server.net.output import Output
from pymq_server.net.tls import peer_subject
from pymq_server.net.watchdog import Watchdog

log = logging.getLogger("pymq.net")

class UnauthenticatedBytes:
    """Bytes the broker holds for connections that have not received CONNECTED, broker-wide."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0


_unauthenticated: weakref.WeakKeyDictionary[object, UnauthenticatedBytes] = weakref.WeakKeyDictionary()


def unauthenticated_bytes(broker) -> UnauthenticatedBytes:
    """The one account of ``broker`` (created on first use)."""
    account = _unauthenticated.get(broker)
    if account is None:
        account = _unauthenticated[broker] = UnauthenticatedBytes(broker.config.max_unauthenticated_bytes)
    return account


def refusal_frame(limit: int) -> bytes:
    """The ERROR frame a socket over ``max_connections`` gets at accept, before its CONNECT is read."""
    exc = ResourceLimit(f"the broker already has {limit} connections (max_connections); try again later",
                        limit=limit)
    return encode_frame("ERROR", error_headers(exc), exc.message.encode(), "1.0")


def unbudgeted(session: BrokerSession) -> int:
    """Input bytes ``session`` takes next whatever the read budget (spec/stomp.md §10): the rest of a large
    body whose head was read (the scanner's ``body_missing``, its NUL included; 0 otherwise).  They are only
    copied into that body (nothing is handled before its NUL) and complete one frame, so they are never held
    back a turn; the bytes after them count as usual.  16 KiB a turn made a bulk SEND's 8 MiB 512 turns, each
    pausing and resuming the socket (a sixth of the broker's CPU of a bulk write, measured).  The one rule of
    both adapters: the TCP one hands them over at once, the WebSocket one decodes them uncharged (each
    WebSocket frame still costs its ``FRAME_COST``, so a body sent in tiny fragments is bounded as before)."""
    return session.conn.body_missing


class StompServerProtocol(asyncio.Protocol):
    """One STOMP connection over a socket: the session's link.  It owns the transport and the read side
    (the per-turn read budget, why reading is paused, the bytes held before login) and composes the
    connection's :class:`~pymq_server.net.output.Output` (what is queued to write, backpressure) and
    :class:`~pymq_server.net.watchdog.Watchdog` (heart-beats and the peer's deadlines)."""

    def __init__(self, broker, loop: asyncio.AbstractEventLoop,
                 session_type: Callable[..., BrokerSession] = BrokerSession) -> None:
        self.broker = broker
        self.session_type = session_type    # the multi-worker broker's HomeSession (server/cores)
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.session: BrokerSession | None = None
        self.certificate_subject: str | None = None
        self.login_host: str | None = None
        self._heads: dict[str, bytes] = {}      # subscription id -> its MESSAGE head (message_head)
        cfg = broker.config
        self._budget = cfg.read_budget
        self._closing = False
        # output; high availability's serving check (None without ha:) guards every flush
        self.output = Output(self, loop, cfg.write_buffer_high, cfg.write_buffer_low, broker.serving)
        # input
        self._pauses: set[str] = set()      # why reading is paused: session, connect, output, budget
        self._turn_bytes = 0                # handed to the session during this loop turn
        self._turn_scheduled = False
        # read, over this turn's budget: handled next turn (a view: the rest of a read is never copied)
        self._backlog: bytes | memoryview | None = None
        self._connected = False             # CONNECTED sent
        self._unauth = unauthenticated_bytes(broker)
        self._unauth_held = 0               # this connection's share of the broker-wide account
        self.watchdog = Watchdog(self, loop, self.output, cfg.heartbeat_grace, cfg.frame_timeout_ms,
                                 cfg.frame_min_rate)

    @property
    def closing(self) -> bool:
        return self._closing

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)    # a stream: create_server's
        cfg = self.broker.config
        transport.set_write_buffer_limits(high=cfg.write_buffer_high, low=cfg.write_buffer_low)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                import socket
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) else None
        self.certificate_subject = peer_subject(transport)   # mutual TLS: read by CONNECT
        # where a login is judged to come from (loopback-only users): a browser page's origin when it is
        # not this machine's (server/net/websocket.py), else the peer's address
        self.login_host = transport.get_extra_info("foreign_origin") or host
        session = self.session = self.session_type(self.broker, self, host, self.broker.new_connection_id())
        session.conn.limit_until_connected(cfg.max_connect_frame_size)
        self.watchdog.expect_connect(cfg.connect_timeout_ms / 1000)

    def data_received(self, data: bytes) -> None:
        self.watchdog.last_rx = self.loop.time()
        if self._closing:
            return
        if self._backlog is not None:       # already over budget this turn (reading is paused)
            self._backlog = b"".join((self._backlog, data))
            return
        self._take(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self.watchdog.cancel()
        self.output.close()
        self._backlog = None
        self._release_unauthenticated()
        if self.session is not None:
            self.session.connection_lost()

    def pause_writing(self) -> None:
        self.output.pause_writing()

    def resume_writing(self) -> None:
        self.output.resume_writing()

    # -- input -----------------------------------------------------------------------------------
    def _take(self, data: bytes | memoryview) -> None:
        """Hand ``data`` to the session within this turn's read budget; keep the rest for later turns.
        Both halves of a read cut by the budget are views of it: a 256 KiB read handed over 16 KiB a turn
        is not copied again each turn (it was: the whole rest every time, 8 copies of each byte)."""
        session = self.session
        if session is None:                 # nothing is read before connection_made
            return
        room = self._budget - self._turn_bytes
        if len(data) > room:
            room = max(room, unbudgeted(session))
        if len(data) > room:
            if room <= 0:
                self._backlog = data
                self._pause("budget")
                self._schedule_turn()
                return
            view = data if isinstance(data, memoryview) else memoryview(data)
            self._backlog = view[room:]
            data = view[:room]
            self._pause("budget")
        self._turn_bytes += len(data)
        self._schedule_turn()
        try:
            session.data_received(data)
        except Exception:  # a broker bug must cost one connection, never the broker
            log.exception("internal error on connection %s", session.id)
            session.fail(PymqError("internal broker error; the connection is closed"))
        if not self._closing and not session.closed:
            self._after_input(session)

    def _schedule_turn(self) -> None:
        if not self._turn_scheduled:
            self._turn_scheduled = True
            self.loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """A new loop turn: a fresh budget, and what was held back from the last one."""
        self._turn_scheduled = False
        self._turn_bytes = 0
        if self._closing:
            return
        data, self._backlog = self._backlog, None
        if data is not None:
            self._take(data)
        if self._backlog is None:
            self._resume("budget")

    def _after_input(self, session: BrokerSession) -> None:
        conn = session.conn
        if not self._connected:
            if conn.state is State.CONNECTING:
                # the CONNECT is being checked (a slow hash in a worker thread): what follows it waits
                # in the socket until CONNECTED, not in the broker's memory
                self._pause("connect")
            self._account_unauthenticated(session)
        self.watchdog.partial(conn.buffered)

    def _account_unauthenticated(self, session: BrokerSession) -> None:
        held = session.conn.buffered + session.held_bytes
        account = self._unauth
        account.held += held - self._unauth_held
        self._unauth_held = held
        if account.held > account.limit:
            session.fail(ResourceLimit(
                f"the broker already holds {account.held} bytes for connections that have not logged in "
                f"(limit {account.limit}); try again", limit=account.limit))

    def _release_unauthenticated(self) -> None:
        self._unauth.held -= self._unauth_held
        self._unauth_held = 0

    def _pause(self, reason: str) -> None:
        if not self._pauses and self.transport is not None and not self._closing:
            self.transport.pause_reading()
        self._pauses.add(reason)

    def _resume(self, reason: str) -> None:
        if reason not in self._pauses:
            return
        self._pauses.discard(reason)
        if not self._pauses and self.transport is not None and not self._closing:
            self.watchdog.reading_resumed()
            self.transport.resume_reading()

    def reading_held(self) -> bool:
        """Reading is paused by the broker (flow control, a CONNECT being checked, a full output), not
        only by this turn's read budget: the peer cannot be judged meanwhile."""
        return bool(self._pauses) and self._pauses != {"budget"}

    # -- the session's link ----------------------------------------------------------------------
    def pause_reading(self) -> None:
        self._pause("session")

    def resume_reading(self) -> None:
        self._resume("session")

    def start_heartbeat(self, session, send_ms: int, recv_ms: int) -> None:
        """``send_ms``: we must send at least this often; ``recv_ms``: the peer promised this."""
        self.watchdog.start_heartbeat(send_ms, recv_ms)

    def send_frame(self, conn, frame: Frame) -> None:
        self.output.write((conn.send(frame),))
        if frame.command == "CONNECTED":
            self._connected = True
            self._release_unauthenticated()
            self.watchdog.connected()
            self._resume("connect")

    def logged_in_elsewhere(self) -> None:
        """The connection was logged in by another worker, which handed it over (server/cores/handover.py):
        from here on as after CONNECTED, which that worker sent."""
        self._connected = True
        self._release_unauthenticated()
        self.watchdog.connected()
        self._resume("connect")

    def send_frame_pieces(self, conn, frame: Frame, pieces) -> None:
        """A frame whose body is given as pieces (an Arrow range answer, segments.IpcPieces: views of a
        retained log's buffers): the head is encoded as for an empty body, given the pieces' total as its
        content-length, and the pieces are queued as they are, so large ones reach the socket uncopied."""
        head = conn.send(frame)                      # ends with the blank line and the NUL of an empty body
        if pieces.size:
            head = head[:-2] + b"content-length:%d\n\n" % pieces.size
            self.output.write((head, *[p if isinstance(p, bytes) else memoryview(p) for p in pieces], b"\x00"))
        else:
            self.output.write((head,))

    def send_message(self, conn: StompConnection, consumer: Consumer, entry: Entry, ack: str | None) -> None:
        """One delivery, encoded by the codec from the subscription's head (this link's cache, per
        subscription id) and the message's header block (encoded once per message)."""
        head = self._heads.get(consumer.id)
        if head is None:
            if len(self._heads) >= 4096:
                self._heads.clear()             # ids come and go (UNSUBSCRIBE): the cache stays small
            head = self._heads[consumer.id] = message_head(consumer.id, conn.version)
        message = entry.message
        pieces = conn.send_message(head, message.header_block(conn.version), message.body, ack, entry.deliveries,
                                   entry.first_in_group)
        output = self.output
        if len(pieces) == 1 and not output.closed:
            # Output.write() for the one small piece of a MESSAGE, inlined: this runs once per delivery
            data = pieces[0]
            output.pieces.append(data)
            output.bytes += len(data)
            output.queued()
        else:
            output.write(pieces)

    def send_browse(self, conn: StompConnection, sub_id: str, entry: Entry | BrowseEntry) -> None:
        message = entry.message
        head = message_head(sub_id, conn.version) + b"browser:true\n"
        self.output.write(conn.send_message(head, message.header_block(conn.version), message.body))

    def write_encoded(self, data: bytes) -> None:
        """Frames another worker encoded for this connection (server/cores: a MESSAGE or ERROR from the
        destination's owner), written in order with this connection's own."""
        self.output.write((data,))

    # -- backpressure (the output tells) and the end ------------------------------------------------
    def output_full(self) -> None:
        """While the output is over ``write_buffer_high``: no deliveries and no reading."""
        session = self.session
        if session is None or self._closing:
            return
        if session.writable:
            session.writable = False     # stop dispatch now; set_writable(True) resumes it
        self._pause("output")

    def output_room(self) -> None:
        """The output is under ``write_buffer_low`` again: deliveries and reading resume together."""
        session = self.session
        if session is None or self._closing:
            return
        self._resume("output")
        if not session.writable and not session.closed:
            session.set_writable(True)

    def abort(self) -> None:
        """Drop the connection without writing anything more (high availability: fenced, spec/ha.md §2.4)."""
        self._closing = True
        self.output.close()
        self.watchdog.cancel()
        self._release_unauthenticated()
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Write what is queued (an ERROR or the last RECEIPT), then close."""
        if self._closing:
            return
        self.output.flush(force=True)
        self._closing = True
        self.output.closed = True
        self.watchdog.cancel()
        self._release_unauthenticated()
        if self.transport is not None:
            self.transport.close()
