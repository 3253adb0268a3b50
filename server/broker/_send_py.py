"""A SEND frame's headers into a :class:`SendRequest`: the reference semantics of ``parse_send``.

The compiled twin (``_ext/send.pyx``, built as ``_send_c``) gives the same request, or raises the same
exception naming the same header, for every input; ``requests.py`` picks one (``PYMQ_NO_EXTENSIONS=1`` takes
this one). Both run one look-up per header: a header is dropped (transport and broker-owned names), mapped to
a field (``persistent``, ``priority``, ``expires``, ``expiration``, ``timestamp``: parsed, not kept), or a
property; a property that is also a *special* header (scheduling, duplicates, cluster forwarding) sends the
request down the rarer path, which consumes the scheduling headers. Numbers go through the one bounded
parser's rule (:func:`pymq.protocol.numbers.parse_wire_int`); a boolean is ``true`` or ``false`` in any case.

This module is a leaf but for forwarded.py (a leaf too: a peer's forward has its cluster headers taken apart
here, ``forwarded.split``); the compiled twin imports :class:`SendRequest` and the spellings from it, so the
SEND spellings of the alias table live here and ``requests.ALIASES`` lists them.
"""
from __future__ import annotations

import functools
from typing import Final, NamedTuple
from collections.abc import Mapping

from pymq_server.broker import forwarded
from pymq_server.broker.message import BROKER_HEADERS, TRANSPORT_HEADERS

from pymq.errors import InvalidHeader
from pymq.protocol.numbers import INT64_MAX, parse_wire_int

#: SEND's concepts of the alias table (requests.ALIASES, spec/stomp.md §4), in the order they are tried.
#: Consumed when the message is made: the delivered message does not carry them (a forward would wait again).
DELAY: Final = ("AMQ_SCHEDULED_DELAY", "pymq-delay")
DELIVER_AT: Final = ("AMQ_SCHEDULED_TIME",)
DEDUP_ID: Final = ("pymq-dedup-id", "_AMQ_DUPL_ID")

#: SEND headers mapped to message fields (the broker writes them back in canonical form)
MAPPED: Final = frozenset({"persistent", "priority", "expires", "expiration", "timestamp"})
#: SEND headers that are not the message's (the request's own fields, or the broker's to set)
DROPPED: Final = TRANSPORT_HEADERS | BROKER_HEADERS
#: the SEND properties that also mean something to the broker (delays, duplicates, cluster forwarding)
SPECIAL: Final = frozenset({"pymq-forwarded", "pymq-subscription", *DELAY, *DELIVER_AT, *DEDUP_ID})
SCHEDULING: Final = frozenset({*DELAY, *DELIVER_AT})
#: a boolean header's two exact spellings (every client sends one of them: one look-up)
BOOLS: Final = {"true": True, "false": False}


class SendRequest(NamedTuple):
    """One SEND. ``properties`` are the message's own headers as MESSAGE frames repeat them (the mapped
    JMS fields, transport headers and broker-owned headers taken out); the mapped fields are parsed."""

    destination: str
    properties: dict[str, str]
    body: bytes
    transaction: str | None = None
    receipt: str | None = None
    persistent: bool | None = None       # None: the broker's default
    priority: int | None = None          # None: the queue's default
    expires: int | None = None           # absolute ms; 0 = never
    ttl: int | None = None               # ``expiration``: ms relative to arrival (``expires`` wins)
    delay: int | None = None             # AMQ_SCHEDULED_DELAY, pymq-delay
    deliver_at: int | None = None        # AMQ_SCHEDULED_TIME (wins over the delay)
    timestamp: int | None = None
    dedup_id: str | None = None
    forwarded: str | None = None         # pymq-forwarded: the node this came from (cluster inbound)
    subscription: str | None = None      # pymq-subscription: a handed-over durable subscription's key
    message_id: str | None = None        # the id a forwarded message keeps (cluster inbound: forwarded.py)

    @property
    def group_id(self) -> str | None:
        return self.properties.get("JMSXGroupID")

    @property
    def reply_to(self) -> str | None:
        return self.properties.get("reply-to")


#: builds a SendRequest from a tuple of all its fields in C: a SEND makes one per message
new_send = functools.partial(tuple.__new__, SendRequest)


def first_value(headers: Mapping[str, str], spellings: tuple[str, ...]) -> str | None:
    """The value of the first of ``spellings`` present and non-empty in ``headers``."""
    for name in spellings:
        value = headers.get(name)
        if value:
            return value
    return None


def parse_bool(name: str, value: str) -> bool | None:
    """A boolean header's value: ``true`` or ``false`` in any case; empty is absent (None)."""
    if not value:
        return None
    low = value.lower()
    if low == "true" or low == "false":
        return low == "true"
    raise InvalidHeader(f"header {name!r} must be true or false, got {value[:32]!r}", header=name)


def parse_number(name: str, value: str, maximum: int = INT64_MAX) -> int | None:
    """A number header's value by the one bounded rule; empty is absent (None)."""
    return None if value == "" else parse_wire_int(name, value, maximum=maximum)


def _first_int(headers: Mapping[str, str], spellings: tuple[str, ...]) -> int | None:
    """The number the first of ``spellings`` present carries (every spelling is checked)."""
    found = None
    for name in spellings:
        text = headers.get(name)
        value = None if text is None else parse_number(name, text)
        if found is None:
            found = value
    return found


def parse_send(headers: Mapping[str, str], body: bytes) -> SendRequest:
    """A SEND frame's headers and body as a :class:`SendRequest` (spec/stomp.md §4)."""
    properties: dict[str, str] = {}
    persistent = priority = expires = ttl = timestamp = None
    for name, value in headers.items():
        if name in DROPPED:
            continue
        if name not in MAPPED:
            properties[name] = value
        elif name == "persistent":
            persistent = BOOLS.get(value)       # the spellings every client sends, at one look-up
            if persistent is None:
                persistent = parse_bool(name, value)
        elif name == "priority":
            priority = parse_number(name, value, 9)
        elif name == "expires":
            expires = parse_number(name, value)
        elif name == "expiration":
            ttl = parse_number(name, value)
        else:
            timestamp = parse_number(name, value)
    if SPECIAL.isdisjoint(properties):         # the common case: none of the rarer headers
        return new_send((headers["destination"], properties, body, headers.get("transaction"),
                         headers.get("receipt"), persistent, priority, expires, ttl, None, None, timestamp,
                         None, None, None, None))
    return rarer_send(headers, properties, body, persistent, priority, expires, ttl, timestamp)


def rarer_send(headers: Mapping[str, str], properties: dict[str, str], body: bytes, persistent: bool | None,
               priority: int | None, expires: int | None, ttl: int | None, timestamp: int | None) -> SendRequest:
    """The request of a SEND whose properties hold a special header: scheduling (consumed here), duplicate
    id, cluster forwarding. Both twins of parse_send end here, so this path has one definition."""
    delay = deliver_at = None
    if not SCHEDULING.isdisjoint(properties):
        delay = _first_int(properties, DELAY)
        deliver_at = _first_int(properties, DELIVER_AT)
        for name in SCHEDULING:
            properties.pop(name, None)          # consumed here: the message does not carry them on
    dedup_id = first_value(properties, DEDUP_ID)
    if forwarded.FORWARDED in properties:       # a peer's forwarded message: the cluster's headers out (forwarded.py)
        node, subscription, message_id, dedup_id = forwarded.split(properties, dedup_id)
    else:
        node, subscription, message_id = None, properties.get(forwarded.SUBSCRIPTION), None
    return SendRequest(headers["destination"], properties, body, headers.get("transaction"),
                       headers.get("receipt"), persistent, priority, expires, ttl, delay, deliver_at,
                       timestamp, dedup_id, node, subscription, message_id)
