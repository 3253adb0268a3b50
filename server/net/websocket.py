"""STOMP over WebSocket (RFC 6455; subprotocols ``v12.stomp``, ``v11.stomp``, ``v10.stomp``).

aiohttp does the HTTP upgrade and the WebSocket framing; everything STOMP is the TCP adapter's.  Each
WebSocket connection gets the same :class:`~pymq_server.net.tcp.StompServerProtocol` a TCP connection
gets, in front of a :class:`WebSocketTransport` — an ``asyncio.Transport`` whose bytes travel as
WebSocket messages.  So sessions, authentication, heart-beats, the CONNECT deadline, frame and header
limits, write-buffer backpressure and memory flow control are one implementation for both; this module
only moves bytes.

Bytes in: the payloads of text and binary messages, concatenated, are the STOMP byte stream (a client
may put one frame per message, several, or split one).  A message larger than ``max_frame_size`` plus
64 KiB closes the WebSocket with 1009 (message too big) before it is buffered whole; a frame over
``max_frame_size`` inside a smaller message gets the same STOMP ERROR as over TCP.  While the broker
pauses reading (memory high, a full queue), the next message is not read, and aiohttp stops reading the
socket once its own small buffer is full: a producer cannot push the broker past its limits this way.

Bytes out: each write (the TCP adapter already gathers a loop iteration's frames into one) becomes one
message — a text message when it is valid UTF-8, which is what browser clients expect, and a binary one
otherwise (a binary body).  Queued bytes above the write-buffer high-water mark pause the protocol,
exactly as a TCP transport does, so a slow browser costs at most about ``write_buffer_high`` bytes.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from pymq_server.net.tcp import StompServerProtocol

log = logging.getLogger("pymq.net.websocket")

SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")
_MESSAGE_SLACK = 64 * 1024


class WebSocketTransport(asyncio.Transport):
    """The transport a :class:`StompServerProtocol` writes to and pauses, over one WebSocket."""

    def __init__(self, ws: web.WebSocketResponse, request: web.BaseRequest,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._ws = ws
        self._request = request
        self._loop = loop
        self._protocol: asyncio.BaseProtocol | None = None
        self._out: deque[bytes] = deque()
        self._out_bytes = 0
        self._high = 64 * 1024
        self._low = 16 * 1024
        self._protocol_paused = False
        self._closing = False
        self._lost = False
        self._wake = asyncio.Event()
        self.reading = asyncio.Event()       # the reader loop waits on it: pause_reading clears it
        self.reading.set()
        self._writer = loop.create_task(self._write_loop())

    # -- asyncio.BaseTransport -------------------------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "websocket":
            return self._ws
        transport = self._request.transport
        return transport.get_extra_info(name, default) if transport is not None else default

    def is_closing(self) -> bool:
        return self._closing or self._lost

    def close(self) -> None:
        """Send what is queued, then a close message (the writer does both, in order)."""
        if self._closing:
            return
        self._closing = True
        self.reading.set()
        self._wake.set()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol  # type: ignore[return-value]

    # -- reading ---------------------------------------------------------------------------------
    def pause_reading(self) -> None:
        self.reading.clear()

    def resume_reading(self) -> None:
        self.reading.set()

    def is_reading(self) -> bool:
        return self.reading.is_set()

    # -- writing ---------------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self._lost or not data:
            return
        self._out.append(bytes(data))
        self._out_bytes += len(data)
        self._wake.set()
        if self._out_bytes > self._high and not self._protocol_paused and self._protocol is not None:
            self._protocol_paused = True
            self._protocol.pause_writing()  # type: ignore[attr-defined]

    def writelines(self, list_of_data) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("a WebSocket has no half-close; use close()")

    def abort(self) -> None:
        self._closing = True
        self._out.clear()
        self._out_bytes = 0
        self._writer.cancel()
        self.reading.set()
        if self._request.transport is not None:
            self._request.transport.abort()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        if low is None:
            low = high // 4
        self._high, self._low = high, low

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        return self._out_bytes

    async def _write_loop(self) -> None:
        ws = self._ws
        try:
            while True:
                if not self._out:
                    if self._closing:
                        break
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                data = self._out.popleft()
                try:
                    if data.isascii():
                        await ws.send_str(data.decode("ascii"))
                    else:
                        try:
                            text = data.decode("utf-8")
                        except UnicodeDecodeError:
                            await ws.send_bytes(data)
                        else:
                            await ws.send_str(text)
                except (ConnectionError, RuntimeError):     # the peer went away mid-write
                    self._out.clear()
                    self._out_bytes = 0
                    break
                self._out_bytes -= len(data)
                if self._protocol_paused and self._out_bytes <= self._low and not self._lost:
                    self._protocol_paused = False
                    self._protocol.resume_writing()  # type: ignore[union-attr]
            if not ws.closed:
                await ws.close()
        except asyncio.CancelledError:
            pass

    def connection_lost(self) -> None:
        """The reader saw the WebSocket end; nothing more is written."""
        self._lost = True
        self._closing = True
        self._out.clear()
        self._out_bytes = 0
        self._wake.set()
        self.reading.set()


class WebSocketListener:
    """An aiohttp site that upgrades ``path`` to a WebSocket carrying STOMP."""

    def __init__(self, broker, host: str, port: int, path: str, ssl_context=None,
                 allowed_origins: "list[str] | None" = None) -> None:
        self.broker = broker
        self.allowed_origins = None if allowed_origins is None or "*" in allowed_origins \
            else {o.rstrip("/").lower() for o in allowed_origins}
        self.host = host
        self.port = port
        self.path = path
        self.ssl_context = ssl_context
        self.runner: web.AppRunner | None = None
        self._connections: set[WebSocketTransport] = set()

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get(self.path, self._upgrade)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port, ssl_context=self.ssl_context,
                           reuse_address=True, backlog=1024)
        try:
            await site.start()
        except BaseException:
            await self.runner.cleanup()
            self.runner = None
            raise
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.port

    async def stop(self) -> None:
        """Stop accepting; connections still open are closed by their sessions (BrokerServer.stop)."""
        for transport in list(self._connections):
            transport.close()
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def _upgrade(self, request: web.Request) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is not None and self.allowed_origins is not None \
                and origin.rstrip("/").lower() not in self.allowed_origins:
            log.info("websocket from %s refused: origin %s is not in websocket.allowed_origins",
                     request.remote, origin)
            return web.Response(status=403, text=f"origin {origin} may not connect "
                                                 f"(websocket.allowed_origins)\n")
        ws = web.WebSocketResponse(protocols=SUBPROTOCOLS, autoping=True, compress=False,
                                   max_msg_size=self.broker.config.max_frame_size + _MESSAGE_SLACK)
        ready = ws.can_prepare(request)
        if not ready.ok:
            return web.Response(status=426, text="this path speaks STOMP over WebSocket "
                                                 f"(subprotocols {', '.join(SUBPROTOCOLS)})\n",
                                headers={"Upgrade": "websocket"})
        await ws.prepare(request)
        loop = asyncio.get_running_loop()
        transport = WebSocketTransport(ws, request, loop)
        protocol = StompServerProtocol(self.broker, loop)
        transport.set_protocol(protocol)
        self._connections.add(transport)
        error: BaseException | None = None
        peer_gone = False
        try:
            protocol.connection_made(transport)
            while not transport.is_closing():
                if not transport.reading.is_set():
                    await transport.reading.wait()
                    continue
                msg = await ws.receive()
                if msg.type is WSMsgType.TEXT:
                    protocol.data_received(msg.data.encode("utf-8"))
                elif msg.type is WSMsgType.BINARY:
                    protocol.data_received(msg.data)
                else:                                       # CLOSE, CLOSING, CLOSED, ERROR
                    if msg.type is WSMsgType.ERROR:
                        error = ws.exception()
                        log.info("websocket from %s: %s", request.remote, error)
                    peer_gone = True
                    break
            if peer_gone:
                transport.connection_lost()
            else:
                transport.close()                           # our side: the ERROR or RECEIPT, then close
            await asyncio.wait({transport._writer})
        finally:
            self._connections.discard(transport)
            transport.connection_lost()
            protocol.connection_lost(error if isinstance(error, Exception) else None)
            if not ws.closed:
                await ws.close()
        return ws
