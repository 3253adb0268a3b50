"""One broker's membership in a cluster (spec/cluster.md): the asyncio driver of the cluster's state.

The broker core calls the ``ClusterMembership`` hooks (server/broker/membership.py) on its event loop; the
decisions are the sans-IO state's (state.py and its parts: members, routes, topics, hosting), which
returns actions; this driver does the I/O they ask for — the store (registry.py, in the runtime's worker
threads), the links to the peers (link.py), the broker's queues (outboxes.py, redistribution.py,
handover.py, all through the typed seam host.py) — and keeps the heartbeat.

Invariants:
* a message accepted for another node is first held in that node's outbox queue (stored like any queue
  when persistent) and leaves it only on the peer's receipt: nothing accepted is lost to a crash or a
  dead peer (its outbox is re-routed or held, §5);
* a forwarded message is never forwarded again (``pymq-forwarded``) and keeps its id on every node;
* a grouped queue message goes to the node the group hash names over the live nodes;
* with backups (spec/ha.md §5) every write to the store, every link, forward and control frame is of this
  process's HA epoch, and a peer's links of a lower epoch than its node id has shown are refused.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, cast
from collections.abc import Callable, Mapping

from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.topic import Topic
from pymq_server.cluster.actions import (
    Action,
    Adopt,
    Announce,
    AttachOutbox,
    CheckRedistribution,
    Connect,
    DropAdopted,
    Fenced,
    FollowConsumer,
    HeldTransfer,
    MoveOrder,
    PeerDead,
    Replaced,
    Reroute,
    SendConsumers,
)
from pymq_server.cluster.epochs import LinkEpochs
from pymq_server.cluster.handover import Moves
from pymq_server.cluster.host import ClusterHost
from pymq_server.cluster.link import PeerLink
from pymq_server.cluster.outboxes import OUTBOX_PREFIX, Outboxes
from pymq_server.cluster.redistribution import Redistribution, has_local_consumer, local_consumers
from pymq_server.cluster.registry import ClusterRegistry, Member, open_registry
from pymq_server.cluster.state import CONTROL_PREFIX, Clock, ClusterState, SystemClock
from pymq_server.config import ClusterConfig

from pymq.errors import PymqError
from pymq.routing.groups import RoutingKey, parse_routing_key

log = logging.getLogger("pymq.cluster")

__all__ = ["OUTBOX_PREFIX", "ClusterNode"]


def _log_failure(message: str, *args: object) -> Callable[[asyncio.Future[Any]], None]:
    """A done-callback for work in the background: logs ``message % (*args, error)`` if it failed."""
    def done(future: asyncio.Future[Any]) -> None:
        error = None if future.cancelled() else future.exception()
        if error is not None:
            log.error(message, *args, error)
    return done


class ClusterNode:
    """The broker's ClusterMembership (server/broker/membership.py) when it is part of a cluster."""

    active = True

    def __init__(self, broker: ClusterHost, config: ClusterConfig, loop: asyncio.AbstractEventLoop,
                 node_id: str, advertise: str, clock: Clock | None = None, epoch: int = 0) -> None:
        self.broker = broker
        self.config = config
        self.loop = loop
        self.node_id = node_id
        self.advertise = config.advertise or advertise
        self.epoch = epoch                  # this process's HA epoch (0: the node has no backups)
        self.abandoned = False

        def local_key(name: str) -> RoutingKey:
            queue = broker.queues.get(name)
            return RoutingKey(queue.config.routing_key) if queue is not None else RoutingKey.GROUP

        self.state = ClusterState(node_id, config, clock or SystemClock(), local_key=local_key,
                                  hosts_here=lambda key: broker.find_subscription(key) is not None, epoch=epoch)
        self.started = self.state.started
        self.epochs = LinkEpochs(self.state)
        self.outboxes = Outboxes(broker, self.state)
        self.redistribution = Redistribution(broker, self.state)
        self.links: dict[str, PeerLink] = {}
        self._connecting: set[str] = set()
        self.moves = Moves(broker, self.state, self.links, self._announce_now, self._assign)
        self._registry: ClusterRegistry | None = None
        self._tick: asyncio.TimerHandle | None = None
        self._digest_due = False
        self._consumers_due = False

    @property
    def registry(self) -> ClusterRegistry:
        """The cluster store, open from :meth:`start` on."""
        if self._registry is None:
            raise RuntimeError("the cluster node has not started")
        return self._registry

    def _in_thread(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        return self.loop.run_in_executor(None, fn, *args)

    async def _assign(self, key: str, node: str | None, record: dict | None = None) -> None:
        await self._in_thread(self.registry.assign, key, node, record)

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._registry = await self._in_thread(open_registry, self.config.store, self.config.name, self.node_id,
                                               self.epoch)
        # queues this node declares with a routing key (config or catalog) tell the cluster how they route
        broker = self.broker
        declared: dict[str, str] = {name: q.config.routing_key for name, q in broker.queues.items()
                    if q.config.routing_key != RoutingKey.GROUP.value}
        for name, settings in (broker.config.queues or {}).items():
            if settings.routing_key != RoutingKey.GROUP.value:     # validated QueueConfig (server/config.py)
                declared[name] = parse_routing_key(settings.routing_key).value
        for name, key in declared.items():
            await self._in_thread(self.registry.set_routing_key, name, key)
        await self._attach_recovered()
        await self._refresh()
        log.info("cluster %s: node %s at %s; members %s", self.config.name, self.node_id, self.advertise,
                 sorted(self.state.membership.members))

    async def _attach_recovered(self) -> None:
        """What the broker recovered before it joined: subscribed topics into the filter, outboxes under
        their peers, and each recovered durable subscription either claimed (the map names no one else)
        or, when the map says another node adopted it meanwhile, moved there (spec/cluster.md §5, §6)."""
        broker = self.broker
        self.outboxes.recovered()
        for topic in list(broker.topics.values()):
            if topic.subscriptions:
                self.topic_changed(topic)
        hosted = await self._in_thread(self.registry.subscriptions)
        for sub in list(broker.durable_subscriptions()):
            key = sub.name
            host = hosted.get(key)
            if host is None or host.node == self.node_id:
                self.state.hosting.created_here(key)
                await self._assign(key, self.node_id, broker.durable_record(sub))
            else:
                log.info("cluster: durable subscription %s moved to %s while this node was away", key, host.node)
                self.moves.follow(key, host.node)

    def _schedule(self) -> None:
        if not self.state.stopping and not self.abandoned:
            self._tick = self.loop.call_later(self.config.heartbeat_ms / 1000.0, self._on_tick)

    def _on_tick(self) -> None:
        task = self.loop.create_task(self._refresh())
        task.add_done_callback(_log_failure("cluster refresh failed: %s"))

    async def _refresh(self) -> None:
        """Beat, read the members, the assignment map and the routing keys; act on what changed."""
        if self.abandoned:
            return
        me = Member(self.node_id, self.advertise, self.started, self.state.clock.now_ms(), self.epoch)

        def io() -> tuple:
            self.registry.beat(me)
            return self.registry.members(), self.registry.subscriptions(), self.registry.routing_keys()

        try:
            members, hosted, routing_keys = await self._in_thread(io)
        except PymqError as exc:
            if getattr(exc, "reason", None) == "stale-epoch":
                self._act([Fenced(int(getattr(exc, "stored_epoch", 0) or 0))])
                return
            log.error("cluster store unreachable: %s (keeping the last membership)", exc)
        else:
            if self.abandoned:
                return
            self._act(self.state.read(members, hosted, routing_keys))
        self._schedule()

    def abandon(self) -> None:
        """Fenced (spec/ha.md §2.4, §5): another process holds this node now.  Nothing more goes to the
        store or a link: the heartbeat stops, every link is aborted, no hand-over, the record stays (it is
        the new process's)."""
        if self.abandoned:
            return
        self.abandoned = True
        self.state.stopping = True
        if self._tick is not None:
            self._tick.cancel()
        for link in list(self.links.values()):
            link.abort()
        self.links.clear()

    async def stop(self) -> None:
        """Leave cleanly: hand durable subscriptions over, let outboxes drain, ask peers to drop our
        filter, delete our record (spec/cluster.md §6)."""
        if self.abandoned:
            registry = self._registry
            if registry is not None:
                await self._in_thread(registry.close)
            return
        self.state.stopping = True
        if self._tick is not None:
            self._tick.cancel()
        try:
            await self.moves.leave()
            deadline = time.monotonic() + self.config.handover_timeout_s
            # a bounded wait for the outboxes to drain (polled: no event says "all empty")
            while time.monotonic() < deadline and self.outboxes.draining(self.state.ready):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        except Exception:  # leaving must finish even if a peer misbehaves; what is held stays stored
            log.exception("cluster hand-over failed")
        self._send_all({"destination": CONTROL_PREFIX + "drop-filter", "pymq-node": self.node_id})
        await asyncio.sleep(0.05)
        for link in list(self.links.values()):
            link.close()
        registry = self._registry
        if registry is not None:
            try:
                await self._in_thread(registry.leave, self.node_id)
            except PymqError as exc:
                log.warning("could not delete this node's membership record: %s", exc)
            await self._in_thread(registry.close)

    # -- actions --------------------------------------------------------------------------------------
    def _act(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Connect):
                self._connect(action.peer, action.address)
            elif isinstance(action, PeerDead):
                link = self.links.pop(action.peer, None)
                if link is not None:
                    link.close()
                self.outboxes.detach(action.peer)
                self.outboxes.reroute(action.peer)
            elif isinstance(action, Reroute):
                self.outboxes.reroute(action.peer)
            elif isinstance(action, Announce):
                headers, body = self.state.topics.announcement()
                self._send_to(action.peers, headers, body)
            elif isinstance(action, SendConsumers):
                counts = {q.name: n for q in self.broker.queues.values() if (n := local_consumers(q))}
                self._send_to(action.peers, {"destination": CONTROL_PREFIX + "consumers", "pymq-node": self.node_id,
                                             "content-type": "application/json"}, json.dumps(counts).encode())
            elif isinstance(action, AttachOutbox):
                link = self.links.get(action.peer)
                if link is not None:
                    self.outboxes.attach(action.peer, link)
            elif isinstance(action, CheckRedistribution):
                self.redistribution.refresh(action.queues)
            elif isinstance(action, HeldTransfer):
                self.outboxes.transfer_held(action)
            elif isinstance(action, MoveOrder):
                self._move(action)
            elif isinstance(action, FollowConsumer):
                self.moves.follow(action.key, action.to)
            elif isinstance(action, Adopt):
                self.moves.adopt(action.record)
            elif isinstance(action, DropAdopted):
                self.moves.drop_adopted(action.key)
            elif isinstance(action, Replaced):
                self._replaced(action)
            elif isinstance(action, Fenced):
                log.error("cluster: this node was taken over at epoch %d (this process holds %d): leaving "
                          "the cluster without a word", action.epoch, self.epoch)
                self.abandon()

    def _replaced(self, action: Replaced) -> None:
        """A peer's node id is held at a higher epoch: our link to its former process closes (the next read
        connects to the record's address), its former process's links here are aborted."""
        link = self.links.pop(action.peer, None)
        if link is not None:
            link.close()
        self.epochs.replaced(action.peer, action.epoch)

    def _move(self, order: MoveOrder) -> None:
        if order.host == self.node_id:
            if order.key not in self.state.hosting.transfers:
                self.loop.create_task(self.moves.transfer(order.key, order.target, drop=True))
            return
        link = self.links.get(order.host)
        try:
            if link is None:
                raise PymqError("no link")
            link.send({"destination": CONTROL_PREFIX + "move-to", "pymq-node": self.node_id,
                       "pymq-subscription": order.key, "pymq-target": order.target})
        except PymqError as exc:
            log.info("cluster: could not order %s to move %s: %s", order.host, order.key, exc)

    def _send_to(self, peers: tuple[str, ...], headers: dict, body: bytes = b"") -> None:
        for peer in peers:
            link = self.links.get(peer)
            if link is not None and link.ready:
                try:
                    link.send(headers, body)
                except PymqError:
                    pass

    def _send_all(self, headers: dict, body: bytes = b"") -> None:
        self._send_to(tuple(self.links), headers, body)

    # -- links ------------------------------------------------------------------------------------------
    def _connect(self, peer: str, address: str) -> None:
        if peer in self.links or peer in self._connecting:
            return
        self._connecting.add(peer)
        link = PeerLink(self, peer, address)

        async def open_link() -> None:
            try:
                await link.open()
                self.links[peer] = link
            except OSError as exc:
                log.info("cluster: cannot reach %s at %s yet (%s)", peer, address, exc.strerror or exc)
            finally:
                self._connecting.discard(peer)

        self.loop.create_task(open_link())

    def link_ready(self, link: PeerLink) -> None:
        self.links[link.peer] = link            # (its CONNECTED may come before open() has returned)
        self._act(self.state.link_up(link.peer))

    def link_lost(self, link: PeerLink, was_ready: bool) -> None:
        peer = link.peer
        if self.links.get(peer) is link:
            del self.links[peer]
            self.state.link_down(peer)
        self.outboxes.detach(peer, link)

    # -- what the broker core asks (ClusterMembership) --------------------------------------------------
    def outbox(self, peer: str) -> MessageQueue:
        return self.outboxes(peer)

    def route_queue(self, queue: MessageQueue, headers: Mapping[str, str], message_id: str) -> str | None:
        """The peer a new message for ``queue`` goes to, or None to keep it here (spec/cluster.md §4)."""
        state = self.state
        if state.membership.alone:                 # per message: the common case first, nothing computed
            return None
        return state.route_queue(queue.destination[len("/queue/"):], queue.name, headers, message_id,
                                 lambda: has_local_consumer(queue), queue.config.routing_key)

    def topic_outboxes(self, topic: Topic, message: Any) -> list[MessageQueue]:
        """Outboxes of the peers that should get a topic message, and of dead hosts of durable
        subscriptions to it (held for them: spec/cluster.md §5)."""
        targets, held = self.state.topic_targets(topic.name)
        made, outbox = self.outboxes.queues, self.outboxes       # (per message: made ones by one look-up)
        outboxes = [q if (q := made.get(p)) is not None else outbox(p) for p in targets]
        return outboxes + outbox.held_for(held) if held else outboxes

    def link_admitted(self, session: Any, headers: Mapping[str, str]) -> None:
        """A peer's link logged in (spec/ha.md §5): refused with ClusterError at a stale epoch."""
        self._act(self.epochs.admitted(session, headers))

    def on_forwarded(self, client: Any = None) -> None:
        if client is not None:
            self.epochs.check(client)
        self.state.figures.received_forwarded += 1

    def discarded_forwarded(self) -> None:
        """A forwarded topic message found no subscriber here: the peer's filter matched wrongly."""
        self.state.figures.discarded_false_positive += 1

    def topic_changed(self, topic: Topic) -> None:
        """A local subscription was added or removed: the filter follows, announced once per loop turn."""
        if self.state.topic_changed(topic.name, bool(topic.subscriptions), topic.pattern) and not self._digest_due:
            self._digest_due = True
            self.loop.call_soon(self._announce_now)

    def _announce_now(self) -> None:
        self._digest_due = False
        self._act(self.state.announce())

    def queue_consumers_changed(self, queue: MessageQueue) -> None:
        if queue.kind != "queue":
            return
        if not self._consumers_due:
            self._consumers_due = True
            self.loop.call_soon(self._send_consumers)
        self.redistribution.check(queue)

    def _send_consumers(self) -> None:
        self._consumers_due = False
        self._act([SendConsumers(self.state.ready_peers())])

    def durable_created(self, key: str) -> None:
        """A durable subscription now lives here.  If the map said another live node hosted it, that node
        is asked to move its pending messages here and drop its copy: the subscription follows its
        consumer (spec/cluster.md §6)."""
        if not self.state.hosting.created_here(key):
            return
        sub = self.broker.find_subscription(key)
        record = self.broker.durable_record(sub) if sub is not None else None
        # the store, not this node's cached copy of the map, says who hosted it until now
        claim = self._in_thread(self.registry.claim, key, self.node_id, record)
        claim.add_done_callback(lambda fut: self._claimed(key, fut))

    def _claimed(self, key: str, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            log.error("could not record durable subscription %s in the cluster store: %s", key,
                      None if fut.cancelled() else fut.exception())
            return
        previous = cast("str | None", fut.result())
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

    def durable_removed(self, key: str) -> None:
        if self.state.hosting.removed_here(key):
            self._in_thread(self.registry.assign, key, None)

    def routing_key_declared(self, queue: str, routing_key: str) -> None:
        """A queue was declared here with an explicit routing key: every node must route it alike."""
        key = self.state.routes.declare(queue, routing_key)
        self.redistribution.refresh([queue])
        done = self._in_thread(self.registry.set_routing_key, queue, key.value)
        done.add_done_callback(_log_failure("could not record the routing key of %s in the cluster store: %s", queue))

    def on_control(self, session: Any, headers: dict, body: bytes) -> None:
        """A control message from another node (spec/cluster.md §2)."""
        self.epochs.check(session)
        kind = headers["destination"][len(CONTROL_PREFIX):]
        peer = headers.get("pymq-node") or session.user.name.split(":", 1)[-1]
        self._act(self.state.control(peer, kind, headers, body))

    # -- status and admin -------------------------------------------------------------------------------
    def status(self) -> dict:
        status = self.state.status()
        status["links"] = {p: link.ready for p, link in sorted(self.links.items())}
        status["outboxes"] = {p: q.depth for p, q in self.outboxes}
        return status

    def list_outboxes(self) -> list[dict]:
        return self.outboxes.listing()

    def purge_outbox(self, peer: str, forget: bool = False) -> dict:
        """Drop what this node holds for a peer that is not alive (a node gone for good).  ``forget`` also
        deletes its membership record, so no node holds for it any more; if it ever returns it rejoins and
        recovers its own stored subscriptions."""
        purged = self.outboxes.purge(peer)
        if forget:
            self.state.membership.forget(peer)
            self.state.hosting.forget(peer)
            done = self._in_thread(self.registry.leave, peer)
            done.add_done_callback(_log_failure("could not delete %s's membership record: %s", peer))
        log.warning("cluster: purged %d message(s) held for %s%s", purged, peer, " and forgot it" if forget else "")
        return {"node": peer, "purged_messages": purged, "forgotten": forget}
