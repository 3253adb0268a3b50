"""A node's topic interest: the topics its subscribers want, and a counting bloom filter of them that keeps
its false-positive target as the topics come and go (seed 004, spec/routing.md §3.8).

A counting filter cannot be resized from its counters (they do not say which topics made them), but a
node knows its subscribed topics anyway, so the filter is *regenerated* from them, as the seed proposes
("if the bloom filter becomes unacceptably inaccurate ... the bloom filter may be regenerated based on the
current recipient profiles").  The decision is made from the **measured** fill of the filter, not from a
count: the false-positive rate of a filter with a fraction ``f`` of its counters non-zero and ``k`` hashes
is ``f ** k``; when that exceeds ``tolerance`` times the target, the filter grows; when the topics fall far
below the filter's size, it shrinks (never below the configured capacity), so a digest stays small.

Each regeneration starts a new **epoch**; announcements carry (incarnation, serial, epoch) so that a peer
applies only the newest digest and never mixes a digest of one size with a version of another
(``PeerFilters.update_from_bytes``).  Works with either implementation of the filter (the twins compute
the same fill, so they resize at the same moments and produce the same digests).  Sans-IO.
"""
from __future__ import annotations

import math
from types import ModuleType
from collections.abc import Iterable

from pymq.errors import ConfigError
from pymq.routing import bloom as _chosen

#: grow when the measured false-positive rate exceeds the target by this factor
DEFAULT_TOLERANCE = 2.0
#: shrink when the topics held fall below this fraction of the filter's design capacity
SHRINK_BELOW = 1 / 8


def estimated_fpr(fill_ratio: float, k: int) -> float:
    """False-positive rate of a bloom filter from its measured fill: ``fill ** k``."""
    return fill_ratio ** k


class InterestFilter:
    """The topics a node's local subscribers want, and the subscription filter peers receive a digest of.

    ``add``/``remove`` take a topic once per first subscriber / last subscriber (a set, not a multiset);
    ``check()`` regenerates the filter when its measured false-positive rate misses the target and returns
    whether it did.  The caller announces ``digest()`` with ``epoch`` after a change.
    """

    __slots__ = ("_impl", "_fpr", "_min_capacity", "_tolerance", "_capacity", "_filter", "_topics",
                 "_patterns", "epoch", "resizes")

    def __init__(self, capacity: int, fpr: float = 0.01, *, tolerance: float = DEFAULT_TOLERANCE,
                 implementation: ModuleType | None = None) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ConfigError(f"filter capacity must be a positive integer, got {capacity!r}", capacity=capacity)
        if not tolerance >= 1.0:
            raise ConfigError(f"filter tolerance must be at least 1, got {tolerance!r}", tolerance=tolerance)
        self._impl = implementation if implementation is not None else _chosen.implementation
        self._fpr = fpr
        self._min_capacity = capacity
        self._tolerance = tolerance
        self._capacity = capacity
        self._filter: _chosen.SubscriptionFilter = self._impl.SubscriptionFilter.for_capacity(capacity, fpr)
        self._topics: set[str] = set()
        self._patterns: dict[str, int] = {}
        self.epoch = 0
        self.resizes: list[tuple[int, int, int]] = []   # (topics, old m, new m) per regeneration, latest last

    # -- what the node's subscribers want ---------------------------------------------------------------
    @property
    def topics(self) -> frozenset[str]:
        return frozenset(self._topics)

    def __contains__(self, topic: object) -> bool:
        return topic in self._topics

    def __len__(self) -> int:
        return len(self._topics)

    def add(self, topic: str) -> bool:
        """The topic's first local subscriber appeared; False if it was already held."""
        if topic in self._topics:
            return False
        self._topics.add(topic)
        self._filter.add(topic)
        return True

    def remove(self, topic: str) -> bool:
        """The topic's last local subscriber left; False if it was not held."""
        if topic not in self._topics:
            return False
        self._topics.discard(topic)
        self._filter.remove(topic)
        return True

    def add_pattern(self, pattern: str) -> None:
        self._patterns[pattern] = self._patterns.get(pattern, 0) + 1
        self._filter.add_pattern(pattern)

    def remove_pattern(self, pattern: str) -> bool:
        n = self._patterns.get(pattern, 0)
        if not n:
            return False
        if n == 1:
            del self._patterns[pattern]
        else:
            self._patterns[pattern] = n - 1
        return self._filter.remove_pattern(pattern)

    # -- the filter --------------------------------------------------------------------------------------
    @property
    def filter(self) -> _chosen.SubscriptionFilter:
        """The current ``SubscriptionFilter`` (replaced by each regeneration: do not keep it)."""
        return self._filter

    @property
    def capacity(self) -> int:
        """Topics the current filter is sized for at the target rate."""
        return self._capacity

    @property
    def fpr_target(self) -> float:
        return self._fpr

    def measured_fpr(self) -> float:
        """The false-positive rate the filter's fill implies now."""
        return estimated_fpr(self._filter.fill_ratio(), self._filter.k)

    def might_contain(self, topic: str) -> bool:
        return self._filter.might_contain(topic)

    def digest(self) -> _chosen.BloomDigest:
        return self._filter.digest()

    def memory_bytes(self) -> int:
        """Bytes of counters (one per counter) this node keeps for its filter."""
        return self._filter.m

    def check(self) -> bool:
        """Regenerate the filter if its measured rate misses the target (grow) or the topics fell far below
        its size (shrink).  True when a new filter (and epoch) was made: announce it."""
        n = len(self._topics)
        measured = self.measured_fpr()
        if measured > self._fpr * self._tolerance:
            wanted = max(2 * self._capacity, math.ceil(n * 1.5))
        elif self._capacity > self._min_capacity and n < self._capacity * SHRINK_BELOW:
            wanted = max(self._min_capacity, 2 * n)
        else:
            return False
        try:
            m, k = _chosen.optimal_parameters(wanted, self._fpr)
        except ConfigError:
            return False          # at the largest filter the format allows: keep it (more false positives)
        if m == self._filter.m and k == self._filter.k:
            return False
        self._regenerate(wanted, m, k)
        return True

    def _regenerate(self, capacity: int, m: int, k: int) -> None:
        fresh = self._impl.SubscriptionFilter(m, k)
        for topic in self._topics:
            fresh.add(topic)
        for pattern, times in self._patterns.items():
            for _ in range(times):
                fresh.add_pattern(pattern)
        self.resizes.append((len(self._topics), self._filter.m, m))
        self._filter = fresh
        self._capacity = capacity
        self.epoch += 1

    @classmethod
    def of(cls, topics: Iterable[str], capacity: int, fpr: float = 0.01, *, tolerance: float = DEFAULT_TOLERANCE,
           implementation: ModuleType | None = None) -> InterestFilter:
        """A filter holding ``topics``, already checked (sized for them)."""
        self = cls(capacity, fpr, tolerance=tolerance, implementation=implementation)
        for topic in topics:
            self.add(topic)
        while self.check():
            pass
        return self
