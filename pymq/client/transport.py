"""Client transports: how a blocking Connection exchanges frames with a broker.

* :class:`TcpTransport` — a socket, the sans-IO client state machine, one reader thread, and a
  heart-beat thread when heart-beats are negotiated.  Writes happen on the caller's thread under a lock.
* :class:`VmTransport` — an in-process broker (``vm://name``): frames are handed to the broker's loop as
  objects, no socket and no encoding, through the same broker session code as TCP clients.

Both call ``on_frame(frame)`` for every frame after CONNECTED (from their own thread: it must not block)
and ``on_lost(error)`` exactly once when the connection ends for any reason.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable
from urllib.parse import parse_qs, urlparse

from pymq.errors import (ConnectFailed, ConnectionClosed, HeartbeatTimeout, PymqError, ProtocolError,
                         TimeoutError, error_from_headers)
from pymq.protocol.connection import Role, StompConnection, negotiate_heartbeat, parse_heartbeat
from pymq.protocol.frame import Frame

FrameHandler = Callable[[Frame], None]
LostHandler = Callable[[PymqError], None]


class Transport:
    on_frame: FrameHandler
    on_lost: LostHandler
    version: str = "1.2"
    session_id: str = ""

    def connect(self, headers: dict, timeout: float) -> Frame: ...
    def send(self, frame: Frame) -> None: ...
    def close(self) -> None: ...


class TcpTransport(Transport):
    def __init__(self, host: str, port: int, *, max_frame_size: int = 64 * 1024 * 1024,
                 heartbeat: tuple[int, int] = (10_000, 10_000), heartbeat_grace: float = 2.0) -> None:
        self.host, self.port = host, port
        self.heartbeat = heartbeat
        self.grace = heartbeat_grace
        self.conn = StompConnection(Role.CLIENT, max_frame_size=max_frame_size)
        self.sock: socket.socket | None = None
        self._wlock = threading.Lock()
        self._closed = threading.Event()
        self._lost_reported = False
        self._last_recv = time.monotonic()
        self._last_send = time.monotonic()
        self._reader: threading.Thread | None = None
        self._beater: threading.Thread | None = None

    def connect(self, headers: dict, timeout: float) -> Frame:
        try:
            self.sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}",
                                host=self.host, port=self.port) from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        headers = dict(headers)
        headers["heart-beat"] = f"{self.heartbeat[0]},{self.heartbeat[1]}"
        self.sock.sendall(self.conn.send(Frame("CONNECT", headers)))
        deadline = time.monotonic() + timeout
        frames: list[Frame] = []
        while not frames:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.sock.close()
                raise TimeoutError(f"no CONNECTED from {self.host}:{self.port} within {timeout}s")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError as exc:
                self.sock.close()
                raise ConnectFailed(f"connection to {self.host}:{self.port} failed: {exc}") from None
            if not data:
                self.sock.close()
                raise ConnectFailed(f"{self.host}:{self.port} closed the connection during CONNECT")
            try:
                frames = self.conn.receive_data(data)
            except ProtocolError as exc:
                self.sock.close()
                raise ConnectFailed(f"{self.host}:{self.port} answered CONNECT with bad data: {exc}") \
                    from None
        first = frames[0]
        if first.command == "ERROR":
            self.sock.close()
            raise error_from_headers(first.headers, first.body.decode("utf-8", "replace"))
        self.version = self.conn.version
        self.session_id = first.headers.get("session", "")
        send_ms, recv_ms = negotiate_heartbeat(self.heartbeat, parse_heartbeat(first.headers.get("heart-beat")))
        self.sock.settimeout(None)
        self._reader = threading.Thread(target=self._read_loop, name="pymq-reader", daemon=True)
        self._reader.start()
        if send_ms or recv_ms:
            self._beater = threading.Thread(target=self._beat_loop, args=(send_ms, recv_ms),
                                            name="pymq-heartbeat", daemon=True)
            self._beater.start()
        return first

    def _read_loop(self) -> None:
        sock = self.sock
        conn = self.conn
        try:
            pending = conn.receive_data(b"")   # anything that arrived right behind CONNECTED
            for frame in pending:
                self.on_frame(frame)
            while not self._closed.is_set():
                try:
                    data = sock.recv(262144)
                except OSError as exc:
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
                        self._lost(error_from_headers(frame.headers, frame.body.decode("utf-8", "replace")))
                        return
        except ProtocolError as exc:
            self._lost(ConnectionClosed(f"the broker sent invalid STOMP: {exc}"))
        except Exception as exc:  # the reader must report, never die silently
            self._lost(ConnectionClosed(f"reader failed: {exc!r}"))

    def _beat_loop(self, send_ms: int, recv_ms: int) -> None:
        step = min(x for x in (send_ms, recv_ms) if x) / 1000.0 / 2
        while not self._closed.wait(step):
            now = time.monotonic()
            if send_ms and now - self._last_send >= send_ms / 1000.0:
                try:
                    with self._wlock:
                        self.sock.sendall(b"\n")
                    self._last_send = now
                except OSError:
                    pass
            if recv_ms and now - self._last_recv > recv_ms / 1000.0 * self.grace:
                self._lost(HeartbeatTimeout(f"no data from the broker for {now - self._last_recv:.1f}s"))
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return

    def send(self, frame: Frame) -> None:
        if self._closed.is_set():
            raise ConnectionClosed("the connection is closed")
        with self._wlock:
            data = self.conn.send(frame)
            try:
                self.sock.sendall(data)
            except OSError as exc:
                raise ConnectionClosed(f"sending to the broker failed: {exc}") from None
            self._last_send = time.monotonic()

    def _lost(self, error: PymqError) -> None:
        if self._lost_reported:
            return
        self._lost_reported = True
        self._closed.set()
        try:
            self.sock.close()
        except OSError:
            pass
        self.on_lost(error)

    def close(self) -> None:
        self._closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        if not self._lost_reported:
            self._lost_reported = True
            self.on_lost(ConnectionClosed("the connection was closed"))


class VmTransport(Transport):
    """An in-process connection to the embedded broker ``name`` (started on first use)."""

    def __init__(self, name: str, options: dict | None = None) -> None:
        from pymq_server.net.vm import embedded_broker
        self.name = name
        self.embedded = embedded_broker(name, options or {})
        self.link = None
        self._closed = False
        self._lost_reported = False

    def connect(self, headers: dict, timeout: float) -> Frame:
        self.link, first = self.embedded.open_link(self._deliver, headers, timeout)
        if first.command == "ERROR":
            raise error_from_headers(first.headers, first.body.decode("utf-8", "replace"))
        self.version = first.headers.get("version", "1.2")
        self.session_id = first.headers.get("session", "")
        return first

    def _deliver(self, frame: Frame | None, error: PymqError | None = None) -> None:
        # runs on the broker's loop thread
        if frame is None:
            self._report_lost(error or ConnectionClosed("the embedded broker closed the connection"))
            return
        self.on_frame(frame)
        if frame.command == "ERROR":
            self._report_lost(error_from_headers(frame.headers, frame.body.decode("utf-8", "replace")))

    def _report_lost(self, error: PymqError) -> None:
        if self._lost_reported:
            return
        self._lost_reported = True
        self._closed = True
        self.on_lost(error)

    def send(self, frame: Frame) -> None:
        if self._closed:
            raise ConnectionClosed("the connection is closed")
        self.link.submit(frame)

    def close(self) -> None:
        self._closed = True
        if self.link is not None:
            self.link.disconnect()
        self._report_lost(ConnectionClosed("the connection was closed"))


def parse_url(url: str) -> tuple[str, tuple]:
    """``stomp://host:port`` (or ``tcp://``) -> ("stomp", (host, port)); ``vm://name[?k=v]`` ->
    ("vm", (name, options)).  Both SDKs' transports read URLs through this."""
    parsed = urlparse(url)
    if parsed.scheme in ("stomp", "tcp"):
        return "stomp", (parsed.hostname or "127.0.0.1", parsed.port or 61613)
    if parsed.scheme == "vm":
        name = (parsed.netloc or parsed.path.lstrip("/")) or "default"
        return "vm", (name, {k: v[-1] for k, v in parse_qs(parsed.query).items()})
    raise ConnectFailed(f"unsupported URL {url!r}: use stomp://host:port or vm://name")


TCP_OPTIONS = frozenset({"heartbeat", "heartbeat_grace", "max_frame_size"})


def transport_for(url: str, **options) -> Transport:
    kind, where = parse_url(url)
    if kind == "stomp":
        return TcpTransport(*where, **{k: v for k, v in options.items() if k in TCP_OPTIONS})
    return VmTransport(*where)
