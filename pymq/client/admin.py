"""Managing queues from an application (seed 001): create, drop, purge, list, metrics, permissions.

``conn.queue_manager()`` (both SDKs) talks to the broker's admin destination (spec/admin.md) over the
same connection: a private temporary reply queue and correlation ids.  Refusals come back as the same
exception classes the broker would raise (``DestinationExists``, ``AccessDenied``, ...), with the
broker's message.  The operations are described once here (:class:`AdminCall`: the request and how to
read its answer); the SDK shells' ``QueueManager`` (blocking) and ``AsyncQueueManager`` run them.
"""
from __future__ import annotations

import itertools
import json
import uuid
from typing import Generic, TypeVar
from collections.abc import Callable

from pymq.destination import Destination, Queue, as_destination
from pymq.errors import ERROR_CODES, MessageFormatError, PymqError
from pymq.protocol.frame import Frame

ADMIN_DESTINATION = "/pymq/admin"
_INTERRUPTED = json.dumps({"ok": False, "error": {
    "code": "connection-interrupted", "message": "the connection to the broker was lost before the answer came; "
    "whether the operation ran is unknown (the connection fails over: try again)"}}).encode("utf-8")

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
        self.subscription: Frame | None = None
        self._ids = itertools.count(1)

    def request(self, call: AdminCall[T]) -> tuple[str, Frame]:
        corr = f"adm-{next(self._ids)}-{uuid.uuid4().hex[:6]}"
        self.answers[corr] = None
        return corr, Frame("SEND", {
            "destination": ADMIN_DESTINATION, "pymq-admin-op": call.op, "reply-to": self.reply_to,
            "correlation-id": corr, "content-type": "application/json"},
            json.dumps(call.args).encode("utf-8"))

    def subscribe(self, sub_id: str) -> Frame:
        self.subscription = Frame("SUBSCRIBE", {"destination": self.reply_to, "id": sub_id, "ack": "auto"})
        return self.subscription

    def _resubscription(self) -> Frame | None:
        return self.subscription

    def _interrupted(self) -> None:
        """A failover lost the link: the answers still to come went with it (the operation may or may not
        have run), so each waiting call raises ConnectionInterrupted."""
        for corr, answer in list(self.answers.items()):
            if answer is None:
                self.answers[corr] = Frame("MESSAGE", {"correlation-id": corr}, _INTERRUPTED)
                self._answered(corr)

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
