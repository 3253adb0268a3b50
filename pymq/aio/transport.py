"""Async transports: how an :class:`~pymq.aio.AsyncConnection` exchanges frames with a broker, on one loop.

* :class:`StompTransport` — an ``asyncio.Protocol`` (over TLS for ``stomps://``) around the sans-IO client state machine
  (:class:`pymq.protocol.connection.StompConnection`), so framing, escaping and the transition table are
  the ones the broker and the blocking SDK use.  Outgoing frames are gathered per loop iteration into one
  ``transport.write`` (a burst of sends costs one syscall, as on the broker side).  A heart-beat task,
  owned by the transport, beats and watches the broker when heart-beats are negotiated.
* :class:`VmTransport` — the embedded broker behind ``vm://name`` (the one the blocking SDK uses, through
  the same link and the same client end, :class:`pymq.client.vm.VmEndpoint`): frames cross threads as
  objects, into the broker's loop in batches and back into ours through a deque drained by one
  ``call_soon_threadsafe`` per batch.

Contract with the connection (all on the client's event loop):
``on_frame(frame)`` for every frame after CONNECTED, in arrival order; ``on_lost(error)`` exactly once
when the connection ends for any reason (also after our own ``close()``).  ``send(frame)`` never blocks
and never awaits: it validates, queues and returns.  Producer flow control is ``paused`` plus
``await writable(timeout)``: TCP pauses when our write buffer passes its high-water mark (the broker
stopped reading us), vm:// when the embedded broker says so.
"""
from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from collections.abc import Callable

from pymq.client.transport import closed_after_handshake, tls_failure
from pymq.client.url import StompAddress, VmAddress
from pymq.client.vm import VmEndpoint, embedded
from pymq.client._core import error_of
from pymq.errors import ConnectFailed, ConnectionClosed, HeartbeatTimeout, ProtocolError, PymqError
from pymq.errors import TimeoutError as PymqTimeout
from pymq.protocol.connection import Role, StompConnection, negotiate_heartbeat, parse_heartbeat
from pymq.protocol.frame import Frame

FrameHandler = Callable[[Frame], None]
LostHandler = Callable[[PymqError], None]

#: flush gathered writes at once past this many bytes, so a send loop that never yields stays bounded
_FLUSH_AT = 64 * 1024


class AsyncTransport:
    """What an AsyncConnection needs from a transport (see the module docstring)."""

    on_frame: FrameHandler
    on_lost: LostHandler
    version: str = "1.2"
    session_id: str = ""
    paused: bool = False         # True while the broker holds back this connection's SENDs

    async def connect(self, headers: dict[str, str], timeout: float) -> Frame:
        raise NotImplementedError

    def send(self, frame: Frame) -> None:
        raise NotImplementedError

    async def writable(self, timeout: float) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        raise NotImplementedError


class _FlowGate:
    """Futures of producers waiting for the broker to take SENDs again."""

    __slots__ = ("waiters",)

    def __init__(self) -> None:
        self.waiters: list[asyncio.Future[None]] = []

    async def wait(self, timeout: float, what: str) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise PymqTimeout(f"{what} kept this producer paused for {timeout:g} s (memory limit)") from None
        finally:
            if fut in self.waiters:
                self.waiters.remove(fut)

    def open(self, error: PymqError | None = None) -> None:
        waiters, self.waiters = self.waiters, []
        for fut in waiters:
            if not fut.done():
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)


class StompTransport(AsyncTransport, asyncio.Protocol):
    """STOMP over TCP with asyncio; the reader is the Protocol itself (no reader task to leak)."""

    def __init__(self, host: str, port: int, *, max_frame_size: int = 64 * 1024 * 1024,
                 heartbeat: tuple[int, int] = (10_000, 10_000), heartbeat_grace: float = 2.0,
                 ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None) -> None:
        self.host, self.port = host, port
        self.heartbeat = heartbeat
        self.grace = heartbeat_grace
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname
        self.conn = StompConnection(Role.CLIENT, max_frame_size=max_frame_size)
        self._loop: asyncio.AbstractEventLoop | None = None      # the client's loop, from connect()
        self._transport: asyncio.Transport | None = None
        self._connected: asyncio.Future[Frame] | None = None     # CONNECTED (or the refusal) while connecting
        self._gone: asyncio.Future[None] | None = None           # resolved by connection_lost
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._closed = False
        self._lost_reported = False
        self._beater: asyncio.Task[None] | None = None
        self._last_recv = self._last_send = time.monotonic()
        self._flow = _FlowGate()
        self._established = False          # on_lost is reported only for a connection that opened
        self.paused = False

    @property
    def closed(self) -> bool:
        return self._closed

    # -- connecting ------------------------------------------------------------------------------
    async def connect(self, headers: dict[str, str], timeout: float) -> Frame:
        loop = self._loop = asyncio.get_running_loop()
        connected = self._connected = loop.create_future()
        self._gone = loop.create_future()
        try:
            return await self._connect(connected, headers, timeout)
        except BaseException:
            # failed, timed out, or the task connecting was cancelled (an application's own timeout, a
            # failover attempt given up): the socket closes now, and its close must not fail a future
            # nobody awaits any more ("Future exception was never retrieved"; a cancelled create_connection
            # may have closed it, and failed the future, before the cancellation reaches this line)
            if not connected.done():
                connected.cancel()
            elif not connected.cancelled():
                connected.exception()      # retrieved: what this raises says why the attempt ended
            self._abort()
            raise

    async def _connect(self, connected: asyncio.Future[Frame], headers: dict[str, str], timeout: float) -> Frame:
        loop = asyncio.get_running_loop()
        where = f"{self.host}:{self.port}"
        tls = self.ssl_context
        try:
            if tls is None:
                opening = loop.create_connection(lambda: self, self.host, self.port)
            else:
                opening = loop.create_connection(lambda: self, self.host, self.port, ssl=tls,
                                                 server_hostname=self.server_hostname or self.host,
                                                 ssl_handshake_timeout=timeout)
            await asyncio.wait_for(opening, timeout)
        except asyncio.TimeoutError:
            raise ConnectFailed(f"cannot connect to {where}: no answer within {timeout:g} s",
                                host=self.host, port=self.port) from None
        except (ssl.SSLError, ssl.CertificateError) as exc:
            assert tls is not None
            raise tls_failure(where, exc, verifying=tls.verify_mode != ssl.CERT_NONE) from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {where}: {exc.strerror or exc}",
                                host=self.host, port=self.port) from None
        headers = dict(headers)
        headers["heart-beat"] = f"{self.heartbeat[0]},{self.heartbeat[1]}"
        assert self._transport is not None      # connection_made ran inside create_connection
        self._transport.write(self.conn.send(Frame("CONNECT", headers)))
        try:
            first = await asyncio.wait_for(asyncio.shield(connected), timeout)
        except asyncio.TimeoutError:
            raise PymqTimeout(f"no CONNECTED from {where} within {timeout:g} s") from None
        self.version = self.conn.version
        self.session_id = first.headers.get("session", "")
        self._established = True
        send_ms, recv_ms = negotiate_heartbeat(self.heartbeat, parse_heartbeat(first.headers.get("heart-beat")))
        if send_ms or recv_ms:
            self._beater = loop.create_task(self._beat(send_ms, recv_ms), name="pymq-aio-heartbeat")
        # frames that arrived right behind CONNECTED wait for the negotiated version
        self._dispatch(self.conn.receive_data(b""))
        return first

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        self._last_recv = time.monotonic()
        try:
            frames = self.conn.receive_data(data)
        except ProtocolError as exc:
            self._fail(ConnectionClosed(f"the broker sent invalid STOMP: {exc}"))
            return
        connecting = self._connected
        if connecting is not None and not connecting.done():
            if not frames:
                return
            first, frames = frames[0], frames[1:]
            if first.command == "ERROR":
                connecting.set_exception(error_of(first))
            else:
                connecting.set_result(first)
            return   # the rest is parsed once the version is settled (see connect)
        self._dispatch(frames)

    def _dispatch(self, frames: list[Frame]) -> None:
        for frame in frames:
            self.on_frame(frame)
            if frame.command == "ERROR":
                self._fail(error_of(frame))
                return

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._gone is not None and not self._gone.done():
            self._gone.set_result(None)
        connecting = self._connected
        if connecting is not None and not connecting.done():
            # TLS 1.3: a refused client certificate shows only after the handshake
            if isinstance(exc, (ssl.SSLError, ssl.CertificateError)):
                connecting.set_exception(tls_failure(f"{self.host}:{self.port}", exc, verifying=True))
            elif self.ssl_context is not None:
                connecting.set_exception(closed_after_handshake(f"{self.host}:{self.port}"))
            else:
                connecting.set_exception(ConnectFailed(
                    f"{self.host}:{self.port} closed the connection during CONNECT"))
        reason = f"connection to the broker failed: {exc}" if exc else "the broker closed the connection"
        self._report_lost(ConnectionClosed(reason))

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._flow.open()

    # -- writing -----------------------------------------------------------------------------------
    def send(self, frame: Frame) -> None:
        if self._closed:
            raise ConnectionClosed("the connection is closed")
        data = self.conn.send(frame)       # our misuse raises here, before a byte is queued
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= _FLUSH_AT:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None          # set by connect(), before any send
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out:
            return
        out, self._out = self._out, []
        self._out_bytes = 0
        if self._transport is None or self._transport.is_closing():
            return
        self._transport.write(b"".join(out) if len(out) > 1 else out[0])
        self._last_send = time.monotonic()

    async def writable(self, timeout: float) -> None:
        if self.paused and not self._closed:
            await self._flow.wait(timeout, f"the broker at {self.host}:{self.port}")

    # -- heart-beats -------------------------------------------------------------------------------
    async def _beat(self, send_ms: int, recv_ms: int) -> None:
        step = min(x for x in (send_ms, recv_ms) if x) / 1000.0 / 2
        # beat once half an interval passed without a write: checked every step, the longest silence
        # is then one interval even when the loop runs late, never interval + step
        beat_after = send_ms / 1000.0 / 2
        while not self._closed:
            await asyncio.sleep(step)
            now = time.monotonic()
            if send_ms and now - self._last_send >= beat_after and not self._out:
                transport = self._transport
                if transport is not None and not transport.is_closing():
                    transport.write(b"\n")
                    self._last_send = now
            if recv_ms and now - self._last_recv > recv_ms / 1000.0 * self.grace:
                self._fail(HeartbeatTimeout(f"no data from the broker for {now - self._last_recv:.1f}s"))
                return

    # -- ending ------------------------------------------------------------------------------------
    def _fail(self, error: PymqError) -> None:
        self._report_lost(error)
        self._abort()

    def _abort(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.abort()

    def _report_lost(self, error: PymqError) -> None:
        self._closed = True
        if self._lost_reported:
            return
        self._lost_reported = True
        beater = self._beater
        if beater is not None and beater is not asyncio.current_task():
            beater.cancel()
        self._flow.open(error)
        if self._established:
            self.on_lost(error)

    async def close(self) -> None:
        """Flush what is queued (the DISCONNECT), close the socket and wait until it is closed."""
        self._flush()
        self._closed = True
        if self._beater is not None and self._beater is not asyncio.current_task():
            self._beater.cancel()
            try:
                await self._beater
            except (asyncio.CancelledError, PymqError):
                pass
        if self._transport is not None:
            self._transport.close()
            if self._gone is not None:
                try:
                    await asyncio.wait_for(asyncio.shield(self._gone), 5.0)
                except asyncio.TimeoutError:
                    self._transport.abort()
        self._report_lost(ConnectionClosed("the connection was closed"))


class VmTransport(VmEndpoint, AsyncTransport):
    """An in-process connection to the embedded broker ``name`` (started on first use).

    Frames cross threads as objects: into the broker's loop through the link (batched), and back into
    ours through a deque drained by one ``call_soon_threadsafe`` per batch.  Flow control: ``paused``
    while the link holds SENDs back (memory limit, or more than its window in flight), and
    ``writable()`` waits for the broker's ``flow_changed``."""

    def __init__(self, name: str, options: dict[str, str] | None = None) -> None:
        super().__init__(name, options or {})
        self._loop: asyncio.AbstractEventLoop | None = None
        self._answer: asyncio.Future[Frame] | None = None     # CONNECTED (or the refusal)
        self._inbound: collections.deque[tuple[Frame | None, PymqError | None]] = collections.deque()
        self._drain_scheduled = False
        self._flow = _FlowGate()

    @property
    def paused(self) -> bool:   # type: ignore[override]
        link = self.link
        return link is not None and link.held_back

    async def connect(self, headers: dict[str, str], timeout: float) -> Frame:
        loop = self._loop = asyncio.get_running_loop()
        answer = self._answer = loop.create_future()
        # the first use of a name starts a broker thread and waits for it: not on the event loop
        broker = await loop.run_in_executor(None, embedded, self.name, self.options)
        self._open(broker, headers)
        try:
            first = await asyncio.wait_for(asyncio.shield(answer), timeout)
        except asyncio.TimeoutError:
            self._disconnect()
            raise PymqTimeout(f"embedded broker {self.name!r} did not answer CONNECT in {timeout:g}s") from None
        self.version = self.conn.version
        self.session_id = first.headers.get("session", "")
        return first

    # broker loop thread -> client loop
    def from_broker(self, frame: Frame | None, error: PymqError | None = None) -> None:
        self._inbound.append((frame, error))
        if not self._drain_scheduled:
            # the flag is cleared by the drain *before* it pops, so a frame appended after the clear
            # schedules its own drain and one appended before it is popped by the running drain
            self._drain_scheduled = True
            self._hop(self._drain)

    def flow_changed(self) -> None:
        self._hop(self._flow_changed)

    def _hop(self, callback: Callable[[], None]) -> None:
        loop = self._loop
        try:
            if loop is None:
                raise RuntimeError("no event loop")
            loop.call_soon_threadsafe(callback)
        except RuntimeError:
            # the client's loop is gone without closing: end this connection on the broker
            if self.link is not None:
                self.link.abandon()

    # client loop
    def _flow_changed(self) -> None:
        link = self.link
        if link is not None and link.caught_up:
            self._flow.open()

    def _drain(self) -> None:
        self._drain_scheduled = False
        inbound = self._inbound
        while inbound:
            frame, error = inbound.popleft()
            if not self._handle(frame, error):
                return

    def _connected(self, frame: Frame) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_result(frame)

    def _refused(self, error: PymqError) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_exception(error)

    def _report_lost(self, error: PymqError) -> None:
        self._flow.open(error)
        self.on_lost(error)

    def send(self, frame: Frame) -> None:
        self._submit(frame)

    async def writable(self, timeout: float) -> None:
        link = self.link
        if self._closed or link is None or not link.held_back:
            return
        link.want_wake = True          # then re-check: the broker may have caught up in between
        if not link.caught_up:
            await self._flow.wait(timeout, f"the embedded broker {self.name!r}")

    async def close(self) -> None:
        self._disconnect()
        self._lost(ConnectionClosed("the connection was closed"))


def transport_for(address: StompAddress | VmAddress, *, heartbeat: tuple[int, int] = (10_000, 10_000),
                  ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None) -> AsyncTransport:
    """The transport for a parsed URL (``stomp://``, ``stomps://`` or ``vm://``)."""
    if isinstance(address, StompAddress):
        return StompTransport(address.host, address.port, heartbeat=heartbeat, ssl_context=ssl_context,
                              server_hostname=server_hostname)
    return VmTransport(address.name, address.options)
