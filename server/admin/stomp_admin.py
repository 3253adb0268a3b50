"""The STOMP admin destination ``/pymq/admin`` (spec/admin.md).

A request is a SEND to ``/pymq/admin`` with ``pymq-admin-op:<operation>``, a JSON object body of
arguments, ``reply-to`` (usually a temporary queue) and ``correlation-id``.  The answer is a message on
the reply-to destination with the same correlation id and a JSON body: ``{"ok": true, "result": ...}``
or ``{"ok": false, "error": {"code": ..., "message": ...}}``.  Refusals are answers, not ERROR frames:
a denied or invalid admin request does not cost the connection.
"""
from __future__ import annotations

import json
import logging

from pymq.errors import InvalidHeader, MissingHeader, PymqError
from pymq_server.admin.ops import error_result

ADMIN_DESTINATION = "/pymq/admin"
log = logging.getLogger("pymq.admin")


def handle(session, headers: dict, body: bytes) -> None:
    op = headers.get("pymq-admin-op")
    if op is None:
        raise MissingHeader("an admin request needs a 'pymq-admin-op' header", header="pymq-admin-op")
    reply_to = headers.get("reply-to")
    if reply_to is None:
        raise MissingHeader("an admin request needs a 'reply-to' destination for its answer",
                            header="reply-to")
    if headers.get("transaction") is not None:
        raise InvalidHeader("admin requests cannot be part of a transaction", header="transaction")
    broker = session.broker
    try:
        args = json.loads(body.decode("utf-8")) if body.strip() else {}
        result = {"ok": True, "result": broker.admin.execute(session.user, op, args)}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        result = {"ok": False, "error": {"code": "config", "message": f"admin body is not JSON: {exc}"}}
    except PymqError as exc:
        result = error_result(exc)
    log.info("admin %s by %s: %s", op, getattr(session.user, "name", None), "ok" if result["ok"] else
             result["error"]["code"])
    reply = {"destination": reply_to, "content-type": "application/json", "persistent": "false",
             "pymq-admin-op": op}
    if "correlation-id" in headers:
        reply["correlation-id"] = headers["correlation-id"]
    broker.send(session, reply, json.dumps(result, default=str).encode("utf-8"))
