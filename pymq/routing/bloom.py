"""Picker for the routing hash and the counting bloom filter: the compiled module if built, else the twin.

``IMPLEMENTATIONS`` maps "py" (always) and "c" (when built and not disabled by PYMQ_NO_EXTENSIONS=1) to
the modules, so tests and benchmarks can run one against the other; everything else imports the names
below, which come from the chosen one.  Both implementations compute the same bits (spec/routing.md).
"""
from __future__ import annotations

from types import ModuleType

from pymq._accel import load

_py, _c = load("pymq.routing._bloom_py", "pymq.routing._bloom_c")

IMPLEMENTATIONS: dict[str, ModuleType] = {"py": _py} if _c is None else {"py": _py, "c": _c}
#: the module in use: ``pymq.routing._bloom_c`` or ``pymq.routing._bloom_py``
implementation: ModuleType = _c if _c is not None else _py

murmur3_32 = implementation.murmur3_32
group_hash = implementation.group_hash
hash_pair = implementation.hash_pair
bloom_indexes = implementation.bloom_indexes
indexes_from_pair = implementation.indexes_from_pair
SubscriptionFilter = implementation.SubscriptionFilter
BloomDigest = implementation.BloomDigest
RendezvousTable = implementation.RendezvousTable
optimal_parameters = _py.optimal_parameters

HASH_VERSION: int = _py.HASH_VERSION
HASH_SEED_2: int = _py.HASH_SEED_2
COUNTER_MAX: int = _py.COUNTER_MAX

__all__ = [
    "IMPLEMENTATIONS", "implementation", "murmur3_32", "group_hash", "hash_pair", "bloom_indexes",
    "indexes_from_pair", "SubscriptionFilter", "BloomDigest", "RendezvousTable", "optimal_parameters",
    "HASH_VERSION", "HASH_SEED_2", "COUNTER_MAX",
]
