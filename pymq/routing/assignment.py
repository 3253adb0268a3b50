"""Where recipients live (seed 004): the assignment of durable subscribers to nodes, by policy.

A *recipient* is what the seed assigns to a message server: here the owner of durable subscriptions (a
client id; a shared subscription is a recipient of its own), with the set of topics (sources) it subscribes
to.  A node stores one copy of each topic message for all its recipients, so how recipients are grouped on
nodes decides how many copies of a message the cluster forwards and stores.

Policies:

- ``hash`` (the baseline): ``rendezvous(recipient id)`` over the nodes (spec/routing.md §2.2).  Stateless,
  evenly spread, and a membership change moves only about 1/N of the recipients; but a popular source's
  subscribers are spread over every node, so each of its messages is stored N times.
- ``similar`` (the seed's "assigning similar recipients to the same message server"): a recipient goes to
  the node whose stored topics overlap its own the most — the intersection ``|T(r) ∩ T(node)|``, the
  numerator of their Jaccard index — weighted by the room the node has left, ``overlap × (capacity -
  load)``, among the nodes below a capacity of ``(1 + slack) × recipients / N`` (so consolidation never
  piles everyone on a few nodes); ties go to the current node, then the least loaded; a recipient sharing
  nothing goes to the least loaded node.  This is greedy streaming partitioning — linear deterministic
  greedy (Stanton & Kliot, KDD 2012) on the recipients' topic sets, the min-max hypergraph setting of
  Alistarh et al. (NeurIPS 2015) — the seed's "identifying patterns of similar subscriptions" done one
  recipient at a time, so it scales to millions of recipients.
- ``balance`` (the cluster's earlier behaviour): recipients stay where they subscribed; a leaving node's
  go to the least loaded peer.  It places nothing by itself.

The same code runs in a cluster node (the coordinator plans moves of idle durable subscriptions:
spec/cluster.md §6) and in the internet-scale simulation (bench/bench_cluster_sim.py).  Sans-IO.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from pymq import enums
from pymq.errors import ConfigError
from pymq.routing.groups import GroupRouter


class AssignmentPolicy(enums.StrEnum):
    BALANCE = "balance"
    HASH = "hash"
    SIMILAR = "similar"


def parse_policy(value: AssignmentPolicy | str) -> AssignmentPolicy:
    try:
        return AssignmentPolicy(value)
    except ValueError:
        raise ConfigError(f"assignment must be one of {', '.join(p.value for p in AssignmentPolicy)}, "
                          f"got {value!r}", assignment=str(value)) from None


def recipient_of(subscription_key: str) -> str:
    """The recipient a durable subscription belongs to: ``sub:<owner>:<name>`` -> ``<owner>``; a shared
    subscription (``sub:shared:<name>``) is a recipient of its own."""
    _, owner, name = (subscription_key.split(":", 2) + ["", ""])[:3]
    return f"shared:{name}" if owner == "shared" else owner


class Placement:
    """Which node each recipient is on, and what that makes each node store.

    ``holders[topic]`` maps each node storing the topic to the number of its recipients subscribing to it:
    a node stores (and is forwarded) a topic's messages iff it appears there.
    """

    __slots__ = ("_nodes", "where", "topics_of", "holders", "load", "_heap")

    def __init__(self, nodes: Iterable[str]) -> None:
        self._nodes: list[str] = []
        self.where: dict[str, str] = {}                   # recipient -> node
        self.topics_of: dict[str, tuple[str, ...]] = {}   # recipient -> its topics
        self.holders: dict[str, dict[str, int]] = {}      # topic -> node -> recipients there subscribing
        self.load: dict[str, int] = {}                    # node -> recipients
        self._heap: list[tuple[int, str]] = []            # (load, node), lazily corrected
        for node in nodes:
            self.add_node(node)
        if not self._nodes:
            raise ConfigError("a placement needs at least one node")

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self._nodes)

    def __len__(self) -> int:
        return len(self.where)

    def add_node(self, node: str) -> None:
        if node in self.load:
            return
        self._nodes = sorted(self._nodes + [node], key=lambda n: n.encode("utf-8"))
        self.load[node] = 0
        heapq.heappush(self._heap, (0, node))

    def remove_node(self, node: str) -> list[str]:
        """Take a node away; returns its recipients, now unassigned (the caller places them)."""
        orphans = [r for r, n in self.where.items() if n == node]
        for r in orphans:
            self.unassign(r)
        self._nodes.remove(node)
        del self.load[node]
        self._heap = [(load, n) for load, n in self._heap if n != node]
        heapq.heapify(self._heap)
        return orphans

    def assign(self, recipient: str, topics: Sequence[str], node: str) -> None:
        if recipient in self.where:
            self.unassign(recipient)
        topics = tuple(topics)
        self.where[recipient] = node
        self.topics_of[recipient] = topics
        self.load[node] += 1
        heapq.heappush(self._heap, (self.load[node], node))
        holders = self.holders
        for t in topics:
            h = holders.get(t)
            if h is None:
                holders[t] = {node: 1}
            else:
                h[node] = h.get(node, 0) + 1

    def unassign(self, recipient: str) -> str:
        node = self.where.pop(recipient)
        topics = self.topics_of.pop(recipient)
        self.load[node] -= 1
        heapq.heappush(self._heap, (self.load[node], node))
        holders = self.holders
        for t in topics:
            h = holders[t]
            n = h[node] - 1
            if n:
                h[node] = n
            else:
                del h[node]
                if not h:
                    del holders[t]
        return node

    def least_loaded(self, below: int | None = None) -> str | None:
        """A node with the fewest recipients (the first in name order among equals), or None if none has
        fewer than ``below``."""
        heap, load = self._heap, self.load
        while heap:
            n_load, node = heap[0]
            if node not in load or load[node] != n_load:
                heapq.heappop(heap)          # stale entry
                continue
            if below is not None and n_load >= below:
                return None
            return node
        return None

    def stored_on(self, topic: str) -> int:
        """How many nodes store (are forwarded) this topic's messages."""
        return len(self.holders.get(topic, ()))

    def topics_by_node(self) -> dict[str, list[str]]:
        """Every node's stored topics (one pass over the holders)."""
        out: dict[str, list[str]] = {n: [] for n in self._nodes}
        for topic, h in self.holders.items():
            for node in h:
                out[node].append(topic)
        return out

    def overlap(self, topics: Iterable[str]) -> dict[str, int]:
        """For each node storing any of ``topics``: how many of them it stores."""
        scores: dict[str, int] = {}
        get = scores.get
        holders = self.holders
        for t in topics:
            h = holders.get(t)
            if h:
                for node in h:
                    scores[node] = get(node, 0) + 1
        return scores


class Policy(Protocol):
    name: AssignmentPolicy

    def choose(self, placement: Placement, recipient: str, topics: Sequence[str],
               current: str | None = None) -> str: ...


class HashPolicy:
    """rendezvous(recipient) over the placement's nodes."""

    name = AssignmentPolicy.HASH

    def __init__(self) -> None:
        self._router: GroupRouter | None = None

    def _for(self, nodes: tuple[str, ...]) -> GroupRouter:
        router = self._router
        if router is None or router.destinations != nodes:
            router = self._router = GroupRouter(nodes)
        return router

    def choose(self, placement: Placement, recipient: str, topics: Sequence[str],
               current: str | None = None) -> str:
        return self._for(placement.nodes).route(recipient)


class SimilarPolicy:
    """The node whose stored topics overlap the recipient's most, below the capacity bound."""

    name = AssignmentPolicy.SIMILAR

    def __init__(self, slack: float = 0.1, expected: int | None = None) -> None:
        if slack < 0:
            raise ConfigError("the similar policy's slack must not be negative", slack=slack)
        self.slack = slack
        self.expected = expected        # recipients the capacity is computed for (default: those placed)
        self._tiebreak = HashPolicy()

    def capacity(self, placement: Placement, adding: int = 1) -> int:
        total = self.expected if self.expected is not None else len(placement) + adding
        return max(1, math.ceil((1.0 + self.slack) * total / len(placement.nodes)))

    def choose(self, placement: Placement, recipient: str, topics: Sequence[str],
               current: str | None = None, *, cap: int | None = None, exclude: str | None = None) -> str:
        """The recipient must be unassigned; ``current`` is where it was (it stays there on a tie).
        ``cap`` overrides the capacity bound; ``exclude`` is a node it must leave (shedding).

        A new recipient (no ``current``): each node below the bound weighs ``(overlap + 1) × (cap - load)``
        — the overlap, plus one so that an empty node competes, times the room left (linear deterministic
        greedy); without the room factor the first nodes fill to the bound with everyone sharing a popular
        topic and the last ones stay empty.  A placed recipient being reconsidered moves only for strictly
        more overlap (moves cost messages), or, sharing nothing where it is, to a node emptier than its own.
        Ties: the current node, then the least loaded, then the recipient's own rendezvous order (so
        recipients sharing nothing spread evenly)."""
        if cap is None:
            cap = self.capacity(placement)
        load = placement.load
        scores = placement.overlap(topics)
        candidates = set(scores)
        if current is not None and current in load:
            candidates.add(current)
        empty = placement.least_loaded(below=cap)
        if empty is not None:
            candidates.add(empty)
            hashed = self._tiebreak.choose(placement, recipient, topics)
            if load[hashed] == load[empty]:
                candidates.add(hashed)
        else:
            hashed = None
        stay = current is not None and current in load and current != exclude and load[current] < cap and (
            scores.get(current, 0) > 0 or empty is None or load[empty] >= load[current])
        best, best_key = None, None
        for node in candidates:
            n_load = load[node]
            if n_load >= cap or node == exclude:
                continue                                  # full: a node at the bound takes no one
            score = scores.get(node, 0)
            weight = (score + 1) * (cap - n_load) if current is None else score
            key = (weight, stay and node == current, -n_load, node == hashed)
            if best_key is None or key > best_key:
                best, best_key = node, key
        if best is None:                                  # every node at the bound (slack 0)
            best = min((n for n in placement.nodes if n != exclude), key=lambda n: (load[n], n))
        return best


def make_policy(policy: AssignmentPolicy | str, **options: Any) -> Policy | None:
    """The policy object for a setting; None for ``balance`` (it places nothing)."""
    kind = parse_policy(policy)
    if kind is AssignmentPolicy.HASH:
        return HashPolicy()
    if kind is AssignmentPolicy.SIMILAR:
        return SimilarPolicy(**options)
    return None


# -- plans ----------------------------------------------------------------------------------------------
def place_all(placement: Placement, policy: Policy, recipients: Iterable[tuple[str, Sequence[str]]]) -> None:
    """Stream recipients (id, topics) into the placement, one decision each."""
    for recipient, topics in recipients:
        placement.assign(recipient, topics, policy.choose(placement, recipient, topics))


def reconsider(placement: Placement, policy: Policy, recipients: Iterable[str],
               movable: Callable[[str], bool] | None = None,
               max_moves: int | None = None) -> list[tuple[str, str, str]]:
    """One pass over ``recipients``: each is taken out and placed again by the policy (staying where it is
    unless the policy prefers another node).  ``movable(recipient)`` False pins one (a subscription with a
    consumer).  Returns the moves (recipient, from, to), at most ``max_moves``."""
    moves: list[tuple[str, str, str]] = []
    for r in recipients:
        if max_moves is not None and len(moves) >= max_moves:
            break
        current = placement.where.get(r)
        if current is None or (movable is not None and not movable(r)):
            continue
        topics = placement.topics_of[r]
        placement.unassign(r)
        target = policy.choose(placement, r, topics, current=current)
        placement.assign(r, topics, target)
        if target != current:
            moves.append((r, current, target))
    return moves


def shed(placement: Placement, policy: Policy, movable: Callable[[str], bool] | None = None,
         max_moves: int | None = None) -> list[tuple[str, str, str]]:
    """After a node joins, give it its share.  ``hash``: every recipient whose rendezvous winner changed
    moves (about 1/N, all to the newcomer).  ``similar``: about as few — recipients leave the most loaded
    nodes (above the fair share, recipients / nodes), the least attached first (those sharing the fewest
    topics with other recipients of their node), until as many have moved as a fair share holds; each goes
    where the policy places it among the nodes below the fair share (mostly the newcomer).  Returns the
    moves (recipient, from, to)."""
    moves: list[tuple[str, str, str]] = []
    if isinstance(policy, HashPolicy):
        router = policy._for(placement.nodes)
        for r, node in list(placement.where.items()):
            target = router.route(r)
            if target != node and (movable is None or movable(r)):
                if max_moves is not None and len(moves) >= max_moves:
                    break
                placement.assign(r, placement.topics_of[r], target)
                moves.append((r, node, target))
        return moves
    if not isinstance(policy, SimilarPolicy):
        return []
    fair = max(1, math.ceil(len(placement) / len(placement.nodes)))
    budget = min(fair, max_moves) if max_moves is not None else fair
    members: dict[str, list[str]] = {}
    for r, node in placement.where.items():
        members.setdefault(node, []).append(r)
    holders = placement.holders
    order: dict[str, list[str]] = {}          # per node: its recipients, most attached first (popped from the end)
    while len(moves) < budget:
        node = max(placement.nodes, key=lambda n: (placement.load[n], n))
        if placement.load[node] <= fair:
            break
        queue = order.get(node)
        if queue is None:
            # attachment: the topics a recipient shares with other recipients of its node, measured once
            # per node (the ranking barely changes as a few recipients leave)
            queue = order[node] = sorted(
                (r for r in members.get(node, ()) if movable is None or movable(r)),
                key=lambda r: (-sum(1 for t in placement.topics_of[r] if holders[t].get(node, 0) > 1), r))
        moved_one = False
        while queue:
            r = queue.pop()
            if placement.where.get(r) != node:
                continue
            topics = placement.topics_of[r]
            placement.unassign(r)
            target = policy.choose(placement, r, topics, cap=fair, exclude=node)
            placement.assign(r, topics, target)
            moves.append((r, node, target))
            moved_one = True
            break
        if not moved_one:
            break
    return moves


def iter_moves_by_node(moves: Iterable[tuple[str, str, str]]) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """Group moves by the node that must carry them out (the current host)."""
    grouped: dict[str, list[tuple[str, str]]] = {}
    for r, source, target in moves:
        grouped.setdefault(source, []).append((r, target))
    yield from sorted(grouped.items())
