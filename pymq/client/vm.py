"""The one seam between the SDKs and the broker package (``pymq_server``).

Only this module imports the broker package, and only when it is needed: importing ``pymq`` or
``pymq.aio`` never imports the server (tests/client/test_sdk_surfaces.py checks both).  Two things
cross it:

* the embedded broker of ``vm://`` URLs (``pymq_server.net.vm``).  :class:`VmEndpoint` is the client
  end both SDKs' vm:// transports share: the client's STOMP state machine (so misuse fails the same way
  as over TCP) and what to do with each frame the broker hands over.  The transports add only how they
  cross threads: the blocking one handles frames on the broker's thread (its callbacks never block),
  the asyncio one hops onto its event loop;
* the SQL device's pending-row writer, for ``send(..., transaction=db)`` (:mod:`pymq.client.apptx`):
  the row format and the in-process wake-up of an embedded broker on SQLite are the device's, so the
  SDK calls its code instead of repeating it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Callable

from pymq.client._core import error_of
from pymq.errors import ConnectFailed, ConnectionClosed, IllegalStateError, ProtocolError, PymqError
from pymq.protocol.connection import RECV, SEND, TRANSITIONS, Role, State, StompConnection
from pymq.protocol.frame import Frame

if TYPE_CHECKING:   # re-exported for the transports' annotations: they import the server through here only
    from pymq_server.net.vm import EmbeddedBroker as EmbeddedBroker
    from pymq_server.net.vm import VmLink as VmLink

#: frames a CONNECTED client may send without a state change, and the states in which a client may
#: receive a MESSAGE without one: read from the state table, not repeated
SESSION_FRAMES = frozenset(command for (role, state, way, command), after in TRANSITIONS.items()
                            if role is Role.CLIENT and state is State.CONNECTED and way == SEND
                            and after is State.CONNECTED)
_MESSAGE_STATES = tuple(state for (role, state, way, command), after in TRANSITIONS.items()
                        if role is Role.CLIENT and way == RECV and command == "MESSAGE" and after is state)


def embedded(name: str, options: dict[str, str]) -> EmbeddedBroker:
    """The embedded broker ``name`` (started on first use: this may take a moment)."""
    try:
        from pymq_server.net.vm import embedded_broker
    except ImportError as exc:   # an SDK-only install
        raise ConnectFailed(f"vm://{name} needs the broker package (pymq_server), which cannot be "
                            f"imported: {exc}") from None
    return embedded_broker(name, options)


def pending_row_writer() -> Callable[..., int]:
    """``pymq_server.storage.sql.send_in_transaction``: writes a SEND frame as a pending row of the
    application's own database transaction (spec/storage.md, "SQL device")."""
    try:
        from pymq_server.storage.sql import send_in_transaction
    except ImportError as exc:  # SQLAlchemy (or the broker package) is not installed
        raise IllegalStateError(f"sending in a database transaction needs SQLAlchemy and pymq_server: {exc}") \
            from None
    return send_in_transaction


class VmEndpoint:
    """The client end of one vm:// link (see the module docstring)."""

    on_frame: Callable[[Frame], None]

    def __init__(self, name: str, options: dict[str, str]) -> None:
        self.name = name
        self.options = options
        self.conn = StompConnection(Role.CLIENT)
        self.link: VmLink | None = None
        self._closed = False
        self._established = False
        self._lost_reported = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _open(self, broker: EmbeddedBroker, headers: dict[str, str]) -> None:
        self.conn.send_frame(Frame("CONNECT", headers))
        self.link = broker.link(self)
        self.link.open(headers)

    # -- what a transport provides ------------------------------------------------------------------
    def _connected(self, frame: Frame) -> None:
        """CONNECTED arrived."""
        raise NotImplementedError

    def _refused(self, error: PymqError) -> None:
        """The broker refused CONNECT (or went away before answering)."""
        raise NotImplementedError

    def _report_lost(self, error: PymqError) -> None:
        """The established connection ended (called once)."""
        raise NotImplementedError

    def from_broker(self, frame: Frame | None, error: PymqError | None = None) -> None:
        raise NotImplementedError

    def flow_changed(self) -> None:
        raise NotImplementedError

    # -- one inbound frame, on whichever thread the transport handles them --------------------------
    def _handle(self, frame: Frame | None, error: PymqError | None) -> bool:
        """Account for and pass on one frame from the broker; False once nothing more may follow."""
        if frame is None:
            self._lost(error or ConnectionClosed("the embedded broker closed the connection"))
            return False
        conn = self.conn
        if frame.command == "MESSAGE" and conn.state in _MESSAGE_STATES:
            # the broker's own state machine checked this MESSAGE as it sent it, and a MESSAGE changes
            # no state here: skip the table on the hottest path (every other frame goes through it)
            self.on_frame(frame)
            return True
        try:
            conn.receive_frame(frame)
        except ProtocolError as exc:
            self._lost(ConnectionClosed(f"the embedded broker sent an invalid frame: {exc}"))
            if self.link is not None:
                self.link.disconnect()
            return False
        if not self._established:
            if frame.command == "ERROR":
                self._closed = True
                self._refused(error_of(frame))
                return False
            self._established = True
            self._connected(frame)
            return True
        if self._lost_reported:
            return False
        self.on_frame(frame)
        if frame.command == "ERROR":
            self._lost(error_of(frame))
            return False
        return True

    def _lost(self, error: PymqError) -> None:
        self._closed = True
        if not self._established:
            self._refused(ConnectFailed(f"embedded broker {self.name!r} closed the connection during CONNECT"))
            return
        if self._lost_reported:
            return
        self._lost_reported = True
        self._report_lost(error)

    def _submit(self, frame: Frame) -> None:
        link = self.link
        if self._closed or link is None:
            raise ConnectionClosed("the connection is closed")
        conn = self.conn
        if conn.state is not State.CONNECTED or frame.command not in SESSION_FRAMES:
            conn.send_frame(frame)      # the table decides (in CONNECTED it allows every session frame)
        link.submit(frame)

    def _disconnect(self) -> None:
        self._closed = True
        if self.link is not None:
            self.link.disconnect()
