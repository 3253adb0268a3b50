"""A connection's output: what it has to write and has not handed to its transport yet.

:class:`Output` owns the pieces queued for one socket (spec/stomp.md §10, "Output"): frames are queued as
pieces — a MESSAGE's body is the message's own bytes object, referenced, never copied per subscriber — and
handed to the transport once per event-loop turn (a consumer fed by a burst of SENDs costs one syscall, not
one per message), small pieces joined into one write, a large body in slices of :data:`SLICE` and only while
the transport's buffer is under its high-water mark.  It says when the bytes queued here and in the
transport pass ``write_buffer_high`` and when they are back under ``write_buffer_low``; what that stops
(deliveries and reading) is the link's (:class:`~pymq_server.net.tcp.StompServerProtocol`).  Under ``ha:``
bytes leave only under a fresh lease (spec/ha.md §2.1): a flush asks the serving check first.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Protocol


#: a piece at least this long is handed to the transport alone, in slices of this size (smaller ones
#: are joined into one write)
SLICE = 256 * 1024


class Writer(Protocol):
    """What an :class:`Output` needs of its link: the transport to write to, and whom to tell."""

    transport: asyncio.Transport | None

    def abort(self) -> None: ...

    def output_full(self) -> None: ...

    def output_room(self) -> None: ...


class Output:
    def __init__(self, link: Writer, loop: asyncio.AbstractEventLoop, high: int, low: int,
                 serving: Any) -> None:
        self.link = link
        self.loop = loop
        self.high = high
        self.low = low
        self.serving = serving          # high availability's serving check (None without ha:)
        self.pieces: deque = deque()    # bytes, or memoryview slices of message bodies
        self.bytes = 0
        self.large = 0                  # queued pieces of SLICE bytes or more (a large body, written in slices)
        self.scheduled = False          # a flush at the end of this loop turn
        self.transport_paused = False   # the transport's buffer is over its high-water mark
        self.sent = False               # something was queued since the heart-beat last looked
        self.closed = False             # nothing more is queued

    def write(self, pieces: tuple) -> None:
        if self.closed:
            return
        out = self.pieces
        for piece in pieces:
            out.append(piece)
            size = len(piece)
            self.bytes += size
            if size >= SLICE:
                self.large += 1
        self.queued()

    def queued(self) -> None:
        """Pieces were queued: a flush at the end of this loop turn, backpressure past the mark."""
        self.sent = True
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)
        if self.bytes > self.high:
            self.changed()

    def flush(self, force: bool = False) -> None:
        """Hand queued pieces to the transport while its buffer is under the high-water mark (all of
        them when ``force``): small pieces joined into one write, large ones in slices."""
        self.scheduled = False
        transport = self.link.transport
        if transport is None or (self.closed and not force):
            return
        out = self.pieces
        serving = self.serving
        if serving is not None and out:
            # high availability (spec/ha.md §2.1): bytes leave only under a fresh lease
            verdict = serving.may_send()
            if not verdict:
                if verdict is None:               # not confirmed just now: try again shortly
                    self.scheduled = True
                    self.loop.call_later(0.01, self.flush, force)
                else:
                    self.link.abort()             # fenced: nothing more, ever
                return
        if not self.large and (force or not self.transport_paused):
            # the common case, small MESSAGEs and RECEIPTs only: one join and one write, no walk over
            # the pieces (this runs once per loop turn with tens of frames queued)
            if out:
                transport.write(b"".join(out) if len(out) > 1 else out[0])
                out.clear()
                self.bytes = 0
            self.changed()
            return
        small: list = []
        while out and (force or not self.transport_paused):
            piece = out[0]
            size = len(piece)
            if size < SLICE:
                small.append(piece)
                out.popleft()
                self.bytes -= size
                continue
            if small:
                transport.write(b"".join(small))
                small = []
                if self.transport_paused and not force:
                    break
            view = piece if isinstance(piece, memoryview) else memoryview(piece)
            transport.write(view[:SLICE])
            self.bytes -= min(size, SLICE)
            if size > SLICE:
                out[0] = view[SLICE:]
                if size - SLICE < SLICE:
                    self.large -= 1         # what is left of it is a small piece now
            else:
                out.popleft()
                self.large -= 1
        if small:
            transport.write(b"".join(small))
        self.changed()

    def changed(self) -> None:
        """Backpressure: while the transport's buffer is over ``write_buffer_high`` (it says so with
        pause_writing, and resume_writing once under ``write_buffer_low``) or the pieces queued here pass
        the mark, the link is told it is full; once both are under the low mark, that there is room."""
        if self.transport_paused or self.bytes > self.high:
            self.link.output_full()
        elif self.bytes <= self.low:
            self.link.output_room()

    def pause_writing(self) -> None:
        self.transport_paused = True
        self.changed()

    def resume_writing(self) -> None:
        self.transport_paused = False
        self.flush()

    def heartbeat(self) -> None:
        """A heart-beat is due: a newline, unless something was written since the last one was due."""
        transport = self.link.transport
        if not self.sent and not self.pieces and transport is not None:
            transport.write(b"\n")
        self.sent = False

    def close(self) -> None:
        """Nothing more is queued, and what is queued is dropped (a lost or aborted connection)."""
        self.closed = True
        self.pieces.clear()
        self.bytes = 0
        self.large = 0
