"""A message crossing from one cluster node to another (spec/cluster.md §3): the headers it travels with,
and what the receiving node makes of them, so that the message is the same message on every node.

A message keeps what it was given where it was accepted — its id, its timestamp, its expiry, every header
and property — across forwards, redistributions, re-routes and hand-overs: a consumer on any node sees
what a consumer on the accepting node sees (only ``subscription``, ``ack`` and ``pymq-seq`` belong to one
delivery on one node), and a reply correlated by JMSMessageID finds its request wherever it was consumed.

The sender (the outbox reader, server/cluster/link.py) adds the cluster's own headers, which the receiver
takes out again as it parses the SEND (:func:`split`, called by requests.py's ``parse_send``):

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

FORWARDED: Final = "pymq-forwarded"
MESSAGE_ID: Final = "pymq-message-id"
FORWARD_ID: Final = "pymq-forward-id"
SUBSCRIPTION: Final = "pymq-subscription"
#: the cluster's own headers on a forwarded SEND, never part of the message on the receiving node
CLUSTER_HEADERS: Final = frozenset({FORWARDED, MESSAGE_ID, FORWARD_ID, SUBSCRIPTION})

#: what a node sends as an id: printable, no separators a 1.0 frame could not carry, not longer than this
_is_id: Final = re.compile(r"[!-~]{1,512}").fullmatch

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


def split(properties: dict[str, str], dedup_id: str | None) -> tuple[str, str | None, str | None, str | None]:
    """A peer's forwarded SEND (``pymq-forwarded`` among its ``properties``) as it is parsed (requests.py
    parse_send): the four cluster headers taken out of the message's properties, in place, and what they
    say: (the sending node, the durable subscription of a hand-over copy, the message's own id, the
    duplicate id — the crossing, ``fwd:<node>-<key>``; from a node that sent no ``pymq-forward-id``, the
    ``dedup_id`` the SEND came with). Ids no frame could carry are refused (InvalidHeader), whatever the
    message's fate on this node. Only a cluster login may send such a SEND (router.py refuses others), and
    a SEND without ``pymq-forwarded`` keeps these names as plain properties: a client never picks its id."""
    pop = properties.pop
    node, subscription = pop(FORWARDED), pop(SUBSCRIPTION, None)
    message_id, crossing = pop(MESSAGE_ID, None), pop(FORWARD_ID, None)
    if message_id is not None and not _is_id(message_id):
        raise _invalid(MESSAGE_ID, message_id)
    if crossing is None:
        return node, subscription, message_id, dedup_id
    if not _is_id(crossing):
        raise _invalid(FORWARD_ID, crossing)
    return node, subscription, message_id, "fwd:" + crossing


def _invalid(name: str, value: str) -> InvalidHeader:
    return InvalidHeader(f"header {name!r} must be 1 to 512 printable ASCII characters without spaces, "
                         f"got {value[:32]!r}", header=name)
