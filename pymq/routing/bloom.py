"""Picker for the routing hash and the counting bloom filter: the compiled module if built, else the twin.

``IMPLEMENTATIONS`` maps "py" (always) and "c" (when built and not disabled by PYMQ_NO_EXTENSIONS=1) to
the modules, so tests and benchmarks can run one against the other; everything else imports the names
below, which come from the chosen one.  Both implementations compute the same bits (spec/routing.md).
A plain import, so the type checker reads the compiled module's stub (``_bloom_c.pyi``) and checks the
twin against it.
"""
from __future__ import annotations

from types import ModuleType
from typing import Protocol, Union

from pymq._accel import NO_EXTENSIONS, note_missing
from pymq.routing import _bloom_py as _py
from pymq.routing._bloom_py import COUNTER_MAX, HASH_SEED_2, HASH_VERSION, optimal_parameters

try:
    if NO_EXTENSIONS:
        raise ImportError("PYMQ_NO_EXTENSIONS=1")
    from pymq.routing import _bloom_c as _c
    from pymq.routing._bloom_c import (BloomDigest, RendezvousTable, SubscriptionFilter, bloom_indexes, group_hash,
                                       hash_pair, indexes_from_pair, murmur3_32)
except ImportError:
    _c = None  # type: ignore[assignment]
    note_missing("pymq.routing._bloom_c")
    from pymq.routing._bloom_py import (BloomDigest, RendezvousTable,  # type: ignore[assignment]
                                        SubscriptionFilter, bloom_indexes, group_hash, hash_pair,
                                        indexes_from_pair, murmur3_32)

Item = Union[str, bytes, bytearray, memoryview]


class Digest(Protocol):
    """A peer's subscription digest (``BloomDigest`` of either implementation)."""

    @property
    def m(self) -> int: ...

    @property
    def k(self) -> int: ...

    @property
    def match_all(self) -> bool:
        """The peer holds a wildcard subscription: it wants every topic."""
        ...

    def might_contain(self, item: Item) -> bool: ...

    def might_contain_pair(self, h1: int, h2: int) -> bool: ...


IMPLEMENTATIONS: dict[str, ModuleType] = {"py": _py} if _c is None else {"py": _py, "c": _c}
#: the module in use: ``pymq.routing._bloom_c`` or ``pymq.routing._bloom_py``
implementation: ModuleType = _c if _c is not None else _py

__all__ = [
    "IMPLEMENTATIONS", "implementation", "murmur3_32", "group_hash", "hash_pair", "bloom_indexes",
    "indexes_from_pair", "SubscriptionFilter", "BloomDigest", "RendezvousTable", "optimal_parameters",
    "HASH_VERSION", "HASH_SEED_2", "COUNTER_MAX", "Digest", "Item",
]
