"""The forwarding decision of seed 004: to which peers does a topic message go?

A node holds the latest ``BloomDigest`` each peer sent it and forwards a topic message only to peers whose
digest may contain the topic.  Popular topics (the caller decides which, e.g. subscribed on most nodes)
skip the probes and go to every peer, as the seed recommends.  A topic is hashed once per message
(``hash_pair``) whatever the number of peers.

Invariants - never lose a message for a subscriber:
- A peer known but without a digest yet (just joined), or whose digest uses a format or hash version this
  node does not understand, receives everything (match-all).
- Bloom filters have no false negatives, so ``targets`` includes every peer that has a subscriber; it
  may include a few that have none (false positives), which discard the message.
Sans-IO: the cluster layer feeds digests in and sends messages out.
"""
from __future__ import annotations

from types import ModuleType
from typing import NamedTuple, Union
from collections.abc import Callable, Iterable

from pymq.errors import ClusterError
from pymq.routing import bloom as _chosen
from pymq.routing.bloom import Digest

Topic = Union[str, bytes]
_UNDERSTOOD_FALLBACK = ("unsupported-hash-version", "unsupported-format")


class FilterVersion(NamedTuple):
    """Which announcement of a peer's filter a digest is (spec/cluster.md §2).

    ``incarnation``: when the peer started (a restarted peer counts again from 1); ``serial``: increases with
    every announcement of that incarnation; ``epoch``: increases when the peer regenerates its filter at a
    new size.  Announcements are ordered by (incarnation, serial); within one incarnation and epoch the
    filter's size (m, k) never changes.
    """

    incarnation: int
    serial: int
    epoch: int


class PeerFilters:
    """This node's view of its peers' subscription digests."""

    __slots__ = ("_digests", "_versions", "_order", "_popular", "_hash_pair", "stale")

    def __init__(self, *, popular: Iterable[str] = (), implementation: ModuleType | None = None) -> None:
        self._digests: dict[str, Digest | None] = {}
        self._versions: dict[str, FilterVersion] = {}
        self.stale = 0            # announcements ignored because a newer one was already applied
        self._order: tuple[str, ...] = ()  # peers in node-id order, rebuilt on membership change only
        self._popular: set[str] = set(popular)
        self._hash_pair: Callable[[Topic], tuple[int, int]] = (implementation or _chosen.implementation).hash_pair

    # -- membership --------------------------------------------------------------------------------
    def add_peer(self, node_id: str) -> None:
        """A peer joined; until its digest arrives it receives every topic message."""
        self._digests.setdefault(node_id, None)
        self._order = tuple(sorted(self._digests))

    def remove_peer(self, node_id: str) -> None:
        """A peer left.  Drop it only after the node taking over its subscribers has sent its new digest
        (spec/routing.md, hand-over), or messages for the handed-over subscribers are missed meanwhile."""
        self._digests.pop(node_id, None)
        self._versions.pop(node_id, None)
        self._order = tuple(sorted(self._digests))

    @property
    def peers(self) -> tuple[str, ...]:
        return self._order

    def digest(self, node_id: str) -> Digest | None:
        """The peer's current digest, or None while it is treated as match-all."""
        return self._digests[node_id]

    # -- digests -----------------------------------------------------------------------------------
    def update(self, node_id: str, digest: Digest | None) -> None:
        """Install a peer's latest digest (a ``BloomDigest`` of either implementation)."""
        self._install(node_id, digest)

    def _install(self, node_id: str, digest: Digest | None) -> None:
        new = node_id not in self._digests
        self._digests[node_id] = digest
        if new:
            self._order = tuple(sorted(self._digests))

    def update_from_bytes(self, node_id: str, data: bytes) -> bool:
        """Install a digest from its wire form.  Returns False when the format or hash version is not
        understood: the peer is then match-all.  Any other malformation raises ``ClusterError``."""
        try:
            digest = _chosen.BloomDigest.from_bytes(data)
        except ClusterError as exc:
            if getattr(exc, "reason", None) in _UNDERSTOOD_FALLBACK:
                self._install(node_id, None)
                return False
            raise
        self._install(node_id, digest)
        return True

    def version(self, node_id: str) -> FilterVersion | None:
        """The version of the peer's digest in use (None before any versioned announcement)."""
        return self._versions.get(node_id)

    def announce(self, node_id: str, data: bytes, version: FilterVersion) -> str:
        """Apply a versioned announcement of a peer's digest: ``"applied"``, ``"match-all"`` (format or hash
        version not understood) or ``"stale"`` (an announcement at least as new was applied already: this
        one is ignored, so a resized filter is never replaced by an older one of another size).  Raises
        ``ClusterError`` for a malformed digest, or (reason ``filter-size-mismatch``) for one whose size
        differs from the size already announced in the same incarnation and epoch."""
        current = self._versions.get(node_id)
        if current is not None and (version.incarnation, version.serial) <= (current.incarnation, current.serial):
            self.stale += 1
            return "stale"
        try:
            digest = _chosen.BloomDigest.from_bytes(data)
        except ClusterError as exc:
            if getattr(exc, "reason", None) in _UNDERSTOOD_FALLBACK:
                self._install(node_id, None)
                self._versions[node_id] = version
                return "match-all"
            raise
        held = self._digests.get(node_id)
        if current is not None and held is not None and version.incarnation == current.incarnation \
                and version.epoch == current.epoch and (held.m, held.k) != (digest.m, digest.k):
            raise ClusterError(f"peer {node_id} announced a filter of {digest.m} counters / {digest.k} hashes in "
                               f"epoch {version.epoch}, which had {held.m} / {held.k}",
                               reason="filter-size-mismatch", node=node_id)
        self._install(node_id, digest)
        self._versions[node_id] = version
        return "applied"

    # -- popular sources ---------------------------------------------------------------------------
    def mark_popular(self, topic: str) -> None:
        self._popular.add(topic)

    def unmark_popular(self, topic: str) -> None:
        self._popular.discard(topic)

    @property
    def popular(self) -> frozenset[str]:
        return frozenset(self._popular)

    def classify(self, topic: str, popular_fraction: float) -> bool:
        """Mark ``topic`` popular when at least ``popular_fraction`` of the peers may want it (their digest
        may contain it, or they are match-all), unmark it otherwise; needs two peers or more.  Returns
        whether it is popular now.  A popular topic is sent to every peer without probing (seed 004)."""
        peers = self._order
        if len(peers) < 2:
            self._popular.discard(topic)
            return False
        h1, h2 = self._hash_pair(topic)
        digests = self._digests
        matching = sum(1 for node in peers if (d := digests[node]) is None or d.might_contain_pair(h1, h2))
        if matching / len(peers) >= popular_fraction:
            self._popular.add(topic)
            return True
        self._popular.discard(topic)
        return False

    # -- the decision ------------------------------------------------------------------------------
    def targets(self, topic: Topic) -> list[str]:
        """Peers to forward a message on ``topic`` to, in node-id order."""
        if topic in self._popular:
            return list(self._order)
        h1, h2 = self._hash_pair(topic)
        digests = self._digests
        return [node for node in self._order
                if (d := digests[node]) is None or d.might_contain_pair(h1, h2)]
