"""JMS messages and their STOMP form (spec/stomp.md §4 and §7).

``TextMessage``, ``BytesMessage`` and ``MapMessage`` carry the JMS headers (message id, timestamp,
correlation id, reply-to, destination, delivery mode, redelivered, type, expiration, priority) and typed
properties.  STOMP headers are strings, so property types travel in one extra header,
``pymq-types: count=i,ratio=f,flag=b`` (strings are the default); a foreign client sees plain values and
a pymq client gets ``int``/``float``/``bool`` back.  The body type travels in ``content-type``:
``text/plain;charset=utf-8``, ``application/octet-stream``, or ``application/x-pymq-map+json``
(ActiveMQ's ``transformation: jms-map-json`` is read too).  A frame without ``content-type`` from a
foreign client is a TextMessage when its body is valid UTF-8, otherwise a BytesMessage.
"""
from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Mapping
from typing import TypeVar, Union, overload
from collections.abc import Callable

from pymq.destination import Destination, as_destination
from pymq.errors import DestinationError, InvalidHeader, MessageFormatError
from pymq.protocol.numbers import INT64_MAX, parse_wire_int

PERSISTENT = 2       # JMS DeliveryMode values
NON_PERSISTENT = 1
DEFAULT_PRIORITY = 4

TEXT_TYPE = "text/plain;charset=utf-8"
BYTES_TYPE = "application/octet-stream"
MAP_TYPE = "application/x-pymq-map+json"

#: headers that are JMS header fields or protocol machinery, never properties
_RESERVED = frozenset({
    "destination", "message-id", "subscription", "ack", "receipt", "transaction", "content-length",
    "content-type", "persistent", "priority", "expires", "expiration", "timestamp", "correlation-id",
    "reply-to", "type", "redelivered", "pymq-types", "pymq-seq", "transformation", "browser",
    "pymq-dedup-id", "pymq-jms-types",
})
_TYPE_CODES = {bool: "b", int: "i", float: "f"}

#: what a message property holds (JMS: boolean, numbers, strings)
PropertyValue = Union[bool, int, float, str]
#: what a MapMessage entry holds
MapValue = Union[bool, int, float, str, bytes, None]
#: what ``producer.send`` accepts: a Message, or a value made into one (see :func:`make_message`)
MessageBody = Union["Message", str, bytes, bytearray, memoryview, Mapping[str, MapValue]]

_D = TypeVar("_D")


def _check_property(name: str, value: object) -> None:
    if not isinstance(name, str) or not name:
        raise MessageFormatError(f"property names must be non-empty strings, got {name!r}")
    if name in _RESERVED:
        raise MessageFormatError(f"{name!r} is a header, not a property; use the message attribute")
    if any(ch in name for ch in ",=\n\r"):
        raise MessageFormatError(f"property name {name!r} must not contain ',', '=' or line breaks")
    if type(value) not in (bool, int, float, str):
        raise MessageFormatError(f"property {name!r} must be bool, int, float or str, "
                                 f"not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise MessageFormatError(f"property {name!r} must be a finite number")


class Message:
    """Base JMS message: headers and properties, no body."""

    content_type = BYTES_TYPE

    def __init__(self, *, properties: Mapping[str, PropertyValue] | None = None,
                 correlation_id: str | None = None, reply_to: Destination | str | None = None,
                 type: str | None = None) -> None:  # noqa: A002 - the JMS name
        self.message_id: str | None = None
        self.timestamp: int = 0                  # ms since the epoch, set at send
        self.correlation_id = correlation_id
        self.reply_to = as_destination(reply_to) if reply_to is not None else None
        self.destination: Destination | None = None
        self.delivery_mode = PERSISTENT
        self.redelivered = False
        self.delivery_count = 1                  # JMSXDeliveryCount
        self.type = type
        self.expiration = 0                      # absolute ms, 0 = never
        self.priority = DEFAULT_PRIORITY
        self.sequence: int | None = None          # the broker's per-destination sequence (pymq-seq)
        self.dedup_id: str | None = None          # duplicate-detection id (spec/stomp.md §9)
        self.properties: dict[str, PropertyValue] = {}
        for name, value in (properties or {}).items():
            self.set_property(name, value)
        self._acknowledge: Callable[[], None] | None = None

    # -- properties ----------------------------------------------------------------------------
    def set_property(self, name: str, value: PropertyValue) -> None:
        _check_property(name, value)
        self.properties[name] = value

    @overload
    def get_property(self, name: str) -> PropertyValue | None: ...
    @overload
    def get_property(self, name: str, default: _D) -> PropertyValue | _D: ...

    def get_property(self, name: str, default: object = None) -> object:
        return self.properties.get(name, default)

    @property
    def group_id(self) -> str | None:
        value = self.properties.get("JMSXGroupID")
        return None if value is None else str(value)

    @group_id.setter
    def group_id(self, value: str | None) -> None:
        if value is None:
            self.properties.pop("JMSXGroupID", None)
        else:
            self.set_property("JMSXGroupID", str(value))

    # -- acknowledgement -----------------------------------------------------------------------
    def acknowledge(self) -> None:
        """CLIENT_ACKNOWLEDGE: acknowledge every message the session has consumed so far."""
        if self._acknowledge is not None:
            self._acknowledge()

    # -- wire ----------------------------------------------------------------------------------
    def _body_bytes(self) -> bytes:
        return b""

    @property
    def persistent(self) -> bool:
        return self.delivery_mode == PERSISTENT

    def to_headers(self) -> dict[str, str]:
        """The SEND headers for this message (destination excluded)."""
        h: dict[str, str] = {"content-type": self.content_type,
                             "persistent": "true" if self.delivery_mode == PERSISTENT else "false"}
        if self.priority != DEFAULT_PRIORITY:
            h["priority"] = str(self.priority)
        if self.expiration:
            h["expires"] = str(self.expiration)
        if self.timestamp:
            h["timestamp"] = str(self.timestamp)
        if self.correlation_id is not None:
            h["correlation-id"] = self.correlation_id
        if self.reply_to is not None:
            h["reply-to"] = self.reply_to.stomp_name
        if self.type is not None:
            h["type"] = self.type
        if self.dedup_id is not None:
            h["pymq-dedup-id"] = self.dedup_id
        types = []
        for name, value in self.properties.items():
            code = _TYPE_CODES.get(type(value))
            if code is None:
                h[name] = str(value)
            else:
                h[name] = ("true" if value else "false") if code == "b" else repr(value) if code == "f" \
                    else str(value)
                types.append(f"{name}={code}")
        if self.properties:
            # even empty: a message with pymq-types is typed, so its string properties stay strings in the
            # broker's selectors; a plain STOMP header without it compares as a number when it reads as one
            # (spec/stomp.md §7, spec/selector.md §3)
            h["pymq-types"] = ",".join(types)
        return h

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} id={self.message_id} dest={self.destination} "
                f"props={self.properties}>")


class TextMessage(Message):
    content_type = TEXT_TYPE

    def __init__(self, text: str = "", *, properties: Mapping[str, PropertyValue] | None = None,
                 correlation_id: str | None = None, reply_to: Destination | str | None = None,
                 type: str | None = None) -> None:  # noqa: A002
        super().__init__(properties=properties, correlation_id=correlation_id, reply_to=reply_to, type=type)
        if not isinstance(text, str):
            raise MessageFormatError(f"TextMessage text must be str, not {type(text).__name__}")
        self.text = text

    @property
    def body(self) -> str:
        return self.text

    def _body_bytes(self) -> bytes:
        return self.text.encode("utf-8")


class BytesMessage(Message):
    content_type = BYTES_TYPE

    def __init__(self, data: bytes | bytearray | memoryview = b"", *,
                 properties: Mapping[str, PropertyValue] | None = None, correlation_id: str | None = None,
                 reply_to: Destination | str | None = None, type: str | None = None) -> None:  # noqa: A002
        super().__init__(properties=properties, correlation_id=correlation_id, reply_to=reply_to, type=type)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MessageFormatError(f"BytesMessage data must be bytes, not {type(data).__name__}")
        self.data = bytes(data)

    @property
    def body(self) -> bytes:
        return self.data

    def _body_bytes(self) -> bytes:
        return self.data


class MapMessage(Message):
    content_type = MAP_TYPE

    def __init__(self, map: Mapping[str, MapValue] | None = None, *,  # noqa: A002 - JMS name
                 properties: Mapping[str, PropertyValue] | None = None, correlation_id: str | None = None,
                 reply_to: Destination | str | None = None, type: str | None = None) -> None:  # noqa: A002
        super().__init__(properties=properties, correlation_id=correlation_id, reply_to=reply_to, type=type)
        self.map: dict[str, MapValue] = {}
        for key, value in (map or {}).items():
            self[key] = value

    def __setitem__(self, key: str, value: MapValue) -> None:
        if not isinstance(key, str):
            raise MessageFormatError(f"MapMessage keys must be str, not {type(key).__name__}")
        if value is not None and type(value) not in (bool, int, float, str, bytes):
            raise MessageFormatError(f"MapMessage value for {key!r} must be bool, int, float, str, bytes "
                                     f"or None, not {type(value).__name__}")
        self.map[key] = value

    def __getitem__(self, key: str) -> MapValue:
        return self.map[key]

    @property
    def body(self) -> dict[str, MapValue]:
        return self.map

    def _body_bytes(self) -> bytes:
        return json.dumps({k: ({"$bytes": base64.b64encode(v).decode()} if isinstance(v, bytes) else v)
                           for k, v in self.map.items()}, separators=(",", ":")).encode("utf-8")


def make_message(body: MessageBody) -> Message:
    """str → TextMessage, bytes → BytesMessage, dict (a mapping) → MapMessage, a Message stays itself."""
    if isinstance(body, Message):
        return body
    if isinstance(body, str):
        return TextMessage(body)
    if isinstance(body, (bytes, bytearray, memoryview)):
        return BytesMessage(bytes(body))
    if isinstance(body, Mapping):
        return MapMessage(body)
    raise MessageFormatError(f"cannot make a message from {type(body).__name__}; "
                             f"use str, bytes, dict or a Message")


def _typed(name: str, value: str, code: str) -> PropertyValue:
    """A property's value as the type ``pymq-types`` names (its text when it does not parse)."""
    try:
        if code == "i":
            # JMS properties are 64-bit at most: the one bounded parser, not int()
            return parse_wire_int(name, value, minimum=-INT64_MAX - 1, maximum=INT64_MAX)
        if code == "f":
            return float(value)
        if code == "b":
            return value == "true"
    except (ValueError, InvalidHeader):
        pass
    return value


def from_frame(headers: Mapping[str, str], body: bytes) -> Message:
    """The Message a MESSAGE frame carries."""
    ctype = headers.get("content-type", "")
    base = ctype.split(";", 1)[0].strip().lower()
    if base == MAP_TYPE or headers.get("transformation") == "jms-map-json":
        try:
            raw = json.loads(body.decode("utf-8")) if body else {}
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MessageFormatError(f"map message body is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise MessageFormatError(f"map message body must be a JSON object, not {type(raw).__name__}")
        mapped = MapMessage()
        for k, v in raw.items():
            if isinstance(v, dict) and "$bytes" in v:
                v = base64.b64decode(v["$bytes"])
            mapped.map[k] = v
        msg: Message = mapped
    elif base.startswith("text/") or base in ("application/json", "application/xml"):
        charset = "utf-8"
        for part in ctype.split(";")[1:]:
            k, _, v = part.strip().partition("=")
            if k.lower() == "charset" and v:
                charset = v.strip('"')
        msg = TextMessage(body.decode(charset, errors="replace"))
    elif base:
        msg = BytesMessage(body)
    else:
        try:
            msg = TextMessage(body.decode("utf-8"))
        except UnicodeDecodeError:
            msg = BytesMessage(body)
    h = headers
    msg.message_id = h.get("message-id")
    dest = h.get("destination")
    if dest:
        try:
            msg.destination = as_destination(dest)
        except DestinationError:
            msg.destination = None
    msg.delivery_mode = NON_PERSISTENT if h.get("persistent", "true").lower() == "false" else PERSISTENT
    msg.priority = _int("priority", h.get("priority"), DEFAULT_PRIORITY)
    msg.timestamp = _int("timestamp", h.get("timestamp"), 0)
    msg.expiration = _int("expires", h.get("expires"), 0)
    msg.correlation_id = h.get("correlation-id")
    rt = h.get("reply-to")
    if rt:
        try:
            msg.reply_to = as_destination(rt)
        except DestinationError:
            msg.reply_to = None
    msg.type = h.get("type")
    msg.dedup_id = h.get("pymq-dedup-id")
    msg.redelivered = h.get("redelivered", "false").lower() == "true"
    seq = h.get("pymq-seq")
    if seq is None:
        msg.sequence = None
    elif len(seq) <= 18 and seq.isdigit() and seq.isascii():   # the common case, as in _int
        msg.sequence = int(seq)
    else:
        number = _int("pymq-seq", seq, -1)
        msg.sequence = None if number < 0 else number
    types: dict[str, str] = {}
    spec = h.get("pymq-types")
    if spec:
        for item in spec.split(","):
            name, _, code = item.rpartition("=")
            types[name] = code
    props = msg.properties
    for name, value in h.items():
        if name in _RESERVED:
            continue
        kind = types.get(name)
        props[name] = _typed(name, value, kind) if kind else value
    count = props.get("JMSXDeliveryCount")
    msg.delivery_count = _int("JMSXDeliveryCount", count, 1) if count is not None else 1
    if "JMSXDeliveryCount" in props:
        props["JMSXDeliveryCount"] = msg.delivery_count
    group_seq = props.get("JMSXGroupSeq")
    if isinstance(group_seq, str):
        props["JMSXGroupSeq"] = _int("JMSXGroupSeq", group_seq, 0)
    return msg


def _int(name: str, value: PropertyValue | None, default: int) -> int:
    """A JMS header's number through the one bounded wire parser; ``default`` when absent or bad (a
    message is still delivered when a foreign client wrote nonsense there)."""
    if type(value) is str:
        # the common case, once per header of every message: at most 18 ASCII digits is always
        # within parse_wire_int's bounds, so int() gives its answer without the call
        if len(value) <= 18 and value.isdigit() and value.isascii():
            return int(value)
        try:
            return parse_wire_int(name, value)
        except InvalidHeader:
            return default
    if value is None or isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    return default


def now_ms() -> int:
    return int(time.time() * 1000)


#: headers that are never message properties (JMS header fields and protocol machinery); readers that
#: turn MESSAGE frames into other forms (the Spark connector's Arrow decoder, the broker's Arrow
#: segments) use the same set as ``from_frame``
RESERVED_HEADERS = _RESERVED


def content_body_type(content_type: str | None, transformation: str | None = None) -> str | None:
    """The kind of body a ``content-type`` announces, as ``from_frame`` reads it: ``"map"``, ``"text"``
    or ``"bytes"``; None when there is no content type (then a valid UTF-8 body is text)."""
    base = (content_type or "").split(";", 1)[0].strip().lower()
    if base == MAP_TYPE or transformation == "jms-map-json":
        return "map"
    if base.startswith("text/") or base in ("application/json", "application/xml"):
        return "text"
    return "bytes" if base else None
