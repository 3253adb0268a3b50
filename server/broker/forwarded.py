"""A message crossing from one cluster node to another (spec/cluster.md §3): the headers it travels with,
and what the receiving node makes of them, so that the message is the same message on every node.

A message keeps what it was given where it was accepted — its id, its timestamp, its expiry, every header
and property — across forwards, redistributions, re-routes and hand-overs: a consumer on any node sees
what a consumer on the accepting node sees (only ``subscription``, ``ack`` and ``pymq-seq`` belong to one
delivery on one node), and a reply correlated by JMSMessageID finds its request wherever it was consumed.

The sender (the outbox reader, server/cluster/link.py) adds the cluster's own headers, which the receiver
takes out again before the message is built (:func:`arrived`):

* ``pymq-forwarded: <node>`` — the sending node; the receiver places the message locally and never
  routes it again (only a cluster login may send it: router.py);
* ``pymq-message-id`` — the message's id, which the receiver gives the message instead of one of its own;
* ``pymq-forward-id: <node>-<key>`` — this crossing: the sender's storage key of the message, unique on
  that node and never reused, so a resend after a lost receipt is a duplicate of the same crossing
  (dropped by the receiver's window, ``fwd:<node>-<key>``) while the same message crossing again later
  (redistributed back and forth as consumers come and go) is not;
* ``pymq-subscription: <key>`` — a hand-over copy, delivered straight into that durable subscription.

A message's own ``pymq-dedup-id`` is the producer's and travels as it is. Invariant: a property a
producer names like one of the four above does not survive a forward (the cluster's value replaces it).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from pymq.errors import InvalidHeader

if TYPE_CHECKING:
    from pymq_server.broker.message import BrokerMessage
    from pymq_server.broker.requests import SendRequest

FORWARDED: Final = "pymq-forwarded"
MESSAGE_ID: Final = "pymq-message-id"
FORWARD_ID: Final = "pymq-forward-id"
SUBSCRIPTION: Final = "pymq-subscription"
#: the cluster's own headers on a forwarded SEND, never part of the message on the receiving node
CLUSTER_HEADERS: Final = frozenset({FORWARDED, MESSAGE_ID, FORWARD_ID, SUBSCRIPTION})

#: what a node sends as an id: printable, no separators a 1.0 frame could not carry, not longer than this
_ID: Final = re.compile(r"[!-~]{1,512}")

#: headers of a held message that belong to one delivery on one node, or to the frame, not to the message
_NOT_CARRIED: Final = frozenset({"destination", "message-id", "pymq-seq", "content-length", "receipt",
                                 "transaction", "subscription", "ack", "redelivered", "JMSXDeliveryCount",
                                 "JMSXGroupFirstForConsumer", "pymq-delivery-time"})


def forward_headers(message: BrokerMessage, origin: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The SEND headers that carry ``message`` from node ``origin`` to a peer."""
    headers = {k: v for k, v in message.headers.items() if k not in _NOT_CARRIED}
    headers["destination"] = message.destination
    headers[FORWARDED] = origin
    headers[MESSAGE_ID] = message.message_id
    headers[FORWARD_ID] = f"{origin}-{message.key}"
    if message.deliver_at:
        headers["AMQ_SCHEDULED_TIME"] = str(message.deliver_at)
    if extra:
        headers.update(extra)
    return headers


def arrived(request: SendRequest) -> SendRequest:
    """A peer's forwarded SEND as the request the receiving node places: the cluster's headers out of the
    message, its own id kept, and the crossing as the duplicate id (a SEND from a node that did not send
    ``pymq-forward-id`` keeps the duplicate id it came with). One copy of the headers, the four taken out of
    it by name (a forwarded message has all but ``pymq-subscription``)."""
    properties = dict(request.properties)
    pop = properties.pop
    forwarded, message_id, crossing = pop(FORWARDED, None), pop(MESSAGE_ID, None), pop(FORWARD_ID, None)
    if pop(SUBSCRIPTION, None) is None and forwarded is None and message_id is None and crossing is None:
        return request
    _check(message_id, crossing)
    dedup_id = request.dedup_id if crossing is None else "fwd:" + crossing
    return request._replace(properties=properties, message_id=message_id, dedup_id=dedup_id)


def kept_id(request: SendRequest) -> str | None:
    """The id a peer's forwarded message keeps, for one dropped before it is built (nothing here holds it),
    its ids refused as :func:`arrived` refuses them: a bad id gets the same answer either way."""
    properties = request.properties
    message_id = properties.get(MESSAGE_ID)
    _check(message_id, properties.get(FORWARD_ID))
    return message_id


def _check(message_id: str | None, crossing: str | None) -> None:
    """What a node sends as an id: refused (InvalidHeader) unless a frame of any version could carry it."""
    if message_id is not None and not _ID.fullmatch(message_id):
        raise _invalid(MESSAGE_ID, message_id)
    if crossing is not None and not _ID.fullmatch(crossing):
        raise _invalid(FORWARD_ID, crossing)


def _invalid(name: str, value: str) -> InvalidHeader:
    return InvalidHeader(f"header {name!r} must be 1 to 512 printable ASCII characters without spaces, "
                         f"got {value[:32]!r}", header=name)
