"""Which peers a topic message travels to (spec/cluster.md §2, §4; spec/routing.md §3): sans-IO.

This node's **interest**: a regenerating counting bloom filter of the topics its local subscriptions
want (pymq/routing/interest.py) and of the topic patterns its pattern subscriptions want (spec/routing.md
§3.5, §5: while it holds one its digest is match-all, so every peer forwards every topic message here),
announced to every peer after each batch of changes with a version ``(incarnation, serial, epoch)`` so that
a receiver never applies an older announcement after a newer one.
The **peers' interest**: their latest digests (pymq/routing/forwarding.py), match-all until a peer says
more; a topic matched by at least ``popular_fraction`` of them is *popular* and goes to every peer without
probing (seed 004). A topic message goes to the peers whose digest may contain its topic, plus every live
host of a durable subscription to it the store names, and is *held* for the dead ones (§5).

Invariants: the announcement a peer gets is the filter as it is after the last batch of changes (a cached
encoding is dropped whenever the filter changes); a peer that has not announced is match-all.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Collection, Mapping

from pymq.protocol.numbers import header_int
from pymq.routing.forwarding import FilterVersion, PeerFilters
from pymq.routing.interest import InterestFilter

log = logging.getLogger("pymq.cluster")

#: topics remembered for re-classifying popularity when a peer's digest changes
RECENT_TOPICS = 10_000


class TopicInterest:
    def __init__(self, node_id: str, incarnation: int, capacity: int, fpr: float, popular_fraction: float,
                 filtering: bool = True) -> None:
        self.node_id = node_id
        self.incarnation = incarnation                  # the node's start time, ms: announcements' first order
        self.filter = InterestFilter(capacity, fpr)
        self.patterns: set[str] = set()                 # topic patterns with local subscribers, in the filter
        self.serial = 0                                 # announcements of this incarnation
        self.dirty = False                              # changed since the last announcement
        self._announcement: tuple[dict[str, str], bytes] | None = None
        self.peers = PeerFilters()
        self.popular_fraction = popular_fraction
        self.filtering = filtering
        self._recent: OrderedDict[str, None] = OrderedDict()

    # -- this node's interest ---------------------------------------------------------------------------
    def changed(self, topic: str, wanted: bool, pattern: bool = False) -> bool:
        """A local subscription of ``topic`` (a pattern topic's normal form when ``pattern``) came or went
        (``wanted``: some remain); True if the filter changed (an announcement is then due)."""
        if pattern:
            if wanted and topic not in self.patterns:
                self.patterns.add(topic)
                self.filter.add_pattern(topic)
            elif not wanted and topic in self.patterns:
                self.patterns.discard(topic)
                self.filter.remove_pattern(topic)
            else:
                return False
        elif wanted and topic not in self.filter:
            self.filter.add(topic)
        elif not wanted and topic in self.filter:
            self.filter.remove(topic)
        else:
            return False
        self.dirty = True
        return True

    def renew(self) -> bool:
        """After a batch of changes: regenerate the filter if its measured rate misses the target, and
        make the next announcement (a new serial). False when nothing changed since the last one."""
        if not self.dirty:
            return False
        self.dirty = False
        before = self.filter.filter.m
        if self.filter.check():
            log.info("cluster: subscription filter regenerated for %d topics: %d -> %d counters (epoch %d)",
                     len(self.filter), before, self.filter.filter.m, self.filter.epoch)
        self._announcement = None
        self.serial += 1
        return True

    def announcement(self) -> tuple[dict[str, str], bytes]:
        """The control message that announces the filter as it is (spec/cluster.md §2)."""
        if self._announcement is None:
            headers = {"destination": "/pymq/cluster/filter", "pymq-node": self.node_id,
                       "content-type": "application/octet-stream",
                       "pymq-filter-incarnation": str(self.incarnation),
                       "pymq-filter-serial": str(self.serial),
                       "pymq-filter-epoch": str(self.filter.epoch)}
            self._announcement = (headers, self.filter.digest().to_bytes())
        return self._announcement

    # -- the peers' interest -----------------------------------------------------------------------------
    def peer_joined(self, peer: str) -> None:
        self.peers.add_peer(peer)

    def peer_left(self, peer: str) -> None:
        self.peers.remove_peer(peer)

    def announced(self, peer: str, headers: Mapping[str, str], body: bytes) -> bool:
        """``peer``'s announcement; False when it is older than what we hold (ignored)."""
        if "pymq-filter-serial" in headers:
            version = FilterVersion(header_int(headers, "pymq-filter-incarnation", 0),
                                    header_int(headers, "pymq-filter-serial", 0),
                                    header_int(headers, "pymq-filter-epoch", 0))
            if self.peers.announce(peer, body, version) == "stale":
                return False
        else:
            self.peers.update_from_bytes(peer, body)      # a node without versioned announcements
        for topic in list(self._recent):
            self.peers.classify(topic, self.popular_fraction)
        return True

    def dropped(self, peer: str, still_member: bool) -> None:
        """``peer`` asked us to forget its digest (it left after handing over): a peer that is still a
        member is match-all again until it says more."""
        self.peers.remove_peer(peer)
        if still_member:
            self.peers.add_peer(peer)

    # -- where a topic message goes ---------------------------------------------------------------------
    def targets(self, topic: str, live: Collection[str], hosts: Collection[str] = ()) -> list[str]:
        """The live peers a message on ``topic`` goes to: those whose digest may want it (every peer for a
        popular topic; every peer without filtering), and the live ``hosts`` of durable subscriptions to
        it (a host gets it even before its digest arrives)."""
        recent = self._recent
        if topic in recent:
            recent.move_to_end(topic)
        else:
            recent[topic] = None
            if len(recent) > RECENT_TOPICS:
                recent.popitem(last=False)
            self.peers.classify(topic, self.popular_fraction)
        if self.filtering:
            targets = [p for p in self.peers.targets(topic) if p in live]
        else:
            targets = [p for p in live if p != self.node_id]
        for host in sorted(hosts):
            if host in live and host not in targets and host != self.node_id:
                targets.append(host)
        return targets

    def status(self) -> dict:
        f = self.filter
        return {"filter_topics": sorted(f.topics), "filter_patterns": sorted(self.patterns),
                "filter": {"topics": len(f), "m": f.filter.m, "k": f.filter.k, "capacity": f.capacity,
                           "epoch": f.epoch, "serial": self.serial, "fpr_target": f.fpr_target,
                           "measured_fpr": f.measured_fpr(), "digest_bytes": 8 + (f.filter.m + 7) // 8},
                "peer_filters": {p: self._peer_status(p) for p in self.peers.peers},
                "popular": sorted(self.peers.popular)}

    def _peer_status(self, peer: str) -> dict:
        digest = self.peers.digest(peer)
        version = self.peers.version(peer)
        return {"match_all": digest is None or digest.match_all, "m": None if digest is None else digest.m,
                "k": None if digest is None else digest.k,
                "epoch": None if version is None else version.epoch,
                "serial": None if version is None else version.serial}
