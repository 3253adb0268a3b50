"""The HTTP admin endpoint (aiohttp): the web console, the JSON API, Prometheus and health probes.

    GET  /                          the web console (static files shipped in the package, no CDN)
    GET  /healthz  /readyz          liveness; readiness (storage open, recovery done, listening) — no login
                                    (a high-availability backup answers these, /metrics and `status` only:
                                    admin/ha.py)
    GET  /metrics                   Prometheus text format (prometheus_client)
    POST /api/session               console log-in (JSON {user, password}) -> cookie + CSRF token
    GET  /api/session               who is logged in (and the CSRF token again)
    DELETE /api/session             log out
    GET  /api/{operation}           a read-only admin operation, arguments in the query string
    POST /api/{operation}           any admin operation, JSON object body of arguments
    GET  /api/queues[/{name}]  /api/topics  /api/storage      shorthands kept from the first version

Every API request is made by a broker user: HTTP basic authentication (``curl``, ``pymq-admin``,
Prometheus) or a console session cookie; permissions are the admin operations' own (ops.py), so the
console, the CLI and STOMP clients are refused the same things.  State-changing requests must be
``POST``/``DELETE`` with ``Content-Type: application/json`` (a cross-site HTML form cannot send that) and,
with a session cookie, the session's CSRF token in ``X-CSRF-Token``.  Answers are JSON
``{"ok": ..., "result" | "error"}`` with 200, or 400/401/403/404/405/413 on errors.

Before anyone has logged in, a request costs little and not for long (issue 24; spec/admin.md §HTTP):

* every socket is counted from ``accept`` against ``admin_max_connections`` (server/net/accept.py), its
  TLS handshake within ``connect_timeout_ms``; over the cap it gets 503 at once;
* the request head must arrive within ``admin_request_timeout_ms`` (aiohttp's keep-alive timer, armed
  from the first byte's wait: a connection whose head is not complete by then is closed), and so must
  the body, read by us with a deadline;
* the user is authenticated from the headers (basic authentication or the console cookie) *before* any
  body byte is read: an unauthenticated POST is answered 401 and closed with its body unread (aiohttp
  reads what is already sent for at most ``LINGER_S`` and drops it);
* a body over ``admin_max_body`` is answered 413 as soon as its ``Content-Length`` says so, and a
  chunked one as soon as it grows past it; log-in bodies (user and password) are capped at 4 KiB;
* a malformed request is one INFO line naming the peer and the reason (aiohttp logged a traceback each);
* answers of more than 64 KiB are written in 64 KiB pieces as the client takes them, within
  ``admin_request_timeout_ms``; a client that does not read is closed then, and what was kept for it
  goes.  ``browse-queue`` pages are capped in bytes besides (server/admin/messages.py).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import json
import logging
from importlib import resources
from typing import Any

from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import HttpProcessingError

from pymq.errors import (ERROR_CODES, AccessDenied, AuthenticationFailed, ConfigError, PymqError, UnknownDestination,
                         UnknownMessage, UnknownUser)
from pymq_server.admin.ha import BackupAdmin, HaCollector, backup_registry
from pymq_server.admin.metrics import exposition, registry_for
from pymq_server.broker.acl import may_monitor
from pymq_server.admin.ops import READ_ONLY, error_result
from pymq_server.admin.sessions import COOKIE, CSRF_HEADER, ConsoleSessions
from pymq_server.broker.auth import is_loopback

log = logging.getLogger("pymq.admin.http")



#: how long an answered request's unread body is still read (and dropped) before the connection closes
LINGER_S = 1.0
#: the largest log-in body (a user name and a password)
LOGIN_BODY = 4 * 1024
#: answers larger than this are written piece by piece as the client reads them
PIECE = 64 * 1024
#: what aiohttp buffers of a body before the handler reads it (it pauses reading at twice this)
READ_BUFFER = 16 * 1024
#: check_circular off: its "markers" dict would keep an answer the client never took alive in the encoder's
#: own reference cycle (closures) until a cyclic collection; answers are trees
_ENCODER = json.JSONEncoder(default=str, check_circular=False)


class TooLarge(PymqError):
    """A request body over ``admin_max_body`` (HTTP 413)."""

    code = "resource-limit"


class TooSlow(PymqError):
    """A request body that did not arrive within ``admin_request_timeout_ms`` (HTTP 408)."""

    code = "frame-timeout"


_STATUS: dict[type[PymqError], int] = {AuthenticationFailed: 401, AccessDenied: 403, UnknownDestination: 404,
                                        UnknownMessage: 404, UnknownUser: 404, TooLarge: 413, TooSlow: 408}


class BadRequestLog(logging.LoggerAdapter):
    """What aiohttp logs: a malformed request from a client is one INFO line, not a traceback; anything
    else (a fault of ours) keeps its traceback."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if not self._bad_request(args, exc_info):
            self.logger.error(msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        # aiohttp reports a first request that is not HTTP at all (a TLS hello, garbage) at debug level
        if not self._bad_request(args, kwargs.get("exc_info")):
            self.logger.debug(msg, *args, **kwargs)

    def _bad_request(self, args: tuple, exc: Any) -> bool:
        if isinstance(exc, ConnectionError):
            # the client went away while aiohttp wrote to it (its "100 Continue" to a request whose sender
            # had already shut its side: found by tests/hostile/admin_fuzzing.py): the client's doing
            self.logger.info("admin HTTP: %s went away mid-request: %s", args[0] if args else "a client",
                             " ".join(str(exc).split())[:200])
            return True
        if not isinstance(exc, HttpProcessingError):
            return False
        reason = " ".join(str(getattr(exc, "message", None) or exc).split())     # aiohttp's are multi-line
        self.logger.info("admin HTTP: bad request from %s: %s", args[0] if args else "?", reason[:200])
        return True


async def _expect(request: web.Request) -> None:
    """``Expect: 100-continue`` answered as aiohttp does, but never echoing the header (aiohttp's own
    417 put its text in the answer, and one with bytes that are not UTF-8 failed with a 500 and a
    traceback) and never written to a client that is gone (tests/hostile/admin_fuzzing.py found both);
    the body is still read only after authentication."""
    if request.version != HttpVersion11:
        return None
    if request.headers.get("Expect", "").lower() != "100-continue":
        raise web.HTTPExpectationFailed(text="only 'Expect: 100-continue' is understood")
    transport = request.transport
    if transport is not None and not transport.is_closing():
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0          # as aiohttp: the answer's own size starts after it
    return None


def refusal_response() -> bytes:
    """What a socket over ``admin_max_connections`` gets at accept, before its request is read."""
    body = b"the admin port has as many connections as it accepts (admin_max_connections); try again later\n"
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)) + body

#: the console's files (served from this list only: no path ever reaches the file system)
CONSOLE_FILES = {"index.html": "text/html", "app.js": "text/javascript", "charts.js": "text/javascript",
                 "app.css": "text/css", "favicon.svg": "image/svg+xml"}

_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
}


def _status_for(kind: type[PymqError]) -> int:
    for cls, status in _STATUS.items():
        if issubclass(kind, cls):
            return status
    return 400


def _load_console() -> dict[str, bytes]:
    folder = resources.files("pymq_server.admin") / "console"
    return {name: (folder / name).read_bytes() for name in CONSOLE_FILES}


class AdminHttp:
    def __init__(self, server, host: str, port: int, ssl_context=None) -> None:
        self.server = server
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.runner: web.AppRunner | None = None
        self.listener: Any = None          # a server/net/accept.py Listener, made by the server
        self.sessions = ConsoleSessions()
        self._console = _load_console()
        self._cores = getattr(server, "cores", None)      # a multi-worker broker: answers for all workers
        cfg = server.config
        self.max_body = cfg.admin_max_body
        self.timeout = cfg.admin_request_timeout_ms / 1000
        self._registries: dict[int, Any] = {}
        self._backup: BackupAdmin | None = None

    @property
    def admin(self):
        return self.server.admin

    @property
    def backup(self) -> BackupAdmin | None:
        """What answers while the process waits as a backup (no broker core yet; spec/ha.md §1.8)."""
        if self.server.admin is not None:
            return None
        if self._backup is None:
            self._backup = BackupAdmin(self.server)
        return self._backup

    @property
    def _registry(self):
        """The metrics registry of the admin that answers now (a backup's until it takes over)."""
        admin = self.server.admin
        registry = self._registries.get(id(admin))
        if registry is None:
            if admin is None:
                registry = backup_registry(self.server)
            else:
                registry = registry_for(admin, self._cores.collector if self._cores is not None else None)
                if getattr(self.server, "ha", None) is not None:
                    registry.register(HaCollector(self.server))
            self._registries = {id(admin): registry}
        return registry

    async def start(self) -> int:
        app = web.Application(client_max_size=self.max_body, middlewares=[self._security_headers])
        routes = [("GET", "/", self._index), ("GET", "/console/{file}", self._asset),
                  ("GET", "/healthz", self._healthz), ("GET", "/readyz", self._readyz),
                  ("GET", "/metrics", self._metrics), ("POST", "/api/session", self._login),
                  ("GET", "/api/session", self._whoami), ("DELETE", "/api/session", self._logout),
                  ("GET", "/api/queues", self._get_op("list-queues")),
                  ("GET", "/api/queues/{name}", self._get_op("queue-info")),
                  ("GET", "/api/topics", self._get_op("list-topics")),
                  ("GET", "/api/storage", self._get_op("storage")),
                  ("GET", "/api/{op}", self._get), ("POST", "/api/{op}", self._post)]
        for method, path, handler in routes:
            app.router.add_route(method, path, handler, expect_handler=_expect)
            if method == "GET":
                app.router.add_route("HEAD", path, handler, expect_handler=_expect)
        # every other request too, so that no request meets aiohttp's own Expect handler (see _expect)
        app.router.add_route("*", "/{tail:.*}", self._no_route, expect_handler=_expect)
        # the keep-alive timer closes a connection whose request head is not complete in time (aiohttp
        # arms it at connect and after each answer); what is sent of a body we do not want is read for
        # LINGER_S at most
        self.runner = web.AppRunner(app, access_log=None, keepalive_timeout=self.timeout,
                                    lingering_time=LINGER_S, read_bufsize=READ_BUFFER,
                                    logger=BadRequestLog(logging.getLogger("pymq.admin.http"), {}))
        await self.runner.setup()
        server = self.runner.server
        assert server is not None
        # the listening socket is the server's (listeners.py: counted from accept against admin_max_connections,
        # HTTPS handshakes under connect_timeout_ms, server/net/accept.py)
        self.listener = self.server.admin_listener(self.host, self.port, server, self.ssl_context,
                                                   refusal_response)
        await self.listener.start_serving()
        self.port = int(self.listener.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self.listener is not None:
            self.listener.close()
        if self.runner is not None:
            await self.runner.cleanup()

    @web.middleware
    async def _security_headers(self, request: web.Request, handler):
        response = await handler(request)
        response.headers.update(_SECURITY_HEADERS)
        if request.path.startswith("/api/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    async def _no_route(self, request: web.Request) -> web.StreamResponse:
        """What aiohttp answers when no route matches: 405 naming the methods a path allows, else 404."""
        allowed: set[str] = set()
        for resource in request.app.router.resources():
            if resource is not request.match_info.route.resource:
                _, methods = await resource.resolve(request)
                allowed |= methods
        if allowed:
            raise web.HTTPMethodNotAllowed(request.method, allowed)
        raise web.HTTPNotFound()

    # -- who is asking ---------------------------------------------------------------------------
    async def _basic_user(self, header: str, peer: str | None):
        try:
            login, _, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError, binascii.Error):
            raise AuthenticationFailed("malformed basic authentication header") from None
        return await self._authenticate(login, password, peer)

    async def _authenticate(self, login: str, password: str, peer: str | None):
        """The broker's one login check (Broker.authenticate): a password hash in its bounded pool,
        never on the loop; ``resource-limit`` when too many are waiting."""
        if login.startswith("cluster:"):
            raise AuthenticationFailed("cluster nodes do not use the admin HTTP interface")
        backup = self.backup
        if backup is not None:
            return await backup.authenticate(login, password, peer)
        answer: asyncio.Future = asyncio.get_running_loop().create_future()

        def done(user, error) -> None:
            if not answer.done():
                if error is not None:
                    answer.set_exception(error)
                else:
                    answer.set_result(user)

        self.server.broker.authenticate(login, password, peer, None, done)
        return await answer

    def _session_user(self, request: web.Request, changing: bool):
        token = request.cookies.get(COOKIE)
        session = self.sessions.lookup(token)
        if session is None:
            raise AuthenticationFailed("not logged in (or the console session expired): log in again")
        backup = self.backup
        authenticator = backup.authenticator if backup is not None else self.server.broker.authenticator
        user = authenticator.users.get(session.login)
        if user is None or user.password_hash != session.password_hash:
            self.sessions.drop(token)
            raise AuthenticationFailed(f"user '{session.login}' was removed or its password changed: "
                                       f"log in again", user=session.login)
        if user.loopback_only and not is_loopback(request.remote):
            raise AuthenticationFailed(f"user '{user.name}' can only connect via localhost", user=user.name)
        if changing:
            if not ConsoleSessions.csrf_ok(session, request.headers.get(CSRF_HEADER)):
                raise AccessDenied("missing or wrong CSRF token (X-CSRF-Token) for a state-changing request",
                                   user=user.name, destination="*", permission="csrf")
            origin = request.headers.get("Origin")
            if origin is not None and origin.split("://", 1)[-1] != request.host:
                raise AccessDenied(f"cross-origin request from {origin} refused", user=user.name,
                                   destination="*", permission="origin")
        return user

    async def _user(self, request: web.Request, changing: bool):
        header = request.headers.get("Authorization", "")
        if header.startswith("Basic "):
            return await self._basic_user(header, request.remote)
        if COOKIE in request.cookies:
            return self._session_user(request, changing)
        raise AuthenticationFailed("HTTP basic authentication or a console session is required")

    @staticmethod
    def _json_body_required(request: web.Request) -> None:
        if request.content_type != "application/json":
            raise ConfigError("a state-changing request needs 'Content-Type: application/json'")

    # -- the console -----------------------------------------------------------------------------
    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(body=self._console["index.html"], content_type="text/html", charset="utf-8")

    async def _asset(self, request: web.Request) -> web.Response:
        name = request.match_info["file"]
        kind = CONSOLE_FILES.get(name)
        if kind is None:
            raise web.HTTPNotFound()
        return web.Response(body=self._console[name], content_type=kind,
                            charset="utf-8" if kind.startswith("text/") else None)

    async def _login(self, request: web.Request) -> web.StreamResponse:
        try:
            self._json_body_required(request)
            body = await self._json_body(request, LOGIN_BODY)
            login, password = body.get("user"), body.get("password")
            if not isinstance(login, str) or not isinstance(password, str) or not login:
                raise AuthenticationFailed("log-in needs a JSON body with 'user' and 'password'")
            user = await self._authenticate(login, password, request.remote)
        except PymqError as exc:
            return _error(exc)
        token, session = self.sessions.create(user.name, user.password_hash)
        response = _ok(self._session_view(user, session))
        response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/",
                            secure=request.secure)
        log.info("console log-in by %s from %s", user.name, request.remote)
        return response

    async def _whoami(self, request: web.Request) -> web.Response:
        try:
            user = self._session_user(request, changing=False)
        except PymqError as exc:
            return _error(exc)
        return _ok(self._session_view(user, self.sessions.lookup(request.cookies.get(COOKIE))))

    async def _logout(self, request: web.Request) -> web.Response:
        try:
            self._session_user(request, changing=True)
        except PymqError as exc:
            return _error(exc)
        self.sessions.drop(request.cookies.get(COOKIE))
        response = _ok({"logged_out": True})
        response.del_cookie(COOKIE, path="/")
        return response

    @staticmethod
    def _session_view(user, session) -> dict:
        return {"user": user.name, "roles": sorted(user.roles), "admin": "admin" in user.roles,
                "csrf": session.csrf if session is not None else None}

    # -- probes and metrics ----------------------------------------------------------------------
    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        backup = self.backup
        ready, checks = backup.readiness() if backup is not None else self.admin.readiness()
        return web.json_response({"ready": ready, "checks": checks}, status=200 if ready else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        try:
            user = await self._user(request, changing=False)
        except PymqError as exc:
            return web.Response(status=401, text=exc.message + "\n",
                                headers={"WWW-Authenticate": 'Basic realm="pymq"'})
        if not may_monitor(user):
            # the exposition names every destination: administrators and the monitor role only
            return web.Response(status=403, text=f"user '{user.name}' may not read metrics: the admin or "
                                                 f"monitor role is needed\n")
        if self._cores is not None:
            await self._cores.refresh_metrics()
        body, content_type = exposition(self._registry, request.headers.get("Accept", ""))
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    # -- operations ------------------------------------------------------------------------------
    def _get_op(self, op: str):
        async def handler(request: web.Request) -> web.StreamResponse:
            args = dict(request.query)
            args.update(request.match_info)
            return await self._run(request, op, args, changing=False)
        return handler

    async def _get(self, request: web.Request) -> web.StreamResponse:
        op = request.match_info["op"]
        if op not in READ_ONLY:
            return _error(ConfigError(f"'{op}' changes the broker (or does not exist): use POST"), status=405)
        return await self._run(request, op, dict(request.query), changing=False)

    async def _post(self, request: web.Request) -> web.StreamResponse:
        try:
            self._json_body_required(request)
            # who is asking, from the headers, before a byte of the body is read
            user = await self._user(request, changing=True)
            args = await self._json_body(request, self.max_body)
        except PymqError as exc:
            return _error(exc)
        return await self._run(request, request.match_info["op"], args, changing=True, user=user)

    async def _run(self, request: web.Request, op: str, args, changing: bool, user=None) -> web.StreamResponse:
        try:
            if user is None:
                user = await self._user(request, changing)
        except PymqError as exc:
            return _error(exc)
        backup = self.backup
        if backup is not None:
            result = backup.answer(op)
        else:
            answer: asyncio.Future = asyncio.get_running_loop().create_future()
            # a multi-worker broker runs the operation where the queue lives, or everywhere (server/cores)
            submit = self._cores.submit if self._cores is not None else self.admin.submit
            submit(user, op, args, answer.set_result)
            result = await answer
        status = 200
        if not result["ok"]:
            status = 500 if result.get("internal") else _status_for(ERROR_CODES.get(result["error"]["code"],
                                                                                     PymqError))
        return await self._answer(request, result, status)

    async def _answer(self, request: web.Request, result: dict, status: int) -> web.StreamResponse:
        """A JSON answer; a large one encoded and written a piece at a time as the client reads it, within
        the request deadline: a client that does not read, or goes, is closed, and nothing of the answer
        stays behind (no encoded copy of it is ever made whole)."""
        parts = _ENCODER.iterencode(result)
        head: list[str] = []
        size = 0
        for part in parts:
            head.append(part)
            size += len(part)
            if size > PIECE:
                break
        else:
            return web.json_response(text="".join(head), status=status)
        response = web.StreamResponse(status=status, headers={"Content-Type": "application/json; charset=utf-8",
                                                              "Cache-Control": "no-store", **_SECURITY_HEADERS})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        try:
            await asyncio.wait_for(response.prepare(request), self.timeout)
            pending = head
            for more in itertools.chain(parts, (None,)):
                if more is not None:
                    pending.append(more)
                    size += len(more)
                    if size < PIECE:
                        continue
                piece = "".join(pending).encode("utf-8")
                pending, size = [], 0
                await asyncio.wait_for(response.write(piece), max(0.0, deadline - loop.time()))
            await asyncio.wait_for(response.write_eof(), max(0.0, deadline - loop.time()))
        except (asyncio.TimeoutError, ConnectionError) as exc:
            log.info("admin HTTP: %s from %s: the answer was not taken within %.0f s (%s); closed",
                     request.path, request.remote, self.timeout, type(exc).__name__)
            exc.__traceback__ = None        # its frames would keep the answer alive until a cyclic GC
            if request.transport is not None:
                request.transport.abort()
        finally:
            close = getattr(parts, "close", None)          # a generator: what it holds goes now
            if close is not None:
                close()
        return response

    async def _json_body(self, request: web.Request, limit: int) -> dict:
        """The request's JSON object body, read within the request deadline and at most ``limit`` bytes
        (413 as soon as a Content-Length or a chunked body passes it)."""
        if request.content_length is not None and request.content_length > limit:
            raise TooLarge(f"the body is {request.content_length} bytes; at most {limit} are taken",
                           limit=limit)
        if not request.can_read_body:
            return {}
        chunks: list[bytes] = []

        async def read() -> None:
            size = 0
            while True:
                chunk = await request.content.readany()
                if not chunk:
                    return
                size += len(chunk)
                if size > limit:
                    raise TooLarge(f"the body is more than {limit} bytes", limit=limit)
                chunks.append(chunk)

        try:
            await asyncio.wait_for(read(), self.timeout)
        except asyncio.TimeoutError:
            raise TooSlow(f"the body did not arrive within {self.timeout:.0f} s "
                          f"(admin_request_timeout_ms)") from None
        return _json_object(b"".join(chunks))


def _json_object(data: bytes) -> dict:
    if not data.strip():
        return {}
    try:
        body = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise ConfigError("body is nested too deeply") from None
    if not isinstance(body, dict):
        raise ConfigError("the body must be a JSON object")
    return body


def _ok(result) -> web.Response:
    return web.json_response({"ok": True, "result": result}, dumps=_dumps)


def _error(exc: PymqError, status: int | None = None) -> web.Response:
    response = web.json_response(error_result(exc), status=status or _status_for(type(exc)), dumps=_dumps)
    if isinstance(exc, (AuthenticationFailed, TooLarge, TooSlow)):
        # its body may be unread (or still coming): this connection carries no further request
        response.force_close()
    return response


def _dumps(value) -> str:
    return json.dumps(value, default=str)
