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

from pymq.errors import AccessDenied, InvalidHeader, MissingHeader, PymqError
from pymq_server.admin.ops import error_result
from pymq_server.broker import vhosts
from pymq_server.broker.acl import is_admin
from pymq_server.broker.destination import ADMIN_DESTINATION
from pymq_server.broker.requests import parse_send

__all__ = ["ADMIN_DESTINATION", "handle"]

log = logging.getLogger("pymq.admin")


def handle(session, headers: dict, body: bytes, submit=None) -> None:
    """``submit``: how the operation runs (default: this broker's admin; a multi-worker broker's home
    passes one that runs it where the queue lives, server/cores/admin.py)."""
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
    # the answer goes where the asker's reply-to names in the asker's vhost (spec/stomp.md §1): an
    # administrator asking from /shop with reply-to:/queue/answers reads it there, never in '/' or another vhost
    # (a '$' name is refused as in a destination header: no answer lands in another vhost's queue)
    if not getattr(session, "is_cluster", False):
        vhosts.check_client_destination(reply_to)
    reply_to = vhosts.inside(reply_to, getattr(session, "_vh_prefix", ""))
    reply = {"destination": reply_to, "content-type": "application/json", "persistent": "false",
             "pymq-admin-op": op}
    if "correlation-id" in headers:
        reply["correlation-id"] = headers["correlation-id"]
    immediate = True

    def answer(result: dict) -> None:
        body = json.dumps(result, default=str).encode("utf-8")
        # the broker's own answer: it never pauses the asker as a producer (a status request while memory is
        # high is answered, and the asker's next frames are read)
        if immediate:
            broker.send(session, parse_send(reply, body), pause=False)     # an error here is the SEND's own
            return
        if session.closed:
            return                                # the asker left while the slow part ran
        try:
            broker.send(session, parse_send(reply, body), pause=False)
        except PymqError as exc:
            log.info("admin %s: the answer could not be delivered: %s", op, exc.message)

    try:
        args = json.loads(body.decode("utf-8")) if body.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        answer({"ok": False, "error": {"code": "config", "message": f"admin body is not JSON: {exc}"}})
        return
    except RecursionError:
        answer({"ok": False, "error": {"code": "config", "message": "admin body is nested too deeply"}})
        return
    if getattr(session, "vhost", "/") != "/" and not is_admin(session.user):
        # admin operations name the broker's destinations (spec/admin.md "Virtual hosts"): from inside a
        # virtual host only an administrator may use them
        answer(error_result(AccessDenied(
            f"user '{session.user.name}' may not use admin operations from virtual host '/{session.vhost}': "
            f"they name the broker's destinations", user=session.user.name, destination="/pymq/admin",
            permission="admin")))
        return
    (submit or broker.admin.submit)(session.user, op, args, answer)
    immediate = False
