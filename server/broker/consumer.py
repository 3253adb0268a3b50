"""A consumer: one SUBSCRIBE on one connection, reading from one queue (or subscription queue).

Credit: a consumer with client or client-individual acks may hold at most ``prefetch`` unacknowledged
messages (0 = no limit, as RabbitMQ's prefetch-count 0); auto-ack consumers are limited only by their
connection's write buffer.  ``unacked`` keeps delivery order, which cumulative (client) acks rely on.
"""
from __future__ import annotations

AUTO, CLIENT, CLIENT_INDIVIDUAL = "auto", "client", "client-individual"
ACK_MODES = (AUTO, CLIENT, CLIENT_INDIVIDUAL)


class Consumer:
    __slots__ = ("session", "id", "queue", "ack_mode", "prefetch", "in_flight", "selector", "unacked",
                 "subscription", "destination", "active", "head", "scan", "exclusive")

    def __init__(self, session, sub_id: str, queue, ack_mode: str, prefetch: int, selector=None,
                 subscription=None, destination: str = "", exclusive: bool = False) -> None:
        self.session = session
        self.id = sub_id
        self.queue = queue
        self.ack_mode = ack_mode
        self.prefetch = prefetch
        self.in_flight = 0
        self.selector = selector          # compiled selector evaluated at dispatch (queues)
        self.unacked: dict = {}           # token -> entry, in delivery order
        self.subscription = subscription  # the TopicSubscription this consumer reads, if any
        self.destination = destination    # the destination the client subscribed to
        self.active = True
        self.head = None                  # the encoded "MESSAGE\nsubscription:<id>\n" prefix (TCP)
        self.scan = [0, [-1] * 10]        # where its selective scans resume (ReadyIndex.take_first)
        self.exclusive = exclusive        # asked to be the queue's only receiver (activemq.exclusive)

    def can_take(self) -> bool:
        return self.active and self.session.writable and (
            not self.prefetch or self.in_flight < self.prefetch)

    def accepts(self, entry) -> bool:
        selector = self.selector
        return selector is None or selector.matches(entry.message.selector_values())

    def deliver(self, entry) -> None:
        self.session.deliver(self, entry)

    def __repr__(self) -> str:
        return f"<Consumer {self.id} on {self.queue.name} {self.ack_mode} in_flight={self.in_flight}>"


def exclusive_owner(consumers: list, everyone: bool) -> Consumer | None:
    """The one consumer of a queue with exclusive consumers: the first active one in subscription order
    that asked for it (``everyone``: the queue is exclusive, so any consumer). None: nobody is exclusive
    now, every consumer takes its turn."""
    for consumer in consumers:
        if consumer.active and (everyone or consumer.exclusive):
            return consumer
    return None
