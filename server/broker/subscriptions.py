"""Layer 2, subscriptions: who reads what — consumers of queues, and topic subscriptions of every kind.

A topic subscription is a queue in its topic plus a filter (selector, no-local, spec/stomp.md §4):
non-durable (one SUBSCRIBE, gone with its last consumer), shared non-durable (JMS 2.0, by name), or
durable (``sub:<owner>:<name>``, owner = client id or user; ``sub:shared:<name>`` when shared), kept in
the catalog (``dsub:<key>``) and receiving while its subscriber is away. Durable subscriptions are also
what moves between cluster nodes (spec/cluster.md §6): :meth:`Subscriptions.record` describes one,
:meth:`Subscriptions.adopt` hosts one another node handed over.

Who may reach a durable subscription (spec/admin.md, "Ownership and permissions"): a ``client-id`` is
bound to the user who first connected with it (``client:<id>`` in the catalog, so it survives restarts),
and a durable subscription to the user who created it (``user`` in its record); another user can neither
attach to it, read it, acknowledge it nor delete it. Every check comes before anything is created.

Depends on: destinations (layer 1), and the cluster membership, which hears of every change.
"""
from __future__ import annotations

import json
from typing import Any
from collections.abc import Callable, Iterator

from pymq_server.broker.acl import is_admin
from pymq_server.broker.auth import User
from pymq_server.broker.budgets import DURABLE_COST, Budgets, selector_cost
from pymq_server.broker.routes import Watched
from pymq_server.broker.clients import Client, durable_owner
from pymq_server.broker.consumer import AUTO, Consumer
from pymq_server.broker.destinations import Destinations, Kind
from pymq_server.broker.membership import STANDALONE, ClusterMembership
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.requests import SubscribeRequest
from pymq_server.broker.topic import Topic, TopicSubscription
from pymq_server.config import BrokerConfig
from pymq_server.storage.store import HoldingStore

from pymq.errors import AccessDenied, DestinationError, IllegalStateError, InvalidSelector, UnknownDestination


def durable_key(owner: str, name: str, shared: bool) -> str:
    return f"sub:{'shared' if shared else owner}:{name}"


def _selector_text(selector: object) -> str | None:
    return None if selector is None else selector.text  # type: ignore[attr-defined]


class Subscriptions:
    def __init__(self, config: BrokerConfig, destinations: Destinations, store: HoldingStore,
                 budgets: Budgets) -> None:
        self.config = config
        self.budgets = budgets                              # durable subscriptions are charged to their creator
        self.destinations = destinations
        self.store = store
        self.default_prefetch = config.default_prefetch
        self.cluster: ClusterMembership = STANDALONE
        self.durable: dict[str, TopicSubscription] = {}     # key -> durable subscription hosted here
        #: durable key -> the user who created it (who may produce to its dead-letter queue: routes.py)
        self.creators: Watched[str, str] = Watched(destinations.generation)
        self.client_ids: dict[str, str] = {}                # client id -> the user it is bound to
        destinations.subscription_creator = self._creator_of_dotted
        self._compile: Callable | None = None

    def compile_selector(self, text: str | None):
        if text is None or not text.strip():
            return None
        if self._compile is None:
            try:
                from pymq.selector import compile_selector
            except ImportError:
                raise InvalidSelector("selectors are not available in this build", position=0,
                                      expected="no selector") from None
            limits = self.config.selector_limits()      # what one selector may cost (spec/selector.md §7)

            def compile_limited(text: str):
                return compile_selector(text, limits=limits)
            self._compile = compile_limited
        return self._compile(text)

    # -- client ids and creators --------------------------------------------------------------------
    def check_client_id(self, user: User, client_id: str) -> None:
        """A CONNECT with ``client-id`` by another user than the one it is bound to is refused before the
        connection exists. Administrators may use any (and bind none)."""
        holder = self.client_ids.get(client_id)
        if holder is not None and holder != user.name and not is_admin(user):
            raise AccessDenied(f"user '{user.name}' may not connect with client id {client_id!r}: it belongs to "
                               f"user '{holder}'", user=user.name, destination=f"client-id:{client_id}",
                               permission="client-id")

    def bind_client_id(self, user: User, client_id: str) -> None:
        """Bind ``client_id`` to the first (non-administrator) user that connected with it, in the
        catalog so that the binding survives restarts."""
        if client_id in self.client_ids or is_admin(user):
            return
        self.client_ids[client_id] = user.name
        self.store.put_meta("client:" + client_id, json.dumps({"user": user.name}).encode())

    def restore_client_id(self, client_id: str, record: dict) -> None:
        self.client_ids[client_id] = record["user"]

    def _check_creator(self, user: User, key: str, name: str) -> None:
        creator = self.creators.get(key)
        if creator is not None and creator != user.name and not is_admin(user):
            raise AccessDenied(f"user '{user.name}' may not use durable subscription {name!r}: it belongs to "
                               f"user '{creator}'", user=user.name, destination=f"subscription:{name}",
                               permission="consume")

    def _creator_of_dotted(self, dotted: str) -> str | None:
        """The creator of the durable subscription whose key, ':' written '.', is ``dotted`` (the name of
        its dead-letter queue after the prefix), or None."""
        if not dotted.startswith("sub."):
            return None
        for key, creator in self.creators.items():
            if key.replace(":", ".") == dotted:
                return creator
        return None

    # -- consumers --------------------------------------------------------------------------------
    def consumer(self, client: Client, request: SubscribeRequest, compiled: Any = None) -> Consumer:
        """A consumer for a SUBSCRIBE (not attached yet): of a queue, a temporary queue or a topic
        subscription, created as the request says; ``compiled``: its selector, compiled already (off the
        loop, by the session)."""
        destinations = self.destinations
        destination = request.destination
        kind, name = destinations.resolve(destination)
        selector = compiled if compiled is not None else self.compile_selector(request.selector)
        prefetch = request.prefetch
        if prefetch is None:
            prefetch = self.default_prefetch if request.ack != AUTO else 0
        if kind is Kind.QUEUE:
            queue = destinations.queue_for(client.user, name, "consume")
        elif kind is Kind.TEMP_QUEUE:
            queue = destinations.owned_temp_queue(client, destination, name, "consume from")
        else:
            if kind is Kind.TEMP_TOPIC:
                if request.durable_name:        # refused before the connection's topic is made
                    raise DestinationError(f"a temporary topic has no durable subscriptions (it ends with its "
                                           f"connection): {destination!r}", destination=destination)
                topic = destinations.owned_temp_topic(client, destination, name)
            else:
                if request.durable_name:
                    # the subscription's owner before the topic: a refusal creates nothing
                    self._check_creator(client.user, durable_key(durable_owner(client), request.durable_name,
                                                                 request.shared), request.durable_name)
                topic = destinations.topic_for(client.user, name, "consume")
            sub = self._topic_subscription(client, request, topic, selector)
            return Consumer(client, request.id, sub.queue, request.ack, prefetch, None, subscription=sub,
                            destination=destination, exclusive=request.exclusive)
        return Consumer(client, request.id, queue, request.ack, prefetch, selector, destination=destination,
                        exclusive=request.exclusive)

    def _topic_subscription(self, client: Client, request: SubscribeRequest, topic: Topic,
                            selector: object) -> TopicSubscription:
        no_local = request.no_local
        name = request.durable_name
        if name:
            owner = durable_owner(client)
            key = durable_key(owner, name, request.shared)
            sub = topic.subscriptions.get(key)
            if sub is not None and (_selector_text(sub.selector) != _selector_text(selector)
                                    or sub.no_local != no_local):
                if sub.queue.consumers:
                    raise IllegalStateError(f"durable subscription {name!r} is in use; it cannot "
                                            f"change its selector while a consumer is active")
                self.drop(sub)   # JMS: a new selector means a new subscription
                sub = None
            if sub is None:
                sub = self.create_durable(topic, key, selector, no_local, owner, request.shared, name,
                                          creator=client.user.name)
            elif sub.queue.consumers and not sub.shared:
                raise IllegalStateError(f"durable subscription {name!r} already has an active consumer "
                                        f"(use a shared subscription for several)", subscription=name)
            return sub
        if request.shared_name:
            key = f"shared:{request.shared_name}"
            sub = topic.subscriptions.get(key)
            if sub is None:
                queue = self.destinations.subscription_queue(key, topic, durable=False)
                sub = TopicSubscription(topic, key, queue, selector, no_local, client.id, shared=True)
                self._added(topic, sub)
            return sub
        key = f"{client.id}:{request.id}"
        queue = self.destinations.subscription_queue(key, topic, durable=False)
        sub = TopicSubscription(topic, key, queue, selector, no_local, client.id)
        self._added(topic, sub)
        return sub

    def _added(self, topic: Topic, sub: TopicSubscription) -> None:
        topic.add(sub)
        if not topic.temporary:          # a temporary topic lives on its connection's node only
            self.cluster.topic_changed(topic)

    def consumer_added(self, consumer: Consumer) -> None:
        self.cluster.queue_consumers_changed(consumer.queue)
        self._log_consumer(consumer, "attached")

    def _log_consumer(self, consumer: Consumer, what: str) -> None:
        queue = consumer.queue
        if queue.kind == "queue" and self.destinations.queue_logs.enabled:
            client = consumer.session
            self.destinations.queue_logs.event(
                queue.destination[len("/queue/"):],
                f"consumer {what}: connection {client.id} user {client.user.name} subscription {consumer.id} "
                f"({len(queue.consumers)} now)")

    def consumer_removed(self, consumer: Consumer) -> None:
        self.cluster.queue_consumers_changed(consumer.queue)
        self._log_consumer(consumer, "detached")
        sub = consumer.subscription
        if sub is not None and not sub.durable and not consumer.queue.consumers:
            self.drop(sub)          # a non-durable subscription ends with its last consumer

    # -- durable subscriptions --------------------------------------------------------------------
    def create_durable(self, topic: Topic, key: str, selector: object, no_local: bool, owner: str,
                       shared: bool, name: str, persist: bool = True, *, creator: str | None = None,
                       existing: bool = False) -> TopicSubscription:
        """``existing``: it exists already (recovered, handed over by another node): charged to its creator
        whatever the budget; else the creator's budget is charged first, and a refusal makes nothing."""
        cost = self.budgets.charge_user(creator, f"durable subscription {name[:64]!r}",
                                        DURABLE_COST + 2 * len(key) + selector_cost(_selector_text(selector)),
                                        force=existing or not persist)
        queue = self.destinations.subscription_queue(key, topic, durable=True)
        sub = TopicSubscription(topic, key, queue, selector, no_local, None, durable=True, shared=shared,
                                client_id=owner)
        sub.user, sub.cost = creator, cost
        self.durable[key] = sub
        if creator is not None:
            self.creators[key] = creator
        self._added(topic, sub)
        self.cluster.durable_created(key)
        if persist:
            record = {"topic": topic.name, "selector": _selector_text(selector), "no_local": no_local,
                      "owner": owner, "shared": shared, "name": name, "user": creator}
            self.store.put_meta("dsub:" + key, json.dumps(record).encode())
        return sub

    def restore(self, key: str, record: dict) -> TopicSubscription:
        """A durable subscription found in the catalog at start."""
        return self.create_durable(self.destinations.topic(record["topic"]), key,
                                   self.compile_selector(record.get("selector")), record.get("no_local", False),
                                   record["owner"], record.get("shared", False), record["name"], persist=False,
                                   creator=record.get("user"))

    def drop(self, sub: TopicSubscription) -> None:
        """End a subscription: its queue and messages go; a durable one leaves the catalog."""
        topic = sub.topic
        topic.remove(sub.name)
        for consumer in list(sub.queue.consumers):
            sub.queue.remove_consumer(consumer)
        sub.queue.purge()
        if sub.durable:
            self.durable.pop(sub.name, None)
            self.creators.pop(sub.name, None)
            self.store.put_meta("dsub:" + sub.name, None)
            self.budgets.release_user(sub.user, sub.cost)
            sub.cost = 0
        if not topic.temporary:
            self.cluster.topic_changed(topic)
        if sub.durable:
            self.cluster.durable_removed(sub.name)

    def find(self, key: str) -> TopicSubscription | None:
        return self.durable.get(key)

    def hosted(self) -> Iterator[TopicSubscription]:
        """The durable subscriptions this broker hosts (a snapshot: hand-over drops them as it goes)."""
        yield from list(self.durable.values())

    def unsubscribe(self, consumer: Consumer) -> None:
        """UNSUBSCRIBE that also deletes the durable subscription the consumer read."""
        sub = consumer.subscription
        if sub is None or not sub.durable:
            return
        if sub.queue.consumers:
            raise IllegalStateError(f"durable subscription {sub.name!r} still has active consumers")
        self.drop(sub)

    def remove(self, client: Client, name: str, shared: bool = False) -> None:
        """Delete a durable subscription by name (JMS Session.unsubscribe)."""
        key = durable_key(durable_owner(client), name, shared)
        sub = self.durable.get(key)
        if sub is None:
            raise UnknownDestination(f"no durable subscription named {name!r}")
        self._check_creator(client.user, key, name)
        if sub.queue.consumers:
            raise IllegalStateError(f"durable subscription {name!r} still has active consumers")
        self.drop(sub)

    def for_reader(self, client: Client, topic_name: str, name: str, shared: bool, permission: str) -> MessageQueue:
        """The queue of a durable subscription a range reader names (to ``browse`` it or acknowledge it:
        ``consume``); a reader that owns a durable subscription may create it by reading it first.
        Both checks come first: a refused reader creates no topic and no subscription."""
        owner = durable_owner(client)
        key = durable_key(owner, name, shared)
        self._check_creator(client.user, key, name)
        topic = self.destinations.topic_for(client.user, topic_name, permission)
        sub = topic.subscriptions.get(key)
        if sub is None:
            sub = self.create_durable(topic, key, None, False, owner, shared, name, creator=client.user.name)
        return sub.queue

    # -- moving between nodes (spec/cluster.md §6) ---------------------------------------------------
    def record(self, sub: TopicSubscription) -> dict:
        """What another node needs to host ``sub``."""
        return {"key": sub.name, "topic": sub.topic.name, "selector": _selector_text(sub.selector),
                "no_local": sub.no_local, "owner": sub.client_id, "shared": sub.shared,
                "name": sub.name.split(":", 2)[2], "user": self.creators.get(sub.name)}

    def adopt(self, record: dict) -> TopicSubscription:
        """Host a durable subscription another node handed over (no-op when already here)."""
        sub = self.find(record["key"])
        if sub is not None:
            return sub
        return self.create_durable(self.destinations.topic(record["topic"]), record["key"],
                                   self.compile_selector(record.get("selector")), record.get("no_local", False),
                                   record["owner"], record.get("shared", False), record["name"],
                                   creator=record.get("user"), existing=True)
