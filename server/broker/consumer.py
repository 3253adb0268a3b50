"""A consumer: one SUBSCRIBE on one connection, reading from one queue (or subscription queue).

Credit: a consumer with client or client-individual acks may hold at most ``prefetch`` unacknowledged
messages (0 = no limit, as RabbitMQ's prefetch-count 0); auto-ack consumers are limited only by their
connection's write buffer.  ``unacked`` keeps delivery order, which cumulative (client) acks rely on.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol
from collections.abc import Mapping

if TYPE_CHECKING:
    from pymq_server.broker.clients import Client
    from pymq_server.broker.entry import Entry
    from pymq_server.broker.queue import MessageQueue
    from pymq_server.broker.topic import TopicSubscription

AUTO, CLIENT, CLIENT_INDIVIDUAL = "auto", "client", "client-individual"
ACK_MODES = (AUTO, CLIENT, CLIENT_INDIVIDUAL)


class Selector(Protocol):
    """A compiled JMS selector (pymq.selector): whether a message's values match it."""

    def matches(self, values: Mapping[str, Any]) -> bool: ...


class QueueReader(Protocol):
    """What a queue needs of whoever reads from it (dispatch.py): a client's :class:`Consumer`, and the
    cluster node's readers of its outboxes and of queues it redistributes from."""

    active: bool            # false once it is leaving: nothing more is given to it
    #: it acknowledges what it is given as it is written (a client's auto-ack consumer): a new message it takes
    #: as it arrives is acquired and acknowledged in one step (MessageQueue._pass); false for the cluster's
    #: readers, which complete an entry later (an outbox's link at its receipt)
    passes: bool

    @property
    def exclusive(self) -> bool: ...

    @property
    def ack_mode(self) -> str: ...

    @property
    def selector(self) -> Selector | None: ...

    @property
    def scan(self) -> list[Any]:
        """Where its selective scans resume (ReadyIndex.take_first)."""

    def can_take(self) -> bool: ...

    def deliver(self, entry: Entry) -> None: ...


class Consumer:
    __slots__ = ("session", "id", "queue", "ack_mode", "prefetch", "in_flight", "selector", "unacked",
                 "subscription", "destination", "active", "scan", "exclusive", "cost", "passes")

    """One SUBSCRIBE of a client connection (``session``, whose ``deliver`` writes the MESSAGE)."""

    def __init__(self, session: Client, sub_id: str, queue: MessageQueue, ack_mode: str, prefetch: int,
                 selector: Selector | None = None, subscription: TopicSubscription | None = None,
                 destination: str = "", exclusive: bool = False) -> None:
        self.session = session
        self.id = sub_id
        self.queue = queue
        self.ack_mode = ack_mode
        self.prefetch = prefetch
        self.in_flight = 0
        self.selector = selector          # compiled selector evaluated at dispatch (queues)
        self.unacked: dict[str, Entry] = {}   # token -> entry, in delivery order
        self.subscription = subscription  # the TopicSubscription this consumer reads, if any
        self.destination = destination    # the destination the client subscribed to
        self.active = True
        self.scan: list[Any] = [0, [-1] * 10]   # where its selective scans resume (ReadyIndex.take_first)
        self.exclusive = exclusive        # asked to be the queue's only receiver (activemq.exclusive)
        self.cost = 0                     # what its connection's budget was charged for it (budgets.py)
        self.passes = ack_mode == AUTO    # its session acknowledges an auto-ack delivery as it writes it

    def can_take(self) -> bool:
        return self.active and self.session.writable and (
            not self.prefetch or self.in_flight < self.prefetch)

    def accepts(self, entry: Entry) -> bool:
        selector = self.selector
        return selector is None or selector.matches(entry.message.selector_values())

    def deliver(self, entry: Entry) -> None:
        self.session.deliver(self, entry)

    def __repr__(self) -> str:
        return f"<Consumer {self.id} on {self.queue.name} {self.ack_mode} in_flight={self.in_flight}>"


def exclusive_owner(consumers: list[QueueReader], everyone: bool) -> QueueReader | None:
    """The one consumer of a queue with exclusive consumers: the first active one in subscription order
    that asked for it (``everyone``: the queue is exclusive, so any consumer). None: nobody is exclusive
    now, every consumer takes its turn."""
    for consumer in consumers:
        if consumer.active and (everyone or consumer.exclusive):
            return consumer
    return None
