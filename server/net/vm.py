"""The vm:// link: one in-process connection between an SDK and a broker on a background thread, no socket.

Each client connection is a :class:`VmLink`: frames go in as objects (batched: one ``call_soon_threadsafe``
per burst) and come out as objects, through the same broker session code as TCP clients, so semantics are
identical. The broker it reaches is a :class:`VmHost`: the embedded broker of ``vm://name`` URLs
(server/embedded.py, which runs a whole server and so sits above this package; the distribution registers
its ``embedded_broker`` as the entry point ``vm`` of group ``pymq.transports``, which ``pymq.client.vm``
looks up when a ``vm://`` URL is first used). The link never blocks: the client's transport decides how to
wait (a thread on an Event, a task on a future) when :attr:`VmLink.held_back` says so.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from pymq.errors import ConnectionClosed, PymqError
from pymq.protocol.connection import StompConnection
from pymq.protocol.frame import Frame
from pymq_server.broker.session import BrokerSession

if TYPE_CHECKING:
    from pymq_server.broker.broker import Broker

#: SEND bytes handed to the broker's loop and not yet taken by it: above HIGH the producer waits until
#: the broker has caught up to LOW (the vm:// twin of a socket's write buffer; without it a send loop
#: would pile SENDs into the broker loop's ready queue, where the broker's memory limit cannot see them)
WINDOW_HIGH = 1024 * 1024
WINDOW_LOW = 256 * 1024
_FRAME_OVERHEAD = 64    # a SEND's headers, roughly: keeps a flood of empty bodies bounded too


class VmHost(Protocol):
    """What a link needs of the in-process broker it connects to (server/embedded.py runs one): its event
    loop, and the broker core once started."""

    loop: asyncio.AbstractEventLoop

    @property
    def broker(self) -> Broker | None: ...


class VmClient(Protocol):
    """The client end of a link.  Both are called on the broker's loop thread and must not block."""

    def from_broker(self, frame: Frame | None, error: PymqError | None = None) -> None:
        """A frame for the client (CONNECTED or ERROR first), or None when the connection ended."""

    def flow_changed(self) -> None:
        """The broker resumed reading, or caught up with the SENDs in flight: re-check ``held_back``."""


class VmLink:
    """One in-process connection: the client's handle (``open``, ``submit``, ``held_back``,
    ``disconnect``) and the broker session's link (``send_frame``, ``send_message``, ...).

    Flow control without locks across threads: ``submitted`` is written by the client only (its
    transport serialises its senders), ``taken`` and ``paused`` by the broker's loop only.  A client
    over the window sets ``want_wake`` and then re-checks; the broker checks ``want_wake`` after each
    take, so a wake-up is never lost between the two threads.
    """

    window_high = WINDOW_HIGH
    window_low = WINDOW_LOW

    def __init__(self, host: VmHost, client: VmClient) -> None:
        self.host = host
        self.loop = host.loop
        self.client = client
        self.session: BrokerSession | None = None
        self.paused = False          # the broker holds back SENDs (memory limit)
        self.submitted = 0
        self.taken = 0
        self.want_wake = False
        self._closed = False
        self._outbound: deque[Frame] = deque()
        self._take_scheduled = False

    # -- the client's side (its threads; never blocks) ---------------------------------------------
    def open(self, headers: dict[str, str]) -> None:
        """Send CONNECT: CONNECTED (or the refusal's ERROR) reaches ``client.from_broker`` first."""
        self.loop.call_soon_threadsafe(self._start, dict(headers))

    @property
    def in_flight(self) -> int:
        return self.submitted - self.taken

    @property
    def held_back(self) -> bool:
        """The client should wait before its next SEND (see ``flow_changed``)."""
        return self.paused or self.in_flight > self.window_high

    @property
    def caught_up(self) -> bool:
        return not self.paused and self.in_flight <= self.window_low

    def submit(self, frame: Frame) -> None:
        if self._closed:
            raise ConnectionClosed("the connection is closed")
        if frame.command == "SEND":
            self.submitted += len(frame.body) + _FRAME_OVERHEAD
        self._outbound.append(frame)
        if not self._take_scheduled:
            # one wake-up of the broker's loop per burst, not per frame (each costs a syscall).  The
            # frame is appended before the flag is read and the broker clears the flag before
            # draining, so no frame is ever left behind without a scheduled drain.
            self._take_scheduled = True
            self.loop.call_soon_threadsafe(self._take_batch)

    def disconnect(self) -> None:
        if not self._closed:
            self.loop.call_soon_threadsafe(self._close_from_client)

    def abandon(self) -> None:
        """The client went away without closing (its event loop is gone): end the connection."""
        if not self._closed:
            self._closed = True
            self.loop.call_soon_threadsafe(self._close_from_client)

    # -- the broker's loop -------------------------------------------------------------------------
    def _start(self, headers: dict[str, str]) -> None:
        broker = self.host.broker
        assert broker is not None           # the embedded broker started before any link opened
        self.session = BrokerSession(broker, self, None, broker.new_connection_id())
        # CONNECT goes through the session like any frame: a refusal (credentials, connection limit)
        # comes back as its ERROR frame
        self.session.frame_received(Frame("CONNECT", headers))

    def _take_batch(self) -> None:
        self._take_scheduled = False
        outbound = self._outbound
        while outbound:
            frame = outbound.popleft()
            if frame.command == "SEND":
                self.taken += len(frame.body) + _FRAME_OVERHEAD
                if self.want_wake and not self.paused and self.submitted - self.taken <= self.window_low:
                    self.want_wake = False
                    self.client.flow_changed()
            self._receive(frame)

    def _receive(self, frame: Frame) -> None:
        session = self.session
        if session is None:
            return
        try:
            session.frame_received(frame)
        except Exception as exc:  # noqa: BLE001 - a broker bug costs this connection, never the broker
            session.fail(PymqError(f"internal broker error: {exc!r}"))

    def _close_from_client(self) -> None:
        self._closed = True
        if self.session is not None:
            self.session.connection_lost()

    # -- the broker session's link ----------------------------------------------------------------
    def send_frame(self, conn: StompConnection, frame: Frame) -> None:
        conn.send_frame(frame)
        if not self._closed:
            self.client.from_broker(frame)

    def send_frame_pieces(self, conn: StompConnection, frame: Frame, pieces: Any) -> None:
        """A frame whose body comes in pieces (segments.IpcPieces): in process, the client takes bytes."""
        self.send_frame(conn, frame._replace(body=pieces.join()))

    def send_message(self, conn: StompConnection, consumer: Any, entry: Any, ack: str | None) -> None:
        message = entry.message
        headers = {"subscription": consumer.id}
        if ack is not None:
            headers["ack"] = ack
        if entry.deliveries > 1:
            headers["redelivered"] = "true"
            headers["JMSXDeliveryCount"] = str(entry.deliveries)
        if entry.first_in_group:
            headers["JMSXGroupFirstForConsumer"] = "true"
        headers.update(message.wire_headers())
        frame = Frame("MESSAGE", headers, message.body)
        conn.send_frame(frame)
        self.client.from_broker(frame)

    def send_browse(self, conn: StompConnection, sub_id: str, entry: Any) -> None:
        headers = {"subscription": sub_id, "browser": "true"}
        headers.update(entry.message.wire_headers())
        frame = Frame("MESSAGE", headers, entry.message.body)
        conn.send_frame(frame)
        self.client.from_broker(frame)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.client.from_broker(None, None)

    def start_heartbeat(self, session: BrokerSession, send_ms: int, recv_ms: int) -> None:
        pass  # in-process: a dead client is a closed link, no beats needed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False
        self.client.flow_changed()
