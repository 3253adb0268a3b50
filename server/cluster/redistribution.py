"""Redistribution (spec/cluster.md §4, Artemis's): a queue with ready messages and no local consumer, while a
peer has consumers for it, sends its unkeyed messages to that peer, so consumers on any node drain a queue
whose producers are elsewhere.

A :class:`Redistributor` is a consumer of the local queue standing in for the consumers elsewhere: it takes
a message only while some peer whose link is up has consumers, and never a keyed one (a keyed message's
node is its key's hash: spec/routing.md §2.3). The decision whether a queue wants one is the state's
(routes.py); this module attaches and detaches them.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Iterable, Mapping

from pymq.routing.groups import RoutingKey
from pymq_server.broker.consumer import AUTO, Selector
from pymq_server.broker.entry import Entry
from pymq_server.broker.queue import MessageQueue
from pymq_server.cluster.host import ClusterHost
from pymq_server.cluster.link import OutboxConsumer
from pymq_server.cluster.state import ClusterState


class _Unkeyed:
    """A redistributor's selector: it never takes a keyed message.  Fixed for the redistributor's life; a
    changed routing key replaces the redistributor."""

    def __init__(self, routing_key: RoutingKey) -> None:
        self.routing_key = routing_key
        self.text = "JMSXGroupID IS NULL" + \
            (" AND JMSCorrelationID IS NULL" if routing_key is RoutingKey.CORRELATION_ID else "")

    def matches(self, values: Mapping[str, Any]) -> bool:
        if values.get("JMSXGroupID") is not None:
            return False
        return self.routing_key is not RoutingKey.CORRELATION_ID or values.get("JMSCorrelationID") is None


class Redistributor:
    """Consumer of a local queue with no local consumers, moving its unkeyed messages to a peer that has
    consumers for it (duck-types broker Consumer)."""

    def __init__(self, owner: Redistribution, queue: MessageQueue, routing_key: RoutingKey) -> None:
        self.owner = owner
        self.queue = queue
        self.unkeyed = _Unkeyed(routing_key)
        self.selector: Selector | None = self.unkeyed     # for the ready index (it caches the verdicts)
        self.active = True
        self.id = "redistributor"
        self.ack_mode = AUTO            # each entry completes as it is handed on: no count to keep
        self.passes = False             # it completes the entry itself (deliver), not as a client's write
        self.session = None
        self.unacked: dict = {}
        self.scan = [0, [-1] * 10]
        self.remote = True
        self.exclusive = False       # never an exclusive consumer: it stands in for consumers elsewhere

    def can_take(self) -> bool:
        return self.active and self.owner.peer_for(self.queue) is not None

    def accepts(self, entry: Entry) -> bool:
        return self.unkeyed.matches(entry.message.selector_values())

    def deliver(self, entry: Entry) -> None:
        peer = self.owner.peer_for(self.queue)
        assert peer is not None                 # can_take said so, in the same loop turn
        self.owner.host.redistribute(entry.message, peer)
        self.owner.state.figures.redistributed += 1
        self.queue.complete(entry)

    def detach(self) -> None:
        self.active = False
        self.queue.remove_consumer(self)


def _client(consumer: Any) -> bool:
    """A consumer that is a client of this node (not a redistributor, not an outbox's link)."""
    return not getattr(consumer, "remote", False) and not isinstance(consumer, OutboxConsumer)


def local_consumers(queue: MessageQueue) -> int:
    """How many of the queue's consumers are clients of this node (told to peers)."""
    return sum(map(_client, queue.consumers))


def has_local_consumer(queue: MessageQueue) -> bool:
    """Whether one is (asked per unkeyed queue message: stops at the first)."""
    return any(map(_client, queue.consumers))


class Redistribution:
    def __init__(self, host: ClusterHost, state: ClusterState) -> None:
        self.host = host
        self.state = state
        self.redistributors: dict[str, Redistributor] = {}

    def peer_for(self, queue: MessageQueue) -> str | None:
        return self.state.routes.consumer_peer(queue.name)

    def check(self, queue: MessageQueue) -> None:
        """Attach or detach the redistributor of a local queue. A queue routing on message ids has none:
        every message of it is keyed and stays on its key's node."""
        name = queue.destination[len("/queue/"):]
        routes = self.state.routes
        redistributor = self.redistributors.get(name)
        setting = routes.key_for(name)
        if redistributor is not None and redistributor.unkeyed.routing_key is not setting:
            redistributor.detach()                 # its selector's verdicts are cached by the ready index
            del self.redistributors[name]
            redistributor = None
        wanted = routes.wants_redistributor(name, queue.name, local_consumers(queue))
        if wanted and redistributor is None:
            redistributor = self.redistributors[name] = Redistributor(self, queue, setting)
            queue.add_consumer(redistributor)
        elif not wanted and redistributor is not None:
            redistributor.detach()
            del self.redistributors[name]

    def refresh(self, names: Iterable[str] | None) -> None:
        """Check the queues named (None: every queue of the broker)."""
        queues = self.host.queues
        if names is None:
            for queue in list(queues.values()):
                self.check(queue)
            return
        for name in names:
            found = queues.get(name)
            if found is not None:
                self.check(found)
