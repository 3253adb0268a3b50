"""What the broker core asks of its cluster membership, and the broker that stands alone.

The core never tests whether it is in a cluster: it holds a :class:`ClusterMembership` — the cluster
node (server/cluster/node.py) once one is attached, :class:`Standalone` until then — and calls it where a
cluster has a say (spec/cluster.md): where a queue message goes, which peers a topic message travels to,
and which local changes the peers must hear about.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol
from collections.abc import Mapping

from pymq.errors import ConfigError, DestinationError

if TYPE_CHECKING:
    from pymq_server.broker.message import BrokerMessage
    from pymq_server.broker.queue import MessageQueue
    from pymq_server.broker.topic import Topic


class ClusterMembership(Protocol):
    #: True for a node of a cluster with a say in routing; the standalone broker's is False
    active: bool

    def route_queue(self, queue: MessageQueue, headers: Mapping[str, str], message_id: str) -> str | None:
        """The peer a new message for ``queue`` (with these message headers: its group, its correlation
        id; and the id it is given) goes to, or None to keep it here (spec/cluster.md §4)."""
        ...

    def topic_outboxes(self, topic: Topic, message: BrokerMessage) -> list[MessageQueue]:
        """The outboxes of the peers that should get a topic message (spec/cluster.md §3)."""
        ...

    def outbox(self, peer: str) -> MessageQueue:
        """The queue of messages waiting to go to ``peer``."""
        ...

    def on_forwarded(self, client: Any = None) -> None:
        """A peer forwarded a message here over ``client``'s link (refused, raising, when that link is of a
        fenced former process of the node: spec/ha.md §5)."""
        ...

    def link_admitted(self, session: Any, headers: Mapping[str, str]) -> None:
        """A peer node's link logged in with these CONNECT headers; raises to refuse it."""
        ...

    def discarded_forwarded(self) -> None:
        """A forwarded topic message found no subscriber here (the peer's filter matched wrongly)."""
        ...

    def topic_changed(self, topic: Topic) -> None:
        """A local subscription of ``topic`` was added or removed (the node's filter follows)."""
        ...

    def queue_consumers_changed(self, queue: MessageQueue) -> None: ...

    def durable_created(self, key: str) -> None: ...

    def durable_removed(self, key: str) -> None: ...

    def routing_key_declared(self, queue: str, routing_key: str) -> None:
        """A queue was declared with an explicit routing key: every node must route it alike."""
        ...

    def on_control(self, session: Any, headers: dict, body: bytes) -> None:
        """A control message from another node (``/pymq/cluster/...``)."""
        ...

    def status(self) -> dict:
        ...


class Standalone:
    """A broker that is not part of a cluster: every message stays here, nobody needs telling."""

    active = False

    def route_queue(self, queue: MessageQueue, headers: Mapping[str, str], message_id: str) -> str | None:
        return None

    def topic_outboxes(self, topic: Topic, message: BrokerMessage) -> list[MessageQueue]:
        return []

    def outbox(self, peer: str) -> MessageQueue:
        raise ConfigError(f"this broker is not part of a cluster: there is no peer {peer!r}")

    def on_forwarded(self, client: Any = None) -> None:
        pass

    def link_admitted(self, session: Any, headers: Mapping[str, str]) -> None:
        pass

    def discarded_forwarded(self) -> None:
        pass

    def topic_changed(self, topic: Topic) -> None:
        pass

    def queue_consumers_changed(self, queue: MessageQueue) -> None:
        pass

    def durable_created(self, key: str) -> None:
        pass

    def durable_removed(self, key: str) -> None:
        pass

    def routing_key_declared(self, queue: str, routing_key: str) -> None:
        pass

    def on_control(self, session: Any, headers: dict, body: bytes) -> None:
        raise DestinationError(f"{headers.get('destination')!r}: this broker is not part of a cluster",
                               destination=headers.get("destination", ""))

    def status(self) -> dict:
        raise ConfigError("this broker is not part of a cluster")


STANDALONE = Standalone()
