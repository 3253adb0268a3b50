"""The broker's view of a message, and the mapping from SEND headers to JMS concepts.

A :class:`BrokerMessage` is created once per SEND and shared by every queue entry that refers to it (a
topic message with ten subscribers is one object).  Its wire form is cached: the header block every
MESSAGE frame repeats is encoded once per escaping style, so fan-out costs a join, not an encode.

Header mapping (spec/stomp.md §4): ``persistent``, ``priority``, ``expires`` (absolute ms) and
``expiration`` (relative ms, RabbitMQ; ``expires`` wins when both are present), ``AMQ_SCHEDULED_DELAY``
and ``AMQ_SCHEDULED_TIME``; ``correlation-id``, ``reply-to``, ``type`` and everything else travel as
they are and are properties to selectors.  Headers only the broker may set are dropped from SENDs.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pymq.protocol.numbers import INT64_MAX
from pymq.protocol.scanner import encode_headers
from pymq.selector import untyped
from pymq_server.broker import vhosts

if TYPE_CHECKING:
    from pymq_server.broker.requests import SendRequest

#: transport headers of a SEND that are not part of the message
TRANSPORT_HEADERS = frozenset({"destination", "receipt", "transaction", "content-length"})
#: headers the broker owns on MESSAGE frames; a client cannot forge them
BROKER_HEADERS = frozenset({"message-id", "subscription", "ack", "redelivered", "JMSXDeliveryCount",
                            "pymq-seq", "JMSXGroupFirstForConsumer", "pymq-delivery-time"})
DEFAULT_PRIORITY = 4
_DIGITS = tuple(str(p) for p in range(10))


def now_ms() -> int:
    return int(time.time() * 1000)


class BrokerMessage:
    """One message held by the broker (immutable after creation, except its cached encodings)."""

    __slots__ = ("key", "message_id", "destination", "seq", "headers", "body", "persistent", "priority",
                 "timestamp", "expires", "deliver_at", "group_id", "producer", "size", "device",
                 "_block", "_block_raw", "_values", "refs", "rule", "chosen", "client_id", "user", "bulk")

    def __init__(self, key: int, message_id: str, destination: str, seq: int, headers: dict,
                 body: bytes, persistent: bool, priority: int, timestamp: int, expires: int,
                 deliver_at: int = 0, producer: str = "", client_id: str | None = None,
                 user: str | None = None) -> None:
        self.key = key
        self.message_id = message_id
        self.destination = destination
        self.seq = seq
        self.headers = headers          # message headers/properties as they appear on MESSAGE frames
        self.body = body
        self.persistent = persistent
        self.priority = priority
        self.timestamp = timestamp
        self.expires = expires          # absolute ms, 0 = never
        self.deliver_at = deliver_at    # absolute ms, 0 = now
        self.group_id = headers.get("JMSXGroupID")
        self.producer = producer        # connection id of the sender (no-local)
        self.size = len(body)
        self.device: Any = None         # the holding device that stores it (None: not placed yet)
        self.rule: str | None = None    # the storage rule that chose the device
        self.chosen: str | None = None  # the device the rule chose (even when the heap holds it)
        self.client_id = client_id      # the producing connection's client id and user (storage rules)
        self.user = user
        self.refs = 0                   # queue entries still pointing at it (storage frees at 0)
        self.bulk: Any = None           # the queue's bulk block (blocks.py) a row of a bulk SEND came from
        self._block: bytes | None = None
        self._block_raw: dict[str, bytes] | None = None
        self._values: dict[str, Any] | None = None

    def expired(self, now: int) -> bool:
        return 0 < self.expires <= now

    def header_block(self, version: str) -> bytes:
        """The encoded header lines every MESSAGE frame of this message repeats, for a connection of
        ``version`` (cached: 1.2 escapes CR, 1.1 has no CR escape, 1.0 escapes nothing)."""
        if version == "1.2":
            if self._block is None:
                self._block = self._encode_block(True, True)
            return self._block
        cache = self._block_raw
        if cache is None:
            cache = self._block_raw = {}
        block = cache.get(version)
        if block is None:
            block = cache[version] = self._encode_block(version != "1.0", False)
        return block

    def _encode_block(self, escaped: bool, cr: bool) -> bytes:
        block = encode_headers(self.wire_headers(), escaped, cr)
        if self.body:
            block += b"content-length:%d\n" % len(self.body)
        return block

    def frame_headers(self) -> dict:
        """MESSAGE headers as a dict (the in-process transport and storage use this form)."""
        headers = {"destination": self.destination, "message-id": self.message_id,
                   "pymq-seq": str(self.seq)}
        headers.update(self.headers)
        return headers

    def wire_headers(self) -> dict:
        """:meth:`frame_headers` as a MESSAGE shows them: a virtual host's destination as its clients name it
        (without the vhost, vhosts.py; every reader of a message is in its vhost)."""
        headers = self.frame_headers()
        if vhosts.PREFIX in self.destination:
            headers["destination"] = vhosts.outside(self.destination)
        return headers

    def selector_values(self) -> dict:
        """Identifier → value for selector evaluation (JMS header names plus every property)."""
        values = self._values
        if values is None:
            h = self.headers
            values = dict(h)
            _apply_types(values, h.get("pymq-types"))
            values["JMSPriority"] = self.priority
            values["JMSTimestamp"] = self.timestamp
            values["JMSDeliveryMode"] = "PERSISTENT" if self.persistent else "NON_PERSISTENT"
            values["JMSMessageID"] = self.message_id
            values["JMSExpiration"] = self.expires
            if "correlation-id" in h:
                values["JMSCorrelationID"] = h["correlation-id"]
            if "type" in h:
                values["JMSType"] = h["type"]
            if "reply-to" in h:
                values["JMSReplyTo"] = h["reply-to"]
            self._values = values
        return values


def _apply_types(values: dict, spec: str | None) -> None:
    """Property types for selectors (spec/selector.md §3). A message with ``pymq-types`` (a pymq SDK's,
    even empty) is typed: the properties it names are numbers/booleans, the others strings, exactly. A
    message without it (a plain STOMP client's) has no declared types: a header whose text reads as a
    number compares as that number in numeric comparisons (``n:9`` and ``n > 5``, as ActiveMQ does for
    STOMP) and as its text against strings (``pymq.selector.untyped``)."""
    if spec is None:
        for name, raw in values.items():
            if type(raw) is str and raw and raw[0] in _NUMBER_START:
                values[name] = untyped(raw)
        for name in ("JMSXGroupSeq", "JMSXDeliveryCount"):
            if name in values:
                try:
                    values[name] = int(values[name])
                except ValueError:
                    pass
        return
    if not spec:
        return
    for item in spec.split(","):
        name, _, code = item.rpartition("=")
        if name not in values:
            continue
        raw = values[name]
        try:
            if code == "i":
                values[name] = int(raw)
            elif code == "f":
                values[name] = float(raw)
            elif code == "b":
                values[name] = raw == "true"
        except ValueError:
            pass


#: the first characters of a text that may read as a number (the rest is pymq.selector's to judge)
_NUMBER_START = frozenset("0123456789+-.")


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
    headers["priority"] = _DIGITS[priority]
    headers["timestamp"] = str(timestamp)
    headers["expires"] = str(expires) if expires else "0"
    return BrokerMessage(key, message_id, destination, seq, headers, request.body, persistent, priority,
                         timestamp, expires, deliver_at, producer, client_id, user)
