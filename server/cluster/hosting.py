"""Where durable subscriptions live (spec/cluster.md §5, §6): the assignment map and the decisions made
from it, sans-IO.

The store's map names the host and the record (topic, selector, ...) of every durable subscription;
this node keeps its last read, indexed by topic (a topic message goes to every live host of a durable
subscription to it and is held for the dead ones), plus what it claimed itself since (the store write
may still be on its way). From a new read it decides which held messages go on to a subscription that
another node adopted; from the assignment policy (pymq/routing/assignment.py) it decides, as the
coordinator, which idle subscriptions move and, as a leaving node, which peer takes each of its own.

Invariants: a subscription is ordered to move at most once per ``10 × rebalance_interval_ms``; one this
node is moving away (a transfer in progress, ``transfers``) is not moved a second time meanwhile; a
subscription adopted at another node's request (``quiet``) is recorded by that node, not claimed here.
"""
from __future__ import annotations

from collections.abc import Callable, Collection

from pymq.routing.assignment import (
    AssignmentPolicy,
    Placement,
    Policy,
    SimilarPolicy,
    make_policy,
    parse_policy,
    recipient_of,
    reconsider,
)
from pymq_server.cluster.actions import HeldTransfer, MoveOrder
from pymq_server.cluster.records import Hosted


class Hosting:
    def __init__(self, node_id: str, assignment: str, rebalance_interval_ms: int, rebalance_max_moves: int,
                 similar_slack: float, hosts_here: Callable[[str], bool]) -> None:
        self.node_id = node_id
        self.assignment = assignment
        self.rebalance_interval_ms = rebalance_interval_ms
        self.rebalance_max_moves = rebalance_max_moves
        self.similar_slack = similar_slack
        self.hosts_here = hosts_here                    # does this node hold durable subscription ``key`` now
        self.hosted: dict[str, Hosted] = {}             # the store's map, as last read
        self.assignments: dict[str, str] = {}           # subscription -> host: the map and our own claims
        self.by_topic: dict[str, set[str]] = {}         # topic -> other nodes hosting a durable subscription
        self.quiet: set[str] = set()                    # adopting at another node's request right now
        self.transfers: set[str] = set()                # being moved away from here right now
        self.ordered: dict[str, float] = {}             # coordinator: subscription -> when a move was ordered
        self._last_rebalance: float | None = None

    # -- the store's map ---------------------------------------------------------------------------------
    def read(self, hosted: dict[str, Hosted], alive: Callable[[str], bool]) -> list[HeldTransfer]:
        """A new read of the map: the index by topic, and what this node held for a dead host's
        subscription that another node has adopted since the last read."""
        previous, self.hosted = self.hosted, hosted
        assignments = {key: h.node for key, h in hosted.items()}
        for key, node in self.assignments.items():
            if node == self.node_id and key not in assignments and self.hosts_here(key):
                assignments[key] = node            # claimed here; the store write is still on its way
        self.assignments = assignments
        by_topic: dict[str, set[str]] = {}
        for h in hosted.values():
            if h.topic is not None and h.node != self.node_id:
                by_topic.setdefault(h.topic, set()).add(h.node)
        self.by_topic = by_topic
        transfers = []
        for key, before in previous.items():
            now = hosted.get(key)
            if now is None or now.node == before.node or before.topic is None or alive(before.node):
                continue
            record = before.record or {}
            transfers.append(HeldTransfer(before.node, key, before.topic, record.get("selector"), now.node,
                                          before.topic not in self.held_topics(before.node)))
        return transfers

    def held_topics(self, peer: str) -> set[str]:
        """The topics of the durable subscriptions the map names ``peer`` as the host of."""
        return {h.topic for h in self.hosted.values() if h.node == peer and h.topic is not None}

    def subscriptions_of(self, peer: str) -> list[str]:
        return sorted(k for k, h in self.hosted.items() if h.node == peer)

    def forget(self, peer: str) -> None:
        """``peer``'s record was deleted for good: nothing is held for it any more."""
        self.by_topic = {t: {n for n in hosts if n != peer} for t, hosts in self.by_topic.items()}

    # -- this node's own subscriptions -----------------------------------------------------------------
    def created_here(self, key: str) -> bool:
        """A durable subscription now lives here; False when it is an adoption at another node's
        request (that node records the new host itself, after moving the messages)."""
        if key in self.quiet:
            return False
        self.assignments[key] = self.node_id
        return True

    def removed_here(self, key: str) -> bool:
        """A durable subscription hosted here is gone; True when the store's entry must go too."""
        if self.assignments.get(key) != self.node_id:
            return False
        del self.assignments[key]
        return True

    def moved(self, key: str, to: str) -> None:
        """``key`` now lives on ``to`` (recorded before the local copy is dropped, so the drop does not
        erase the new host's entry)."""
        self.assignments[key] = to

    def ours(self, key: str) -> bool:
        return self.assignments.get(key) == self.node_id

    # -- the assignment policy ----------------------------------------------------------------------------
    def _policy(self) -> Policy | None:
        options = {"slack": float(self.similar_slack)} \
            if parse_policy(self.assignment) is AssignmentPolicy.SIMILAR else {}
        return make_policy(self.assignment, **options)

    def placement(self, nodes: Collection[str], exclude: str | None = None) -> tuple[Placement, dict[str, dict]]:
        """The recipients of the map on ``nodes`` (each at the node hosting most of its subscriptions),
        and recipient -> {subscription key: host}."""
        keys: dict[str, dict[str, str]] = {}
        topics: dict[str, set[str]] = {}
        for key, hosted in sorted(self.hosted.items()):
            if key == exclude or hosted.topic is None or hosted.node not in nodes:
                continue
            r = recipient_of(key)
            keys.setdefault(r, {})[key] = hosted.node
            topics.setdefault(r, set()).add(hosted.topic)
        placement = Placement(sorted(nodes))
        for r in sorted(keys):
            hosts = list(keys[r].values())
            home = max(sorted(set(hosts)), key=hosts.count)
            placement.assign(r, sorted(topics[r]), home)
        return placement, keys

    def successor(self, key: str, topic: str, peers: Collection[str]) -> str | None:
        """Where durable subscription ``key`` goes when this node leaves: the policy's choice among
        ``peers`` (balance: the peer hosting the fewest)."""
        peers = sorted(peers)
        if not peers:
            return None
        policy = self._policy()
        if policy is None:
            load = {p: 0 for p in peers}
            for node in self.assignments.values():
                if node in load:
                    load[node] += 1
            return min(peers, key=lambda p: (load[p], p))
        placement, _ = self.placement(peers, exclude=key)
        recipient = recipient_of(key)
        topics = set(placement.topics_of.get(recipient, ())) | {topic}
        if recipient in placement.where:
            placement.unassign(recipient)
        return policy.choose(placement, recipient, sorted(topics))

    def rebalance(self, now: float, nodes: Collection[str]) -> list[MoveOrder]:
        """The coordinator's round (spec/cluster.md §6), when one is due at monotonic time ``now``: every
        recipient reconsidered once, at most ``rebalance_max_moves`` of them moved; the subscriptions to
        move, each with its host and target. ``nodes``: this node and the peers whose link is up."""
        interval = self.rebalance_interval_ms
        policy = self._policy()
        if interval == 0 or policy is None or len(nodes) < 2:
            return []
        if self._last_rebalance is not None and (now - self._last_rebalance) * 1000 < interval:
            return []
        self._last_rebalance = now
        quiet_for = 10 * interval / 1000
        ordered = self.ordered = {k: t for k, t in self.ordered.items() if now - t < quiet_for}
        placement, keys = self.placement(nodes)
        if isinstance(policy, SimilarPolicy):
            policy.expected = len(placement)
        moves = reconsider(placement, policy, sorted(keys),
                           movable=lambda r: not any(k in ordered for k in keys[r]),
                           max_moves=self.rebalance_max_moves)
        orders = []
        for recipient, _, target in moves:
            for key, host in sorted(keys[recipient].items()):
                if host == target:
                    continue
                ordered[key] = now
                orders.append(MoveOrder(key, host, target))
        return orders
