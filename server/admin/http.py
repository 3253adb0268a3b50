"""The HTTP admin endpoint (aiohttp), for operators, ``curl`` and Prometheus (spec/admin.md).

    GET  /metrics                   Prometheus text format
    GET  /api/queues                list-queues          GET /api/queues/{name}   queue-info
    GET  /api/topics                list-topics          GET /api/storage         storage
    POST /api/{operation}           any admin operation, JSON object body of arguments

Every request needs HTTP basic authentication with a broker user (the users file; guest only from
loopback, as on STOMP); permissions are the admin operations' own.  Answers are JSON
``{"ok": ..., "result" | "error"}`` with 200, or 400/401/403/404 on errors.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging

from aiohttp import web

from pymq.errors import AccessDenied, AuthenticationFailed, PymqError, UnknownDestination
from pymq_server.admin.ops import error_result, prometheus

log = logging.getLogger("pymq.admin.http")

_STATUS = {AuthenticationFailed: 401, AccessDenied: 403, UnknownDestination: 404}


def _status_for(exc: PymqError) -> int:
    for cls, status in _STATUS.items():
        if isinstance(exc, cls):
            return status
    return 400


class AdminHttp:
    def __init__(self, server, host: str, port: int) -> None:
        self.server = server
        self.host = host
        self.port = port
        self.runner: web.AppRunner | None = None

    async def start(self) -> int:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/api/queues", self._op("list-queues"))
        app.router.add_get("/api/queues/{name}", self._op("queue-info"))
        app.router.add_get("/api/topics", self._op("list-topics"))
        app.router.add_get("/api/storage", self._op("storage"))
        app.router.add_post("/api/{op}", self._post)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _user(self, request: web.Request):
        header = request.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            raise AuthenticationFailed("HTTP basic authentication with a broker user is required")
        try:
            login, _, password = base64.b64decode(header[6:]).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            raise AuthenticationFailed("malformed basic authentication header") from None
        auth = self.server.broker.authenticator
        peer = request.remote
        if auth.needs_slow_check(login, password):
            return await asyncio.get_running_loop().run_in_executor(
                None, auth.authenticate, login, password, peer)
        return auth.authenticate(login, password, peer)

    def _op(self, op: str):
        async def handler(request: web.Request) -> web.Response:
            args = dict(request.match_info)
            args.update(request.query)
            return await self._run(request, op, args)
        return handler

    async def _post(self, request: web.Request) -> web.Response:
        try:
            args = await request.json() if request.can_read_body else {}
        except json.JSONDecodeError as exc:
            return web.json_response({"ok": False, "error": {"code": "config",
                                                             "message": f"body is not JSON: {exc}"}}, status=400)
        return await self._run(request, request.match_info["op"], args)

    async def _run(self, request: web.Request, op: str, args) -> web.Response:
        try:
            user = await self._user(request)
            result = self.server.admin.execute(user, op, args)
        except PymqError as exc:
            return web.json_response(error_result(exc), status=_status_for(exc), dumps=_dumps)
        return web.json_response({"ok": True, "result": result}, dumps=_dumps)

    async def _metrics(self, request: web.Request) -> web.Response:
        try:
            await self._user(request)
        except PymqError as exc:
            return web.Response(status=401, text=exc.message + "\n",
                                headers={"WWW-Authenticate": 'Basic realm="pymq"'})
        return web.Response(text=prometheus(self.server.admin),
                            content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})


def _dumps(value) -> str:
    return json.dumps(value, default=str)
