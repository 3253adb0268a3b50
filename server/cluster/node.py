"""One broker's membership in a cluster (spec/cluster.md): routing, filters, forwarding, hand-over.

The broker core calls a handful of hooks (``route_queue``, ``topic_outboxes``, ``topic_changed``,
``queue_consumers_changed``, ``durable_created``, ``on_control``); everything else happens here, on the
broker's event loop.  Blocking store I/O (the registry) runs in the runtime's worker threads.

Invariants:
* a message accepted for another node is first held in that node's outbox queue (stored like any queue
  when persistent) and leaves it only on the peer's receipt: nothing accepted is lost to a crash or a
  dead peer (its outbox is re-routed or held, §5);
* a forwarded message is never forwarded again (``pymq-forwarded``);
* a grouped queue message goes to the node the group hash names over the live nodes.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections import OrderedDict
from typing import Any
from collections.abc import Callable, Mapping

from pymq_server.broker import destination as dest
from pymq_server.broker.consumer import AUTO
from pymq_server.broker.queue import MessageQueue
from pymq_server.cluster.link import OutboxConsumer, PeerLink
from pymq_server.cluster.registry import ClusterRegistry, Hosted, Member, now_ms, open_registry
from pymq_server.config import ClusterConfig, QueueConfig  # noqa: F401  (ClusterConfig: re-exported)

from pymq.errors import IllegalStateError, PymqError
from pymq.protocol.numbers import header_int
from pymq.routing import GroupRouter
from pymq.routing.assignment import (
    AssignmentPolicy,
    Placement,
    SimilarPolicy,
    make_policy,
    parse_policy,
    recipient_of,
    reconsider,
)
from pymq.routing.forwarding import FilterVersion, PeerFilters
from pymq.routing.groups import RoutingKey, parse_routing_key, routing_key_of
from pymq.routing.interest import InterestFilter

log = logging.getLogger("pymq.cluster")


def _log_failure(message: str, *args: object) -> Callable[[asyncio.Future[Any]], None]:
    """A done-callback for work in the background: logs ``message % (*args, error)`` if it failed."""
    def done(future: asyncio.Future[Any]) -> None:
        error = None if future.cancelled() else future.exception()
        if error is not None:
            log.error(message, *args, error)
    return done

OUTBOX_PREFIX = "$cluster.out."
CONTROL_PREFIX = "/pymq/cluster/"
_OUTBOX_CONFIG = QueueConfig(max_deliveries=0, dead_letter=False)
RECENT_TOPICS = 10_000


class _Unkeyed:
    """A redistributor's selector: it never takes a keyed message (its node is the hash's: spec/routing.md
    §2.3).  Fixed for the redistributor's life; a changed routing key replaces the redistributor."""

    def __init__(self, routing_key: RoutingKey) -> None:
        self.routing_key = routing_key
        self.text = "JMSXGroupID IS NULL" + \
            (" AND JMSCorrelationID IS NULL" if routing_key is RoutingKey.CORRELATION_ID else "")

    def matches(self, values) -> bool:
        if values.get("JMSXGroupID") is not None:
            return False
        return self.routing_key is not RoutingKey.CORRELATION_ID or values.get("JMSCorrelationID") is None


class Redistributor:
    """Consumer of a local queue with no local consumers, moving its unkeyed messages to a peer that
    has consumers for it (duck-types broker Consumer)."""

    def __init__(self, node: ClusterNode, queue: MessageQueue, routing_key: RoutingKey) -> None:
        self.node = node
        self.queue = queue
        self.selector = _Unkeyed(routing_key)
        self.active = True
        self.id = "redistributor"
        self.ack_mode = AUTO            # each entry completes as it is handed on: no count to keep
        self.session = None
        self.unacked: dict = {}
        self.scan = [0, [-1] * 10]
        self.remote = True
        self.exclusive = False       # never an exclusive consumer: it stands in for consumers elsewhere

    def can_take(self) -> bool:
        return self.active and self.node.consumer_peer(self.queue.name) is not None

    def accepts(self, entry) -> bool:
        return self.selector.matches(entry.message.selector_values())

    def deliver(self, entry) -> None:
        peer = self.node.consumer_peer(self.queue.name)
        self.node.broker.redistribute(entry.message, peer)
        self.node.redistributed += 1
        self.queue.complete(entry)

    def detach(self) -> None:
        self.active = False
        self.queue.remove_consumer(self)


class ClusterNode:
    """The broker's ClusterMembership (server/broker/membership.py) when it is part of a cluster."""

    active = True

    def __init__(self, broker, config: ClusterConfig, loop: asyncio.AbstractEventLoop, node_id: str,
                 advertise: str) -> None:
        self.broker = broker
        self.config = config
        self.loop = loop
        self.node_id = node_id
        self.advertise = config.advertise or advertise
        self.started = now_ms()
        self._registry: ClusterRegistry | None = None
        self.members: dict[str, Member] = {}         # live members, this node included
        self.assignments: dict[str, str] = {}         # durable subscription key -> node (cached)
        self.hosted: dict[str, Hosted] = {}            # durable subscription key -> host and record (cached)
        self.dead: set[str] = set()                    # members whose record stays but whose beats stopped
        self._durable_hosts: dict[str, set[str]] = {}  # topic -> other nodes hosting a durable subscription
        self.routing_keys: dict[str, RoutingKey] = {}   # queue -> routing key, cluster-wide (cached)
        self.links: dict[str, PeerLink] = {}
        self._connecting: set[str] = set()
        self.outboxes: dict[str, MessageQueue] = {}
        self._outbox_consumers: dict[str, OutboxConsumer] = {}
        # the topics local subscribers want; the filter is regenerated at a new size (a new epoch) when its
        # measured false-positive rate misses filter_fpr (spec/routing.md §3.8)
        self.filter = InterestFilter(config.filter_capacity, config.filter_fpr)
        self._patterns_held: set[str] = set()     # topic patterns with local subscribers, in the filter
        self._filter_serial = 0                        # announcements of this incarnation (spec/cluster.md §2)
        self._announcement: tuple[dict, bytes] | None = None
        self.peer_filters = PeerFilters()
        self.remote_consumers: dict[str, dict[str, int]] = {}
        self._rr = itertools.count()
        self.router = GroupRouter([node_id], strategy=config.group_routing)
        self.redistributors: dict[str, Redistributor] = {}
        self._recent_topics: OrderedDict[str, None] = OrderedDict()
        self._digest_dirty = False
        self._consumers_dirty = False
        self._tick: asyncio.TimerHandle | None = None
        self._quiet: set[str] = set()                  # subscriptions being adopted at another node's request
        self._ordered: dict[str, float] = {}           # coordinator: subscription -> when a move was ordered
        self._last_rebalance = 0.0
        self._transfers: set[str] = set()              # subscriptions this node is moving away now
        self._stopping = False
        # figures (admin "cluster" operation, tests, benchmarks)
        self.forwarded = 0
        self.forwarded_topic = 0
        self.received_forwarded = 0
        self.discarded_false_positive = 0
        self.redistributed = 0
        self.rerouted = 0
        self.held = 0                                  # topic messages held for dead peers' subscribers
        self.held_refused = 0                          # not held: the dead peer's outbox was at its cap
        self.held_transferred = 0                      # held messages sent on to a subscription's new host
        self.held_purged = 0
        self.moves_ordered = 0                         # coordinator: moves of idle subscriptions it ordered
        self.moved_out = 0                             # subscriptions this node moved to another by policy
        self.moves_refused = 0                         # refused: a consumer was attached

    @property
    def registry(self) -> ClusterRegistry:
        """The cluster store, open from :meth:`start` on."""
        if self._registry is None:
            raise RuntimeError("the cluster node has not started")
        return self._registry

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        self._registry = await self.loop.run_in_executor(None, open_registry, self.config.store, self.config.name)
        # queues this node declares with a routing key (config or catalog) tell the cluster how they route
        declared = {name: q.config.routing_key for name, q in self.broker.queues.items()
                    if q.config.routing_key != RoutingKey.GROUP.value}
        for name, settings in (self.broker.config.queues or {}).items():
            if settings.routing_key != RoutingKey.GROUP.value:     # validated QueueConfig (server/config.py)
                declared[name] = parse_routing_key(settings.routing_key).value
        for name, key in declared.items():
            await self.loop.run_in_executor(None, self.registry.set_routing_key, name, key)
        await self._attach_recovered()
        await self._refresh()
        log.info("cluster %s: node %s at %s; members %s", self.config.name, self.node_id, self.advertise,
                 sorted(self.members))

    async def _attach_recovered(self) -> None:
        """What the broker recovered before it joined: subscribed topics into the filter, outboxes under
        their peers, and each recovered durable subscription either claimed (the map names no one else)
        or, when the map says another node adopted it meanwhile, moved there (spec/cluster.md §5, §6)."""
        broker = self.broker
        for name, queue in broker.internal.items():
            if name.startswith(OUTBOX_PREFIX):
                self.outboxes[name[len(OUTBOX_PREFIX):]] = queue
        for topic in list(broker.topics.values()):
            if topic.subscriptions:
                self.topic_changed(topic)
        hosted = await self.loop.run_in_executor(None, self.registry.subscriptions)
        for sub in broker.durable_subscriptions():
            key = sub.name
            record = broker.durable_record(sub)
            host = hosted.get(key)
            if host is None or host.node == self.node_id:
                self.assignments[key] = self.node_id
                await self.loop.run_in_executor(None, self.registry.assign, key, self.node_id, record)
            else:
                log.info("cluster: durable subscription %s moved to %s while this node was away", key, host.node)
                self._move_subscription(key, host.node)

    def _schedule(self) -> None:
        if not self._stopping:
            self._tick = self.loop.call_later(self.config.heartbeat_ms / 1000.0, self._on_tick)

    def _on_tick(self) -> None:
        task = self.loop.create_task(self._refresh())
        task.add_done_callback(_log_failure("cluster refresh failed: %s"))

    async def _refresh(self) -> None:
        """Beat, read the members and the assignment map, react to joins and deaths."""
        me = Member(self.node_id, self.advertise, self.started, now_ms())

        def io():
            self.registry.beat(me)
            return self.registry.members(), self.registry.subscriptions(), self.registry.routing_keys()

        try:
            members, hosted, routing_keys = await self.loop.run_in_executor(None, io)
        except PymqError as exc:
            log.error("cluster store unreachable: %s (keeping the last membership)", exc)
            self._schedule()
            return
        self._apply_routing_keys(routing_keys)
        now = now_ms()
        alive = {m.node: m for m in members if m.alive(now, self.config.dead_after_ms) or m.node == self.node_id}
        first = not self.members
        self.dead = {m.node for m in members if m.node not in alive}
        self._apply_membership(alive)
        if first:
            for peer in sorted(self.dead & set(self.outboxes)):
                self._reroute_outbox(peer)         # recovered outboxes of peers that died meanwhile
        self._apply_hosted(hosted)
        self._maybe_rebalance()
        self._schedule()

    def _apply_membership(self, alive: dict[str, Member]) -> None:
        before = set(self.members)
        self.members = alive
        now = set(alive)
        for peer in sorted(now - before - {self.node_id}):
            log.info("cluster: node %s joined (%s)", peer, alive[peer].address)
            self.peer_filters.add_peer(peer)
        for peer in sorted(before - now):
            if peer != self.node_id:
                self._peer_dead(peer)
        if now != before:
            self.router = GroupRouter(sorted(now), strategy=self.config.group_routing)
        for peer, member in alive.items():
            if peer != self.node_id and peer not in self.links and peer not in self._connecting:
                self._connect(peer, member.address)

    def _apply_hosted(self, hosted: dict[str, Hosted]) -> None:
        """A new read of the assignment map: index durable interest by topic, and send on what this node
        held for a dead host's subscription that another node has adopted meanwhile (spec/cluster.md §5)."""
        previous = self.hosted
        self.hosted = hosted
        assignments = {key: h.node for key, h in hosted.items()}
        for key, node in self.assignments.items():
            if node == self.node_id and key not in assignments and self.broker.find_subscription(key) is not None:
                assignments[key] = node            # claimed here; the store write is still on its way
        self.assignments = assignments
        by_topic: dict[str, set[str]] = {}
        for h in hosted.values():
            if h.topic is not None and h.node != self.node_id:
                by_topic.setdefault(h.topic, set()).add(h.node)
        self._durable_hosts = by_topic
        for key, before in previous.items():
            now = hosted.get(key)
            topic = before.topic
            if now is None or now.node == before.node or topic is None:
                continue
            if before.node in self.outboxes and before.node not in self.members:
                self._transfer_held(before.node, key, before, topic, now.node)

    def _held_topics(self, peer: str) -> set[str]:
        return {h.topic for h in self.hosted.values() if h.node == peer and h.topic is not None}

    def _transfer_held(self, dead: str, key: str, hosted: Hosted, topic: str, to: str) -> None:
        """Durable subscription ``key`` of dead node ``dead`` now lives on ``to``: the topic messages this
        node held for it go there (a copy addressed to the subscription), and what no other subscription
        of the dead node wants any more is released."""
        broker = self.broker
        outbox = self.outboxes[dead]
        topic_dest = "/topic/" + topic
        record = hosted.record or {}
        try:
            selector = broker.compile_selector(record.get("selector"))
        except PymqError:
            selector = None                        # hold on the safe side: the new host filters again
        still_wanted = self._held_topics(dead)
        local = broker.find_subscription(key) if to == self.node_id else None
        moved = released = 0
        for entry in list(outbox.ready):
            message = entry.message
            if message.destination != topic_dest or "pymq-subscription" in message.headers:
                continue
            if selector is None or selector.matches(message.selector_values()):
                if local is not None or to != self.node_id:
                    broker.hand_over(message, key, to)      # a copy addressed to the subscription
                moved += 1
            if hosted.topic not in still_wanted:
                outbox.remove_ready([entry])       # its copy (if any) holds its own reference
                released += 1
        self.held_transferred += moved
        if moved or released:
            log.info("cluster: %d message(s) held for %s's durable subscription %s sent on to %s; %d released",
                     moved, dead, key, to, released)

    def _connect(self, peer: str, address: str) -> None:
        self._connecting.add(peer)
        link = PeerLink(self, peer, address)

        async def open_link():
            try:
                await link.open()
                self.links[peer] = link
            except OSError as exc:
                log.info("cluster: cannot reach %s at %s yet (%s)", peer, address, exc.strerror or exc)
            finally:
                self._connecting.discard(peer)

        self.loop.create_task(open_link())

    async def stop(self) -> None:
        """Leave cleanly: hand durable subscriptions over, let outboxes drain, ask peers to drop our
        filter, delete our record (spec/cluster.md §6)."""
        self._stopping = True
        if self._tick is not None:
            self._tick.cancel()
        try:
            await self._hand_over()
        except Exception:  # leaving must finish even if a peer misbehaves; what is held stays stored
            log.exception("cluster hand-over failed")
        for link in list(self.links.values()):
            if link.ready:
                try:
                    link.send({"destination": CONTROL_PREFIX + "drop-filter", "pymq-node": self.node_id})
                except PymqError:
                    pass
        await asyncio.sleep(0.05)
        for link in list(self.links.values()):
            link.close()
        registry = self._registry
        if registry is not None:
            try:
                await self.loop.run_in_executor(None, registry.leave, self.node_id)
            except PymqError as exc:
                log.warning("could not delete this node's membership record: %s", exc)
            await self.loop.run_in_executor(None, registry.close)

    # -- links -------------------------------------------------------------------------------------
    def link_ready(self, link: PeerLink) -> None:
        peer = link.peer
        log.info("cluster: link to %s is up", peer)
        self._send_digest(link)
        self._send_consumers(link)
        outbox = self.outbox(peer)
        consumer = OutboxConsumer(self, outbox, link)
        self._outbox_consumers[peer] = consumer
        outbox.add_consumer(consumer)

    def link_lost(self, link: PeerLink, was_ready: bool) -> None:
        peer = link.peer
        if self.links.get(peer) is link:
            del self.links[peer]
        consumer = self._outbox_consumers.pop(peer, None)
        if consumer is not None and consumer.link is link:
            consumer.detach()
        if was_ready and not self._stopping:
            log.info("cluster: link to %s is down", peer)

    def _peer_dead(self, peer: str) -> None:
        log.warning("cluster: node %s is dead (no heartbeat for %d ms)", peer, self.config.dead_after_ms)
        link = self.links.pop(peer, None)
        if link is not None:
            link.close()
        consumer = self._outbox_consumers.pop(peer, None)
        if consumer is not None:
            consumer.detach()
        self.peer_filters.remove_peer(peer)
        for per_queue in self.remote_consumers.values():
            per_queue.pop(peer, None)
        self.router = GroupRouter(sorted(self.members), strategy=self.config.group_routing)
        self._reroute_outbox(peer)

    def _reroute_outbox(self, peer: str) -> None:
        """A dead peer's outbox: queue messages go where routing says now (their group's new node, or
        the local queue); topic messages are held for the peer's return (its durable subscribers)."""
        outbox = self.outboxes.get(peer)
        if outbox is None:
            return
        broker = self.broker
        for entry in list(outbox.ready):
            message = entry.message
            kind, name = broker.resolve(message.destination)
            if kind is not dest.Kind.QUEUE or "pymq-subscription" in message.headers:
                continue
            key = self.message_key(name, message.group_id, message.headers.get("correlation-id"),
                                   message.message_id)
            target = self.router.route(key) if key is not None else self.node_id
            broker.reroute(message, None if target == self.node_id else target)
            outbox.remove_ready([entry])        # its new reference was added first: nothing to lose
            self.rerouted += 1

    # -- outboxes ----------------------------------------------------------------------------------
    def outbox(self, peer: str) -> MessageQueue:
        queue = self.outboxes.get(peer)
        if queue is None:
            queue = self.broker.internal_queue(OUTBOX_PREFIX + peer, _OUTBOX_CONFIG)
            self.outboxes[peer] = queue
        return queue

    # -- queue routing (spec/cluster.md §4) ------------------------------------------------------
    def routing_key_for(self, queue: MessageQueue | str) -> RoutingKey:
        """Which id a queue routes on: the cluster-wide setting if one was declared, else this node's."""
        name = queue if isinstance(queue, str) else queue.destination[len("/queue/"):]
        key = self.routing_keys.get(name)
        if key is not None:
            return key
        if isinstance(queue, str):
            local = self.broker.queues.get(name)
            return RoutingKey(local.config.routing_key) if local is not None else RoutingKey.GROUP
        return RoutingKey(queue.config.routing_key)

    def routing_key_declared(self, queue: str, routing_key: str) -> None:
        """A queue was declared here with an explicit routing key: every node must route it alike."""
        key = parse_routing_key(routing_key)
        self.routing_keys[queue] = key
        self._refresh_redistributor(queue)
        done = self.loop.run_in_executor(None, self.registry.set_routing_key, queue, key.value)
        done.add_done_callback(_log_failure("could not record the routing key of %s in the cluster store: %s", queue))

    def _apply_routing_keys(self, raw: dict[str, str]) -> None:
        keys = {}
        for queue, value in raw.items():
            try:
                keys[queue] = parse_routing_key(value)
            except PymqError:
                log.error("cluster store: queue %s has an unknown routing key %r; routing on groups", queue, value)
        changed = {q for q in set(keys) | set(self.routing_keys) if keys.get(q) != self.routing_keys.get(q)}
        self.routing_keys = keys
        for queue in changed:
            self._refresh_redistributor(queue)

    def message_key(self, queue: MessageQueue | str, group_id, correlation_id, message_id) -> str | None:
        picked = routing_key_of(self.routing_key_for(queue), group_id=group_id, correlation_id=correlation_id,
                                message_id=message_id)
        return None if picked is None else picked.key

    def route_queue(self, queue: MessageQueue, headers: Mapping[str, str], message_id: str) -> str | None:
        """The peer a new message for ``queue`` goes to, or None to keep it here."""
        if len(self.members) < 2:
            return None
        setting = self.routing_key_for(queue)
        key = routing_key_of(setting, group_id=headers.get("JMSXGroupID"),
                             correlation_id=headers.get("correlation-id"), message_id=message_id)
        if key is not None:
            target = self.router.route(key.key)
            return None if target == self.node_id else target
        if _local_consumers(queue):
            return None
        return self.consumer_peer(queue.name)

    def consumer_peer(self, queue_name: str) -> str | None:
        """A live peer with consumers for this queue, round-robin; None when there is none."""
        per_peer = self.remote_consumers.get(queue_name)
        if not per_peer:
            return None
        peers = sorted(p for p, n in per_peer.items() if n > 0 and p in self.links and self.links[p].ready)
        if not peers:
            return None
        return peers[next(self._rr) % len(peers)]

    def queue_consumers_changed(self, queue: MessageQueue) -> None:
        if queue.kind != "queue":
            return
        self._consumers_dirty = True
        self.loop.call_soon(self._flush_consumers)
        self.check_redistribution(queue)

    def check_redistribution(self, queue: MessageQueue) -> None:
        """Attach or detach the redistributor of a local queue (spec/cluster.md §4).  A queue routing on
        message ids has none: every message of it is keyed and stays on its key's node."""
        name = queue.name
        redistributor = self.redistributors.get(name)
        setting = self.routing_key_for(queue)
        if redistributor is not None and redistributor.selector.routing_key is not setting:
            redistributor.detach()                 # its selector's verdicts are cached by the ready index
            del self.redistributors[name]
            redistributor = None
        wanted = setting is not RoutingKey.MESSAGE_ID and not _local_consumers(queue) \
            and self.consumer_peer(name) is not None
        if wanted and redistributor is None:
            redistributor = self.redistributors[name] = Redistributor(self, queue, setting)
            queue.add_consumer(redistributor)
        elif not wanted and redistributor is not None:
            redistributor.detach()
            del self.redistributors[name]

    def _refresh_redistributor(self, name: str) -> None:
        queue = self.broker.queues.get(name)
        if queue is not None:
            self.check_redistribution(queue)

    # -- topics ---------------------------------------------------------------------------------------
    def topic_outboxes(self, topic, message) -> list[MessageQueue]:
        """Outboxes of the peers that should get a topic message: those whose digest may contain the
        topic, or every peer for a popular topic (seed 004), and the outboxes of dead hosts of durable
        subscriptions to the topic (held for them)."""
        if len(self.members) < 2 and not self.dead:
            return []
        name = topic.name
        recent = self._recent_topics
        if name in recent:
            recent.move_to_end(name)
        else:
            recent[name] = None
            if len(recent) > RECENT_TOPICS:
                recent.popitem(last=False)
            self._update_popularity(name)
        if self.config.topic_filtering:
            targets = [p for p in self.peer_filters.targets(name) if p in self.members]
        else:
            targets = [p for p in self.members if p != self.node_id]
        hosts = self._durable_hosts.get(name)
        held = []
        if hosts:
            # The assignment map names every durable subscription's host: a live host gets the message even
            # before its digest arrives, a dead one's outbox holds it until it returns or its subscription
            # is adopted elsewhere (spec/cluster.md §5).
            for host in hosts:
                if host in self.members:
                    if host not in targets:
                        targets.append(host)
                elif host in self.dead:
                    cap = self.config.held_max_messages
                    outbox = self.outbox(host)
                    if cap and outbox.depth >= cap:
                        self.held_refused += 1
                        continue
                    held.append(outbox)
        if targets:
            self.forwarded_topic += 1
        if held:
            self.held += 1
        return [self.outbox(p) for p in targets] + held

    def topic_changed(self, topic) -> None:
        """A local subscription was added or removed: keep the filter to topics with subscriptions."""
        name = topic.name
        wanted = bool(topic.subscriptions)
        if getattr(topic, "pattern", False):
            # a pattern's subscribers (spec/routing.md §3.5): the filter holds the pattern, and while it holds
            # one its digest is match-all, so every peer forwards every topic message here
            if wanted and name not in self._patterns_held:
                self._patterns_held.add(name)
                self.filter.add_pattern(name)
            elif not wanted and name in self._patterns_held:
                self._patterns_held.discard(name)
                self.filter.remove_pattern(name)
            else:
                return
            self._digest_dirty = True
            self.loop.call_soon(self._flush_digest)
            return
        if wanted and name not in self.filter:
            self.filter.add(name)
        elif not wanted and name in self.filter:
            self.filter.remove(name)
        else:
            return
        self._digest_dirty = True
        self.loop.call_soon(self._flush_digest)

    def _update_popularity(self, topic: str) -> None:
        self.peer_filters.classify(topic, self.config.popular_fraction)

    def _flush_digest(self) -> None:
        """Announce the filter after changes (batched per loop iteration), regenerating it first when its
        measured false-positive rate misses the target."""
        if not self._digest_dirty:
            return
        self._digest_dirty = False
        before = self.filter.filter.m
        if self.filter.check():
            log.info("cluster: subscription filter regenerated for %d topics: %d -> %d counters (epoch %d)",
                     len(self.filter), before, self.filter.filter.m, self.filter.epoch)
        self._announcement = None
        self._filter_serial += 1
        for link in list(self.links.values()):
            if link.ready:
                self._send_digest(link)

    def _current_announcement(self) -> tuple[dict, bytes]:
        if self._announcement is None:
            headers = {"destination": CONTROL_PREFIX + "filter", "pymq-node": self.node_id,
                       "content-type": "application/octet-stream",
                       "pymq-filter-incarnation": str(self.started),
                       "pymq-filter-serial": str(self._filter_serial),
                       "pymq-filter-epoch": str(self.filter.epoch)}
            self._announcement = (headers, self.filter.digest().to_bytes())
        return self._announcement

    def _send_digest(self, link: PeerLink) -> None:
        headers, body = self._current_announcement()
        try:
            link.send(headers, body)
        except PymqError:
            pass

    def _flush_consumers(self) -> None:
        if not self._consumers_dirty:
            return
        self._consumers_dirty = False
        for link in list(self.links.values()):
            if link.ready:
                self._send_consumers(link)

    def _send_consumers(self, link: PeerLink) -> None:
        counts = {q.name: n for q in self.broker.queues.values() if (n := _local_consumers(q))}
        try:
            link.send({"destination": CONTROL_PREFIX + "consumers", "pymq-node": self.node_id,
                       "content-type": "application/json"}, json.dumps(counts).encode())
        except PymqError:
            pass

    # -- what peers tell us --------------------------------------------------------------------
    def on_control(self, session, headers: dict, body: bytes) -> None:
        kind = headers["destination"][len(CONTROL_PREFIX):]
        peer = headers.get("pymq-node") or session.user.name.split(":", 1)[-1]
        if kind == "filter":
            if "pymq-filter-serial" in headers:
                version = FilterVersion(header_int(headers, "pymq-filter-incarnation", 0),
                                        header_int(headers, "pymq-filter-serial", 0),
                                        header_int(headers, "pymq-filter-epoch", 0))
                if self.peer_filters.announce(peer, body, version) == "stale":
                    return
            else:
                self.peer_filters.update_from_bytes(peer, body)     # a node without versioned announcements
            for topic in list(self._recent_topics):
                self._update_popularity(topic)
        elif kind == "drop-filter":
            self.peer_filters.remove_peer(peer)
            if peer in self.members and not self._stopping:
                self.peer_filters.add_peer(peer)      # still a member: match-all until it says more
        elif kind == "consumers":
            counts = json.loads(body.decode("utf-8") or "{}")
            for per_peer in self.remote_consumers.values():
                per_peer.pop(peer, None)
            for queue_name, n in counts.items():
                self.remote_consumers.setdefault(queue_name, {})[peer] = int(n)
            for queue in list(self.broker.queues.values()):
                self.check_redistribution(queue)
        elif kind == "move-subscription":
            self._move_subscription(headers["pymq-subscription"], peer)
        elif kind == "subscription":
            # adopt at the sender's request: the sender records the new host once it has moved the messages
            record = json.loads(body.decode("utf-8"))
            self._quiet.add(record["key"])
            try:
                self.broker.adopt_durable(record)
            finally:
                self._quiet.discard(record["key"])
            self._flush_digest()       # our new digest leaves before the receipt the sender waits for
        elif kind == "drop-subscription":
            self._drop_adopted(headers["pymq-subscription"])
        elif kind == "move-to":
            key, target = headers["pymq-subscription"], headers["pymq-target"]
            if key not in self._transfers:
                self.loop.create_task(self._transfer_subscription(key, target, drop=True))
        else:
            raise PymqError(f"unknown cluster control destination {headers['destination']!r}")

    def discarded_forwarded(self) -> None:
        """A forwarded topic message found no subscriber here: the peer's filter matched wrongly."""
        self.discarded_false_positive += 1

    def on_forwarded(self) -> None:
        self.received_forwarded += 1

    # -- durable subscriptions (spec/cluster.md §6) ----------------------------------------------
    def durable_created(self, key: str) -> None:
        """A durable subscription now lives here.  If the map says another live node hosted it, that node
        is asked to move its pending messages here and drop its copy: the subscription follows its
        consumer (spec/cluster.md §6).  A subscription adopted at its host's request is recorded by that
        host, after it moved the messages."""
        if key in self._quiet:
            return
        self.assignments[key] = self.node_id
        sub = self.broker.find_subscription(key)
        record = self.broker.durable_record(sub) if sub is not None else None
        # the store, not this node's cached copy of the map, says who hosted it until now
        claim = self.loop.run_in_executor(None, self.registry.claim, key, self.node_id, record)
        claim.add_done_callback(lambda fut: self._claimed(key, fut))

    def _claimed(self, key: str, fut) -> None:
        if fut.cancelled() or fut.exception() is not None:
            log.error("could not record durable subscription %s in the cluster store: %s", key,
                      None if fut.cancelled() else fut.exception())
            return
        previous = fut.result()
        if previous in (None, self.node_id):
            return
        link = self.links.get(previous)
        if link is None or not link.ready:
            # a dead host: what peers held for it comes here when they read the map (§5); what the dead
            # node itself stored comes when it returns and finds the map naming this node (§6)
            log.warning("durable subscription %s was hosted by %s, which is not reachable; its stored "
                        "messages follow when it returns", key, previous)
            return
        try:
            link.send({"destination": CONTROL_PREFIX + "move-subscription", "pymq-node": self.node_id,
                       "pymq-subscription": key})
        except PymqError as exc:
            log.warning("could not ask %s to move durable subscription %s here: %s", previous, key, exc)

    def _move_subscription(self, key: str, to: str) -> None:
        """Another node now hosts ``key``: send it our pending messages, then drop our copy."""
        broker = self.broker
        sub = broker.find_subscription(key)
        if sub is None:
            return
        if sub.queue.consumers:
            log.warning("durable subscription %s is being consumed here; not moving it to %s", key, to)
            return
        self.assignments[key] = to            # before the drop: it must not erase the new host's entry
        for entry in list(sub.queue.ready):
            broker.hand_over(entry.message, key, to)
            sub.queue.remove_ready([entry])
        broker.drop_subscription(sub)
        log.info("cluster: durable subscription %s moved to %s, where its consumer is", key, to)

    def durable_removed(self, key: str) -> None:
        if self.assignments.get(key) == self.node_id:
            self.assignments.pop(key, None)
            self.loop.run_in_executor(None, self.registry.assign, key, None)

    def _drop_adopted(self, key: str) -> None:
        """The host that asked us to adopt ``key`` kept it after all (a consumer attached meanwhile)."""
        sub = self.broker.find_subscription(key)
        if sub is None or sub.queue.consumers or self.assignments.get(key) == self.node_id:
            return
        self.broker.drop_subscription(sub)

    def successor_for(self, key: str, topic: str) -> str | None:
        """Where a durable subscription goes when this node leaves: the assignment policy's choice among
        the live peers (balance: the peer hosting the fewest)."""
        peers = sorted(p for p in self.members if p != self.node_id and p in self.links and self.links[p].ready)
        if not peers:
            return None
        policy = make_policy(self.config.assignment, **self._policy_options())
        if policy is None:
            load = {p: 0 for p in peers}
            for node in self.assignments.values():
                if node in load:
                    load[node] += 1
            return min(peers, key=lambda p: (load[p], p))
        placement, _ = self._placement(peers, exclude=key)
        recipient = recipient_of(key)
        topics = set(placement.topics_of.get(recipient, ())) | {topic}
        if recipient in placement.where:
            placement.unassign(recipient)
        return policy.choose(placement, recipient, sorted(topics))

    def _policy_options(self) -> dict:
        if parse_policy(self.config.assignment) is AssignmentPolicy.SIMILAR:
            return {"slack": float(self.config.similar_slack)}
        return {}

    def _placement(self, nodes: list[str], exclude: str | None = None) -> tuple[Placement, dict[str, dict]]:
        """The recipients of the assignment map on ``nodes`` (each at the node hosting most of its
        subscriptions), and recipient -> {subscription key: host}."""
        keys: dict[str, dict[str, str]] = {}
        topics: dict[str, set[str]] = {}
        for key, hosted in sorted(self.hosted.items()):
            if key == exclude or hosted.topic is None or hosted.node not in nodes:
                continue
            r = recipient_of(key)
            keys.setdefault(r, {})[key] = hosted.node
            topics.setdefault(r, set()).add(hosted.topic)
        placement = Placement(nodes)
        for r in sorted(keys):
            hosts = list(keys[r].values())
            home = max(sorted(set(hosts)), key=hosts.count)
            placement.assign(r, sorted(topics[r]), home)
        return placement, keys

    def _maybe_rebalance(self) -> None:
        """The coordinator (the first live node in name order) places idle durable subscriptions by the
        assignment policy: every ``rebalance_interval_ms`` it reconsiders each recipient and orders the
        host of each subscription that should live elsewhere to move it (spec/cluster.md §6)."""
        cfg = self.config
        if self._stopping or cfg.rebalance_interval_ms == 0 or len(self.members) < 2:
            return
        if min(self.members, key=lambda n: n.encode("utf-8")) != self.node_id:
            return
        policy = make_policy(cfg.assignment, **self._policy_options())
        if policy is None:
            return
        now = time.monotonic()
        if (now - self._last_rebalance) * 1000 < cfg.rebalance_interval_ms:
            return
        self._last_rebalance = now
        quiet_for = 10 * cfg.rebalance_interval_ms / 1000
        self._ordered = {k: t for k, t in self._ordered.items() if now - t < quiet_for}
        nodes = sorted(p for p in self.members if p == self.node_id or (p in self.links and self.links[p].ready))
        placement, keys = self._placement(nodes)
        if isinstance(policy, SimilarPolicy):
            policy.expected = len(placement)
        ordered = self._ordered
        moves = reconsider(placement, policy, sorted(keys),
                           movable=lambda r: not any(k in ordered for k in keys[r]),
                           max_moves=cfg.rebalance_max_moves)
        for recipient, _, target in moves:
            for key, host in sorted(keys[recipient].items()):
                if host == target:
                    continue
                ordered[key] = now
                self.moves_ordered += 1
                if host == self.node_id:
                    if key not in self._transfers:
                        self.loop.create_task(self._transfer_subscription(key, target, drop=True))
                    continue
                link = self.links.get(host)
                if link is None:
                    log.info("cluster: could not order %s to move %s: no link", host, key)
                    continue
                try:
                    link.send({"destination": CONTROL_PREFIX + "move-to", "pymq-node": self.node_id,
                               "pymq-subscription": key, "pymq-target": target})
                except PymqError as exc:
                    log.info("cluster: could not order %s to move %s: %s", host, key, exc)

    async def _transfer_subscription(self, key: str, to: str, drop: bool) -> bool:
        """Move durable subscription ``key`` from here to ``to``: ``to`` adopts it (and announces its filter)
        before its receipt; then, in one step with no consumer able to attach in between, the pending
        messages go to ``to`` through its outbox and (``drop``) the local copy goes; then the store names
        ``to``.  Refused while a consumer is attached, before and after the adoption."""
        broker = self.broker
        sub = broker.find_subscription(key)
        link = self.links.get(to)
        if sub is None or to == self.node_id or link is None or not link.ready:
            return False
        if drop and sub.queue.consumers:
            self.moves_refused += 1
            log.info("cluster: durable subscription %s has a consumer here; not moving it to %s", key, to)
            return False
        self._transfers.add(key)
        try:
            record = broker.durable_record(sub)
            record["key"] = key
            done = self.loop.create_future()

            def confirmed() -> None:
                if not done.done():
                    done.set_result(True)
            try:
                link.send({"destination": CONTROL_PREFIX + "subscription", "pymq-node": self.node_id,
                           "content-type": "application/json"}, json.dumps(record).encode(),
                          on_receipt=confirmed)
                await asyncio.wait_for(done, self.config.handover_timeout_s)
            except (PymqError, asyncio.TimeoutError) as exc:
                log.warning("moving durable subscription %s to %s failed: %s", key, to, exc)
                return False
            sub = broker.find_subscription(key)
            if sub is None or (drop and sub.queue.consumers):
                # a consumer attached while the new host adopted it: it stays here; the new host drops its copy
                self.moves_refused += 1
                try:
                    link.send({"destination": CONTROL_PREFIX + "drop-subscription", "pymq-node": self.node_id,
                               "pymq-subscription": key})
                except PymqError:
                    pass
                return False
            self.assignments[key] = to            # before the drop: it must not erase the new host's entry
            for entry in list(sub.queue.ready):
                broker.hand_over(entry.message, key, to)
                sub.queue.remove_ready([entry])
            if drop:
                broker.drop_subscription(sub)
                self.moved_out += 1
            del record["key"]
            await self.loop.run_in_executor(None, self.registry.assign, key, to, record)
            log.info("cluster: durable subscription %s moved to %s (%s)", key, to,
                     f"assignment: {self.config.assignment}" if drop else "hand-over")
            return True
        finally:
            self._transfers.discard(key)

    async def _hand_over(self) -> None:
        broker = self.broker
        for sub in broker.durable_subscriptions():
            key = sub.name
            successor = self.successor_for(key, sub.topic.name)
            if successor is None:
                log.warning("no live peer to take durable subscription %s; it stays stored here", key)
                continue
            await self._transfer_subscription(key, successor, drop=False)
        deadline = time.monotonic() + self.config.handover_timeout_s
        # a bounded wait at shutdown for the outboxes to drain (polled: no event says "all empty")
        while time.monotonic() < deadline and any(q.depth for q in self.outboxes.values()  # noqa: ASYNC110
                                                   if self.links.get(_peer_of(q)) is not None):
            await asyncio.sleep(0.02)

    # -- status ----------------------------------------------------------------------------------
    def status(self) -> dict:
        return {"node": self.node_id, "members": sorted(self.members),
                "links": {p: link.ready for p, link in sorted(self.links.items())},
                "outboxes": {p: q.depth for p, q in sorted(self.outboxes.items())},
                "filter_topics": sorted(self.filter.topics),
                "filter_patterns": sorted(self._patterns_held),
                "filter": {"topics": len(self.filter), "m": self.filter.filter.m, "k": self.filter.filter.k,
                           "capacity": self.filter.capacity, "epoch": self.filter.epoch,
                           "serial": self._filter_serial, "fpr_target": self.filter.fpr_target,
                           "measured_fpr": self.filter.measured_fpr(),
                           "digest_bytes": 8 + (self.filter.filter.m + 7) // 8},
                "peer_filters": {p: _peer_filter_status(self.peer_filters, p) for p in self.peer_filters.peers},
                "popular": sorted(self.peer_filters.popular),
                "remote_consumers": self.remote_consumers,
                "assignments": dict(sorted(self.assignments.items())),
                "routing_keys": {q: k.value for q, k in sorted(self.routing_keys.items())},
                "forwarded": self.forwarded, "forwarded_topic_messages": self.forwarded_topic,
                "received_forwarded": self.received_forwarded,
                "discarded_false_positive": self.discarded_false_positive,
                "redistributed": self.redistributed, "rerouted": self.rerouted,
                "assignment": self.config.assignment, "moves_ordered": self.moves_ordered,
                "moved_out": self.moved_out, "moves_refused": self.moves_refused,
                "dead": sorted(self.dead), "held": self.held, "held_refused": self.held_refused,
                "held_transferred": self.held_transferred, "held_purged": self.held_purged}

    # -- held outboxes (admin: list-outboxes, purge-outbox) ---------------------------------------
    def list_outboxes(self) -> list[dict]:
        """Every outbox with what it holds; ``held`` marks a peer that is not alive (its messages wait for
        it to return or for its subscriptions to be adopted)."""
        out = []
        for peer, queue in sorted(self.outboxes.items()):
            alive = peer in self.members
            entries = list(queue.ready)
            out.append({"node": peer, "alive": alive, "held": not alive,
                        "state": "alive" if alive else ("dead" if peer in self.dead else "gone"),
                        "messages": queue.depth, "in_flight": queue.acquired,
                        "bytes": sum(e.message.size for e in entries),
                        "topics": sorted({e.message.destination for e in entries
                                          if e.message.destination.startswith("/topic/")}),
                        "subscriptions": sorted(k for k, h in self.hosted.items() if h.node == peer)})
        return out

    def purge_outbox(self, peer: str, forget: bool = False) -> dict:
        """Drop what this node holds for a peer that is not alive (a node gone for good).  ``forget`` also
        deletes its membership record, so no node holds for it any more; if it ever returns it rejoins and
        recovers its own stored subscriptions."""
        if peer == self.node_id:
            raise IllegalStateError("a node has no outbox to itself", node=peer)
        if peer in self.members:
            raise IllegalStateError(f"node {peer!r} is alive: its outbox drains to it and is not purged",
                                    node=peer)
        queue = self.outboxes.get(peer)
        purged = 0
        if queue is not None:
            purged = queue.purge()
            self.held_purged += purged
        if forget:
            self.dead.discard(peer)
            self._durable_hosts = {t: {n for n in hosts if n != peer} for t, hosts in self._durable_hosts.items()}
            done = self.loop.run_in_executor(None, self.registry.leave, peer)
            done.add_done_callback(_log_failure("could not delete %s's membership record: %s", peer))
        log.warning("cluster: purged %d message(s) held for %s%s", purged, peer, " and forgot it" if forget else "")
        return {"node": peer, "purged_messages": purged, "forgotten": forget}


def _local_consumers(queue: MessageQueue) -> int:
    return sum(1 for c in queue.consumers if not getattr(c, "remote", False) and not isinstance(c, OutboxConsumer))


def _peer_of(queue: MessageQueue) -> str:
    return queue.name.split(OUTBOX_PREFIX, 1)[-1]


def _peer_filter_status(filters: PeerFilters, peer: str) -> dict:
    digest = filters.digest(peer)
    version = filters.version(peer)
    return {"match_all": digest is None or digest.match_all, "m": None if digest is None else digest.m,
            "k": None if digest is None else digest.k,
            "epoch": None if version is None else version.epoch,
            "serial": None if version is None else version.serial}
