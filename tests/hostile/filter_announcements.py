"""A cluster peer's filter announcement as an input surface (spec/routing.md §3.4-3.5): the digest bytes and
the ``pymq-filter-patterns`` list, and the one property every announcement must keep, whatever its bytes.
Used by tests/hostile/test_filter_announcements.py and the coverage-guided target ``bench/fuzz_targets.py
filter``."""
from __future__ import annotations

from pymq.errors import ClusterError
from pymq_server.cluster import topics as cluster_topics

PROBES = ("a", "a.b", "stocks.ibm", "stocks.ibm.x", "bonds", "")


def check_announcement(body: bytes, raw: str | None) -> str:
    """Apply ``peer``'s announcement to a fresh node and check it: refused with a ClusterError (a malformed
    digest), or applied so that a topic goes to the peer exactly when the digest is match-all, its bits may
    hold the topic, or a listed pattern matches it (never anything else raised, never a wanted topic left
    out).  Returns ``"refused"``, ``"match-all"``, ``"patterns"`` or ``"digest"``."""
    interest = cluster_topics.TopicInterest("me", 1, 10, 0.01, 1.0)
    interest.peer_joined("peer")
    headers = {"pymq-filter-serial": "1", "pymq-filter-incarnation": "1", "pymq-filter-epoch": "0"}
    if raw is not None:
        headers[cluster_topics.PATTERNS_HEADER] = raw
    try:
        interest.announced("peer", headers, body)
    except ClusterError:
        return "refused"
    listed = cluster_topics.parse_patterns(raw) if raw is not None else None
    digest = interest.peers.digest("peer")
    kept = interest.peer_patterns.of("peer")
    probes = PROBES + tuple(p.replace("*", "x").replace("#", "y.z") for p in (listed or [])[:5])
    for topic in probes:
        sent = interest.targets(topic, {"me", "peer"}) == ["peer"]
        if digest is None or digest.match_all:
            assert sent and kept is None, (topic, raw)
            continue
        by_bits = digest.might_contain(topic)
        by_patterns = kept is not None and _matches(kept, topic)
        assert sent == (by_bits or by_patterns), (topic, raw, by_bits, by_patterns)
    if digest is None or digest.match_all:
        return "match-all"
    return "patterns" if kept else "digest"


def _matches(patterns: list[str], topic: str) -> bool:
    from pymq.routing.topics import matches
    return any(matches(p, topic) for p in patterns)
