"""A client connection moves to the worker that owns its destination (spec/cores.md §2.4).

The kernel gives a new connection to any worker (``SO_REUSEPORT``). Forwarding every frame of it to the
destination's owner and every MESSAGE back (home.py, shadow.py) costs each crossing a second parse, a
re-encode and two channel writes: with one destination the second worker only adds work. So a connection
whose *first* frame after CONNECT is a SEND or SUBSCRIBE for a destination owned by another worker, and
that holds nothing yet (no subscription, temporary destination, receipt or delivery, no transaction with an
operation: it has handled nothing but its CONNECT and BEGINs, which the owner handles again first), is handed
over instead:

1. the home stops reading it (the frame and what follows wait), writes what its output still holds, and
   gives up only if that cannot be written at once or the scanner is inside a large body (it forwards,
   as before);
2. it sends the socket's descriptor to the owner over the owner's hand-over socket (a Unix datagram
   socket in the channel directory, ``SCM_RIGHTS``) with a token, then a HANDOVER envelope on the
   channel with the same token: the connection's state (principal, version, negotiated heart-beats,
   client id, vhost) and every byte read and not yet handled (the frame itself, re-encoded, the frames
   parsed behind it, the scanner's unparsed bytes, bytes held while paused);
3. the home forgets the connection without a word on the socket (its descriptor closes; the owner's
   copy keeps the TCP connection open); the owner makes it one of its own connections, in the state
   CONNECTED, and handles the bytes, then reads the socket where the home stopped.

Whatever goes wrong before the descriptor is sent leaves the connection where it was, forwarding. The
client sees nothing: same socket, same session, its receipts, heart-beats and acknowledgements handled by
the owner from the frame on. A connection that later uses a destination of a third worker forwards from
its new home as any connection does.
"""
from __future__ import annotations

import array
import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from pymq.errors import PymqError
from pymq.protocol.frame import Frame
from pymq.protocol.scanner import encode_frame
from pymq_server.broker import vhosts
from pymq_server.broker.auth import User
from pymq_server.cores.envelope import Kind
from pymq_server.net.tcp import StompServerProtocol

if TYPE_CHECKING:
    from pymq_server.cores.home import HomeSession
    from pymq_server.cores.mesh import Mesh
    from pymq_server.net.accept import Listener

log = logging.getLogger("pymq.cores")

#: a descriptor whose state envelope has not come within this long is closed (its home died between)
UNMATCHED_S = 30.0
#: a descriptor that comes before this worker's listener is bound waits up to this many times 50 ms
LISTENER_TRIES = 200
_LENGTH = struct.Struct(">I")


def socket_path(directory: str, k: int) -> str:
    return os.path.join(directory, f"h{k}.sock")


def pack_state(doc: dict[str, Any], unread: bytes) -> bytes:
    state = json.dumps(doc).encode()
    return _LENGTH.pack(len(state)) + state + unread


#: the state's fields and what each must be (hand_over writes exactly these): a string, a string or None, a
#: list of strings, a STOMP version, a heart-beat in ms
_STATE_FIELDS = {"user": "str", "roles": "list", "subject": "str?", "version": "version", "client_id": "str?",
                 "vhost": "str", "to_client": "ms", "to_server": "ms", "from": "str", "reclaim": "str?"}
_REQUIRED = frozenset({"user", "version"})
#: bounds on what a state may hold (a name, a role list, a heart-beat: far above anything real)
MAX_STATE_TEXT = 64 * 1024
MAX_ROLES = 4096
MAX_HEARTBEAT_MS = 2 ** 31 - 1


def unpack_state(payload: bytes) -> tuple[dict[str, Any], bytes]:
    """The state and the unread bytes; ValueError for anything else: a state that is not exactly what
    :func:`hand_over` writes (its fields, each of its type and within bounds) is refused whole. A channel is the
    broker's own, but a bug must not take the worker down (tests/hostile/handover_states.py, a fuzz target)."""
    if len(payload) < _LENGTH.size:
        raise ValueError("hand-over state shorter than its length")
    (size,) = _LENGTH.unpack_from(payload)
    end = _LENGTH.size + size
    if end > len(payload):
        raise ValueError("hand-over state truncated")
    try:
        doc = json.loads(payload[_LENGTH.size:end])
    except RecursionError:
        raise ValueError("hand-over state nested too deep") from None
    if not isinstance(doc, dict):
        raise ValueError("hand-over state is not an object")
    for key, value in doc.items():
        kind = _STATE_FIELDS.get(key)
        if kind is None:
            raise ValueError(f"hand-over state has an unknown field {key[:64]!r}")
        if not _fits(kind, value):
            raise ValueError(f"hand-over state field {key!r} is not a {kind}")
    missing = _REQUIRED - doc.keys()
    if missing:
        raise ValueError(f"hand-over state lacks {sorted(missing)}")
    return doc, payload[end:]


def _fits(kind: str, value: Any) -> bool:
    if kind == "str" or (kind == "str?" and value is not None):
        return isinstance(value, str) and len(value) <= MAX_STATE_TEXT
    if kind == "str?":
        return True
    if kind == "list":
        return (isinstance(value, list) and len(value) <= MAX_ROLES
                and all(isinstance(r, str) and len(r) <= MAX_STATE_TEXT for r in value))
    if kind == "version":
        return value in ("1.0", "1.1", "1.2")
    return type(value) is int and 0 <= value <= MAX_HEARTBEAT_MS       # "ms" (a bool is no number here)


def movable(session: HomeSession) -> bool:
    """Nothing of this connection is held anywhere yet: only its CONNECT was handled, and BEGINs of transactions
    that hold no operation (a JMS transacted session begins one as it opens; the owner begins them again), on a
    plain socket."""
    link = session.link
    transactions = session.transactions
    return (session.received == 1 + len(transactions) and type(link) is StompServerProtocol
            and session.mesh.handover is not None and not transactions.with_operations()
            and not session.closed and session._held is None and not session.consumers
            and not session.opened and not session.receipts.waiting
            and not session.temporaries and link.transport is not None
            and link.transport.get_extra_info("ssl_object") is None
            and link.transport.get_extra_info("socket") is not None)


def hand_over(session: HomeSession, owner: int, frame: Frame) -> bool:
    """Step 2 and 3 for ``session``, paused with ``frame`` not handled and the frames behind it deferred.
    False: nothing was sent, the connection stays (the caller resumes it, forwarding)."""
    mesh = session.mesh
    box = mesh.handover
    link = cast(StompServerProtocol, session.link)
    transport = link.transport
    if box is None or session.closed or transport is None or mesh.channels.get(owner) is None:
        return False
    output = link.output
    output.flush(force=True)
    if output.pieces or transport.get_write_buffer_size():
        return False                     # CONNECTED not written yet: it must leave from here
    rest = session.conn.unparsed()
    if rest is None:
        return False
    version = session.version
    # its empty transactions, begun again at the owner before the frame (their BEGINs' receipts were written here)
    begun = [Frame("BEGIN", {"transaction": tx}) for tx in session.transactions.names()]
    parts = [encode_frame(f.command, f.headers, f.body, version) for f in (*begun, frame, *session._deferred)]
    parts.append(rest)
    parts.extend(bytes(b) for b in session._held or ())
    backlog = link._backlog
    if backlog is not None:
        parts.append(bytes(backlog))
    user = session.user
    to_client, to_server = session.heartbeats
    # the re-claim token its CONNECTED carried (spec/ha.md §4.7): the owner lets it re-claim the names given there
    reclaim = session.broker.destinations.name_holders.token_of(session.temporary_names, session.vhost, user.name)
    doc = {"user": user.name, "roles": sorted(user.roles), "subject": user.certificate_subject,
           "version": version, "client_id": session.client_id, "vhost": session.vhost,
           "to_client": to_client, "to_server": to_server, "from": session.id, "reclaim": reclaim or None}
    sock = transport.get_extra_info("socket")
    token = box.next_token()
    try:
        fd = os.dup(sock.fileno())
    except OSError:
        return False
    try:
        box.send_descriptor(owner, token, fd)
    except OSError as exc:
        log.info("connection %s stays at worker %d: its hand-over to worker %d failed: %s",
                 session.id, mesh.me, owner, exc)
        return False
    finally:
        os.close(fd)
    mesh.send(owner, Kind.HANDOVER, mesh.me, token, pack_state(doc, b"".join(parts)))
    session.moved()
    return True


class AdoptedProtocol(StompServerProtocol):
    """A connection another worker handed over: CONNECTED already, the unread bytes handled first."""

    def __init__(self, broker: Any, loop: asyncio.AbstractEventLoop, session_type: Callable[..., Any],
                 doc: dict[str, Any], unread: bytes) -> None:
        super().__init__(broker, loop, session_type)
        self._adopt: tuple[dict[str, Any], bytes] | None = (doc, unread)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        adopt, self._adopt = self._adopt, None
        assert adopt is not None and self.session is not None
        doc, unread = adopt
        self.logged_in_elsewhere()
        session = cast("HomeSession", self.session)
        try:
            session.adopt(doc)
        except Exception:  # a bug must cost this connection, never the worker
            log.exception("worker: adopting a handed-over connection failed")
            session.fail(PymqError("internal broker error; the connection is closed"))
            return
        if unread and not session.closed and not self._closing:
            self._take(unread)


class HandoverBox:
    """This worker's hand-over socket: descriptors in (joined with their HANDOVER envelope), and out."""

    def __init__(self, mesh: Mesh, loop: asyncio.AbstractEventLoop) -> None:
        self.mesh = mesh
        self.loop = loop
        self.sock: socket.socket | None = None
        self._out: socket.socket | None = None
        self._tokens = 0
        self._incarnation = secrets.token_hex(6)
        self._fds: dict[str, tuple[int, asyncio.TimerHandle]] = {}
        self._states: dict[str, tuple[bytes, asyncio.TimerHandle]] = {}
        #: where an adopted connection goes: the worker's STOMP listener and its session type (worker.py)
        self.listener: Callable[[], Listener | None] = lambda: None
        self.session_type: Callable[..., Any] | None = None
        self.adopted = 0
        self.moved = 0

    def open(self) -> None:
        path = socket_path(self.mesh.directory, self.mesh.me)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.setblocking(False)
        self.loop.add_reader(sock.fileno(), self._readable)
        out = self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        out.setblocking(False)

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(Exception):
                self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
        if self._out is not None:
            self._out.close()
            self._out = None
        for fd, timer in self._fds.values():
            timer.cancel()
            os.close(fd)
        self._fds.clear()
        for _, timer in self._states.values():
            timer.cancel()
        self._states.clear()

    def next_token(self) -> str:
        """``<worker>.<incarnation>.<n>``: a descriptor a dead incarnation of this worker sent (its envelope never
        left) waits at the owner until UNMATCHED_S; the restarted worker's tokens must not join it."""
        self._tokens += 1
        return f"{self.mesh.me}.{self._incarnation}.{self._tokens}"

    def send_descriptor(self, owner: int, token: str, fd: int) -> None:
        """OSError when it cannot be sent at once (the owner is gone, its queue is full)."""
        if self._out is None:
            raise OSError("the hand-over socket is closed")
        self._out.sendmsg([token.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))],
                          0, socket_path(self.mesh.directory, owner))
        self.moved += 1

    # -- in --------------------------------------------------------------------------------------------
    def _readable(self) -> None:
        sock = self.sock
        while sock is not None:
            try:
                data, fds, flags, _ = socket.recv_fds(sock, 64, 4)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("worker %d: hand-over socket: %s", self.mesh.me, exc)
                return
            if len(fds) != 1 or flags & socket.MSG_CTRUNC:
                for fd in fds:
                    os.close(fd)
                log.warning("worker %d: a hand-over datagram with %d descriptors dropped", self.mesh.me, len(fds))
                continue
            token = data.decode("ascii", "replace")
            state = self._states.pop(token, None)
            if state is not None:
                state[1].cancel()
                self._adopt(fds[0], state[0])
            else:
                self._fds[token] = (fds[0], self.loop.call_later(UNMATCHED_S, self._expire_fd, token))

    def state(self, token: str, payload: bytes) -> None:
        """The HANDOVER envelope (mesh.py)."""
        entry = self._fds.pop(token, None)
        if entry is not None:
            entry[1].cancel()
            self._adopt(entry[0], payload)
        else:
            self._states[token] = (payload, self.loop.call_later(UNMATCHED_S, self._states.pop, token, None))

    def _expire_fd(self, token: str) -> None:
        entry = self._fds.pop(token, None)
        if entry is not None:
            os.close(entry[0])

    def _adopt(self, fd: int, payload: bytes, tries: int = 0) -> None:
        listener = self.listener()
        broker = self.mesh.broker
        if (listener is None or broker is None or self.session_type is None) and self.sock is not None \
                and tries < LISTENER_TRIES:
            # this worker's channels are up but its listener is not bound yet (start-up): wait for it
            self.loop.call_later(0.05, self._adopt, fd, payload, tries + 1)
            return
        sock = socket.socket(fileno=fd)
        if listener is None or broker is None or self.session_type is None:
            sock.close()
            return
        try:
            doc, unread = unpack_state(payload)
        except ValueError as exc:
            log.error("worker %d: a handed-over connection dropped: %s", self.mesh.me, exc)
            sock.close()
            return
        sock.setblocking(False)
        session_type = self.session_type
        self.adopted += 1
        listener.adopt(sock, lambda: AdoptedProtocol(broker, self.loop, session_type, doc, unread))


def adopted_user(doc: dict[str, Any]) -> User:
    return User(str(doc["user"]), "", frozenset(doc.get("roles") or ()), certificate_subject=doc.get("subject"))


def enter(session: HomeSession, doc: dict[str, Any]) -> None:
    """Make ``session`` the connection the state describes (CONNECTED, its principal, heart-beats)."""
    version = str(doc["version"])
    conn = session.conn
    # through the state table, as its CONNECT and our CONNECTED went at its first home
    conn.receive_frame(Frame("CONNECT", {"accept-version": version, "host": "pymq-cores"}, b""))
    conn.send_frame(Frame("CONNECTED", {"version": version}, b""))
    session.version = version
    session.deliveries.version = version
    session.authenticated(adopted_user(doc))
    broker = session.broker
    try:
        broker.session_opened(session)
        vhost = str(doc.get("vhost") or vhosts.DEFAULT)
        if vhost != vhosts.DEFAULT:
            entry = broker.config.vhosts[vhost]
            session.enter_vhost(vhost, entry.max_memory)
        session.temporary_names = broker.temporary_names(session, session.vhost, None).names
        token = doc.get("reclaim")
        if token:
            # the client knows its first worker's token only: offered here, it re-claims these names
            broker.destinations.name_holders.alias(str(token), session.temporary_names, session.vhost,
                                                   session.user.name)
        client_id = doc.get("client_id")
        if client_id:
            session.client_id = str(client_id)
            broker.claim_client_id(session, session.client_id)
    except (PymqError, KeyError) as exc:
        session.fail(exc if isinstance(exc, PymqError) else PymqError(f"hand-over: unknown vhost {exc}"))
        return
    to_client, to_server = int(doc.get("to_client") or 0), int(doc.get("to_server") or 0)
    session.heartbeats = (to_client, to_server)
    session.link.start_heartbeat(session, to_client, to_server)
