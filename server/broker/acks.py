"""One connection's outstanding deliveries: which ack token names which entry of which consumer.

STOMP 1.2 acknowledges by the MESSAGE's ``ack`` token (one counter per connection); 1.0 and 1.1 by
message id, with the subscription in 1.1. ``client`` mode acknowledges cumulatively: everything the
consumer was given up to and including the named delivery, in delivery order (``Consumer.unacked``
keeps that order). Tokens the broker took back (a delivery timeout) are remembered once, so the late
ACK for one is ignored instead of failing the connection.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pymq_server.broker.consumer import CLIENT, Consumer
from pymq_server.broker.requests import AckRequest

from pymq.errors import UnknownMessage, UnknownSubscription

if TYPE_CHECKING:
    from pymq_server.broker.queue import Entry, MessageQueue

log = logging.getLogger("pymq.session")


class DeliveryLedger:
    __slots__ = ("version", "tokens", "next_token", "stale")

    def __init__(self) -> None:
        self.version = "1.0"
        self.tokens: dict[str, Consumer] = {}       # 1.2 ack token -> consumer
        self.next_token = 0
        self.stale: set[str] = set()                # tokens the broker took back (timeouts)

    def resolve(self, request: AckRequest, consumers: dict[str, Consumer]) -> Consumer:
        """The consumer that holds the delivery ``request`` names, or a precise error."""
        token = request.token
        if self.version == "1.2":
            consumer = self.tokens.get(token)
            if consumer is None or token not in consumer.unacked:
                raise UnknownMessage(f"{'NACK' if request.nack else 'ACK'} of unknown or already "
                                     f"acknowledged message (id {token!r})", id=token)
            return consumer
        what = "NACK" if request.nack else "ACK"
        sub = request.subscription
        if sub is not None:
            found = consumers.get(sub)
            if found is None:
                raise UnknownSubscription(f"{what} names unknown subscription {sub!r}", subscription=sub)
            if token not in found.unacked:
                raise UnknownMessage(f"{what} of unknown or already acknowledged message {token!r} on "
                                     f"subscription {sub!r}", id=token)
            return found
        for consumer in consumers.values():
            if token in consumer.unacked:
                return consumer
        raise UnknownMessage(f"{what} of unknown or already acknowledged message {token!r}", id=token)

    def take(self, consumer: Consumer, token: str) -> list[Entry]:
        """Entries an ack/nack of ``token`` covers: cumulative in client mode, just the one otherwise;
        in delivery order."""
        if consumer.ack_mode != CLIENT:
            return [self._take_one(consumer, token)]
        unacked = consumer.unacked
        tokens = self.tokens if self.version == "1.2" else None
        taken = []
        for t in list(unacked):
            taken.append(unacked.pop(t))
            if tokens is not None:
                tokens.pop(t, None)
            if t == token:
                break
        consumer.in_flight -= len(taken)
        return taken

    def _take_one(self, consumer: Consumer, token: str) -> Entry:
        """The one delivery ``token`` names (client-individual, auto): out of the ledger."""
        entry = consumer.unacked.pop(token)
        if self.version == "1.2":
            self.tokens.pop(token, None)
        consumer.in_flight -= 1
        return entry

    def settle(self, request: AckRequest, consumers: dict[str, Consumer], now: float | None = None) -> MessageQueue:
        """Complete (ACK) or release (NACK) what ``request`` names (:meth:`resolve`'s rule, its errors); the
        queue to dispatch once the batch of frames is handled (several releases go back before anything goes
        out again). ``now``: the clock of the read the ACK came in (the session reads it once for a read's
        ACKs, so the queue's depth figures move once for the run: MessageQueue.complete).

        A 1.2 ACK of one delivery (client-individual: one a message, the common case) is :meth:`resolve` and
        :meth:`_take_one` reached sooner: the consumer's entry is found outstanding and taken out by one
        look-up (``unacked.pop``), where resolve asked ``in`` and take popped it after."""
        token = request.token
        if self.version == "1.2" and not request.nack:
            consumer = self.tokens.get(token)
            if consumer is not None and consumer.ack_mode != CLIENT:
                entry = consumer.unacked.pop(token, None)
                if entry is not None:
                    del self.tokens[token]
                    consumer.in_flight -= 1
                    entry.queue.complete(entry, now)
                    return consumer.queue
        consumer = self.resolve(request, consumers)     # the general way, and every error's text
        entries = self.take(consumer, token)
        if request.nack:
            for entry in entries:
                entry.queue.release(entry, failed=True, requeue=request.requeue, dispatch=False)
        else:
            for entry in entries:
                entry.queue.complete(entry, now)
        return consumer.queue

    def is_stale(self, token: str, conn_id: str) -> bool:
        """An ACK/NACK for a delivery the broker took back after its delivery timeout: ignored (the
        message is already back in its queue), once."""
        if token in self.stale:
            self.stale.discard(token)
            log.info("connection %s acknowledged message %s after its delivery timeout; ignored", conn_id, token)
            return True
        return False

    def forget(self, consumer: Consumer, entry: Entry) -> None:
        """The broker took back a delivery (delivery timeout): a late ACK for it is ignored."""
        token = entry.token
        if token is None or consumer.unacked.pop(token, None) is None:
            return
        consumer.in_flight -= 1
        self.tokens.pop(token, None)
        self.stale.add(token)

    def drop_consumer(self, consumer: Consumer) -> list[Entry]:
        """The consumer is gone: its outstanding deliveries, in delivery order, to be released."""
        pending = list(consumer.unacked.values())
        consumer.unacked.clear()
        consumer.in_flight = 0
        for token in [t for t, c in self.tokens.items() if c is consumer]:
            del self.tokens[token]
        return pending

    def clear(self) -> None:
        self.tokens.clear()
