"""A client connection's shadow at the worker that owns a destination it uses (spec/cores.md §2.2).

The home forwards a frame for a destination owned here; the owner runs it through an ordinary
:class:`BrokerSession` (a :class:`ShadowSession`), linked to the home by a :class:`ShadowProtocol`:
the TCP adapter's own output path (MESSAGE encoding, batching, write backpressure) over a
:class:`ShadowTransport` that writes into the channel instead of a socket. So everything a session
does — permissions, placement, receipts after the store's barrier, transactions, groups, durable
subscriptions, flow control — happens at the owner exactly as for a client connected here.

What differs, and why:
* the shadow never authenticates: the home did, and OPEN carries the principal (name, roles). Only the
  broker's own workers can write on a channel (mesh.py), so the principal is the home's word;
  permissions are checked here, by the owner, against it;
* a 1.2 ack token is written ``w<owner>.<n>`` so the home can route an ACK without a table, and the
  prefix is taken off again when the ACK comes back (ShadowSession._handle);
* a RECEIPT goes back as a RECEIPT envelope (the home's receipt gate waits for it), after the
  MESSAGEs written before it, so a client never sees a receipt overtake what preceded it;
* a SEND to ``/pymq/cores/barrier`` with a ``receipt`` is the home's barrier: answered, in frame order,
  once everything this connection stored here is durable, and nothing else (a client's own SEND to a
  ``/pymq/`` name is always handled by its home, never forwarded, so it cannot reach this).
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from pymq.errors import PymqError
from pymq.protocol.frame import Frame
from pymq_server.broker.auth import User
from pymq_server.broker.session import BrokerSession
from pymq_server.cores.envelope import Kind
from pymq_server.cores.ownership import ack_prefix
from pymq_server.net.tcp import StompServerProtocol

if TYPE_CHECKING:
    from pymq_server.broker.broker import Broker
    from pymq_server.cores.mesh import Mesh

log = logging.getLogger("pymq.cores")

#: the destination of the home's barrier SEND (never a client's: /pymq/ names stay with the home)
BARRIER = "/pymq/cores/barrier"


class ShadowTransport:
    """What the TCP adapter writes to, for a shadow: envelopes to the home instead of a socket."""

    def __init__(self, mesh: Mesh, home: int, conn: str) -> None:
        self.mesh = mesh
        self.home = home
        self.conn = conn
        self.closed = False

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.mesh.send(self.home, Kind.FRAME, self.home, self.conn, data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.mesh.send(self.home, Kind.CLOSED, self.home, self.conn)
            self.mesh.shadow_gone(self.home, self.conn)

    abort = close

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        # the owner's producer flow control (memory, a full queue): the home stops reading the client
        if not self.closed:
            self.mesh.send(self.home, Kind.PAUSE, self.home, self.conn)

    def resume_reading(self) -> None:
        if not self.closed:
            self.mesh.send(self.home, Kind.RESUME, self.home, self.conn)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


class ShadowSession(BrokerSession):
    """The owner's session for a connection whose home is another worker."""

    ack_prefix = ""

    def _handle(self, frame: Frame) -> None:
        command = frame.command
        if command == "SEND" and frame.headers.get("destination") == BARRIER:
            self.receipts.receipt(frame.headers["receipt"])
            return
        if (command == "ACK" or command == "NACK") and self.version == "1.2":
            token = frame.headers.get("id", "")
            if token.startswith(self.ack_prefix):
                headers = dict(frame.headers)
                headers["id"] = token[len(self.ack_prefix):]
                frame = Frame(command, headers, frame.body)
        super()._handle(frame)


class ShadowProtocol(StompServerProtocol):
    """The link of a :class:`ShadowSession`: the TCP adapter's output path, writing into the channel."""

    def __init__(self, broker: Broker, loop: asyncio.AbstractEventLoop, mesh: Mesh, home: int,
                 conn: str) -> None:
        super().__init__(broker, loop)
        self.mesh = mesh
        self.home = home
        self.conn = conn
        self._ack_prefix = ack_prefix(mesh.me)
        self._output_holds: set[str] = set()    # why output is held: "client" (FULL), "channel" (full)

    def open(self, doc: dict) -> None:
        """Make the shadow session: CONNECTED already, as the principal the home authenticated."""
        transport = ShadowTransport(self.mesh, self.home, self.conn)
        self.transport = transport      # type: ignore[assignment]  # the channel stands in for a socket
        version = str(doc["version"])
        session = self.session = ShadowSession(self.broker, self, doc.get("host"), f"{self.conn}@w{self.home}")
        session.ack_prefix = self._ack_prefix
        # through the state table, as a client's CONNECT and the broker's CONNECTED would go
        session.conn.receive_frame(Frame("CONNECT", {"accept-version": version, "host": "pymq-cores"}, b""))
        session.conn.send_frame(Frame("CONNECTED", {"version": version}, b""))
        session.version = version
        session.deliveries.version = version
        session.authenticated(User(str(doc["user"]), "", frozenset(doc.get("roles", ())),
                                   certificate_subject=doc.get("subject")))
        self._connected = True
        if self.mesh.channels.get(self.home) is not None and self.mesh.channels[self.home].full:
            self.hold_output("channel")
        # not in broker.sessions: a shadow is not a connection (the home counts it against
        # max_connections, lists it, and closes it); the mesh closes shadows when the worker stops
        try:
            client_id = doc.get("client_id")
            if client_id:
                session.client_id = client_id
                self.broker.claim_client_id(session, client_id)
        except PymqError as exc:
            session.fail(exc)

    def from_home(self, kind: Kind, payload: bytes) -> None:
        if kind is Kind.FRAME:
            # straight to the session: whole frames, already bounded per turn by the home's read budget,
            # and no peer to time out (the TCP adapter's budget, turn and watchdog are for sockets)
            session = self.session
            if session is None or self._closing:
                return
            try:
                session.data_received(payload)
            except Exception:  # a broker bug must cost one connection, never the worker
                log.exception("internal error on forwarded connection %s", session.id)
                session.fail(PymqError("internal broker error; the connection is closed"))
        elif kind is Kind.CLOSE:
            transport = self.transport
            if isinstance(transport, ShadowTransport):
                transport.closed = True         # the home is gone: nothing to tell it
            self.mesh.shadow_gone(self.home, self.conn)
            self.connection_lost(None)
        elif kind is Kind.FULL:
            self.hold_output("client")
        elif kind is Kind.DRAINED:
            self.release_output("client")

    def hold_output(self, reason: str) -> None:
        """Stop dispatching to this connection, as a socket's full buffer does (two reasons may hold
        it: the client's full output at the home, and the channel to the home being full)."""
        if not self._output_holds:
            self.pause_writing()
        self._output_holds.add(reason)

    def release_output(self, reason: str) -> None:
        if reason not in self._output_holds:
            return
        self._output_holds.discard(reason)
        if not self._output_holds:
            self.resume_writing()

    def send_frame(self, conn: Any, frame: Frame) -> None:
        if frame.command == "RECEIPT":
            data = conn.send(frame)
            self.output.flush(force=True)     # what was written before the receipt goes first
            self.mesh.send(self.home, Kind.RECEIPT, self.home, self.conn, data)
            return
        super().send_frame(conn, frame)

    def send_message(self, conn: Any, consumer: Any, entry: Any, ack: str | None) -> None:
        super().send_message(conn, consumer, entry, None if ack is None else self._ack_prefix + ack)
