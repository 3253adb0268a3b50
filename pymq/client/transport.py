"""Client transports: how a blocking Connection exchanges frames with a broker.

* :class:`TcpTransport` — a socket (TLS through an in-memory ``ssl.SSLObject`` for ``stomps://``), the
  sans-IO client state machine, one reader thread, and a heart-beat thread when heart-beats are
  negotiated.  Writes happen on the caller's thread under a lock.
* :class:`VmTransport` — an in-process broker (``vm://name``): frames are handed to the broker's loop as
  objects, no socket and no encoding, through the same broker session code as TCP clients.

Both call ``on_frame(frame)`` for every frame after CONNECTED (from their own thread: it must not block)
and ``on_lost(error)`` exactly once when an established connection ends for any reason.
"""
from __future__ import annotations

import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING
from collections.abc import Callable

from pymq.client.url import StompAddress, VmAddress
from pymq.client._core import error_of
from pymq.client.vm import SESSION_FRAMES, VmEndpoint, embedded
from pymq.errors import (ConnectFailed, ConnectionClosed, HeartbeatTimeout, ProtocolError, PymqError,
                         TlsError)
from pymq.errors import TimeoutError as PymqTimeout
from pymq.protocol.connection import Role, State, StompConnection, negotiate_heartbeat, parse_heartbeat
from pymq.protocol.frame import Frame

if TYPE_CHECKING:
    from pymq.client.vm import VmLink

FrameHandler = Callable[[Frame], None]
LostHandler = Callable[[PymqError], None]

#: how long a producer waits while the embedded broker holds it back (memory limit)
VM_FLOW_TIMEOUT = 30.0


class Transport:
    """What a blocking Connection needs from a transport (see the module docstring)."""

    on_frame: FrameHandler
    on_lost: LostHandler
    version: str = "1.2"
    session_id: str = ""
    #: the asyncio transports' flow-control flag; a blocking send waits inside ``send`` instead
    paused: bool = False

    def connect(self, headers: dict[str, str], timeout: float) -> Frame:
        raise NotImplementedError

    def send(self, frame: Frame) -> None:
        raise NotImplementedError

    def writable(self, timeout: float) -> None:
        """Nothing to wait for: ``send`` itself blocks while the broker holds the producer back."""

    def close(self) -> None:
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        raise NotImplementedError


def tls_failure(where: str, exc: ssl.SSLError | ssl.CertificateError, *, verifying: bool) -> TlsError:
    """The precise error for a failed TLS handshake (both SDKs)."""
    reason = getattr(exc, "reason", None) or type(exc).__name__
    verify_message = getattr(exc, "verify_message", None)
    if isinstance(exc, ssl.SSLCertVerificationError) or reason == "CERTIFICATE_VERIFY_FAILED":
        detail = verify_message or str(exc)
        return TlsError(f"TLS handshake with {where} failed: the broker's certificate is not trusted "
                        f"({detail}); pass ca_file= with the CA that signed it, or server_hostname= "
                        f"when it names another host", reason=str(reason), verify_message=detail or "",
                        verify_code=getattr(exc, "verify_code", 0) or 0)
    if "CERTIFICATE_REQUIRED" in str(reason) or "BAD_CERTIFICATE" in str(reason):
        return TlsError(f"TLS handshake with {where} failed: the broker wants a client certificate "
                        f"(cert_file=, key_file=) or did not accept the one sent ({reason})", reason=str(reason))
    hint = "" if verifying else " (certificate checks were off)"
    return TlsError(f"TLS handshake with {where} failed: {reason}{hint}: {exc}", reason=str(reason))


def closed_after_handshake(where: str) -> TlsError:
    """A TLS broker closed the connection before answering CONNECT, without a TLS alert: what a server
    that refuses the client's certificate (or the lack of one) does under TLS 1.3."""
    return TlsError(f"{where} closed the connection right after the TLS handshake, before answering CONNECT: "
                    f"it wants a client certificate (cert_file=, key_file=) or did not accept the one sent",
                    reason="CLOSED_AFTER_HANDSHAKE")


class _Plain:
    """A connected socket, as the reader and writers use it: ``sendall(data)`` and ``recv(size)``
    (b"" at the end), the socket's own methods for plain TCP (no extra call per read or write)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sendall: Callable[[bytes], None] = sock.sendall
        self.recv: Callable[[int], bytes] = sock.recv


class _Tls(_Plain):
    """TLS over a socket through memory BIOs, so the reader thread and the writing threads never use
    the SSL object at the same time (OpenSSL forbids it; a blocking ``SSLSocket`` shared by a reader
    and writers would).  ``_ssl`` guards the SSL object; ``_wlock`` keeps the socket's bytes in the
    order the SSL object produced them, since a read may produce bytes to send (TLS 1.3 key updates)."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, server_hostname: str | None) -> None:
        super().__init__(sock)
        self.sendall = self._tls_sendall
        self.recv = self._tls_recv
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = ctx.wrap_bio(self._in, self._out, server_side=False, server_hostname=server_hostname)
        self._ssl = threading.Lock()
        self._wlock = threading.Lock()

    def handshake(self, deadline: float) -> None:
        """Complete the handshake before ``deadline``; SSL errors propagate for the caller to word."""
        while True:
            try:
                self._obj.do_handshake()
                self._flush()
                return
            except ssl.SSLWantReadError:
                self._flush()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("TLS handshake timed out") from None
                self.sock.settimeout(remaining)
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionResetError("the peer closed the connection during the TLS handshake") from None
                self._in.write(data)

    def _flush(self) -> None:
        with self._wlock:
            with self._ssl:
                data = self._out.read()
            if data:
                self.sock.sendall(data)

    def _tls_sendall(self, data: bytes) -> None:
        with self._wlock:
            with self._ssl:
                self._obj.write(data)
                out = self._out.read()
            self.sock.sendall(out)

    def _tls_recv(self, size: int) -> bytes:
        while True:
            with self._ssl:
                try:
                    data = self._obj.read(size)
                except ssl.SSLWantReadError:
                    data = b""
                except ssl.SSLZeroReturnError:
                    return b""               # close_notify: a clean end
                pending = self._out.pending
            if pending:
                self._flush()
            if data:
                return data
            raw = self.sock.recv(size)
            if not raw:
                return b""
            with self._ssl:
                self._in.write(raw)


class TcpTransport(Transport):
    def __init__(self, host: str, port: int, *, max_frame_size: int = 64 * 1024 * 1024,
                 heartbeat: tuple[int, int] = (10_000, 10_000), heartbeat_grace: float = 2.0,
                 ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None) -> None:
        self.host, self.port = host, port
        self.heartbeat = heartbeat
        self.grace = heartbeat_grace
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname
        self.conn = StompConnection(Role.CLIENT, max_frame_size=max_frame_size)
        self.sock: socket.socket | None = None
        self.channel: _Plain | None = None
        self._wlock = threading.Lock()
        self._closed = threading.Event()
        self._lost_reported = False
        self._last_recv = time.monotonic()
        self._last_send = time.monotonic()
        self._reader: threading.Thread | None = None
        self._beater: threading.Thread | None = None

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _open_channel(self, timeout: float) -> _Plain:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self.where}: {exc.strerror or exc}",
                                host=self.host, port=self.port) from None
        self.sock = sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is None:
            return _Plain(sock)
        channel = _Tls(sock, self.ssl_context, self.server_hostname)
        try:
            channel.handshake(time.monotonic() + timeout)
        except (ssl.SSLError, ssl.CertificateError) as exc:
            sock.close()
            raise tls_failure(self.where, exc, verifying=self.ssl_context.verify_mode != ssl.CERT_NONE) from None
        except TimeoutError:
            sock.close()
            raise PymqTimeout(f"no TLS handshake with {self.where} within {timeout}s") from None
        except OSError as exc:
            sock.close()
            raise ConnectFailed(f"TLS handshake with {self.where} failed: {exc}",
                                host=self.host, port=self.port) from None
        return channel

    def connect(self, headers: dict[str, str], timeout: float) -> Frame:
        channel = self.channel = self._open_channel(timeout)
        sock = channel.sock
        headers = dict(headers)
        headers["heart-beat"] = f"{self.heartbeat[0]},{self.heartbeat[1]}"
        deadline = time.monotonic() + timeout
        frames: list[Frame] = []
        try:
            sock.settimeout(timeout)
            channel.sendall(self.conn.send(Frame("CONNECT", headers)))
            while not frames:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PymqTimeout(f"no CONNECTED from {self.where} within {timeout}s")
                sock.settimeout(remaining)
                try:
                    data = channel.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    if self.ssl_context is not None:
                        raise closed_after_handshake(self.where)
                    raise ConnectFailed(f"{self.where} closed the connection during CONNECT")
                try:
                    frames = self.conn.receive_data(data)
                except ProtocolError as exc:
                    raise ConnectFailed(f"{self.where} answered CONNECT with bad data: {exc}") from None
        except (ssl.SSLError, ssl.CertificateError) as exc:
            # TLS 1.3: a refused client certificate is only reported after the handshake
            sock.close()
            raise tls_failure(self.where, exc, verifying=True) from None
        except OSError as exc:
            sock.close()
            if self.ssl_context is not None and isinstance(exc, (ConnectionResetError, BrokenPipeError)):
                # the same refusal as a close after the handshake: a peer that closes while our CONNECT
                # is still unread in its socket makes its kernel answer with a reset instead of a FIN
                raise closed_after_handshake(self.where) from None
            raise ConnectFailed(f"connection to {self.where} failed: {exc}") from None
        except PymqError:
            sock.close()
            raise
        first = frames[0]
        if first.command == "ERROR":
            sock.close()
            raise error_of(first)
        self.version = self.conn.version
        self.session_id = first.headers.get("session", "")
        send_ms, recv_ms = negotiate_heartbeat(self.heartbeat, parse_heartbeat(first.headers.get("heart-beat")))
        sock.settimeout(None)
        self._reader = threading.Thread(target=self._read_loop, name="pymq-reader", daemon=True)
        self._reader.start()
        if send_ms or recv_ms:
            self._beater = threading.Thread(target=self._beat_loop, args=(send_ms, recv_ms),
                                            name="pymq-heartbeat", daemon=True)
            self._beater.start()
        return first

    def _read_loop(self) -> None:
        channel = self.channel
        assert channel is not None
        conn = self.conn
        recv = channel.recv
        try:
            pending = conn.receive_data(b"")   # anything that arrived right behind CONNECTED
            for frame in pending:
                self.on_frame(frame)
            while not self._closed.is_set():
                try:
                    data = recv(262144)
                except (OSError, ssl.SSLError) as exc:
                    if self._closed.is_set():
                        return
                    self._lost(ConnectionClosed(f"connection to the broker failed: {exc}"))
                    return
                if not data:
                    self._lost(ConnectionClosed("the broker closed the connection"))
                    return
                self._last_recv = time.monotonic()
                for frame in conn.receive_data(data):
                    self.on_frame(frame)
                    if frame.command == "ERROR":
                        self._lost(error_of(frame))
                        return
        except ProtocolError as exc:
            self._lost(ConnectionClosed(f"the broker sent invalid STOMP: {exc}"))
        except Exception as exc:  # noqa: BLE001 - the reader must report, never die silently
            self._lost(ConnectionClosed(f"reader failed: {exc!r}"))

    def _beat_loop(self, send_ms: int, recv_ms: int) -> None:
        step = min(x for x in (send_ms, recv_ms) if x) / 1000.0 / 2
        channel = self.channel
        assert channel is not None
        while not self._closed.wait(step):
            now = time.monotonic()
            if send_ms and now - self._last_send >= send_ms / 1000.0:
                try:
                    with self._wlock:
                        channel.sendall(b"\n")
                    self._last_send = now
                except (OSError, ssl.SSLError):
                    pass
            if recv_ms and now - self._last_recv > recv_ms / 1000.0 * self.grace:
                self._lost(HeartbeatTimeout(f"no data from the broker for {now - self._last_recv:.1f}s"))
                self._shutdown()
                return

    def send(self, frame: Frame) -> None:
        if self._closed.is_set():
            raise ConnectionClosed("the connection is closed")
        channel = self.channel
        assert channel is not None
        with self._wlock:
            parts = self.conn.send_parts(frame)
            try:
                for part in parts:      # a large body is written from its own bytes (send_parts)
                    channel.sendall(part)
            except (OSError, ssl.SSLError) as exc:
                raise ConnectionClosed(f"sending to the broker failed: {exc}") from None
            self._last_send = time.monotonic()

    def _shutdown(self) -> None:
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _lost(self, error: PymqError) -> None:
        if self._lost_reported:
            return
        self._lost_reported = True
        self._closed.set()
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.on_lost(error)

    def close(self) -> None:
        self._closed.set()
        self._shutdown()
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        if not self._lost_reported:
            self._lost_reported = True
            self.on_lost(ConnectionClosed("the connection was closed"))


class VmTransport(VmEndpoint, Transport):
    """An in-process connection to the embedded broker ``name`` (started on first use).  Frames are
    handled on the broker's thread (``on_frame`` never blocks); a SEND waits on an Event while the
    broker holds the producer back."""

    def __init__(self, name: str, options: dict[str, str] | None = None) -> None:
        super().__init__(name, options or {})
        self._first: list[Frame | PymqError] = []
        self._answered = threading.Event()
        self._flowing = threading.Event()
        self._wlock = threading.Lock()      # submit() counts the bytes in flight: one sender at a time

    def connect(self, headers: dict[str, str], timeout: float) -> Frame:
        self._open(embedded(self.name, self.options), headers)
        if not self._answered.wait(timeout):
            self._disconnect()
            raise PymqTimeout(f"embedded broker {self.name!r} did not answer CONNECT in {timeout}s")
        first = self._first[0]
        if isinstance(first, PymqError):
            raise first
        self.version = self.conn.version
        self.session_id = first.headers.get("session", "")
        return first

    # broker thread
    def from_broker(self, frame: Frame | None, error: PymqError | None = None) -> None:
        self._handle(frame, error)

    def _connected(self, frame: Frame) -> None:
        self._first.append(frame)
        self._answered.set()

    def _refused(self, error: PymqError) -> None:
        if not self._answered.is_set():
            self._first.append(error)
            self._answered.set()

    def _report_lost(self, error: PymqError) -> None:
        self._flowing.set()
        self.on_lost(error)

    def flow_changed(self) -> None:
        link = self.link
        if link is not None and link.caught_up:
            self._flowing.set()

    # application threads
    def send(self, frame: Frame) -> None:
        with self._wlock:
            link = self.link
            if link is None or self._closed:
                raise ConnectionClosed("the connection is closed")
            if (link.paused or link.submitted - link.taken > link.window_high) and frame.command == "SEND":
                self._wait_for_broker(link)
            # VmEndpoint._submit, inlined on the hot path of every send and acknowledgement
            conn = self.conn
            if conn.state is not State.CONNECTED or frame.command not in SESSION_FRAMES:
                conn.send_frame(frame)
            link.submit(frame)

    def _wait_for_broker(self, link: VmLink) -> None:
        deadline = time.monotonic() + VM_FLOW_TIMEOUT
        while link.held_back and not self._closed:
            self._flowing.clear()
            link.want_wake = True            # then re-check: the broker may have caught up meanwhile
            if link.caught_up:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._flowing.wait(remaining):
                raise PymqTimeout(f"the embedded broker {self.name!r} kept this producer paused for "
                                   f"{VM_FLOW_TIMEOUT:g} s (memory limit)")

    def close(self) -> None:
        self._disconnect()
        self._lost(ConnectionClosed("the connection was closed"))


TCP_OPTIONS = frozenset({"heartbeat", "heartbeat_grace", "max_frame_size"})


def transport_for(address: StompAddress | VmAddress, *, heartbeat: tuple[int, int] = (10_000, 10_000),
                  ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None) -> Transport:
    if isinstance(address, StompAddress):
        return TcpTransport(address.host, address.port, heartbeat=heartbeat, ssl_context=ssl_context,
                            server_hostname=server_hostname)
    return VmTransport(address.name, address.options)
