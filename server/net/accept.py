"""Accepting sockets: the connection cap counted at ``accept()``, and the TLS handshake under a deadline.

Every listener of the broker (STOMP, STOMP over TLS, WebSocket, the admin HTTP port) is a
:class:`Listener`: a listening socket whose accept loop is ours, not asyncio's ``create_server``'s,
because asyncio accepts up to ``backlog`` sockets per loop turn before any protocol hears of them —
a burst of stalled clients took every file descriptor before a cap could refuse one, and at ``EMFILE``
asyncio stops accepting on that listener (plain STOMP clients locked out while TLS handshakes stalled).

* **Counted at accept.**  A slot of the listener's :class:`ConnectionSlots` is taken as ``accept()``
  returns, and given back when the socket closes, whatever happened in between — a TLS handshake that
  failed or never ended, an upgrade refused, a session that ended.  STOMP, TLS and WebSocket share the
  broker's ``max_connections``; the admin port has ``admin_max_connections`` of its own, so neither can
  lock the other out.  Both are kept within the process's file-descriptor limit (:func:`fit_descriptors`,
  ``BrokerServer``), so the broker never runs out of descriptors.
* **Refused at once over the cap.**  The listener's refusal (a STOMP ``resource-limit`` ERROR frame, an
  HTTP 503) is written; the socket is half-closed and what the peer already sent is read and dropped for
  at most :data:`LINGER_S` (so the answer is not lost to the reset an unread request provokes), then
  closed.  At most :data:`MAX_LINGERING` refusals linger at once; beyond that, and for TLS listeners
  (nothing can be said before a handshake), the socket is closed at once.
* **TLS under a deadline.**  The handshake runs here (``connect_accepted_socket(ssl=...)``) with
  ``ssl_handshake_timeout`` the listener's deadline (``connect_timeout_ms``): a peer that stalls
  mid-handshake holds its slot that long and no longer (asyncio's default is 60 s), and is counted all along.
* Then the inner protocol (the STOMP adapter, the WebSocket upgrade, aiohttp's request handler) gets the
  (TLS) transport and every later event; bytes that came between the handshake's end and the attach are
  handed to it first.

A refused or failed socket costs one INFO line; :class:`ConnectionSlots` counts them (``refused``,
``handshakes_failed``).
"""
from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import struct
from collections.abc import Callable

log = logging.getLogger("pymq.net")

#: how long a refused socket is read (and what it sent dropped) before it is closed
LINGER_S = 1.0
#: refused sockets lingering at once, per process; beyond this they are closed without a word
MAX_LINGERING = 64
#: sockets accepted per listener per loop turn (the rest wait in the kernel's queue for the next turn)
ACCEPT_BATCH = 64
#: file descriptors kept for the broker's own files (storage, logs, cluster and database links) and for
#: lingering refusals
RESERVED_DESCRIPTORS = 128 + MAX_LINGERING


class ConnectionSlots:
    """Sockets of one group of listeners open at once (accepted, handshaking, speaking), and the cap."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what              # the setting that sets the cap, for messages
        self.held = 0
        self.refused = 0              # sockets refused for want of a slot, since start
        self.handshakes_failed = 0    # TLS handshakes that failed or ran out of time, since start

    def take(self) -> bool:
        if self.held >= self.limit:
            self.refused += 1
            return False
        self.held += 1
        return True

    def give_back(self) -> None:
        self.held -= 1


class Listener:
    """Listening sockets with a counted accept loop; what app.py uses of asyncio's ``Server``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sockets: list[socket.socket], slots: ConnectionSlots,
                 make_inner: Callable[[], asyncio.BaseProtocol], *, ssl_context: ssl.SSLContext | None = None,
                 handshake_timeout: float = 10.0, refusal: Callable[[], bytes] | None = None) -> None:
        self.loop = loop
        self.sockets = sockets
        self.slots = slots
        self.make_inner = make_inner
        self.ssl_context = ssl_context
        self.handshake_timeout = handshake_timeout
        self.refusal = refusal
        self.open: set[AcceptedSocket] = set()
        self._serving = False
        self._closed = asyncio.Event()

    @classmethod
    def bind(cls, loop: asyncio.AbstractEventLoop, host: str, port: int, slots: ConnectionSlots,
             make_inner: Callable[[], asyncio.BaseProtocol], *, reuse_port: bool = False, backlog: int = 1024,
             **options) -> Listener:
        """Bind ``host``:``port`` (every address the name has, as asyncio does); OSError when it cannot."""
        sockets: list[socket.socket] = []
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            for family, kind, proto, _, address in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                if port == 0:        # every address on the port the first one got
                    port = sock.getsockname()[1]
                sock.listen(backlog)
                sock.setblocking(False)
        except OSError:
            for sock in sockets:
                sock.close()
            raise
        return cls(loop, sockets, slots, make_inner, **options)

    async def start_serving(self) -> None:
        if not self._serving and self.sockets:
            self._serving = True
            for sock in self.sockets:
                self.loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = listening.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # out of descriptors all the same (other files of the process): try again shortly
                    log.warning("accept: %s; trying again in 0.1 s", exc.strerror)
                    self.loop.remove_reader(listening.fileno())
                    self.loop.call_later(0.1, self._resume, listening)
                    return
                raise
            conn.setblocking(False)
            if self.slots.take():
                self._admit(conn)
            else:
                self._refuse(conn)

    def _resume(self, listening: socket.socket) -> None:
        if self._serving and listening.fileno() >= 0:
            self.loop.add_reader(listening.fileno(), self._accept, listening)

    def _admit(self, conn: socket.socket) -> None:
        accepted = AcceptedSocket(self)
        self.open.add(accepted)
        self.loop.create_task(self._connect(conn, lambda: accepted, tls=self.ssl_context is not None))

    async def _connect(self, conn: socket.socket, factory: Callable[[], asyncio.Protocol], tls: bool = False) -> None:
        # TLS through connect_accepted_socket(ssl=...), not start_tls on a plain transport: under uvloop
        # start_tls missed ClientHellos that had already arrived and stalled those handshakes until their
        # deadline (most clients, which speak first, failed: the bindings' TLS tests)
        try:
            if tls:
                await self.loop.connect_accepted_socket(factory, conn, ssl=self.ssl_context,
                                                        ssl_handshake_timeout=self.handshake_timeout)
            else:
                await self.loop.connect_accepted_socket(factory, conn)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, EOFError) as exc:
            # the peer went before the transport was made, or (TLS) a broken or stalled handshake: the
            # client's affair; the slot goes back
            if tls:
                self.slots.handshakes_failed += 1
                log.info("TLS handshake from %s failed: %s", _peer_host(conn),
                         "not completed within connect_timeout_ms" if "taking longer" in str(exc)
                         or isinstance(exc, asyncio.TimeoutError) else getattr(exc, "reason", None) or exc)
            conn.close()
            factory().connection_lost(None)

    def adopt(self, conn: socket.socket, make_inner: Callable[[], asyncio.BaseProtocol]) -> bool:
        """A connected plain socket another worker accepted and handed over (server/cores/handover.py),
        counted as an accepted one; False (closed) when no slot is free."""
        if not self.slots.take():
            log.warning("a handed-over connection closed: %s is %d", self.slots.what, self.slots.limit)
            conn.close()
            return False
        accepted = AcceptedSocket(self, make_inner)
        self.open.add(accepted)
        self.loop.create_task(self._connect(conn, lambda: accepted))
        return True

    def _refuse(self, conn: socket.socket) -> None:
        global _lingering
        log.info("a connection refused: %s is %d", self.slots.what, self.slots.limit)
        answer = self.refusal() if self.refusal is not None and self.ssl_context is None else b""
        if not answer or _lingering >= MAX_LINGERING:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            conn.close()                    # at once, the descriptor freed before the next accept
            return
        _lingering += 1
        self.loop.create_task(self._connect(conn, lambda: Refusal(self.loop, answer)))

    def close(self) -> None:
        self._serving = False
        for sock in self.sockets:
            if sock.fileno() >= 0:
                self.loop.remove_reader(sock.fileno())
                sock.close()
        if not self.open:
            self._closed.set()

    async def wait_closed(self) -> None:
        """Until every connection this listener accepted has closed (as asyncio's Server), at most 10 s."""
        if self.open:
            try:
                await asyncio.wait_for(self._closed.wait(), 10)
            except asyncio.TimeoutError:
                pass

    def gone(self, accepted: AcceptedSocket) -> None:
        self.open.discard(accepted)
        if not self._serving and not self.open:
            self._closed.set()


def _peer_host(conn: socket.socket) -> str:
    try:
        peer = conn.getpeername()
    except OSError:
        return "?"
    return peer[0] if isinstance(peer, tuple) else "?"


_lingering = 0
#: SO_LINGER on, 0 s: close() resets the connection and frees its descriptor at once
_RESET = struct.pack("ii", 1, 0)


class Refusal(asyncio.Protocol):
    """A socket refused for want of a slot: the answer, a half-close, what the peer sends dropped, close."""

    def __init__(self, loop: asyncio.AbstractEventLoop, answer: bytes) -> None:
        self.loop = loop
        self.answer = answer
        self._counted = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.answer)  # type: ignore[attr-defined]
        if transport.can_write_eof():  # type: ignore[attr-defined]
            transport.write_eof()  # type: ignore[attr-defined]
        self.loop.call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False                    # the peer is done: close

    def connection_lost(self, exc: Exception | None) -> None:
        global _lingering
        if self._counted:
            self._counted = False
            _lingering -= 1


class AcceptedSocket(asyncio.Protocol):
    """One admitted socket (over TLS once its handshake is done) and its inner protocol; its slot back when
    it closes."""

    def __init__(self, listener: Listener, make_inner: Callable[[], asyncio.BaseProtocol] | None = None) -> None:
        self.listener = listener
        self.make_inner = make_inner or listener.make_inner
        self.inner: asyncio.Protocol | None = None
        self._slot = True
        self._early: list[bytes] = []          # data that arrived before the inner protocol did
        self._eof = False
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._attach(transport)       # over TLS the handshake is done (Listener._connect)

    def _attach(self, transport: asyncio.BaseTransport) -> None:
        inner = self.make_inner()
        self.inner = inner  # type: ignore[assignment]
        inner.connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            inner.data_received(data)  # type: ignore[attr-defined]
        if self._eof and not inner.eof_received():  # type: ignore[attr-defined]
            transport.close()

    def _release(self) -> None:
        if self._slot:
            self._slot = False
            self.listener.slots.give_back()
            self.listener.gone(self)

    # -- events, forwarded -------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)
        else:
            self._early.append(bytes(data))       # between the handshake's end and the attach: one read

    def eof_received(self) -> bool | None:
        if self.inner is not None:
            return self.inner.eof_received()
        self._eof = True
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._release()
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


def fit_descriptors(wanted: int, reserve: int = RESERVED_DESCRIPTORS) -> int:
    """How many sockets the listeners may hold together, at most ``wanted``: the soft RLIMIT_NOFILE less
    ``reserve``, the soft limit raised first (towards the hard one) when ``wanted`` needs it."""
    try:
        import resource
    except ImportError:                  # not a POSIX system: nothing to read
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    need = wanted + reserve
    if soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(hard, need)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass
    return max(1, min(wanted, soft - reserve))
