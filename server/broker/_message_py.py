"""A message's construction: the reference semantics of :class:`~pymq_server.broker.message.BrokerMessage`'s
``__init__`` and of ``message_from_request`` (spec/stomp.md §4).

There is one message class, slotted, in message.py, with its methods; what has a compiled twin
(``_ext/message.pyx``, built as ``_message_c``) is how an instance is filled: ``init_message`` is the class's
``__init__`` and ``message_from_request`` builds a SEND's message with the destination's defaults. message.py
hands the class to both (``bind``) and installs one pair (``PYMQ_NO_EXTENSIONS=1``: this one). For every input
both build a message with the same fields, of the same types, and write the same canonical headers back into
the request's properties (tests/broker/test_message_twins.py); the compiled one fills the slots without a
Python frame, which is all it does differently.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pymq.protocol.numbers import INT64_MAX

if TYPE_CHECKING:
    from pymq_server.broker.message import BrokerMessage
    from pymq_server.broker.requests import SendRequest

DEFAULT_PRIORITY = 4
#: a priority's canonical header text (0-9)
DIGITS = tuple(str(p) for p in range(10))
#: every field of a message, in the order init_message sets them (the class's ``__slots__`` are these)
FIELDS = ("key", "message_id", "destination", "seq", "headers", "body", "persistent", "priority", "timestamp",
          "expires", "deliver_at", "group_id", "producer", "size", "device", "rule", "chosen", "client_id", "user",
          "refs", "bulk", "_block", "_block_raw", "_values")

_message_class: Any = None


def bind(cls: type) -> None:
    """The class ``message_from_request`` builds (message.py's, handed over once it is defined)."""
    global _message_class
    if set(cls.__dict__.get("__slots__", ())) != set(FIELDS):
        raise TypeError(f"{cls.__name__}'s slots are not the message's fields: {sorted(FIELDS)}")
    _message_class = cls


def now_ms() -> int:
    return int(time.time() * 1000)


def init_message(self: BrokerMessage, key: int, message_id: str, destination: str, seq: int, headers: dict,
                 body: bytes, persistent: bool, priority: int, timestamp: int, expires: int,
                 deliver_at: int = 0, producer: str = "", client_id: str | None = None,
                 user: str | None = None) -> None:
    """Every field of a new message: the ones given, ``group_id`` and ``size`` derived, the rest unset."""
    self.key = key
    self.message_id = message_id
    self.destination = destination
    self.seq = seq
    self.headers = headers
    self.body = body
    self.persistent = persistent
    self.priority = priority
    self.timestamp = timestamp
    self.expires = expires
    self.deliver_at = deliver_at
    self.group_id = headers.get("JMSXGroupID")
    self.producer = producer
    self.size = len(body)
    self.device = None
    self.rule = None
    self.chosen = None
    self.client_id = client_id
    self.user = user
    self.refs = 0
    self.bulk = None
    self._block = None
    self._block_raw = None
    self._values = None


def message_from_request(request: SendRequest, *, key: int, message_id: str, seq: int, destination: str,
                         default_persistent: bool = True, producer: str = "", now: int | None = None,
                         default_priority: int = DEFAULT_PRIORITY, default_ttl: int = 0,
                         client_id: str | None = None, user: str | None = None) -> BrokerMessage:
    """The broker message for a parsed SEND (spec/stomp.md §4), with the destination's defaults.

    The message takes ``request.properties`` as its headers (a request is placed once) and writes the
    mapped fields back in canonical form, so every MESSAGE frame shows what the broker applied."""
    now = now_ms() if now is None else now
    headers = request.properties        # (each field read by name where it is first needed: no tuple built)
    persistent = request.persistent
    if persistent is None:
        persistent = default_persistent
    priority = request.priority
    if priority is None:
        priority = default_priority
    expires = request.expires
    if not expires:
        # ``expires`` wins over ``expiration`` even when it is 0; without either, the queue's TTL
        ttl = request.ttl
        expires = min(now + ttl, INT64_MAX) if ttl and expires is None else (now + default_ttl if default_ttl else 0)
    deliver_at = request.deliver_at
    if not deliver_at:
        delay = request.delay
        deliver_at = min(now + delay, INT64_MAX) if delay else 0
    if deliver_at:
        # JMSDeliveryTime, in place of the scheduling headers the request consumed (spec/stomp.md §4)
        headers["pymq-delivery-time"] = str(deliver_at)
    timestamp = request.timestamp or now
    headers["persistent"] = "true" if persistent else "false"
    headers["priority"] = DIGITS[priority]
    headers["timestamp"] = str(timestamp)
    headers["expires"] = str(expires) if expires else "0"
    message: BrokerMessage = _message_class(key, message_id, destination, seq, headers, request.body, persistent,
                                            priority, timestamp, expires, deliver_at, producer, client_id, user)
    return message
