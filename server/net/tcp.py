"""STOMP over TCP: the asyncio adapter between sockets and broker sessions.

One :class:`StompServerProtocol` per connection.  It owns the transport and the receive watchdog and is
the session's *link*.  What one connection may cost is bounded here, at the seam between the socket and
the broker (spec/stomp.md §10):

* **Input.**  At most ``read_budget`` bytes are handed to the session per event-loop turn; the rest of
  a read waits (reading paused) for the next turn, so one pipelining client cannot hold the loop.
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
from collections import deque
from collections.abc import Callable
from typing import cast

from pymq.errors import FrameTimeout, HeartbeatTimeout, PymqError, ResourceLimit, error_headers
from pymq.protocol.connection import State, StompConnection, message_head
from pymq.protocol.frame import Frame
from pymq.protocol.scanner import encode_frame
from pymq_server.broker.consumer import Consumer
from pymq_server.broker.entry import Entry
from pymq_server.broker.outlet import BrowseEntry
from pymq_server.broker.session import BrokerSession
from pymq_server.net.tls import peer_subject

log = logging.getLogger("pymq.net")

#: a piece at least this long is handed to the transport alone, in slices of this size (smaller ones
#: are joined into one write)
SLICE = 256 * 1024


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


class StompServerProtocol(asyncio.Protocol):
    def __init__(self, broker, loop: asyncio.AbstractEventLoop,
                 session_type: Callable[..., BrokerSession] = BrokerSession) -> None:
        self.broker = broker
        self.session_type = session_type    # the multi-worker broker's HomeSession (server/cores)
        self._serving = broker.serving      # high availability's serving check (None without ha:)
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.session: BrokerSession | None = None
        self.certificate_subject: str | None = None
        self.login_host: str | None = None
        self._heads: dict[str, bytes] = {}      # subscription id -> its MESSAGE head (message_head)
        cfg = broker.config
        self._high = cfg.write_buffer_high
        self._low = cfg.write_buffer_low
        self._grace = cfg.heartbeat_grace
        self._budget = cfg.read_budget
        self._frame_timeout = cfg.frame_timeout_ms / 1000.0
        self._frame_rate = float(cfg.frame_min_rate)
        # output: pieces (bytes or memoryview slices of message bodies) not yet given to the transport
        self._out: deque = deque()
        self._out_bytes = 0
        self._large = 0             # queued pieces of SLICE bytes or more (a large body, written in slices)
        self._flush_scheduled = False
        self._transport_paused = False
        self._closing = False
        self._sent = False
        # input
        self._pauses: set[str] = set()      # why reading is paused: session, connect, output, budget
        self._turn_bytes = 0                # handed to the session during this loop turn
        self._turn_scheduled = False
        # read, over this turn's budget: handled next turn (a view: the rest of a read is never copied)
        self._backlog: bytes | memoryview | None = None
        self._connected = False             # CONNECTED sent
        self._unauth = unauthenticated_bytes(broker)
        self._unauth_held = 0               # this connection's share of the broker-wide account
        # the receive watchdog
        now = loop.time()
        self._last_rx = now
        self._recv_window = 0.0             # grace × the peer's promised interval; 0: none promised
        self._partial_since: float | None = None
        self._partial_bytes = 0
        self._watchdog: asyncio.TimerHandle | None = None
        self._hb_send: asyncio.TimerHandle | None = None
        self._connect_timer: asyncio.TimerHandle | None = None

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
        # a client that never sends CONNECT must not hold a connection forever
        self._connect_timer = self.loop.call_later(cfg.connect_timeout_ms / 1000, self._connect_deadline)

    def data_received(self, data: bytes) -> None:
        self._last_rx = self.loop.time()
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
        self._cancel_timers()
        self._out.clear()
        self._out_bytes = 0
        self._large = 0
        self._backlog = None
        self._release_unauthenticated()
        if self.session is not None:
            self.session.connection_lost()

    def pause_writing(self) -> None:
        self._transport_paused = True
        self._output_changed()

    def resume_writing(self) -> None:
        self._transport_paused = False
        self._flush()

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
        buffered = conn.buffered
        if buffered:
            if self._partial_since is None:
                self._partial_since = self.loop.time()
                self._arm_watchdog()
            self._partial_bytes = buffered
        else:
            self._partial_since = None

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
            # the peer could not be heard while we did not read: both clocks start again
            now = self.loop.time()
            self._last_rx = now
            if self._partial_since is not None:
                self._partial_since = now
            self.transport.resume_reading()

    # -- the session's link ----------------------------------------------------------------------
    def pause_reading(self) -> None:
        self._pause("session")

    def resume_reading(self) -> None:
        self._resume("session")

    def send_frame(self, conn, frame: Frame) -> None:
        self._write((conn.send(frame),))
        if frame.command == "CONNECTED":
            self._connected = True
            self._release_unauthenticated()
            if self._connect_timer is not None:
                self._connect_timer.cancel()
                self._connect_timer = None
            self._resume("connect")

    def send_frame_pieces(self, conn, frame: Frame, pieces) -> None:
        """A frame whose body is given as pieces (an Arrow range answer, segments.IpcPieces: views of a
        retained log's buffers): the head is encoded as for an empty body, given the pieces' total as its
        content-length, and the pieces are queued as they are, so large ones reach the socket uncopied."""
        head = conn.send(frame)                      # ends with the blank line and the NUL of an empty body
        if pieces.size:
            head = head[:-2] + b"content-length:%d\n\n" % pieces.size
            self._write((head, *[p if isinstance(p, bytes) else memoryview(p) for p in pieces], b"\x00"))
        else:
            self._write((head,))

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
        if len(pieces) == 1 and not self._closing:
            # _write() for the one small piece of a MESSAGE, inlined: this runs once per delivery
            data = pieces[0]
            self._out.append(data)
            self._out_bytes += len(data)
            self._queued()
        else:
            self._write(pieces)

    def send_browse(self, conn: StompConnection, sub_id: str, entry: Entry | BrowseEntry) -> None:
        message = entry.message
        head = message_head(sub_id, conn.version) + b"browser:true\n"
        self._write(conn.send_message(head, message.header_block(conn.version), message.body))

    def write_encoded(self, data: bytes) -> None:
        """Frames another worker encoded for this connection (server/cores: a MESSAGE or ERROR from the
        destination's owner), written in order with this connection's own."""
        self._write((data,))

    # -- output ----------------------------------------------------------------------------------
    def _write(self, pieces: tuple) -> None:
        if self._closing:
            return
        out = self._out
        for piece in pieces:
            out.append(piece)
            size = len(piece)
            self._out_bytes += size
            if size >= SLICE:
                self._large += 1
        self._queued()

    def _queued(self) -> None:
        """Pieces were queued: a flush at the end of this loop turn, backpressure past the mark."""
        self._sent = True
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)
        if self._out_bytes > self._high:
            self._output_changed()

    def _flush(self, force: bool = False) -> None:
        """Hand queued pieces to the transport while its buffer is under the high-water mark (all of
        them when ``force``): small pieces joined into one write, large ones in slices."""
        self._flush_scheduled = False
        transport = self.transport
        if transport is None or (self._closing and not force):
            return
        out = self._out
        serving = self._serving
        if serving is not None and out:
            # high availability (spec/ha.md §2.1): bytes leave only under a fresh lease
            verdict = serving.may_send()
            if not verdict:
                if verdict is None:               # not confirmed just now: try again shortly
                    self._flush_scheduled = True
                    self.loop.call_later(0.01, self._flush, force)
                else:
                    self.abort()                  # fenced: nothing more, ever
                return
        if not self._large and (force or not self._transport_paused):
            # the common case, small MESSAGEs and RECEIPTs only: one join and one write, no walk over
            # the pieces (this runs once per loop turn with tens of frames queued)
            if out:
                transport.write(b"".join(out) if len(out) > 1 else out[0])
                out.clear()
                self._out_bytes = 0
            self._output_changed()
            return
        small: list = []
        while out and (force or not self._transport_paused):
            piece = out[0]
            size = len(piece)
            if size < SLICE:
                small.append(piece)
                out.popleft()
                self._out_bytes -= size
                continue
            if small:
                transport.write(b"".join(small))
                small = []
                if self._transport_paused and not force:
                    break
            view = piece if isinstance(piece, memoryview) else memoryview(piece)
            transport.write(view[:SLICE])
            self._out_bytes -= min(size, SLICE)
            if size > SLICE:
                out[0] = view[SLICE:]
                if size - SLICE < SLICE:
                    self._large -= 1        # what is left of it is a small piece now
            else:
                out.popleft()
                self._large -= 1
        if small:
            transport.write(b"".join(small))
        self._output_changed()

    def _output_changed(self) -> None:
        """Backpressure: while the transport's buffer is over ``write_buffer_high`` (it says so with
        pause_writing, and resume_writing once under ``write_buffer_low``) or the pieces queued here
        pass the mark, no deliveries and no reading; both resume together."""
        session = self.session
        if session is None or self._closing:
            return
        if self._transport_paused or self._out_bytes > self._high:
            if session.writable:
                session.writable = False     # stop dispatch now; set_writable(True) resumes it
            self._pause("output")
        elif self._out_bytes <= self._low:
            self._resume("output")
            if not session.writable and not session.closed:
                session.set_writable(True)

    def abort(self) -> None:
        """Drop the connection without writing anything more (high availability: fenced, spec/ha.md §2.4)."""
        self._closing = True
        self._out.clear()
        self._out_bytes = 0
        self._large = 0
        self._cancel_timers()
        self._release_unauthenticated()
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Write what is queued (an ERROR or the last RECEIPT), then close."""
        if self._closing:
            return
        self._flush(force=True)
        self._closing = True
        self._cancel_timers()
        self._release_unauthenticated()
        if self.transport is not None:
            self.transport.close()

    # -- heart-beats and the receive watchdog -----------------------------------------------------
    def start_heartbeat(self, session, send_ms: int, recv_ms: int) -> None:
        """``send_ms``: we must send at least this often; ``recv_ms``: the peer promised this."""
        if self._hb_send is not None:
            self._hb_send.cancel()
            self._hb_send = None
        if send_ms:
            # check every half interval: a beat never leaves more than one interval after the last data
            half = send_ms / 2000.0
            self._hb_send = self.loop.call_later(half, self._beat, half)
        self._recv_window = recv_ms / 1000.0 * self._grace if recv_ms else 0.0
        if self._recv_window:
            self._last_rx = self.loop.time()
            self._arm_watchdog()

    def _beat(self, half: float) -> None:
        if self._closing:
            return
        if not self._sent and not self._out and self.transport is not None:
            self.transport.write(b"\n")
        self._sent = False
        self._hb_send = self.loop.call_later(half, self._beat, half)

    def _deadline(self) -> float | None:
        """When the peer is next due to be judged: the heart-beat deadline or the frame's, whichever first."""
        deadlines = []
        if self._recv_window:
            deadlines.append(self._last_rx + self._recv_window)
        if self._partial_since is not None:
            deadlines.append(self._partial_since + self._frame_timeout + self._partial_bytes / self._frame_rate)
        return min(deadlines) if deadlines else None

    def _arm_watchdog(self) -> None:
        deadline = self._deadline()
        if deadline is None or self._closing:
            return
        current = self._watchdog
        if current is not None:
            if current.when() <= deadline:
                return                      # it fires first and re-arms from what it sees then
            current.cancel()
        self._watchdog = self.loop.call_at(deadline, self._watch)

    def _watch(self) -> None:
        self._watchdog = None
        if self._closing or self.session is None or self.session.closed:
            return
        now = self.loop.time()
        if self._pauses - {"budget"}:
            # not reading (flow control, a CONNECT being checked, a full outgoing buffer): the peer
            # cannot be judged; look again later (the clocks restart when reading resumes)
            self._watchdog = self.loop.call_at(now + max(self._recv_window, self._frame_timeout),
                                               self._watch)
            return
        if self._recv_window and now >= self._last_rx + self._recv_window:
            log.info("connection %s: no traffic for %.1fs, closing", self.session.id, now - self._last_rx)
            self.session.fail(HeartbeatTimeout(
                f"no heart-beat or frame received for {now - self._last_rx:.1f}s (the heart-beat "
                f"interval times heartbeat_grace is {self._recv_window:.1f}s)"))
            return
        if self._partial_since is not None:
            allowed = self._frame_timeout + self._partial_bytes / self._frame_rate
            if now >= self._partial_since + allowed:
                log.info("connection %s: frame incomplete after %.1fs, closing", self.session.id,
                         now - self._partial_since)
                self.session.fail(FrameTimeout(
                    f"a frame was not completed within {allowed:.1f}s of its first byte "
                    f"({self._partial_bytes} bytes received)", received=self._partial_bytes))
                return
        self._arm_watchdog()

    def _connect_deadline(self) -> None:
        self._connect_timer = None
        session = self.session
        if (session is not None and session.conn.state in (State.IDLE, State.CONNECTING)
                and not session.input_held):
            session.fail(HeartbeatTimeout("no CONNECT frame received in time"))

    def _cancel_timers(self) -> None:
        for handle in (self._hb_send, self._watchdog, self._connect_timer):
            if handle is not None:
                handle.cancel()
        self._hb_send = self._watchdog = self._connect_timer = None

