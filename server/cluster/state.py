"""The cluster as this node sees it, sans-IO: events in, actions out (spec/cluster.md).

:class:`ClusterState` composes the parts — who is in the cluster (members.py), where queue messages go
(routes.py), which peers want which topics (topics.py), where durable subscriptions live (hosting.py) —
and turns each event into the :mod:`actions <pymq_server.cluster.actions>` the node must take: a read of
the store (every heartbeat), a link that came up or went down, a control message from a peer, a local
change. It never touches a socket, the store, the broker's queues or a timer; time comes from a
:class:`Clock` (tests pass a fake one and move it), and the driver (node.py) does the I/O the actions
ask for. The broker's hot path asks it directly where a queue or topic message goes.

Invariants: a peer's link is *ready* only between the driver's ``link_up`` and ``link_down``/its death;
actions come out in the order the driver must take them (a dead peer's link closes before its outbox is
re-routed; the filter is announced before a receipt the announcement must precede).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import Protocol
from collections.abc import Callable, Mapping

from pymq.errors import PymqError
from pymq.routing.groups import RoutingKey
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
    MoveOrder,
    PeerDead,
    Replaced,
    Reroute,
    SendConsumers,
)
from pymq_server.cluster.hosting import Hosting
from pymq_server.cluster.members import Membership
from pymq_server.cluster.records import Hosted, Member
from pymq_server.cluster.routes import QueueRoutes
from pymq_server.cluster.topics import TopicInterest
from pymq_server.config import ClusterConfig

log = logging.getLogger("pymq.cluster")


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds (membership records carry the writers' wall clocks)."""
        ...

    def monotonic(self) -> float:
        """Seconds, never going back (intervals)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic(self) -> float:
        return time.monotonic()


@dataclass
class Figures:
    """Counters of the admin ``cluster`` operation (spec/admin.md), for tests and benchmarks."""

    forwarded: int = 0                  # messages a peer confirmed (outbox receipts)
    forwarded_topic_messages: int = 0   # topic messages forwarded to at least one peer
    received_forwarded: int = 0
    discarded_false_positive: int = 0   # forwarded here for a topic nobody subscribes to here
    redistributed: int = 0
    rerouted: int = 0
    held: int = 0                       # topic messages held for dead peers' durable subscribers
    held_refused: int = 0               # not held: the dead peer's outbox was at its cap
    held_transferred: int = 0           # held messages sent on to a subscription's new host
    held_purged: int = 0
    moves_ordered: int = 0              # coordinator: moves of idle subscriptions it ordered
    moved_out: int = 0                  # subscriptions this node moved to another by policy
    moves_refused: int = 0              # refused: a consumer was attached
    refused_stale_epoch: int = 0        # links, forwards and control frames of a node's former process


CONTROL_PREFIX = "/pymq/cluster/"


class ClusterState:
    def __init__(self, node_id: str, config: ClusterConfig, clock: Clock, *,
                 local_key: Callable[[str], RoutingKey], hosts_here: Callable[[str], bool], epoch: int = 0) -> None:
        self.node_id = node_id
        #: this process's HA epoch (spec/ha.md §5; 0 without ``ha:``), and the highest each node id has shown
        #: in its record or a link's CONNECT: what is lower is a fenced former process's
        self.epoch = epoch
        self.epochs: dict[str, int] = {}
        #: some node id has shown an epoch above 0 (sticky): until then no link can be below its node's
        #: highest, and a link's frames are not looked up one by one (LinkEpochs.check)
        self.epochs_shown = False
        self._latest: dict[str, Member] = {}        # each node's last record at its highest epoch
        self.fenced = False
        self.config = config
        self.clock = clock
        self.started = clock.now_ms()
        self.membership = Membership(node_id, config.dead_after_ms, config.group_routing)
        self.ready: set[str] = set()            # peers whose link is up
        self.routes = QueueRoutes(node_id, local_key, self.membership, self.ready)
        #: the peer a new message for a queue goes to, or None to keep it here (routes.py): asked per message,
        #: so the driver reaches the rule with no frame of the state's in between
        self.route_queue = self.routes.route
        self.topics = TopicInterest(node_id, self.started, config.filter_capacity, config.filter_fpr,
                                    config.popular_fraction, config.topic_filtering)
        self.hosting = Hosting(node_id, config.assignment, config.rebalance_interval_ms,
                               config.rebalance_max_moves, config.similar_slack, hosts_here)
        self.stopping = False
        self.figures = Figures()

    # -- the store, every heartbeat ------------------------------------------------------------------
    def read(self, members: list[Member], hosted: dict[str, Hosted], routing_keys: Mapping[str, str]
             ) -> list[Action]:
        """One read of the store: react to routing keys declared elsewhere, joins and deaths, subscriptions
        adopted elsewhere, and (the coordinator) place idle subscriptions."""
        actions: list[Action] = []
        members, fenced = self._current(members, actions)
        if fenced:
            return actions
        changed = self.routes.apply(routing_keys)
        if changed:
            actions.append(CheckRedistribution(tuple(sorted(changed))))
        change = self.membership.observe(members, self.clock.now_ms())
        for member in change.joined:
            log.info("cluster: node %s joined (%s)", member.node, member.address)
            self.topics.peer_joined(member.node)
        for peer in change.died:
            actions += self._peer_dead(peer)
        if change.first:
            # recovered outboxes of peers that died while this node was away
            actions += [Reroute(peer) for peer in sorted(self.membership.dead)]
        for peer in self.membership.peers:
            if peer not in self.ready:
                actions.append(Connect(peer, self.membership.members[peer].address))
        actions += self.hosting.read(hosted, self.membership.alive)
        actions += self._rebalance()
        return actions

    # -- epochs (spec/ha.md §5) -------------------------------------------------------------------------
    def _current(self, members: list[Member], actions: list[Action]) -> tuple[list[Member], bool]:
        """The records of this read as the highest epochs say: a record of a lower epoch than one already
        seen (a former live's beat that raced its fence) is read as the last record of the higher one; a
        higher epoch of a peer replaces it (actions); a higher epoch of this node fences this process."""
        out = []
        for member in members:
            node, epoch = member.node, member.epoch
            if node == self.node_id:
                if epoch > self.epoch and not self.fenced:
                    self.fenced = True
                    log.error("cluster: node %s's record is at epoch %d, this process holds %d: fenced",
                              node, epoch, self.epoch)
                    actions.append(Fenced(epoch))
                out.append(member)
                continue
            known = self.epochs.get(node)
            latest = self._latest.get(node)
            if known is not None and epoch < known:
                if epoch == 0 and latest is not None and member.started > latest.started:
                    # the node started again without ``ha:`` (no epoch) after its last record with one: not a
                    # former live (one of those has an epoch, and started before), so it is the node now
                    actions += self._replaced(node, 0)
                else:
                    held = self.membership.members.get(node)
                    if held is not None and held.epoch >= known:
                        out.append(held)
                    continue
            elif known is not None and epoch > known:
                actions += self._replaced(node, epoch)
            self._hold_epoch(node, epoch)
            self._latest[node] = member
            out.append(member)
        return out, self.fenced

    def _replaced(self, peer: str, epoch: int) -> list[Action]:
        log.warning("cluster: node %s is held at epoch %d now (taken over): its former process is refused",
                    peer, epoch)
        self._hold_epoch(peer, epoch)
        self.ready.discard(peer)
        if peer in self.topics.peers.peers:
            self.topics.peer_left(peer)
            self.topics.peer_joined(peer)           # match-all until the new process announces
        self.routes.drop_peer(peer)
        return [Replaced(peer, epoch)]

    def _hold_epoch(self, node: str, epoch: int) -> None:
        self.epochs[node] = epoch
        if epoch:
            self.epochs_shown = True

    def admits(self, peer: str, epoch: int) -> bool:
        """A frame on a link ``peer`` opened at ``epoch``: False (refuse it, counted) when the node id has
        shown a higher epoch since."""
        if epoch >= self.epochs.get(peer, 0):
            return True
        self.figures.refused_stale_epoch += 1
        return False

    def link_opened(self, peer: str, epoch: int) -> tuple[bool, list[Action]]:
        """``peer`` connected at ``epoch``: refused when lower than its highest; a higher one replaces it."""
        if not self.admits(peer, epoch):
            return False, []
        known = self.epochs.get(peer)
        if known is None or epoch == known:
            self._hold_epoch(peer, epoch)
            return True, []
        return True, self._replaced(peer, epoch)

    def _peer_dead(self, peer: str) -> list[Action]:
        log.warning("cluster: node %s is dead (no heartbeat for %d ms)", peer, self.config.dead_after_ms)
        self.ready.discard(peer)
        self.topics.peer_left(peer)
        self.routes.drop_peer(peer)
        return [PeerDead(peer)]

    def _rebalance(self) -> list[MoveOrder]:
        membership = self.membership
        if self.stopping or membership.alone or membership.coordinator != self.node_id:
            return []
        nodes = [self.node_id] + sorted(self.ready & set(membership.members))
        orders = self.hosting.rebalance(self.clock.monotonic(), nodes)
        self.figures.moves_ordered += len(orders)
        return list(orders)

    # -- links -----------------------------------------------------------------------------------------
    def link_up(self, peer: str) -> list[Action]:
        """The link to ``peer`` is up: it hears our filter and consumers first, then the outbox drains."""
        log.info("cluster: link to %s is up", peer)
        self.ready.add(peer)
        return [Announce((peer,)), SendConsumers((peer,)), AttachOutbox(peer)]

    def link_down(self, peer: str) -> None:
        if peer in self.ready and not self.stopping:
            log.info("cluster: link to %s is down", peer)
        self.ready.discard(peer)

    def ready_peers(self) -> tuple[str, ...]:
        return tuple(sorted(self.ready))

    # -- local changes ---------------------------------------------------------------------------------
    def topic_changed(self, topic: str, wanted: bool, pattern: bool = False) -> bool:
        """True when the filter changed: :meth:`announce` is due (the driver batches it per loop turn)."""
        return self.topics.changed(topic, wanted, pattern)

    def announce(self) -> list[Action]:
        """After a batch of filter changes: announce to every peer whose link is up."""
        if not self.topics.renew():
            return []
        return [Announce(self.ready_peers())] if self.ready else []

    # -- the hot path: where a message goes ----------------------------------------------------------
    def topic_targets(self, topic: str) -> tuple[list[str], list[str]]:
        """(live peers a message on ``topic`` goes to, dead hosts of durable subscriptions to it: held)."""
        membership = self.membership
        if membership.alone and not membership.dead:
            return [], []
        hosts = self.hosting.by_topic.get(topic, ())
        targets = self.topics.targets(topic, membership.members, hosts)
        # (per message: a topic without durable subscriptions, the common case, sorts nothing)
        held = sorted(h for h in hosts if h in membership.dead) if hosts else []
        if targets:
            self.figures.forwarded_topic_messages += 1
        return targets, held

    # -- what peers tell us --------------------------------------------------------------------------------
    def control(self, peer: str, kind: str, headers: Mapping[str, str], body: bytes) -> list[Action]:
        """A control message from ``peer`` (spec/cluster.md §2); raises PymqError for an unknown kind."""
        if kind == "filter":
            self.topics.announced(peer, headers, body)
            return []
        if kind == "drop-filter":
            self.topics.dropped(peer, self.membership.alive(peer) and not self.stopping)
            return []
        if kind == "consumers":
            counts = json.loads(body.decode("utf-8") or "{}")
            self.routes.consumers_of(peer, {str(q): int(n) for q, n in counts.items()})
            return [CheckRedistribution(None)]
        if kind == "move-subscription":
            return [FollowConsumer(headers["pymq-subscription"], peer)]
        if kind == "subscription":
            return [Adopt(json.loads(body.decode("utf-8")))]
        if kind == "drop-subscription":
            key = headers["pymq-subscription"]
            return [] if self.hosting.ours(key) else [DropAdopted(key)]
        if kind == "move-to":
            return [MoveOrder(headers["pymq-subscription"], self.node_id, headers["pymq-target"])]
        raise PymqError(f"unknown cluster control destination {CONTROL_PREFIX + kind!r}")

    # -- status --------------------------------------------------------------------------------------
    def status(self) -> dict:
        membership, hosting = self.membership, self.hosting
        status: dict[str, object] = {"node": self.node_id, "members": sorted(membership.members),
                                     "epoch": self.epoch, "epochs": dict(sorted(self.epochs.items()))}
        status.update(self.topics.status())
        status.update({"remote_consumers": self.routes.remote_consumers,
                       "assignments": dict(sorted(hosting.assignments.items())),
                       "routing_keys": {q: k.value for q, k in sorted(self.routes.routing_keys.items())},
                       "assignment": self.config.assignment, "dead": sorted(membership.dead),
                       "heartbeats": membership.reads})
        status.update(asdict(self.figures))
        return status
