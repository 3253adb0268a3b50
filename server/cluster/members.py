"""Who is in the cluster (spec/cluster.md §1), decided from the store's records alone: sans-IO.

Each read of the store's member records (with the reader's wall clock: a record's ``beat`` is the writer's
wall clock, and the store is the one place both meet) gives the live members — those that beat within
``dead_after_ms``, and this node always — and the dead ones: a record whose beats stopped. What changed
since the last read is returned as a :class:`MembershipChange` for the cluster's state to act on (connect
to a newcomer; forget a dead peer's filter, re-route its outbox). The valid destinations of group routing
are the live node ids (spec/routing.md §2), so the router is rebuilt when and only when they change.

Invariants: this node is always live to itself; a peer is live or dead, never both; the router's
destinations are exactly the live node ids.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterable

from pymq.routing import GroupRouter
from pymq_server.cluster.records import Member


@dataclass(frozen=True)
class MembershipChange:
    joined: tuple[Member, ...]      # peers live now that were not at the last read, in name order
    died: tuple[str, ...]           # peers live at the last read that are not now, in name order
    first: bool                     # the first read since this node started

    def __bool__(self) -> bool:
        return bool(self.joined or self.died)


class Membership:
    def __init__(self, node_id: str, dead_after_ms: int, group_routing: str = "rendezvous") -> None:
        self.node_id = node_id
        self.dead_after_ms = dead_after_ms
        self.group_routing = group_routing
        self.members: dict[str, Member] = {}         # live members, this node included (after the first read)
        self.dead: set[str] = set()                  # records whose beats stopped
        self.router = GroupRouter([node_id], strategy=group_routing)
        self.reads = 0
        self.alone = True               # no live peer: nothing routes elsewhere (asked per queue message)

    def observe(self, records: Iterable[Member], now_ms: int) -> MembershipChange:
        """A read of every member record at wall-clock ``now_ms``: the new live and dead sets."""
        records = list(records)
        alive = {m.node: m for m in records if m.node == self.node_id or m.alive(now_ms, self.dead_after_ms)}
        before = set(self.members)
        self.members = alive
        self.alone = len(alive) < 2
        self.dead = {m.node for m in records if m.node not in alive}
        self.reads += 1
        now = set(alive)
        if now != before:
            self.router = GroupRouter(sorted(now), strategy=self.group_routing)
        return MembershipChange(tuple(alive[p] for p in sorted(now - before - {self.node_id})),
                                tuple(sorted(before - now - {self.node_id})), self.reads == 1)

    def forget(self, peer: str) -> None:
        """An administrator deleted ``peer``'s record (purge-outbox with forget): it is neither live nor
        dead any more."""
        self.dead.discard(peer)

    def alive(self, node: str) -> bool:
        return node in self.members

    @property
    def peers(self) -> list[str]:
        """The live peers, in name order."""
        return sorted(p for p in self.members if p != self.node_id)

    @property
    def coordinator(self) -> str:
        """The first live node in UTF-8 order (spec/cluster.md §6): it places idle durable subscriptions."""
        return min(self.members or (self.node_id,), key=lambda n: n.encode("utf-8"))
