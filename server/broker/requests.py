"""What a client asks of the broker, parsed once from STOMP headers into frozen requests.

The session turns every SEND, SUBSCRIBE (to consume or to browse a range), UNSUBSCRIBE, ACK and NACK
into one of the requests below as the frame arrives; nothing under the session reads a header mapping
again. Two rules hold for every call site because they live only here:

* **one alias table** (:data:`ALIASES`): each concept lists every spelling other brokers use for it
  (spec/stomp.md §4), tried in the table's order; a frame that carries two spellings gets the first;
* **one integer parser** (:mod:`pymq.protocol.numbers`): every number — priority, times, delays,
  prefetch, sequence numbers, limits — is ASCII digits with a bound, or an ``invalid-header`` ERROR that
  names the header.

Requests are ``NamedTuple`` s: immutable and typed like frozen dataclasses, and built in a fifth of the
time (a SEND builds one per message on the hot path).
"""
from __future__ import annotations

import functools
from types import ModuleType
from typing import Final, NamedTuple
from collections.abc import Mapping

from pymq_server.broker import _send_py
from pymq_server.broker._send_py import DEDUP_ID, DELAY, DELIVER_AT, first_value
from pymq_server.broker._send_py import SendRequest as SendRequest      # (re-exported: SEND's request)
from pymq_server.broker.consumer import ACK_MODES, AUTO
from pymq_server.broker.segments import COLUMNS_HEADER, parse_columns

from pymq._accel import NO_EXTENSIONS, note_missing
from pymq.errors import InvalidHeader, MissingHeader
from pymq.protocol.numbers import INT32_MAX, INT64_MAX, parse_wire_int

# parse_send: compiled (_ext/send.pyx) unless unavailable or disabled; _send_py.py is its twin and the semantics
try:
    if NO_EXTENSIONS:
        raise ImportError("PYMQ_NO_EXTENSIONS=1")
    from pymq_server.broker import _send_c
except ImportError:
    _send_c = None  # type: ignore[assignment]
    note_missing("pymq_server.broker._send_c")
#: a SEND frame's headers and body as a SendRequest (spec/stomp.md §4; _send_py.parse_send says how)
parse_send = _send_py.parse_send if _send_c is None else _send_c.parse_send

#: both implementations of ``parse_send``, for tests and benchmarks ("c" is None when not built or disabled)
SEND_IMPLEMENTATIONS: dict[str, ModuleType | None] = {"py": _send_py, "c": _send_c}

#: concept -> the header names that carry it, in the order they are tried (spec/stomp.md §4).
ALIASES: Final[Mapping[str, tuple[str, ...]]] = {
    "durable-name": ("durable-subscription-name", "durable-subscriber-name", "activemq.subscriptionName"),
    "prefetch": ("prefetch-count", "activemq.prefetchSize", "pymq-prefetch"),
    "no-local": ("no-local", "activemq.noLocal"),
    "dedup-id": DEDUP_ID,
    # ActiveMQ's consumer option; Artemis names the queue attribute ``exclusive``
    "exclusive": ("activemq.exclusive", "exclusive"),
    # SEND's (_send_py.py): consumed when the message is made
    "delay": DELAY,
    "deliver-at": DELIVER_AT,
}
#: RabbitMQ names a durable subscription with ``x-queue-name``, but only together with ``durable:true``.
RABBITMQ_DURABLE_NAME: Final = "x-queue-name"
_SOURCES: Final = (None, "log", "queue")


def first_alias(headers: Mapping[str, str], concept: str) -> str | None:
    """The value of the first spelling of ``concept`` present and non-empty in ``headers``."""
    return first_value(headers, ALIASES[concept])


def durable_name(headers: Mapping[str, str]) -> str | None:
    """The durable subscription a frame names, in any spelling (the same on every frame)."""
    name = first_alias(headers, "durable-name")
    if name is None and _flag(headers, "durable"):
        name = headers.get(RABBITMQ_DURABLE_NAME) or None
    return name


def _flag(headers: Mapping[str, str], name: str) -> bool:
    value = headers.get(name)
    return value is not None and value.lower() == "true"


def _int(headers: Mapping[str, str], name: str, maximum: int = INT64_MAX) -> int | None:
    value = headers.get(name)
    if value is None or value == "":
        return None
    return parse_wire_int(name, value, maximum=maximum)


# -- SEND (SendRequest and parse_send: _send_py.py and its compiled twin, picked above) ---------------------

#: the header that asks a range read for one Arrow frame, or marks a SEND as a bulk one (spec/spark.md §6, §7)
FORMAT_HEADER: Final = "pymq-format"


class BulkSendRequest(NamedTuple):
    """A bulk SEND (spec/spark.md §7): rows as an Arrow IPC stream, placed as a unit."""

    destination: str
    body: bytes
    receipt: str | None = None


def is_bulk(headers: Mapping[str, str]) -> bool:
    """A SEND carrying ``pymq-format: arrow`` (any other value of the header is refused); a range read
    asking for Arrow."""
    value = headers.get(FORMAT_HEADER)
    if value is None:
        return False
    if value != "arrow":
        raise InvalidHeader(f"header {FORMAT_HEADER!r} must be 'arrow', got {value[:32]!r}", header=FORMAT_HEADER)
    return True


def parse_bulk_send(headers: Mapping[str, str], body: bytes) -> BulkSendRequest:
    if headers.get("transaction") is not None:
        raise InvalidHeader("a bulk SEND (pymq-format: arrow) is its own unit and cannot be part of a transaction "
                            "(spec/spark.md §7)", header="transaction")
    return BulkSendRequest(headers["destination"], body, headers.get("receipt"))


# -- SUBSCRIBE: ranges (browse) and consumers -----------------------------------------------------------

class RangeRequest(NamedTuple):
    """A browse: the waiting messages of a queue, or a range of sequence numbers (spec/stomp.md §9)."""

    destination: str
    id: str
    selector: str | None = None
    source: str | None = None            # "log" | "queue" | None (the log when there is one)
    durable_name: str | None = None
    shared: bool = False
    from_seq: int | None = None
    to_seq: int | None = None
    max_messages: int | None = None
    max_bytes: int | None = None
    from_timestamp: int | None = None
    arrow: bool = False                  # pymq-format: arrow: the answer as one Arrow frame (spec/spark.md §6)
    columns: tuple[str, ...] | None = None   # pymq-columns: the Arrow answer's columns (None: all of them)

    @property
    def ranged(self) -> bool:
        """Follows sequence numbers (else: the whole queue in delivery order)."""
        return (self.from_seq is not None or self.to_seq is not None or self.max_messages is not None
                or self.max_bytes is not None or self.from_timestamp is not None)


class SubscribeRequest(NamedTuple):
    destination: str
    id: str
    ack: str = AUTO
    prefetch: int | None = None          # None: the broker's default for the ack mode
    selector: str | None = None
    no_local: bool = False
    durable_name: str | None = None
    shared: bool = False                 # with durable_name: a JMS 2.0 shared durable subscription
    shared_name: str | None = None       # shared-subscription-name: shared, not durable
    browse: RangeRequest | None = None   # browser:true
    exclusive: bool = False              # activemq.exclusive / exclusive: the queue's only receiver


def _columns(headers: Mapping[str, str]) -> tuple[str, ...] | None:
    text = headers.get(COLUMNS_HEADER)
    return None if text is None else parse_columns(text)


def parse_subscribe(headers: Mapping[str, str]) -> SubscribeRequest:
    destination = headers["destination"]
    sub_id = headers.get("id", destination)     # 1.0 allows no id: the destination identifies it
    selector = headers.get("selector")
    if selector is not None and not selector.strip():
        selector = None
    name = durable_name(headers)
    shared = _flag(headers, "shared")
    if _flag(headers, "browser"):
        source = headers.get("pymq-source")
        if source not in _SOURCES:
            raise InvalidHeader(f"header 'pymq-source' must be log or queue, got {source[:32]!r}",
                                header="pymq-source")
        return SubscribeRequest(destination, sub_id, selector=selector, durable_name=name, shared=shared,
                                browse=RangeRequest(destination, sub_id, selector, source, name, shared,
                                                    _int(headers, "pymq-from-seq"), _int(headers, "pymq-to-seq"),
                                                    _int(headers, "pymq-max-messages"),
                                                    _int(headers, "pymq-max-bytes"),
                                                    _int(headers, "pymq-from-timestamp"), is_bulk(headers),
                                                    _columns(headers)))
    ack = headers.get("ack", AUTO)
    if ack not in ACK_MODES:
        raise InvalidHeader(f"ack mode {ack[:32]!r} is not one of auto, client, client-individual",
                            header="ack")
    ack = ACK_MODES[ACK_MODES.index(ack)]       # the module's constants, so `is` compares work
    prefetch = None
    for spelling in ALIASES["prefetch"]:
        if spelling in headers:
            prefetch = parse_wire_int(spelling, headers[spelling], maximum=INT32_MAX)
            break
    no_local = any(_flag(headers, spelling) for spelling in ALIASES["no-local"])
    exclusive = any(_flag(headers, spelling) for spelling in ALIASES["exclusive"])
    return SubscribeRequest(destination, sub_id, ack, prefetch, selector, no_local, name, shared,
                            headers.get("shared-subscription-name") or None, None, exclusive)


# -- UNSUBSCRIBE ------------------------------------------------------------------------------------------

class UnsubscribeRequest(NamedTuple):
    id: str                             # the subscription id (1.0: or the destination)
    remove_durable: str | None = None    # pymq-durable-name: delete this durable subscription (no consumer)
    shared: bool = False
    drop_durable: bool = False           # also delete the durable subscription the consumer reads
    delete_temporary: str | None = None  # pymq-delete-temporary: delete this connection's temporary destination


def parse_unsubscribe(headers: Mapping[str, str]) -> UnsubscribeRequest:
    # the connection's state table made sure one of the two is there (spec/stomp.md §3)
    return UnsubscribeRequest(headers.get("id") or headers.get("destination") or "", headers.get("pymq-durable-name"),
                              _flag(headers, "shared"),
                              durable_name(headers) is not None or _flag(headers, "pymq-unsubscribe-durable"),
                              headers.get("pymq-delete-temporary"))


# -- ACK / NACK -----------------------------------------------------------------------------------------

class AckRequest(NamedTuple):
    """An ACK or NACK of one delivery (cumulative in ``client`` mode)."""

    token: str                           # 1.2: the MESSAGE's ``ack`` value; 1.0/1.1: its message-id
    subscription: str | None = None      # 1.1: which subscription delivered it
    transaction: str | None = None
    nack: bool = False
    requeue: bool = True                 # NACK requeue:false dead-letters at once (RabbitMQ)


class AckUptoRequest(NamedTuple):
    """ACK with ``pymq-ack-upto``: complete every ready message below ``upto`` (spec/stomp.md §9)."""

    destination: str
    upto: int
    durable_name: str | None = None
    shared: bool = False


def parse_ack(headers: Mapping[str, str], version: str, nack: bool = False) -> AckRequest:
    token = headers["id"] if version == "1.2" else headers["message-id"]
    requeue = True
    if nack:
        value = headers.get("requeue")
        requeue = value is None or value.lower() != "false"
    return _new_ack((token, headers.get("subscription"), headers.get("transaction"), nack, requeue))


_new_ack = functools.partial(tuple.__new__, AckRequest)


def parse_ack_upto(headers: Mapping[str, str]) -> AckUptoRequest:
    destination = headers.get("destination")
    if destination is None:
        raise MissingHeader("a range acknowledgement needs a 'destination' header", header="destination")
    return AckUptoRequest(destination, parse_wire_int("pymq-ack-upto", headers["pymq-ack-upto"]),
                          durable_name(headers), _flag(headers, "shared"))


# -- results ---------------------------------------------------------------------------------------------

#: What a SEND did: (the id the message got, or None when it was dropped as a duplicate; whether it
#: wrote data that a receipt must wait for, spec/stomp.md §5). A plain pair, not a NamedTuple: one is
#: made per SEND and a tuple display costs a third of a NamedTuple's construction.
SendResult = tuple[str | None, bool]
