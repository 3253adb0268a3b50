"""Frames into a connection, in order, with pauses: what a session does before it knows what a frame means.

Bytes from TCP (:meth:`FrameIntake.data_received`) or frames already parsed by the vm:// link
(:meth:`FrameIntake.frame_received`) are handled one frame at a time, in arrival order. Input can be
*held*: while CONNECT's password check runs in a worker thread, and while producer flow control pauses
the connection (memory, a full queue). Meanwhile bytes and already-parsed frames wait, and are handled in
order once the last reason to pause is lifted. After each batch of frames (one read), the queues that got
credit or messages back are dispatched once, so that messages several frames returned are all back in
their queue before any goes out again: redelivered first, in their original order (JMS).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from pymq.errors import PymqError
from pymq.protocol.connection import StompConnection
from pymq.protocol.frame import Frame

if TYPE_CHECKING:
    from pymq_server.broker.outlet import Link


log = logging.getLogger("pymq.session")

#: what a frame's handler returns when it finishes the frame later (:meth:`FrameIntake.later`): its
#: receipt waits for that
LATER: dict[str, str] = {}


class FrameIntake:
    """The input half of a broker session (session.BrokerSession): subclasses handle frames."""

    conn: StompConnection
    link: Link
    closed: bool

    def __init__(self) -> None:
        self._held: list[bytes | memoryview] | None = None   # bytes that arrived while input was held
        self._deferred: list[Frame] = []             # parsed frames waiting for input to resume
        self._pauses: set[str] = set()               # why input is paused (memory, full queues)
        self._redispatch: set = set()                # queues that got credit or messages back this batch
        #: the clock read for this batch's first ACK (session._acknowledge: the batch's ACKs are settled at that
        #: instant); set with a queue in _redispatch, so it goes back to None when they are dispatched
        self._acks_at: float | None = None

    @property
    def input_held(self) -> bool:
        """Input is held (a CONNECT being checked, producer flow control): bytes wait in the session."""
        return self._held is not None

    @property
    def held_bytes(self) -> int:
        """Bytes read and waiting while input is held (the transport counts them for unauthenticated
        connections)."""
        return sum(len(b) for b in self._held) if self._held else 0

    def _handle(self, frame: Frame) -> None:
        raise NotImplementedError

    def fail(self, exc: PymqError, frame: Frame | None = None) -> None:
        raise NotImplementedError

    def frame_done(self, frame: Frame, extra: dict[str, str] | None = None) -> None:
        """``frame`` is handled: its receipt (session.py)."""
        raise NotImplementedError

    def run_off_loop(self, work: Callable[[], Any], done: Callable[[Any, BaseException | None], None]) -> None:
        """``work()`` in a worker thread, then ``done(result, error)`` on the loop (session.py)."""
        raise NotImplementedError

    def later(self, frame: Frame, reason: str, work: Callable[[], Any], then: Callable[[Any], None]) -> None:
        """Finish ``frame`` later (its handler returns :data:`LATER`): ``work()`` runs in a worker thread
        while this connection's next frames wait (input paused for ``reason``), then ``then(result)`` on
        the loop, the frame's receipt, and the frames that waited. An error of either is the frame's ERROR."""
        self.pause_input(reason)

        def done(result: Any, error: BaseException | None) -> None:
            if self.closed:
                return
            try:
                if error is not None:
                    if not isinstance(error, PymqError):
                        log.error("%s of a %s failed", reason, frame.command, exc_info=error)
                        error = PymqError("internal broker error; the connection is closed")
                    raise error
                then(result)
            except PymqError as exc:
                self.fail(exc, frame)
                return
            self.frame_done(frame)
            self.resume_input(reason)
        self.run_off_loop(work, done)

    def data_received(self, data: bytes | memoryview) -> None:
        if self.closed:
            return
        if self._held is not None:          # authenticating, or paused by producer flow control
            self._held.append(data)
            return
        self._consume(data)

    def _consume(self, data: bytes | memoryview) -> None:
        frame: Frame | None = None
        conn = self.conn
        try:
            while True:
                frames = conn.parse(data)
                data = b""
                if not frames:
                    break
                for i, frame in enumerate(frames):
                    conn.receive_frame(frame)          # the state table, at the moment of handling
                    self._handle(frame)
                    if self.closed:
                        return
                    if self._held is not None:
                        # paused mid-batch: the frames already parsed wait with the bytes
                        self._deferred.extend(frames[i + 1:])
                        return
                if frames[-1].command not in ("CONNECT", "STOMP"):
                    break  # the scanner only pauses after CONNECT; nothing else is buffered complete
        except PymqError as exc:
            self.fail(exc, frame)
        finally:
            if self._redispatch:
                self._dispatch_released()

    def _dispatch_released(self) -> None:
        """Dispatch the queues this batch of frames gave credit or messages back, once each, after the
        whole batch: messages NACKed by several frames of one read are all back in their queue before
        any is redelivered, so they go out first and in their original order (JMS)."""
        queues, self._redispatch = self._redispatch, set()
        self._acks_at = None
        for queue in queues:
            queue.dispatch()

    def pause_input(self, reason: str) -> None:
        """Stop taking frames from this connection (producer flow control: memory, a full queue)."""
        self._pauses.add(reason)
        if self._held is None:
            self._held = []
        self.link.pause_reading()

    def resume_input(self, reason: str) -> None:
        """Lift one reason to pause; frames flow again when none is left."""
        self._pauses.discard(reason)
        if self.closed or self._pauses:
            return
        self.link.resume_reading()
        self._resume()

    def _resume(self) -> None:
        """Handle what waited while input was held: deferred frames first, then the held bytes."""
        held, self._held = self._held, None
        try:
            while self._deferred:
                frame = self._deferred.pop(0)
                try:
                    self.conn.receive_frame(frame)
                    self._handle(frame)
                except PymqError as exc:
                    self.fail(exc, frame)
                    return
                if self.closed:
                    return
                if self._held is not None:       # paused again
                    self._held[:0] = held or []
                    return
        finally:
            if self._redispatch:
                self._dispatch_released()
        self._consume(b"".join(held) if held else b"")

    def frame_received(self, frame: Frame) -> None:
        """An already-parsed frame (vm:// transport)."""
        if self.closed:
            return
        try:
            self.conn.receive_frame(frame)
            self._handle(frame)
        except PymqError as exc:
            self.fail(exc, frame)
        finally:
            if self._redispatch:
                self._dispatch_released()
