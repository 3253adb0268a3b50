"""The sockets one server listens on: STOMP, STOMP over TLS, WebSocket and the admin HTTP port.

:class:`Listeners` owns them for one :class:`~pymq_server.app.BrokerServer` run: the connection caps every
socket is counted against from ``accept`` (``max_connections`` shared by the STOMP, TLS and WebSocket
listeners, ``admin_max_connections`` for the admin port, both fitted to the file-descriptor limit), binding
every listener before any accepts (no client connects before all are in place), a bind failure as a
:class:`~pymq.errors.ListenError` naming the listener, and closing them.  What runs behind a socket (the
TCP adapter, the WebSocket adapter, the admin HTTP application) is made here and lives elsewhere
(``server/net/``, ``server/admin/http.py``); when the listeners open in a server's start is the server's.
"""
from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pymq_server.broker.broker import Broker
from pymq_server.broker.session import BrokerSession
from pymq_server.config import BrokerConfig
from pymq_server.net.accept import ConnectionSlots, Listener, fit_descriptors
from pymq_server.net.tcp import StompServerProtocol, refusal_frame

from pymq.errors import ListenError

if TYPE_CHECKING:
    from pymq_server.admin.http import AdminHttp

log = logging.getLogger("pymq.server")


class Listeners:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.ssl_context: ssl.SSLContext | None = None     # the tls: section's, loaded by the server first
        self.stomp: Listener | None = None
        self.tls: Listener | None = None
        self.websocket: Listener | None = None
        self.http: AdminHttp | None = None
        self.port: int | None = None
        self.tls_port: int | None = None
        self.websocket_port: int | None = None
        self.admin_port: int | None = None
        # sockets open at once, counted from accept (server/net/accept.py): the STOMP, TLS and WebSocket
        # listeners share max_connections, the admin port has its own
        self.connections = ConnectionSlots(config.max_connections, "max_connections")
        self.admin_connections = ConnectionSlots(config.admin_max_connections, "admin_max_connections")

    def serving(self) -> list[Listener]:
        """The client listeners bound so far (the admin port is the admin application's)."""
        return [server for server in (self.stomp, self.tls, self.websocket) if server is not None]

    async def start_admin_http(self, server: Any) -> None:
        """The admin port (``server`` is what the admin application serves: the BrokerServer)."""
        from pymq_server.admin.http import AdminHttp
        cfg = self.config
        self.http = AdminHttp(server, cfg.host, cfg.admin_port or 0,
                              ssl_context=self.ssl_context if cfg.admin_tls else None)
        self.admin_port = await _listen("admin HTTP port (admin_port)", cfg.host, cfg.admin_port or 0,
                                        self.http.start())

    async def bind(self, broker: Broker, session_type: Callable[..., BrokerSession], reuse_port: bool) -> None:
        """Bind the STOMP listener and, when configured, the TLS and WebSocket ones; none accepts yet
        (:meth:`start_serving`).  Every socket is counted from accept and TLS handshakes run under
        ``connect_timeout_ms`` (server/net/accept.py)."""
        loop = asyncio.get_running_loop()
        cfg = self.config
        self.fit_caps()
        slots = self.connections
        handshake = cfg.connect_timeout_ms / 1000

        def stomp() -> StompServerProtocol:
            return StompServerProtocol(broker, loop, session_type)

        def stomp_refusal() -> bytes:
            return refusal_frame(slots.limit)

        self.stomp = await _listen("STOMP port (port)", cfg.host, cfg.port, _bind(
            loop, cfg.host, cfg.port, slots, stomp, reuse_port=reuse_port, refusal=stomp_refusal))
        self.port = self.stomp.sockets[0].getsockname()[1]
        if cfg.tls_port is not None:
            self.tls = await _listen("STOMP over TLS port (tls_port)", cfg.host, cfg.tls_port, _bind(
                loop, cfg.host, cfg.tls_port, slots, stomp, reuse_port=reuse_port,
                ssl_context=self.ssl_context, handshake_timeout=handshake))
            self.tls_port = self.tls.sockets[0].getsockname()[1]
        if cfg.websocket is not None:
            from pymq_server.net.websocket import WebSocketConnection, origins, refusal_response
            ws = cfg.websocket
            allowed = origins(ws.allowed_origins)

            def websocket() -> WebSocketConnection:
                return WebSocketConnection(broker, loop, ws.path, allowed)

            self.websocket = await _listen("WebSocket port (websocket.port)", cfg.host, ws.port, _bind(
                loop, cfg.host, ws.port, slots, websocket, ssl_context=self.ssl_context if ws.tls else None,
                handshake_timeout=handshake, refusal=refusal_response))
            self.websocket_port = self.websocket.sockets[0].getsockname()[1]

    async def start_serving(self) -> None:
        """Accept on every bound listener, and say where."""
        cfg = self.config
        for server in self.serving():
            await server.start_serving()
        log.info("pymq-server listening on %s:%d (data in %s)", cfg.host, self.port, cfg.data_dir)
        if self.tls_port is not None:
            log.info("STOMP over TLS on %s:%d", cfg.host, self.tls_port)
        if self.websocket is not None and cfg.websocket is not None:
            scheme = "wss" if cfg.websocket.tls else "ws"
            log.info("STOMP over WebSocket on %s://%s:%d%s", scheme, cfg.host, self.websocket_port,
                     cfg.websocket.path)
        if self.http is not None:
            scheme = "https" if cfg.admin_tls else "http"
            log.info("admin and metrics on %s://%s:%d/", scheme, cfg.host, self.admin_port)

    def admin_listener(self, host: str, port: int, make_inner: Callable[[], asyncio.BaseProtocol],
                       ssl_context: ssl.SSLContext | None, refusal: Callable[[], bytes]) -> Listener:
        """The admin port's listening socket (server/admin/http.py asks): counted from accept against
        ``admin_max_connections``, HTTPS handshakes under ``connect_timeout_ms``."""
        return Listener.bind(asyncio.get_running_loop(), host, port, self.admin_connections, make_inner,
                             ssl_context=ssl_context, handshake_timeout=self.config.connect_timeout_ms / 1000,
                             refusal=refusal)

    def fit_caps(self) -> None:
        """Keep the connection caps within the file-descriptor limit: a broker out of descriptors stops
        accepting on every listener (asyncio pauses them all), so past the limit a connection is refused
        by its cap instead.  The soft limit is raised towards the hard one first when the caps need it."""
        cfg = self.config
        admin = cfg.admin_max_connections if cfg.admin_port is not None else 0
        wanted = cfg.max_connections + admin
        room = fit_descriptors(wanted)
        if room >= wanted:
            return
        admin = min(admin, max(8, room // 8)) if admin else 0
        stomp = max(1, room - admin)
        self.connections.limit = stomp
        self.admin_connections.limit = admin
        log.warning("the file-descriptor limit (ulimit -n) leaves room for %d connections, fewer than "
                    "max_connections %d + admin_max_connections %d: accepting %d STOMP/TLS/WebSocket and %d "
                    "admin connections at once; raise the limit for more", room, cfg.max_connections,
                    cfg.admin_max_connections if cfg.admin_port is not None else 0, stomp, admin)

    def close(self) -> None:
        """Stop accepting on the client listeners (open connections are the sessions')."""
        for server in self.serving():
            server.close()

    async def wait_closed(self) -> None:
        for server in self.serving():
            await server.wait_closed()


async def _bind(loop: asyncio.AbstractEventLoop, host: str, port: int, slots: ConnectionSlots,
                make_inner: Callable[[], asyncio.BaseProtocol], **options: Any) -> Listener:
    return Listener.bind(loop, host, port, slots, make_inner, **options)


async def _listen(what: str, host: str, port: int, starting):
    """Await ``starting`` (a server start); a bind failure becomes a ListenError naming the listener."""
    try:
        return await starting
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port} for the {what}: {exc.strerror or exc}",
                          listener=what, host=host, port=port) from None
