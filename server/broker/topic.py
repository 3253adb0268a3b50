"""Topics: every current subscription gets the message, as one shared object.

A subscription is a :class:`MessageQueue` of kind "subscription" plus a filter (selector, no-local).
Non-durable subscriptions live as long as their SUBSCRIBE; durable ones are named (client id + name),
kept in the catalog and keep receiving while their subscriber is away; shared ones (JMS 2.0) have several
consumers on one subscription queue.  Filters run once per subscription at publish time, so a
subscriber never holds entries it would not accept.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pymq_server.broker.queue import MessageQueue

if TYPE_CHECKING:
    from pymq_server.broker.clients import Client


class TopicSubscription:
    __slots__ = ("topic", "name", "queue", "selector", "no_local", "owner", "durable", "shared",
                 "client_id", "user", "cost")

    def __init__(self, topic: Topic, name: str, queue: MessageQueue, selector=None,
                 no_local: bool = False, owner=None, durable: bool = False, shared: bool = False,
                 client_id: str | None = None) -> None:
        self.topic = topic
        self.name = name
        self.queue = queue
        self.selector = selector
        self.no_local = no_local
        self.owner = owner          # the connection id whose own messages no-local skips
        self.durable = durable
        self.shared = shared
        self.client_id = client_id
        self.user: str | None = None        # a durable one's creator, whose budget it is charged to ...
        self.cost = 0                       # ... this much (budgets.py)

    def wants(self, message) -> bool:
        if self.no_local and message.producer == self.owner:
            return False
        selector = self.selector
        return selector is None or selector.matches(message.selector_values())


class Topic:
    def __init__(self, name: str, prefix: str = "/topic/") -> None:
        self.name = name
        self.destination = prefix + name
        self.subscriptions: dict[str, TopicSubscription] = {}
        self.published = 0
        self.owner: Client | None = None   # the connection of a temporary topic (/temp-topic/): gone with it
        self.temporary = prefix != "/topic/"

    def targets(self, message) -> list[TopicSubscription]:
        return [sub for sub in self.subscriptions.values() if sub.wants(message)]

    def add(self, sub: TopicSubscription) -> None:
        self.subscriptions[sub.name] = sub

    def remove(self, name: str) -> TopicSubscription | None:
        return self.subscriptions.pop(name, None)
