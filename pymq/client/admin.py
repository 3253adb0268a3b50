"""Managing queues from an application (seed 001): create, drop, purge, list, metrics, permissions.

``conn.queue_manager()`` (both SDKs) talks to the broker's admin destination (spec/admin.md) over the
same connection: a private temporary reply queue and correlation ids.  Refusals come back as the same
exception classes the broker would raise (``DestinationExists``, ``AccessDenied``, ...), with the
broker's message.  The operations are described once here (:class:`AdminCall`: the request and how to
read its answer); :class:`QueueManager` runs them blocking, ``pymq.aio.AsyncQueueManager`` with await.
"""
from __future__ import annotations

import itertools
import json
import threading
import uuid
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from collections.abc import Callable

from pymq.destination import Destination, Queue, as_destination
from pymq.errors import ERROR_CODES, MessageFormatError, PymqError, TimeoutError
from pymq.protocol.frame import Frame

if TYPE_CHECKING:
    from pymq.client.blocking import Connection

ADMIN_DESTINATION = "/pymq/admin"

T = TypeVar("T")
JsonObject = dict[str, object]


class AdminCall(Generic[T]):
    """One admin operation: its name and arguments, and how its result is read."""

    __slots__ = ("op", "args", "extract")

    def __init__(self, op: str, args: JsonObject, extract: Callable[[object], T]) -> None:
        self.op = op
        self.args = args
        self.extract = extract


def _object(value: object) -> JsonObject:
    if not isinstance(value, dict):
        raise MessageFormatError(f"the broker answered with {type(value).__name__}, expected an object")
    return value


def _objects(value: object) -> list[JsonObject]:
    if not isinstance(value, list):
        raise MessageFormatError(f"the broker answered with {type(value).__name__}, expected a list")
    return [_object(v) for v in value]


def _count(key: str) -> Callable[[object], int]:
    def extract(value: object) -> int:
        number = _object(value).get(key)
        if not isinstance(number, int):
            raise MessageFormatError(f"the broker's answer has no integer {key!r}")
        return number
    return extract


def _queue_name(name: Queue | str) -> str:
    if isinstance(name, Queue):
        return name.name
    return name[len("/queue/"):] if name.startswith("/queue/") else name


def _destination_name(value: Destination | str) -> str:
    if isinstance(value, str) and not value.startswith("/"):
        value = "/queue/" + value
    return as_destination(value).stomp_name


# -- the operations (shared by both SDKs' queue managers) ------------------------------------------

def create_call(name: Queue | str, grants: dict[str, list[str]] | None, config: JsonObject) -> AdminCall[Queue]:
    queue = Queue(_queue_name(name))
    return AdminCall("create-queue", {"name": queue.name, "config": config, "grants": grants},
                     lambda _: queue)


def alter_call(name: Queue | str, config: JsonObject) -> AdminCall[JsonObject]:
    return AdminCall("alter-queue", {"name": _queue_name(name), "config": config}, _object)


def drop_call(name: Queue | str, force: bool) -> AdminCall[int]:
    return AdminCall("drop-queue", {"name": _queue_name(name), "force": force}, _count("dropped_messages"))


def purge_call(name: Queue | str) -> AdminCall[int]:
    return AdminCall("purge-queue", {"name": _queue_name(name)}, _count("purged_messages"))


def list_call() -> AdminCall[list[JsonObject]]:
    return AdminCall("list-queues", {}, _objects)


def info_call(name: Queue | str) -> AdminCall[JsonObject]:
    return AdminCall("queue-info", {"name": _queue_name(name)}, _object)


def metrics_call(name: Queue | str) -> AdminCall[JsonObject]:
    return AdminCall("queue-info", {"name": _queue_name(name)}, lambda v: _object(_object(v).get("metrics")))


def destinations_call() -> AdminCall[JsonObject]:
    return AdminCall("list-destinations", {}, _object)


def grant_call(op: str, destination: Destination | str, principal: str,
               permissions: tuple[str, ...]) -> AdminCall[JsonObject]:
    return AdminCall(op, {"destination": _destination_name(destination), "principal": principal,
                          "permissions": list(permissions)}, _object)


# -- one request and its answer ------------------------------------------------------------------------

class AdminInbox:
    """The reply subscription: answers by correlation id (a shell adds how a caller waits)."""

    def __init__(self) -> None:
        self.reply_to = f"/temp-queue/admin-{uuid.uuid4().hex[:12]}"
        self.answers: dict[str, Frame | None] = {}
        self._ids = itertools.count(1)

    def request(self, call: AdminCall[T]) -> tuple[str, Frame]:
        corr = f"adm-{next(self._ids)}-{uuid.uuid4().hex[:6]}"
        self.answers[corr] = None
        return corr, Frame("SEND", {
            "destination": ADMIN_DESTINATION, "pymq-admin-op": call.op, "reply-to": self.reply_to,
            "correlation-id": corr, "content-type": "application/json"},
            json.dumps(call.args).encode("utf-8"))

    def subscribe(self, sub_id: str) -> Frame:
        return Frame("SUBSCRIBE", {"destination": self.reply_to, "id": sub_id, "ack": "auto"})

    def _arrived(self, frame: Frame) -> None:
        corr = frame.headers.get("correlation-id", "")
        if corr in self.answers:
            self.answers[corr] = frame
            self._answered(corr)

    def _answered(self, corr: str) -> None:
        raise NotImplementedError

    def _wake(self) -> None:
        raise NotImplementedError


def admin_result(call: AdminCall[T], frame: Frame) -> T:
    """The result of ``call`` from the broker's answer, or the broker's refusal raised."""
    try:
        answer = json.loads(frame.body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MessageFormatError(f"the broker's answer to {call.op!r} is not JSON: {exc}") from None
    answer = _object(answer)
    if answer.get("ok"):
        return call.extract(answer.get("result"))
    error = answer.get("error")
    error = error if isinstance(error, dict) else {}
    cls = ERROR_CODES.get(str(error.get("code", "")), PymqError)
    refusal = cls.__new__(cls)
    PymqError.__init__(refusal, str(error.get("message", "admin operation failed")))
    for key, value in error.items():
        if key not in ("code", "message"):
            setattr(refusal, key, value)
    raise refusal


class _ThreadInbox(AdminInbox):
    def __init__(self) -> None:
        super().__init__()
        self.events: dict[str, threading.Event] = {}

    def _answered(self, corr: str) -> None:
        event = self.events.get(corr)
        if event is not None:
            event.set()

    def _wake(self) -> None:
        for event in list(self.events.values()):
            event.set()


class QueueManager:
    """Queue administration over a blocking :class:`~pymq.Connection` (thread-safe like it)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._lock = threading.Lock()
        self._inbox: _ThreadInbox | None = None

    def _ensure(self) -> _ThreadInbox:
        with self._lock:
            if self._inbox is None:
                inbox = _ThreadInbox()
                sub_id = self.connection._register(inbox)
                self.connection._request(inbox.subscribe(sub_id))
                self._inbox = inbox
            return self._inbox

    def call(self, op: str, timeout: float | None = None, **args: object) -> Any:
        """Run admin operation ``op`` (spec/admin.md) with ``args``; its JSON result, or the broker's
        error raised here.  The methods below are the typed way to the common operations."""
        return self._run(AdminCall(op, dict(args), lambda value: value), timeout)

    def _run(self, call: AdminCall[T], timeout: float | None = None) -> T:
        """Run ``call``; its result, or the broker's error raised here."""
        inbox = self._ensure()
        corr, frame = inbox.request(call)
        event = inbox.events[corr] = threading.Event()
        try:
            self.connection._send(frame)
            wait = self.connection.factory.timeout if timeout is None else timeout
            if not event.wait(wait):
                raise TimeoutError(f"no answer to admin operation {call.op!r} within {wait}s")
            self.connection._check_open()
            answer = inbox.answers.get(corr)
        finally:
            inbox.events.pop(corr, None)
            inbox.answers.pop(corr, None)
        if answer is None:
            raise TimeoutError(f"no answer to admin operation {call.op!r}")
        return admin_result(call, answer)

    # -- the operations ------------------------------------------------------------------------
    def create(self, name: Queue | str, *, grants: dict[str, list[str]] | None = None, **config: object) -> Queue:
        """Create queue ``name`` owned by this connection's user with ``config`` (QueueConfig fields:
        max_deliveries, dead_letter, dead_retention_ms, default_expiration_ms, default_priority,
        delivery_timeout_ms, max_depth, overflow, redelivery_delay_ms, redelivery_multiplier,
        redelivery_max_delay_ms, schema, routing_key).  The same config again is a no-op; a different one
        raises DestinationExists.  ``routing_key`` (group | correlation-id | message-id) says which id picks a
        message's node in a cluster (spec/routing.md §2.3)."""
        return self._run(create_call(name, grants, config))

    def alter(self, name: Queue | str, **config: object) -> JsonObject:
        """Change some settings of queue ``name`` (the QueueConfig fields of :meth:`create`); the others
        keep their values.  Only its owner or an administrator may.  The answer says what changed
        (``changes``) and describes the queue; which settings reach messages already waiting is
        spec/admin.md "Altering a queue".  Kept across restarts."""
        return self._run(alter_call(name, config))

    alter_queue = alter     # the name seed 001's queue manager gives it

    def drop(self, name: Queue | str, *, force: bool = False) -> int:
        """Delete queue ``name`` and its messages; how many it held.  With consumers attached it is refused
        (IllegalStateError) unless ``force``, which detaches them."""
        return self._run(drop_call(name, force))

    def purge(self, name: Queue | str) -> int:
        """Remove every waiting message; how many there were."""
        return self._run(purge_call(name))

    def list(self) -> list[JsonObject]:
        """Every queue, one JSON object each: name, destination, declared, owner and its metrics."""
        return self._run(list_call())

    def info(self, name: Queue | str) -> JsonObject:
        """Queue ``name``: its settings (``config``), ``acl``, ``metrics`` and ``rates``, as a JSON object."""
        return self._run(info_call(name))

    def metrics(self, name: Queue | str) -> JsonObject:
        """Queue ``name``'s metrics (depth, added, removed, expired, delivered, acknowledged...), as a JSON object."""
        return self._run(metrics_call(name))

    def destinations(self) -> JsonObject:
        """The broker's destinations: ``queues``, ``topics`` and retained ``logs``, each a sorted list."""
        return self._run(destinations_call())

    def grant(self, destination: Destination | str, principal: str, *permissions: str) -> JsonObject:
        """Give ``principal`` ``permissions`` (produce, consume, browse) on ``destination``; its new ACL."""
        return self._run(grant_call("grant", destination, principal, permissions))

    def revoke(self, destination: Destination | str, principal: str, *permissions: str) -> JsonObject:
        """Take ``permissions`` on ``destination`` away from ``principal``; its new ACL."""
        return self._run(grant_call("revoke", destination, principal, permissions))
