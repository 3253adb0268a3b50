"""What the cluster node asks of the broker it belongs to: the typed seam from server/cluster/ to the core.

The broker core reaches the cluster only through ``ClusterMembership`` (server/broker/membership.py); the
cluster reaches the core only through this protocol, which the core's facade (``Broker``) implements. Tests
of the cluster's broker-side parts may pass a fake.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol
from collections.abc import Iterator

if TYPE_CHECKING:
    from pymq_server.broker.destinations import Kind
    from pymq_server.broker.message import BrokerMessage
    from pymq_server.broker.queue import MessageQueue
    from pymq_server.broker.topic import Topic, TopicSubscription
    from pymq_server.config import BrokerConfig, QueueConfig


class ClusterHost(Protocol):
    config: BrokerConfig

    @property
    def queues(self) -> dict[str, MessageQueue]: ...

    @property
    def internal(self) -> dict[str, MessageQueue]:
        """The broker's own queues (the outboxes among them)."""
        ...

    @property
    def topics(self) -> dict[str, Topic]: ...

    def resolve(self, destination: str) -> tuple[Kind, str]: ...

    def internal_queue(self, name: str, config: QueueConfig | None = None) -> MessageQueue: ...

    def compile_selector(self, text: str | None) -> Any: ...

    # moves the cluster decides (placed by the core's one placement path: spec/placement.md)
    def redistribute(self, message: BrokerMessage, peer: str) -> None: ...

    def hand_over(self, message: BrokerMessage, subscription: str, peer: str) -> None: ...

    def reroute(self, message: BrokerMessage, peer: str | None) -> None: ...

    # durable subscriptions (spec/cluster.md §6)
    def find_subscription(self, key: str) -> TopicSubscription | None: ...

    def durable_subscriptions(self) -> Iterator[TopicSubscription]: ...

    def durable_record(self, sub: TopicSubscription) -> dict: ...

    def adopt_durable(self, record: dict) -> TopicSubscription: ...

    def drop_subscription(self, sub: TopicSubscription) -> None: ...
