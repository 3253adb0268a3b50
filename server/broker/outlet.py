"""Frames out of a connection: MESSAGEs for consumers and browses, written while the transport has room.

The output half of a broker session (session.BrokerSession): each MESSAGE goes through the session's
*link* (the TCP, WebSocket or vm:// adapter); in client acknowledgement modes the ack ledger records its
token first. The link says when its outgoing buffer is full (``writable`` false): queues stop
dispatching to the connection, and browses pause, until it drains (``set_writable(True)``).
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Protocol
from collections.abc import Iterator

from pymq.protocol.connection import StompConnection
from pymq.protocol.frame import Frame
from pymq_server.broker.acks import DeliveryLedger
from pymq_server.broker.consumer import AUTO, Consumer
from pymq_server.broker.message import BrokerMessage
from pymq_server.broker.segments import IpcPieces
from pymq_server.broker.states import ACQUIRED

if TYPE_CHECKING:
    from pymq_server.broker.broker import Browse
    from pymq_server.broker.queue import Entry


class Link(Protocol):
    """What a session writes through: the TCP adapter (also behind TLS and WebSocket, server/net/tcp.py),
    the vm:// link (server/net/vm.py), a worker's shadow of a connection (server/cores/shadow.py). The link
    owns the wire: it has the codec encode each frame (pymq/protocol: ``StompConnection.send_message`` for
    MESSAGEs) and keeps the bytes it caches for that (a subscription's MESSAGE head); domain objects carry
    none of it."""

    def send_frame(self, conn: StompConnection, frame: Frame) -> None: ...

    def send_frame_pieces(self, conn: StompConnection, frame: Frame, pieces: IpcPieces) -> None: ...

    def send_message(self, conn: StompConnection, consumer: Consumer, entry: Entry, ack: str | None) -> None:
        """One delivery of ``entry`` to ``consumer``; ``ack``: the 1.2 ``ack`` header's value."""

    def send_browse(self, conn: StompConnection, sub_id: str, entry: Entry | BrowseEntry) -> None:
        """One message of a browse (``browser:true``), not acquired."""

    def start_heartbeat(self, session: Any, send_ms: int, recv_ms: int) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...


class FrameOutlet:
    conn: StompConnection
    link: Link
    closed: bool
    version: str
    deliveries: DeliveryLedger
    consumers: dict[str, Consumer]
    _pauses: set[str]

    if TYPE_CHECKING:      # FrameIntake's (the session is both)
        def pause_input(self, reason: str) -> None: ...

        def resume_input(self, reason: str) -> None: ...

    def __init__(self) -> None:
        self.writable = True
        self.sent = 0
        self._browses: deque[Iterator[None]] = deque()   # browses waiting for the outgoing buffer to drain

    def send_frame(self, command: str, headers: dict, body: bytes | IpcPieces = b"") -> None:
        if self.closed:
            return
        if isinstance(body, IpcPieces):
            # an Arrow range answer: views of the log's segments, written as they are (no join, no copy)
            self.link.send_frame_pieces(self.conn, Frame(command, headers), body)
        else:
            self.link.send_frame(self.conn, Frame(command, headers, body))

    def deliver(self, consumer: Consumer, entry: Entry) -> None:
        """Write one MESSAGE for ``entry`` to ``consumer`` (called by the queue's dispatcher)."""
        token: str | None
        if consumer.ack_mode is AUTO:
            token = None
        else:
            ledger = self.deliveries
            if self.version == "1.2":
                ledger.next_token += 1
                token = str(ledger.next_token)
                ledger.tokens[token] = consumer
            else:
                token = entry.message.message_id
            consumer.unacked[token] = entry
            consumer.in_flight += 1
        entry.token = token
        self.sent += 1
        self.link.send_message(self.conn, consumer, entry, token if self.version == "1.2" else None)
        if token is None and entry.state is ACQUIRED:
            # auto: acknowledged as it was delivered (a new message passed through, MessageQueue._pass, was
            # acquired and acknowledged in one step already)
            entry.queue.complete(entry, entry.acquired_at)

    def set_writable(self, writable: bool) -> None:
        """Backpressure from the transport: stop dispatching to this connection while its buffer is full."""
        if writable == self.writable:
            return
        self.writable = writable
        if writable:
            self._run_browses()
            for consumer in list(self.consumers.values()):
                consumer.queue.dispatch()

    # -- browses -----------------------------------------------------------------------------------
    def start_browse(self, browse: Browse) -> None:
        """Write a browse's messages and its end marker now, or after the browses already waiting (spec/stomp.md
        §9). Nothing is acquired; an ActiveMQ-style client may UNSUBSCRIBE a browse, which is no error. One
        browse at a time: while one waits for the outgoing buffer, this connection's next frames wait in its
        socket (a client that asks for browses without reading them cannot make the broker build them all)."""
        self._browses.append(self._browse_cursor(browse))
        if len(self._browses) == 1:
            self._run_browses()
        if self._browses:
            self.pause_input("browse")

    def _browse_cursor(self, browse: Browse) -> Iterator[None]:
        """Writes ``browse``; yields when the transport says the outgoing buffer is full."""
        link, conn, sub_id = self.link, self.conn, browse.request.id
        while True:
            if not self.writable:
                yield
                if self.closed:
                    return
                browse.resume()
                continue
            message = browse.next()
            if message is None:
                break
            link.send_browse(conn, sub_id, BrowseEntry(message))
        self.send_frame("MESSAGE", browse.end_marker(), browse.end_body)   # an Arrow answer's rows: its body

    def _run_browses(self) -> None:
        browses = self._browses
        while browses and self.writable and not self.closed:
            try:
                next(browses[0])
            except StopIteration:
                browses.popleft()
        if not browses and "browse" in self._pauses:
            self.resume_input("browse")            # every browse is written: the next frames are read


class BrowseEntry:
    """What the links' ``send_browse`` reads: a message that is not a queue entry (log, range)."""

    __slots__ = ("message",)

    def __init__(self, message: BrokerMessage) -> None:
        self.message = message
