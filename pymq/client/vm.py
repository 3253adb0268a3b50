"""The SDKs' one seam to the broker package, which the broker registers and the SDK never imports.

``pymq`` does not import ``pymq_server``: an SDK-only install has no broker, and the layer rule
(tests/broker/test_layers.py) keeps the dependency one way.  What the SDKs need of the broker is found
through Python entry points the broker's distribution declares (pyproject.toml), looked up only when
used:

* group ``pymq.transports``, name ``vm``: the embedded broker of ``vm://`` URLs, a callable
  ``(name, options) -> EmbeddedBroker``.  :class:`VmEndpoint` is the client end both SDKs' vm://
  transports share: the client's STOMP state machine (so misuse fails the same way as over TCP) and what
  to do with each frame the broker hands over.  The transports add only how they cross threads: the
  blocking one handles frames on the broker's thread (its callbacks never block), the asyncio one hops
  onto its event loop;
* group ``pymq.app_transactions``, name ``sql``: the SQL device's pending-row writer, for
  ``send(..., transaction=db)`` (:mod:`pymq.client.apptx`): the row format and the in-process wake-up
  of an embedded broker on SQLite are the device's, so the SDK calls its code instead of repeating it.

The broker's side of a link is described here as protocols (:class:`EmbeddedBroker`, :class:`VmLink`),
which ``pymq_server.embedded`` (the broker) and ``pymq_server.net.vm`` (its links) implement.
"""
from __future__ import annotations

import functools
from typing import Protocol
from collections.abc import Callable

from pymq.client._core import error_of
from pymq.errors import ConnectFailed, ConnectionClosed, IllegalStateError, ProtocolError, PymqError
from pymq.protocol.connection import RECV, SEND, TRANSITIONS, Role, State, StompConnection
from pymq.protocol.frame import Frame

#: frames a CONNECTED client may send without a state change, and the states in which a client may
#: receive a MESSAGE without one: read from the state table, not repeated
SESSION_FRAMES = frozenset(command for (role, state, way, command), after in TRANSITIONS.items()
                            if role is Role.CLIENT and state is State.CONNECTED and way == SEND
                            and after is State.CONNECTED)
_MESSAGE_STATES = tuple(state for (role, state, way, command), after in TRANSITIONS.items()
                        if role is Role.CLIENT and way == RECV and command == "MESSAGE" and after is state)

TRANSPORTS = "pymq.transports"
APP_TRANSACTIONS = "pymq.app_transactions"


class VmClient(Protocol):
    """The client end of a link, as the broker calls it (on its loop's thread; never blocks)."""

    def from_broker(self, frame: Frame | None, error: PymqError | None = None) -> None: ...

    def flow_changed(self) -> None: ...


class VmLink(Protocol):
    """The broker's end of one in-process connection, as the client uses it (``pymq_server.net.vm.VmLink``).
    ``submitted`` is the client's count of SEND bytes handed over, ``taken`` the broker's."""

    paused: bool
    submitted: int
    taken: int
    want_wake: bool
    window_high: int

    def open(self, headers: dict[str, str]) -> None: ...

    def submit(self, frame: Frame) -> None: ...

    def disconnect(self) -> None: ...

    def abandon(self) -> None: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def held_back(self) -> bool: ...

    @property
    def caught_up(self) -> bool: ...


class EmbeddedBroker(Protocol):
    """An embedded broker (``vm://name``): one :class:`VmLink` per client connection."""

    def link(self, client: VmClient) -> VmLink: ...


@functools.cache
def registered(group: str, name: str) -> Callable[..., object] | None:
    """The object a distribution registered as entry point ``name`` of ``group`` (None: nothing is)."""
    # imported at the first look-up, not with pymq: importlib.metadata brings 30 more modules (email, csv,
    # datetime, calendar, locale, ...) into every process that imports pymq (an application using the SDK;
    # the broker gets it from pydantic anyway), and in bench_handover's owner process, which imports pymq
    # alone, a heap laid out around them parsed frames 5-12 % slower on the same instructions
    # (bench/README.md, issue 25)
    from importlib.metadata import entry_points
    for point in entry_points(group=group, name=name):
        loaded: Callable[..., object] = point.load()
        return loaded
    return None


def embedded(name: str, options: dict[str, str]) -> EmbeddedBroker:
    """The embedded broker ``name`` (started on first use: this may take a moment)."""
    try:
        start = registered(TRANSPORTS, "vm")
    except ImportError as exc:   # registered, but the broker package cannot be imported
        raise ConnectFailed(f"vm://{name} needs the broker (`pip install \"pymq-broker[server]\"`), which "
                            f"cannot be imported: {exc}") from None
    if start is None:
        raise ConnectFailed(f"vm://{name} needs the broker (pymq-broker), and no installed distribution "
                            f"registers a 'vm' transport (entry point group {TRANSPORTS!r}); an editable "
                            f"install made before it was declared needs `pip install -e .` again")
    broker: EmbeddedBroker = start(name, options)  # type: ignore[assignment]
    return broker


def pending_row_writer() -> Callable[..., int]:
    """The SQL device's ``send_in_transaction``: writes a SEND frame as a pending row of the
    application's own database transaction (spec/storage.md, "SQL device")."""
    try:
        writer = registered(APP_TRANSACTIONS, "sql")
    except ImportError as exc:  # SQLAlchemy (or the broker package) is not installed
        raise IllegalStateError(f"sending in a database transaction needs SQLAlchemy and pymq_server: {exc}") \
            from None
    if writer is None:
        raise IllegalStateError(f"sending in a database transaction needs the broker (pymq-broker), and no "
                                f"installed distribution registers an 'sql' writer (entry point group "
                                f"{APP_TRANSACTIONS!r}); an editable install may need `pip install -e .` again")
    return writer  # type: ignore[return-value]


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
