"""Managing queues from an application (seed 001): create, drop, purge, list, metrics, permissions.

``conn.queue_manager()`` talks to the broker's admin destination (spec/admin.md) over the same
connection: a private temporary reply queue and correlation ids, thread-safe like the Connection.
Refusals come back as the same exception classes the broker would raise (``DestinationExists``,
``AccessDenied``, ...), with the broker's message.
"""
from __future__ import annotations

import itertools
import json
import threading
import uuid
from typing import Any

from pymq.destination import Queue, as_destination
from pymq.errors import ERROR_CODES, PymqError, TimeoutError
from pymq.protocol.frame import Frame

ADMIN_DESTINATION = "/pymq/admin"


class _ReplyInbox:
    """Stands where a MessageConsumer would for the connection's frame routing."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting: dict[str, list] = {}

    def _arrived(self, frame: Frame) -> None:
        corr = frame.headers.get("correlation-id")
        with self.lock:
            slot = self.waiting.get(corr)
        if slot is not None:
            slot.append(frame)
            slot[0].set()

    def _wake(self) -> None:
        with self.lock:
            for slot in self.waiting.values():
                slot[0].set()


class QueueManager:
    def __init__(self, connection) -> None:
        self.connection = connection
        self._lock = threading.Lock()
        self._inbox: _ReplyInbox | None = None
        self._reply_to: str | None = None
        self._ids = itertools.count(1)

    def _ensure(self) -> None:
        with self._lock:
            if self._inbox is not None:
                return
            inbox = _ReplyInbox()
            sub_id = self.connection._register(inbox)
            reply_to = f"/temp-queue/admin-{uuid.uuid4().hex[:12]}"
            self.connection._request(Frame("SUBSCRIBE", {"destination": reply_to, "id": sub_id,
                                                         "ack": "auto"}))
            self._inbox, self._reply_to = inbox, reply_to

    def call(self, op: str, timeout: float | None = None, **args: Any) -> Any:
        """Run admin operation ``op`` with ``args``; its result, or the broker's error raised here."""
        self._ensure()
        corr = f"adm-{next(self._ids)}-{uuid.uuid4().hex[:6]}"
        slot: list = [threading.Event()]
        inbox = self._inbox
        with inbox.lock:
            inbox.waiting[corr] = slot
        try:
            self.connection._send(Frame("SEND", {
                "destination": ADMIN_DESTINATION, "pymq-admin-op": op, "reply-to": self._reply_to,
                "correlation-id": corr, "content-type": "application/json"},
                json.dumps(args).encode("utf-8")))
            wait = self.connection.factory.timeout if timeout is None else timeout
            if not slot[0].wait(wait):
                raise TimeoutError(f"no answer to admin operation {op!r} within {wait}s")
            self.connection._check_open()
            answer = json.loads(slot[1].body.decode("utf-8"))
        finally:
            with inbox.lock:
                inbox.waiting.pop(corr, None)
        if answer.get("ok"):
            return answer.get("result")
        error = answer.get("error") or {}
        cls = ERROR_CODES.get(error.get("code", ""), PymqError)
        exc = cls.__new__(cls)
        PymqError.__init__(exc, error.get("message", "admin operation failed"))
        for key, value in error.items():
            if key not in ("code", "message"):
                setattr(exc, key, value)
        raise exc

    # -- the operations ------------------------------------------------------------------------
    def create(self, name: str, *, grants: dict | None = None, **config: Any) -> Queue:
        """Create queue ``name`` owned by this connection's user with ``config`` (QueueConfig fields:
        max_deliveries, dead_letter, dead_retention_ms, default_expiration_ms, default_priority,
        delivery_timeout_ms, max_depth, overflow, redelivery_delay_ms, redelivery_multiplier,
        redelivery_max_delay_ms, schema, routing_key).  The same config again is a no-op; a different one
        raises DestinationExists.  ``routing_key`` (group | correlation-id | message-id) says which id picks a
        message's node in a cluster (spec/routing.md §2.3)."""
        self.call("create-queue", name=_queue_name(name), config=config, grants=grants)
        return Queue(_queue_name(name))

    def drop(self, name: str, *, force: bool = False) -> int:
        return self.call("drop-queue", name=_queue_name(name), force=force)["dropped_messages"]

    def purge(self, name: str) -> int:
        return self.call("purge-queue", name=_queue_name(name))["purged_messages"]

    def list(self) -> list[dict]:
        return self.call("list-queues")

    def info(self, name: str) -> dict:
        return self.call("queue-info", name=_queue_name(name))

    def metrics(self, name: str) -> dict:
        return self.info(name)["metrics"]

    def destinations(self) -> dict:
        return self.call("list-destinations")

    def grant(self, destination, principal: str, *permissions: str) -> dict:
        return self.call("grant", destination=as_destination(_dest(destination)).stomp_name,
                         principal=principal, permissions=list(permissions))

    def revoke(self, destination, principal: str, *permissions: str) -> dict:
        return self.call("revoke", destination=as_destination(_dest(destination)).stomp_name,
                         principal=principal, permissions=list(permissions))


def _queue_name(name) -> str:
    if isinstance(name, Queue):
        return name.name
    return name[len("/queue/"):] if name.startswith("/queue/") else name


def _dest(value):
    if isinstance(value, str) and not value.startswith("/"):
        return "/queue/" + value
    return value
