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

from typing import TYPE_CHECKING, Any

from pymq._accel import NO_EXTENSIONS, note_missing
from pymq.protocol.scanner import encode_headers
from pymq.selector import untyped
from pymq_server.broker import _message_py, vhosts
from pymq_server.broker._message_py import DEFAULT_PRIORITY as DEFAULT_PRIORITY
from pymq_server.broker._message_py import now_ms as now_ms

#: transport headers of a SEND that are not part of the message
TRANSPORT_HEADERS = frozenset({"destination", "receipt", "transaction", "content-length"})
#: headers the broker owns on MESSAGE frames; a client cannot forge them
BROKER_HEADERS = frozenset({"message-id", "subscription", "ack", "redelivered", "JMSXDeliveryCount",
                            "pymq-seq", "JMSXGroupFirstForConsumer", "pymq-delivery-time"})


class BrokerMessage:
    """One message held by the broker (immutable after creation, except its cached encodings)."""

    __slots__ = _message_py.FIELDS

    # Filled by ``init_message`` (``__init__``) or ``message_from_request``: _message_py.py defines both,
    # _ext/message.pyx compiles them; the pair in use is installed below.
    key: int
    message_id: str
    destination: str
    seq: int
    headers: dict               # message headers/properties as they appear on MESSAGE frames
    body: bytes
    persistent: bool
    priority: int
    timestamp: int
    expires: int                # absolute ms, 0 = never
    deliver_at: int             # absolute ms, 0 = now
    group_id: str | None
    producer: str               # connection id of the sender (no-local)
    size: int
    device: Any                 # the holding device that stores it (None: not placed yet)
    rule: str | None            # the storage rule that chose the device
    chosen: str | None          # the device the rule chose (even when the heap holds it)
    client_id: str | None       # the producing connection's client id and user (storage rules)
    user: str | None
    refs: int                   # queue entries still pointing at it (storage frees at 0)
    bulk: Any                   # the queue's bulk block (blocks.py) a row of a bulk SEND came from
    _block: bytes | None
    _block_raw: dict[str, bytes] | None
    _values: dict[str, Any] | None

    if TYPE_CHECKING:    # (its signature, for the type checker: the function is _message_py.init_message's)
        def __init__(self, key: int, message_id: str, destination: str, seq: int, headers: dict, body: bytes,
                     persistent: bool, priority: int, timestamp: int, expires: int, deliver_at: int = 0,
                     producer: str = "", client_id: str | None = None, user: str | None = None) -> None: ...
    else:
        __init__ = _message_py.init_message

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


# init_message and message_from_request: compiled (_ext/message.pyx) unless unavailable or disabled;
# _message_py.py is the twin and the semantics
try:
    if NO_EXTENSIONS:
        raise ImportError("PYMQ_NO_EXTENSIONS=1")
    from pymq_server.broker import _message_c
except ImportError:
    _message_c = None  # type: ignore[assignment]
    note_missing("pymq_server.broker._message_c")
#: the twins by id (tests/broker/test_message_twins.py); the installed one is the compiled one if built
MESSAGE_IMPLEMENTATIONS: dict[str, Any] = {"py": _message_py, "c": _message_c}
_message_py.bind(BrokerMessage)
_built = _message_py if _message_c is None else _message_c
if _message_c is not None:
    _message_c.bind(BrokerMessage)
    BrokerMessage.__init__ = _message_c.init_message  # type: ignore[method-assign]
#: the broker message for a parsed SEND (spec/stomp.md §4; _message_py.message_from_request says how)
message_from_request = _built.message_from_request
