"""Which peers a topic message travels to (spec/cluster.md §2, §4; spec/routing.md §3): sans-IO.

This node's **interest**: a regenerating counting bloom filter of the topics its local subscriptions
want (pymq/routing/interest.py) and the topic patterns its pattern subscriptions want (spec/routing.md
§3.5, §5). While it holds a pattern its digest carries the match-all flag, and the announcement lists the
patterns themselves in ``pymq-filter-patterns`` (a JSON array of normal forms): a peer that reads that
header clears the flag, matches a topic against the digest's bits *and* the listed patterns (the compiled
``PatternIndex`` the broker matches with), and so forwards a pattern's topics only; a peer of an earlier
version ignores the header and forwards everything, as before. Announced with a version ``(incarnation,
serial, epoch)`` so that a receiver never applies an older announcement after a newer one.
The **peers' interest**: their latest digests (pymq/routing/forwarding.py) and pattern lists, match-all
until a peer says more; a topic matched by at least ``popular_fraction`` of them is *popular* and goes to
every peer without probing (seed 004). A topic message goes to the peers whose digest or patterns may want
its topic, plus every live host of a durable subscription to it the store names, and is *held* for the
dead ones (§5).

Invariants: the announcement a peer gets is the filter as it is after the last batch of changes (a cached
encoding is dropped whenever the filter changes); a peer that has not announced is match-all.
"""
from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Collection, Mapping

from pymq.protocol.numbers import header_int
from pymq.routing.forwarding import FilterVersion, PeerFilters
from pymq.routing.interest import InterestFilter
from pymq.routing.topics import PatternIndex, is_pattern, normalize

log = logging.getLogger("pymq.cluster")

#: topics remembered for re-classifying popularity when a peer's digest changes
RECENT_TOPICS = 10_000
#: the digest's flags byte and its match-all bit (spec/routing.md §3.4)
FLAGS_OFFSET, FLAG_MATCH_ALL = 3, 0x01
#: the header listing a node's topic patterns with its filter (spec/routing.md §3.5)
PATTERNS_HEADER = "pymq-filter-patterns"
#: at most this many patterns, of at most this many bytes in all, are announced; past either the
#: announcement goes without the list and peers forward this node everything (match-all, always correct)
MAX_ANNOUNCED_PATTERNS = 1_000
MAX_ANNOUNCED_PATTERN_BYTES = 32 * 1024
#: topics whose pattern decision is remembered per peer (cleared when its patterns change)
PATTERN_CACHE = 4_096


class PeerPatterns:
    """Every peer's announced patterns in one compiled index (the broker's ``PatternIndex``): for a topic,
    the peers whose patterns match it, with one match per topic until some peer's patterns change."""

    __slots__ = ("index", "owners", "by_peer", "cache")

    def __init__(self) -> None:
        self.index = PatternIndex()
        self.owners: dict[str, set[str]] = {}           # normal form -> peers that listed it
        self.by_peer: dict[str, list[str]] = {}         # peer -> its normal forms
        self.cache: dict[str, tuple[str, ...]] = {}

    def __bool__(self) -> bool:
        return bool(self.by_peer)

    def set(self, peer: str, patterns: list[str] | None) -> None:
        """``peer``'s patterns now (None: it listed none)."""
        for key in self.by_peer.pop(peer, ()):
            self.index.remove(key)
            owners = self.owners[key]
            owners.discard(peer)
            if not owners:
                del self.owners[key]
        if patterns:
            keys = sorted({normalize(p) for p in patterns})     # two spellings of one pattern: one
            for key in keys:
                self.index.add(key)
                self.owners.setdefault(key, set()).add(peer)
            self.by_peer[peer] = keys
        self.cache.clear()

    def of(self, peer: str) -> list[str] | None:
        return self.by_peer.get(peer)

    def peers_for(self, topic: str) -> tuple[str, ...]:
        cache = self.cache
        hit = cache.get(topic)
        if hit is None:
            owners = self.owners
            hit = tuple(sorted({peer for key in self.index.match(topic) for peer in owners[key]}))
            if len(cache) >= PATTERN_CACHE:
                cache.clear()
            cache[topic] = hit
        return hit


def parse_patterns(raw: str) -> list[str] | None:
    """A peer's ``pymq-filter-patterns``: the patterns, or None when the value is not a list of at most
    MAX_ANNOUNCED_PATTERNS topic patterns (the peer is then match-all: unknown means "may want anything")."""
    if len(raw.encode("utf-8")) > 2 * MAX_ANNOUNCED_PATTERN_BYTES:
        return None
    try:
        patterns = json.loads(raw)
    except (ValueError, RecursionError):         # deep nesting: not a list of names either
        return None
    if not isinstance(patterns, list) or len(patterns) > MAX_ANNOUNCED_PATTERNS or \
            not all(isinstance(p, str) and p and is_pattern(p) for p in patterns):
        return None
    return patterns


class TopicInterest:
    def __init__(self, node_id: str, incarnation: int, capacity: int, fpr: float, popular_fraction: float,
                 filtering: bool = True) -> None:
        self.node_id = node_id
        self.incarnation = incarnation                  # the node's start time, ms: announcements' first order
        self.filter = InterestFilter(capacity, fpr)
        self.patterns: set[str] = set()                 # topic patterns with local subscribers, in the filter
        #: announce the patterns themselves (False: the match-all digest alone, as nodes before did)
        self.announce_patterns = True
        self.serial = 0                                 # announcements of this incarnation
        self.dirty = False                              # changed since the last announcement
        self._announcement: tuple[dict[str, str], bytes] | None = None
        self.peers = PeerFilters()
        #: the patterns of peers whose announcement listed them (their digest's match-all flag cleared)
        self.peer_patterns = PeerPatterns()
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
            listed = self.listed_patterns()
            if listed is not None:
                headers[PATTERNS_HEADER] = listed
            self._announcement = (headers, self.filter.digest().to_bytes())
        return self._announcement

    def listed_patterns(self) -> str | None:
        """The ``pymq-filter-patterns`` value for the announcement: None without patterns, or past the
        bounds (the digest's match-all flag then stands alone, as before)."""
        patterns = self.patterns
        if not patterns or not self.announce_patterns or len(patterns) > MAX_ANNOUNCED_PATTERNS:
            return None
        value = json.dumps(sorted(patterns), ensure_ascii=False, separators=(",", ":"))
        return value if len(value.encode("utf-8")) <= MAX_ANNOUNCED_PATTERN_BYTES else None

    # -- the peers' interest -----------------------------------------------------------------------------
    def peer_joined(self, peer: str) -> None:
        self.peers.add_peer(peer)

    def peer_left(self, peer: str) -> None:
        self.peers.remove_peer(peer)
        self.peer_patterns.set(peer, None)

    def announced(self, peer: str, headers: Mapping[str, str], body: bytes) -> bool:
        """``peer``'s announcement; False when it is older than what we hold (ignored)."""
        raw = headers.get(PATTERNS_HEADER)
        patterns = parse_patterns(raw) if raw is not None else None
        if raw is not None and patterns is None:
            log.warning("cluster: %s announced patterns that are not a list of topic patterns: it gets "
                        "every topic message", peer)
        if patterns is not None and len(body) > FLAGS_OFFSET and body[FLAGS_OFFSET] & FLAG_MATCH_ALL:
            # the flag stands for the listed patterns: the bits are the peer's topics (spec/routing.md §3.5)
            body = body[:FLAGS_OFFSET] + bytes([body[FLAGS_OFFSET] & ~FLAG_MATCH_ALL]) + body[FLAGS_OFFSET + 1:]
        else:
            patterns = None
        if "pymq-filter-serial" in headers:
            version = FilterVersion(header_int(headers, "pymq-filter-incarnation", 0),
                                    header_int(headers, "pymq-filter-serial", 0),
                                    header_int(headers, "pymq-filter-epoch", 0))
            if self.peers.announce(peer, body, version) == "stale":
                return False
        else:
            self.peers.update_from_bytes(peer, body)      # a node without versioned announcements
        if self.peers.digest(peer) is None:
            patterns = None             # a digest it cannot read: match-all, and the list says nothing more
        self.peer_patterns.set(peer, patterns)
        for topic in list(self._recent):
            self.peers.classify(topic, self.popular_fraction)
        return True

    def dropped(self, peer: str, still_member: bool) -> None:
        """``peer`` asked us to forget its digest (it left after handing over): a peer that is still a
        member is match-all again until it says more."""
        self.peers.remove_peer(peer)
        self.peer_patterns.set(peer, None)
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
            if self.peer_patterns.by_peer:           # (a dict's truth: no call per message without patterns)
                targets = self._with_patterns(topic, targets, live)
        else:
            targets = [p for p in live if p != self.node_id]
        if hosts:
            for host in sorted(hosts):
                if host in live and host not in targets and host != self.node_id:
                    targets.append(host)
        return targets

    def _with_patterns(self, topic: str, targets: list[str], live: Collection[str]) -> list[str]:
        """``targets`` and the live peers whose announced patterns match ``topic``, in node-id order."""
        matched = self.peer_patterns.peers_for(topic)
        if not matched:
            return targets
        chosen = set(targets)
        extra = [p for p in matched if p not in chosen and p in live]
        return sorted(targets + extra) if extra else targets

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
                "patterns": self.peer_patterns.of(peer),
                "k": None if digest is None else digest.k,
                "epoch": None if version is None else version.epoch,
                "serial": None if version is None else version.serial}
