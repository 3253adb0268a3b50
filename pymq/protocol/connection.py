"""The STOMP connection state machine, shared by the broker and the Python client (sans-IO).

Everything that affects a connection's state lives in this file: the transition table, the headers each
command requires per version, version and heart-beat negotiation.  A frame that the table does not allow
in the current state is a protocol error.  Errors raised while *receiving* are the peer's fault (the
broker answers them with an ERROR frame and closes); errors raised while *sending* are ours and are raised
before a byte is produced.

Usage (server side)::

    conn = StompConnection(Role.SERVER)
    for frame in conn.receive_data(data):       # raises ProtocolError subclasses
        ...
    transport.write(conn.send(Frame("MESSAGE", headers, body)))
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pymq import enums
from pymq.errors import (InvalidHeader, MalformedFrame, MissingHeader, ProtocolError, UnknownCommand,
                         UnsupportedVersion)
from pymq.protocol.frame import ALL_COMMANDS, BODY_COMMANDS, VERSIONS, Frame
from pymq.protocol.numbers import INT32_MAX, parse_wire_int
from pymq.protocol.scanner import DEFAULT_MAX_FRAME_SIZE, FrameScanner, encode_frame, escape

if TYPE_CHECKING:
    from pymq.protocol._scanner_py import Headers

#: a body at least this long is sent apart from its frame's head (:meth:`StompConnection.send_parts`)
LARGE_BODY = 64 * 1024


def encode_frame_parts(command: str, headers: Headers, body: bytes, version: str) -> tuple[bytes, ...]:
    """``encode_frame(command, headers, body, version)`` as (head, body, NUL) for a body of
    :data:`LARGE_BODY` or more, else as one piece.  The head is ``encode_frame`` of the frame without its
    body, its blank line moved behind the content-length line that ``encode_frame`` writes last: one
    header encoder (both scanner twins'), the same bytes (tests/protocol/test_frame_parts.py)."""
    if len(body) < LARGE_BODY:
        return (encode_frame(command, headers, body, version),)
    bare = encode_frame(command, headers, b"", version)       # ...headers "\n" "\0"
    return bare[:-2] + b"content-length:%d\n\n" % len(body), body, b"\x00"


def message_head(subscription: str, version: str) -> bytes:
    """The first lines of every MESSAGE a subscription gets, ``MESSAGE`` and its ``subscription`` header,
    escaped as ``version`` escapes header values (1.0 not at all, 1.1 without CR): a link encodes it once
    per subscription and hands it to :meth:`StompConnection.send_message`."""
    sub = subscription if version == "1.0" else escape(subscription, version != "1.1")
    return f"MESSAGE\nsubscription:{sub}\n".encode()


_MESSAGE = Frame("MESSAGE", {}, b"")


class Role(enums.Enum):
    CLIENT = "client"
    SERVER = "server"


class State(enums.Enum):
    IDLE = "idle"                  # nothing exchanged yet
    CONNECTING = "connecting"      # CONNECT seen, CONNECTED not yet
    CONNECTED = "connected"
    DISCONNECTING = "disconnecting"  # DISCONNECT seen; only its RECEIPT (or ERROR) may follow
    CLOSED = "closed"              # after ERROR, or a DISCONNECT completed


SEND, RECV = "send", "recv"
_SESSION_FRAMES = ("SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT")
#: the table's name for the RECEIPT that answers the DISCONNECT itself (its ``receipt-id`` is the
#: DISCONNECT's ``receipt``); RECEIPTs of earlier frames may still travel before it and leave the
#: connection DISCONNECTING, whatever the STOMP version.
DISCONNECT_RECEIPT = "RECEIPT(DISCONNECT)"

# (role, state, direction, command) -> next state.  Direction is from this end's point of view.
TRANSITIONS: dict[tuple[Role, State, str, str], State] = {}


def _allow(role: Role, state: State, direction: str, commands: Iterable[str], to: State | None = None) -> None:
    for command in commands:
        TRANSITIONS[(role, state, direction, command)] = to if to is not None else state


# server
_allow(Role.SERVER, State.IDLE, RECV, ("CONNECT", "STOMP"), State.CONNECTING)
_allow(Role.SERVER, State.IDLE, SEND, ("ERROR",), State.CLOSED)
_allow(Role.SERVER, State.CONNECTING, SEND, ("CONNECTED",), State.CONNECTED)
_allow(Role.SERVER, State.CONNECTING, SEND, ("ERROR",), State.CLOSED)
_allow(Role.SERVER, State.CONNECTED, RECV, _SESSION_FRAMES)
_allow(Role.SERVER, State.CONNECTED, RECV, ("DISCONNECT",), State.DISCONNECTING)
_allow(Role.SERVER, State.CONNECTED, SEND, ("MESSAGE", "RECEIPT"))
_allow(Role.SERVER, State.CONNECTED, SEND, ("ERROR",), State.CLOSED)
_allow(Role.SERVER, State.DISCONNECTING, SEND, ("RECEIPT",))
_allow(Role.SERVER, State.DISCONNECTING, SEND, (DISCONNECT_RECEIPT, "ERROR"), State.CLOSED)
# client
_allow(Role.CLIENT, State.IDLE, SEND, ("CONNECT", "STOMP"), State.CONNECTING)
_allow(Role.CLIENT, State.CONNECTING, RECV, ("CONNECTED",), State.CONNECTED)
_allow(Role.CLIENT, State.CONNECTING, RECV, ("ERROR",), State.CLOSED)
_allow(Role.CLIENT, State.CONNECTED, SEND, _SESSION_FRAMES)
_allow(Role.CLIENT, State.CONNECTED, SEND, ("DISCONNECT",), State.DISCONNECTING)
_allow(Role.CLIENT, State.CONNECTED, RECV, ("MESSAGE", "RECEIPT"))
_allow(Role.CLIENT, State.CONNECTED, RECV, ("ERROR",), State.CLOSED)
# messages already in flight may still arrive while our DISCONNECT waits for its receipt
_allow(Role.CLIENT, State.DISCONNECTING, RECV, ("MESSAGE", "RECEIPT"))
_allow(Role.CLIENT, State.DISCONNECTING, RECV, (DISCONNECT_RECEIPT, "ERROR"), State.CLOSED)

# command -> {version: required headers}; 1.0 is the most lenient (no ids on SUBSCRIBE/ACK).
REQUIRED_HEADERS: dict[str, dict[str, tuple[str, ...]]] = {
    "SEND": {"1.0": ("destination",), "1.1": ("destination",), "1.2": ("destination",)},
    "SUBSCRIBE": {"1.0": ("destination",), "1.1": ("destination", "id"), "1.2": ("destination", "id")},
    "UNSUBSCRIBE": {"1.0": (), "1.1": ("id",), "1.2": ("id",)},   # 1.0: id or destination, see below
    "ACK": {"1.0": ("message-id",), "1.1": ("message-id", "subscription"), "1.2": ("id",)},
    "NACK": {"1.1": ("message-id", "subscription"), "1.2": ("id",)},
    "BEGIN": {v: ("transaction",) for v in VERSIONS},
    "COMMIT": {v: ("transaction",) for v in VERSIONS},
    "ABORT": {v: ("transaction",) for v in VERSIONS},
    "CONNECTED": {"1.0": (), "1.1": ("version",), "1.2": ("version",)},
    "MESSAGE": {v: ("destination", "message-id") for v in VERSIONS},
    "RECEIPT": {v: ("receipt-id",) for v in VERSIONS},
}


#: the states in which a server may send a MESSAGE, which never changes the state: read from the table once,
#: so each delivery checks a set instead of building the table's key (StompConnection.send_message)
_SERVER_MESSAGE_STATES = frozenset(state for (role, state, way, command), after in TRANSITIONS.items()
                                   if role is Role.SERVER and way == SEND and command == "MESSAGE" and after is state)

# REQUIRED_HEADERS by version, what receive_frame looks up per frame: the headers a command needs, or None
# where _check_required must decide (a command unknown to the version, 1.0's UNSUBSCRIBE)
_REQUIRED_BY_VERSION: dict[str, dict[str, tuple[str, ...] | None]] = {
    version: {command: None if version not in per_version or (command, version) == ("UNSUBSCRIBE", "1.0")
              else per_version[version] for command, per_version in REQUIRED_HEADERS.items()}
    for version in VERSIONS}


def negotiate_version(accept_version: str | None, supported: Iterable[str] = VERSIONS) -> str:
    """Highest version both ends speak; a CONNECT without accept-version speaks 1.0."""
    if not accept_version:
        return "1.0"
    offered = {v.strip() for v in accept_version.split(",")}
    common = [v for v in supported if v in offered]
    if not common:
        raise UnsupportedVersion(f"supported protocol versions are {','.join(supported)}",
                                 offered=accept_version)
    return max(common, key=lambda v: tuple(int(x) for x in v.split(".")))


def parse_heartbeat(value: str | None) -> tuple[int, int]:
    """``cx,cy`` (or ``sx,sy``) in ms: two wire integers, each at most 2**31-1 (about 24 days)."""
    if not value:
        return 0, 0
    parts = value.split(",", 2)
    if len(parts) != 2:
        shown = value if len(value) <= 32 else value[:29] + "..."
        raise InvalidHeader(f"header 'heart-beat' must be two comma-separated integers, got {shown!r}",
                            header="heart-beat")
    return (parse_wire_int("heart-beat", parts[0], maximum=INT32_MAX),
            parse_wire_int("heart-beat", parts[1], maximum=INT32_MAX))


def negotiate_heartbeat(connect: tuple[int, int], connected: tuple[int, int]) -> tuple[int, int]:
    """(client→server interval, server→client interval) in ms, 0 meaning none (STOMP 1.2 "Heart-beating").

    ``connect`` is the CONNECT frame's (cx, cy), ``connected`` the CONNECTED frame's (sx, sy).
    """
    cx, cy = connect
    sx, sy = connected
    to_server = max(cx, sy) if cx and sy else 0
    to_client = max(sx, cy) if sx and cy else 0
    return to_server, to_client


def offer_heartbeat(connect: tuple[int, int], longest: tuple[int, int], floor: int) -> tuple[int, int]:
    """The (sx, sy) a server answers in CONNECTED to a client's (cx, cy) so that the client's own intervals
    are honoured, as RabbitMQ does, down to ``floor`` ms (or the server's own ``longest`` (sx, sy) offer,
    when that is shorter still).

    STOMP makes each direction's interval the larger of the two sides' numbers, so a server that always
    offered its own ``longest`` would turn a client's ``heart-beat:0,500`` into beats every ``longest`` ms.
    A direction the client asks nothing of (0) gets the server's offer unchanged (no beats flow there
    anyway); a server that sends or wants no beats (0 in ``longest``) keeps 0.
    """
    cx, cy = connect
    send, recv = longest
    sx = min(send, max(floor, cy)) if cy and send else send
    sy = min(recv, max(floor, cx)) if cx and recv else recv
    return sx, sy


class StompConnection:
    """One end of a STOMP connection: parses what arrives, validates and encodes what leaves."""

    def __init__(self, role: Role, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 max_headers: int = 1000) -> None:
        self.role = role
        self.state = State.IDLE
        self.version = "1.0"
        #: (interval we must send at, interval we expect to receive at) in ms; 0 = off
        self.heartbeat = (0, 0)
        self._scanner = FrameScanner(max_frame_size=max_frame_size, max_headers=max_headers)
        #: the ``receipt`` header of the DISCONNECT (sent by a client, received by a server)
        self._disconnect_receipt: str | None = None
        #: the frame limit once CONNECTED settles the session (see limit_until_connected)
        self._settled_frame_size: int | None = None
        self._transitions = TRANSITIONS
        self._peer_may_send_body = BODY_COMMANDS

    # -- receiving ---------------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> list[Frame]:
        """Frames completed by ``data``; raises a ProtocolError subclass if the peer broke the protocol.

        Stops after a CONNECT/STOMP/CONNECTED frame: bytes after it wait for the negotiated version.
        Once CONNECTED is sent (or received), call ``receive_data(b"")`` to parse them.
        """
        frames = self._scanner.feed(data)
        if frames:
            for frame in frames:
                self.receive_frame(frame)
        return frames

    def parse(self, data: bytes | memoryview) -> list[Frame]:
        """Frames completed by ``data``, *not yet* checked against the state table: the caller passes
        each to :meth:`receive_frame` when it handles it.  A broker must do that — the state change
        of a DISCONNECT at the end of a read must not apply before the ACKs in front of it are
        handled (their handling may still send MESSAGEs)."""
        return self._scanner.feed(data)

    def _table_command(self, frame: Frame) -> str:
        """The command as the table knows it: a RECEIPT for the DISCONNECT has its own row."""
        if (frame.command == "RECEIPT" and self.state is State.DISCONNECTING
                and self._disconnect_receipt is not None
                and frame.headers.get("receipt-id") == self._disconnect_receipt):
            return DISCONNECT_RECEIPT
        return frame.command

    def receive_frame(self, frame: Frame) -> None:
        """Check and account for one frame, in handling order (after :meth:`parse`, or for a frame
        that arrived already parsed through the in-process vm:// transport)."""
        command = frame.command
        # only a RECEIPT can be the DISCONNECT's own: every other frame is looked up by its command
        key = (self.role, self.state, RECV, command if command != "RECEIPT" else self._table_command(frame))
        nxt = self._transitions.get(key)
        if nxt is None:
            if command not in ALL_COMMANDS:
                raise UnknownCommand(f"unknown command {command!r}", command=command)
            if self.state is State.IDLE:
                raise ProtocolError(f"expected CONNECT or STOMP as the first frame, got {command}")
            raise ProtocolError(f"{command} is not allowed in state {self.state.value} "
                                f"({self.role.value} side)")
        if frame.body and command not in self._peer_may_send_body:
            raise MalformedFrame(f"{command} frames must not have a body")
        required = _REQUIRED_BY_VERSION[self.version].get(command, ())
        if required is None:
            self._check_required(frame)
        else:
            headers = frame.headers
            for name in required:
                if name not in headers:
                    self._check_required(frame)     # raises, naming the header
        if command in ("CONNECT", "STOMP") and self.role is Role.SERVER:
            # version settles only when we answer; until then, keep parsing as 1.0
            pass
        elif command == "CONNECTED":
            self._settle(frame.headers.get("version", "1.0"))
        elif command == "DISCONNECT":
            self._disconnect_receipt = frame.headers.get("receipt")
        self.state = nxt

    def _check_required(self, frame: Frame) -> None:
        per_version = REQUIRED_HEADERS.get(frame.command)
        if per_version is None:
            return
        required = per_version.get(self.version)
        if required is None:
            raise UnknownCommand(f"{frame.command} does not exist in STOMP {self.version}",
                                 command=frame.command)
        headers = frame.headers
        for name in required:
            if name not in headers:
                raise MissingHeader(f"{frame.command} frame is missing the required '{name}' header",
                                    command=frame.command, header=name)
        if frame.command == "UNSUBSCRIBE" and self.version == "1.0":
            if "id" not in headers and "destination" not in headers:
                raise MissingHeader("UNSUBSCRIBE frame needs an 'id' or a 'destination' header",
                                    command="UNSUBSCRIBE", header="id")

    # -- sending -------------------------------------------------------------------------------------
    def send(self, frame: Frame) -> bytes:
        self._on_send(frame)
        return encode_frame(frame.command, frame.headers, frame.body, self.version)

    def send_parts(self, frame: Frame) -> tuple[bytes, ...]:
        """:meth:`send` as pieces whose concatenation it is: a body of :data:`LARGE_BODY` or more stays
        apart from the head and the NUL (a transport writes it from the caller's own bytes, where the
        encoded frame would be two copies of it: a bulk SEND's 4 MiB, megabytes a second from a Spark
        sink); a smaller frame is one piece."""
        self._on_send(frame)
        return encode_frame_parts(frame.command, frame.headers, frame.body, self.version)

    def send_message(self, head: bytes, block: bytes, body: bytes, ack: str | None = None, deliveries: int = 1,
                     first_in_group: bool = False) -> tuple[bytes, ...]:
        """A MESSAGE (server side), validated by the state table and encoded from parts encoded once each:
        ``head`` (:func:`message_head`, per subscription), this delivery's own lines (``ack``, the
        redelivery count, the group flag), ``block`` (the message's header lines, ending with its
        content-length when it has a body, encoded once per message and escaping: the same for every
        subscriber) and ``body``. One piece, or (head, body, NUL) for a body of :data:`LARGE_BODY` or more,
        which a transport writes from the message's own bytes."""
        if self.state not in _SERVER_MESSAGE_STATES or self.role is not Role.SERVER:
            self._on_send(_MESSAGE)              # raises: the table allows no MESSAGE here
        if ack is not None or deliveries > 1 or first_in_group:
            extra = f"ack:{ack}\n" if ack is not None else ""
            if deliveries > 1:
                extra += f"redelivered:true\nJMSXDeliveryCount:{deliveries}\n"
            if first_in_group:
                extra += "JMSXGroupFirstForConsumer:true\n"
            head = head + extra.encode()
        if len(body) < LARGE_BODY:
            return (b"".join((head, block, b"\n", body, b"\x00")),)
        return head + block + b"\n", body, b"\x00"

    def send_frame(self, frame: Frame) -> Frame:
        """Validate and account for an outgoing frame without encoding it (vm:// transport)."""
        self._on_send(frame)
        return frame

    def _on_send(self, frame: Frame) -> None:
        command = frame.command
        nxt = self._transitions.get((self.role, self.state, SEND,
                                     command if command != "RECEIPT" else self._table_command(frame)))
        if nxt is None:
            raise ProtocolError(f"cannot send {frame.command} in state {self.state.value} "
                                f"({self.role.value} side)")
        if frame.command == "CONNECTED":
            self._settle(frame.headers.get("version", "1.0"))
        elif frame.command == "DISCONNECT":
            self._disconnect_receipt = frame.headers.get("receipt")
        self.state = nxt

    def limit_until_connected(self, max_frame_size: int) -> None:
        """Until CONNECTED is sent (or received), accept frames of at most ``max_frame_size`` bytes.

        A broker gives a peer that has not logged in a small limit (spec/stomp.md §10): a CONNECT is a
        few hundred bytes, and an unauthenticated peer must not make the broker hold megabytes.  The
        full limit applies from the CONNECTED frame on."""
        if self._settled_frame_size is None:
            self._settled_frame_size = self._scanner.max_frame_size
        self._scanner.max_frame_size = min(max_frame_size, self._settled_frame_size)

    def heartbeat_bytes(self) -> bytes:
        return b"\n"

    # -- negotiation -------------------------------------------------------------------------------
    def _settle(self, version: str) -> None:
        if version not in VERSIONS:
            raise UnsupportedVersion(f"peer chose unsupported STOMP version {version!r}")
        self.version = version
        self._scanner.version = version
        if self._settled_frame_size is not None:
            self._scanner.max_frame_size = self._settled_frame_size
            self._settled_frame_size = None

    def set_heartbeat(self, send_ms: int, expect_ms: int) -> None:
        self.heartbeat = (send_ms, expect_ms)

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    def close(self) -> None:
        self.state = State.CLOSED

    @property
    def buffered(self) -> int:
        return self._scanner.buffered

    @property
    def body_missing(self) -> int:
        """Bytes a large body being received still needs (the scanner's ``body_missing``); 0 otherwise."""
        return self._scanner.body_missing

    def unparsed(self) -> bytes | None:
        """The bytes received and not yet parsed into frames (the scanner's ``unparsed``)."""
        return self._scanner.unparsed()
