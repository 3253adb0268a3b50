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

from pymq.errors import InvalidHeader
from pymq.protocol.scanner import encode_headers

#: transport headers of a SEND that are not part of the message
TRANSPORT_HEADERS = frozenset({"destination", "receipt", "transaction", "content-length"})
#: headers the broker owns on MESSAGE frames; a client cannot forge them
BROKER_HEADERS = frozenset({"message-id", "subscription", "ack", "redelivered", "JMSXDeliveryCount",
                            "pymq-seq", "JMSXGroupFirstForConsumer"})
DEFAULT_PRIORITY = 4


def now_ms() -> int:
    return int(time.time() * 1000)


def _int_header(headers: dict, name: str) -> int | None:
    value = headers.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidHeader(f"header {name!r} must be an integer, got {value!r}", header=name) from None


def _bool_header(value: str | None, default: bool, name: str) -> bool:
    if value is None or value == "":
        return default
    low = value.lower()
    if low == "true":
        return True
    if low == "false":
        return False
    raise InvalidHeader(f"header {name!r} must be true or false, got {value!r}", header=name)


class BrokerMessage:
    """One message held by the broker (immutable after creation, except its cached encodings)."""

    __slots__ = ("key", "message_id", "destination", "seq", "headers", "body", "persistent", "priority",
                 "timestamp", "expires", "deliver_at", "group_id", "producer", "size", "device",
                 "_block", "_block_raw", "_values", "refs", "rule", "chosen", "client_id", "user")

    def __init__(self, key: int, message_id: str, destination: str, seq: int, headers: dict,
                 body: bytes, persistent: bool, priority: int, timestamp: int, expires: int,
                 deliver_at: int = 0, producer: str = "") -> None:
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
        self.device = None              # the holding device that stores it (None: memory only)
        self.rule = None                # the storage rule that chose the device
        self.chosen = None              # the device the rule chose (even when the heap holds it)
        self.client_id = None           # the producing connection's client id and user (storage rules)
        self.user = None
        self.refs = 0                   # queue entries still pointing at it (storage frees at 0)
        self._block = None
        self._block_raw = None
        self._values = None

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
        block = encode_headers(self.frame_headers(), escaped, cr)
        if self.body:
            block += b"content-length:%d\n" % len(self.body)
        return block

    def frame_headers(self) -> dict:
        """MESSAGE headers as a dict (the in-process transport and storage use this form)."""
        headers = {"destination": self.destination, "message-id": self.message_id,
                   "pymq-seq": str(self.seq)}
        headers.update(self.headers)
        return headers

    def selector_values(self) -> dict:
        """Identifier → value for selector evaluation (JMS header names plus every property)."""
        values = self._values
        if values is None:
            h = self.headers
            values = dict(h)
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
            _apply_types(values, h.get("pymq-types"))
            self._values = values
        return values


def _apply_types(values: dict, spec: str | None) -> None:
    """Typed properties (``pymq-types: n=i,f=b``) compare as numbers/booleans in selectors."""
    if not spec:
        for name in ("JMSXGroupSeq", "JMSXDeliveryCount"):
            if name in values:
                try:
                    values[name] = int(values[name])
                except ValueError:
                    pass
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


_SKIP = TRANSPORT_HEADERS | BROKER_HEADERS
_MAPPED = frozenset({"persistent", "priority", "expires", "expiration", "AMQ_SCHEDULED_DELAY",
                     "AMQ_SCHEDULED_TIME", "timestamp"})


def message_from_send(headers: dict, body: bytes, *, key: int, message_id: str, seq: int,
                      destination: str, default_persistent: bool = True, producer: str = "",
                      now: int | None = None, default_priority: int = DEFAULT_PRIORITY,
                      default_ttl: int = 0) -> BrokerMessage:
    """Build the broker message for a SEND frame, applying the header mapping of spec/stomp.md §4."""
    now = now_ms() if now is None else now
    kept = {}
    mapped = None
    for name, value in headers.items():
        if name in _SKIP:
            continue
        if name in _MAPPED:
            if mapped is None:
                mapped = {}
            mapped[name] = value
            continue
        kept[name] = value
    persistent = default_persistent
    priority = default_priority
    expires = now + default_ttl if default_ttl else 0
    deliver_at = 0
    timestamp = now
    if mapped:
        ttl = None
        for name, value in mapped.items():
            if name == "persistent":
                persistent = _bool_header(value, default_persistent, "persistent")
            elif name == "priority":
                p = _int_header(mapped, "priority")
                if p is not None:
                    if not 0 <= p <= 9:
                        raise InvalidHeader(f"header 'priority' must be between 0 and 9, got {p}",
                                            header="priority")
                    priority = p
            elif name == "expires":
                e = _int_header(mapped, "expires")
                if e is not None and e < 0:
                    raise InvalidHeader(f"header 'expires' must not be negative, got {e}", header="expires")
                if e:
                    expires = e
            elif name == "expiration":
                ttl = _int_header(mapped, "expiration")
            elif name == "timestamp":
                timestamp = _int_header(mapped, "timestamp") or now
            else:  # AMQ_SCHEDULED_*: kept visible, and applied below
                kept[name] = value
        if ttl and "expires" not in mapped:
            expires = now + ttl
        delay = _int_header(mapped, "AMQ_SCHEDULED_DELAY")
        if delay:
            deliver_at = now + delay
        at = _int_header(mapped, "AMQ_SCHEDULED_TIME")
        if at:
            deliver_at = at
    kept["persistent"] = "true" if persistent else "false"
    kept["priority"] = str(priority)
    kept["timestamp"] = str(timestamp)
    kept["expires"] = str(expires)
    return BrokerMessage(key, message_id, destination, seq, kept, body, persistent, priority, timestamp,
                         expires, deliver_at, producer)
