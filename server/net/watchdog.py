"""A connection's clocks: heart-beats sent, and when a silent or slow peer is dead.

:class:`Watchdog` owns the timers of one socket (spec/stomp.md §6 and §10, "Time"): a heart-beat is sent at
least every interval the peer asked for; a peer that promised heart-beats is dead ``heartbeat_grace`` × its
interval after the last byte received (a deadline from that byte, not a sample per window); a frame must
complete ``frame_timeout_ms`` after its first byte plus one second per ``frame_min_rate`` bytes of it,
heart-beats or not; a connection must send CONNECT within ``connect_timeout_ms``.  While the broker holds
reading paused the peer cannot be judged, and both clocks restart when reading resumes.  What the link tells
it: bytes heard, a frame begun or finished, reading resumed, CONNECTED sent.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from pymq.errors import FrameTimeout, HeartbeatTimeout
from pymq.protocol.connection import State
from pymq_server.net.output import Output

log = logging.getLogger("pymq.net")


class Watched(Protocol):
    """What a :class:`Watchdog` needs of its link."""

    session: Any                     # the BrokerSession (fail, closed, conn, input_held)

    @property
    def closing(self) -> bool: ...

    def reading_held(self) -> bool: ...


class Watchdog:
    def __init__(self, link: Watched, loop: asyncio.AbstractEventLoop, output: Output, grace: float,
                 frame_timeout_ms: int, frame_min_rate: int) -> None:
        self.link = link
        self.loop = loop
        self.output = output
        self.grace = grace
        self.frame_timeout = frame_timeout_ms / 1000.0
        self.frame_rate = float(frame_min_rate)
        self.last_rx = loop.time()
        self.recv_window = 0.0              # grace × the peer's promised interval; 0: none promised
        self.partial_since: float | None = None
        self.partial_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._beat_timer: asyncio.TimerHandle | None = None
        self._connect_timer: asyncio.TimerHandle | None = None

    # -- what the link tells it --------------------------------------------------------------------
    def partial(self, buffered: int) -> None:
        """``buffered`` bytes of a frame not complete yet (0: none)."""
        if buffered:
            if self.partial_since is None:
                self.partial_since = self.loop.time()
                self.arm()
            self.partial_bytes = buffered
        else:
            self.partial_since = None

    def reading_resumed(self) -> None:
        """The peer could not be heard while the broker did not read: both clocks start again."""
        now = self.loop.time()
        self.last_rx = now
        if self.partial_since is not None:
            self.partial_since = now

    def expect_connect(self, seconds: float) -> None:
        """A client that never sends CONNECT must not hold a connection forever."""
        self._connect_timer = self.loop.call_later(seconds, self._connect_deadline)

    def connected(self) -> None:
        if self._connect_timer is not None:
            self._connect_timer.cancel()
            self._connect_timer = None

    def start_heartbeat(self, send_ms: int, recv_ms: int) -> None:
        """``send_ms``: we must send at least this often; ``recv_ms``: the peer promised this."""
        if self._beat_timer is not None:
            self._beat_timer.cancel()
            self._beat_timer = None
        if send_ms:
            # check every half interval: a beat never leaves more than one interval after the last data
            half = send_ms / 2000.0
            self._beat_timer = self.loop.call_later(half, self._beat, half)
        self.recv_window = recv_ms / 1000.0 * self.grace if recv_ms else 0.0
        if self.recv_window:
            self.last_rx = self.loop.time()
            self.arm()

    def cancel(self) -> None:
        for handle in (self._beat_timer, self._timer, self._connect_timer):
            if handle is not None:
                handle.cancel()
        self._beat_timer = self._timer = self._connect_timer = None

    # -- the timers ----------------------------------------------------------------------------------
    def _beat(self, half: float) -> None:
        if self.link.closing:
            return
        self.output.heartbeat()
        self._beat_timer = self.loop.call_later(half, self._beat, half)

    def _deadline(self) -> float | None:
        """When the peer is next due to be judged: the heart-beat deadline or the frame's, whichever first."""
        deadlines = []
        if self.recv_window:
            deadlines.append(self.last_rx + self.recv_window)
        if self.partial_since is not None:
            deadlines.append(self.partial_since + self.frame_timeout + self.partial_bytes / self.frame_rate)
        return min(deadlines) if deadlines else None

    def arm(self) -> None:
        deadline = self._deadline()
        if deadline is None or self.link.closing:
            return
        current = self._timer
        if current is not None:
            if current.when() <= deadline:
                return                      # it fires first and re-arms from what it sees then
            current.cancel()
        self._timer = self.loop.call_at(deadline, self._watch)

    def _watch(self) -> None:
        self._timer = None
        session = self.link.session
        if self.link.closing or session is None or session.closed:
            return
        now = self.loop.time()
        if self.link.reading_held():
            # not reading (flow control, a CONNECT being checked, a full outgoing buffer): the peer
            # cannot be judged; look again later (the clocks restart when reading resumes)
            self._timer = self.loop.call_at(now + max(self.recv_window, self.frame_timeout), self._watch)
            return
        if self.recv_window and now >= self.last_rx + self.recv_window:
            log.info("connection %s: no traffic for %.1fs, closing", session.id, now - self.last_rx)
            session.fail(HeartbeatTimeout(
                f"no heart-beat or frame received for {now - self.last_rx:.1f}s (the heart-beat "
                f"interval times heartbeat_grace is {self.recv_window:.1f}s)"))
            return
        if self.partial_since is not None:
            allowed = self.frame_timeout + self.partial_bytes / self.frame_rate
            if now >= self.partial_since + allowed:
                log.info("connection %s: frame incomplete after %.1fs, closing", session.id,
                         now - self.partial_since)
                session.fail(FrameTimeout(
                    f"a frame was not completed within {allowed:.1f}s of its first byte "
                    f"({self.partial_bytes} bytes received)", received=self.partial_bytes))
                return
        self.arm()

    def _connect_deadline(self) -> None:
        self._connect_timer = None
        session = self.link.session
        if (session is not None and session.conn.state in (State.IDLE, State.CONNECTING)
                and not session.input_held):
            session.fail(HeartbeatTimeout("no CONNECT frame received in time"))
