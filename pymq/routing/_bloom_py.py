"""Reference semantics of the routing hash and the counting bloom subscription filter (spec/routing.md).

This pure-Python twin defines what `_ext/bloom.pyx` (compiled to ``pymq.routing._bloom_c``) must compute
bit for bit: MurmurHash3 x86_32, the rendezvous score table used by group routing, the k bloom indexes of
a topic, the counting filter with saturating 8-bit counters, its wire digest and its persistence form.

Invariants:
- Items are ``str`` (hashed as UTF-8; a lone surrogate raises ``UnicodeEncodeError``) or bytes-like.
- No false negatives: a topic added and not yet removed is always found.  Only a saturated counter (255)
  breaks add/remove symmetry, and it does so on the safe side: it is never decremented again.
- Every encoder here has a decoder that rejects anything it would not itself have produced.
"""
from __future__ import annotations

import math
import struct
from typing import Union
from collections.abc import Sequence

from pymq.errors import ClusterError, ConfigError

Item = Union[str, bytes, bytearray, memoryview]

#: version of the index derivation (murmur3 x86_32, seeds 0 and HASH_SEED_2, double hashing); travels
#: with every digest so a peer never probes bits with a different derivation.
HASH_VERSION = 1
#: seed of the second murmur3 value (the double-hashing step); the first uses seed 0.
HASH_SEED_2 = 0x9E3779B9
COUNTER_MAX = 255  #: 8-bit counters; a counter that reaches this value is saturated for good
MAX_K = 32
MAX_M = 1 << 30
MAX_COUNT = (1 << 63) - 1  #: topics held; a filter claiming more is malformed (the compiled twin stores an int64)

DIGEST_FORMAT = 1
FILTER_FORMAT = 1
FILTER_MAGIC = b"PMQC"
FLAG_MATCH_ALL = 0x01

_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_MASK = 0xFFFFFFFF

_DIGEST_HEADER = struct.Struct(">BBBBI")          # format, hash_version, k, flags, m
_FILTER_HEADER = struct.Struct(">4sBBBBIQI")      # magic, format, hash_version, k, counter bits, m, count, P
_PATTERN_HEADER = struct.Struct(">IH")            # refcount, utf-8 length


def _as_bytes(item: Item) -> bytes:
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, bytes):
        return item
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    raise TypeError(f"a routing key is str or bytes, not {type(item).__name__}")


def _split(data: bytes) -> tuple[tuple[int, ...], bytes]:
    """Little-endian 32-bit blocks and the 0-3 byte tail; unpacked once, hashed under many seeds."""
    nblocks = len(data) >> 2
    return struct.unpack_from(f"<{nblocks}I", data), data[nblocks << 2:]


def _murmur3_parts(blocks: tuple[int, ...], tail: bytes, length: int, seed: int) -> int:
    h = seed & _MASK
    for k in blocks:
        k = (k * _C1) & _MASK
        k = ((k << 15) | (k >> 17)) & _MASK
        k = (k * _C2) & _MASK
        h ^= k
        h = ((h << 13) | (h >> 19)) & _MASK
        h = (h * 5 + 0xE6546B64) & _MASK
    if tail:
        k = 0
        n = len(tail)
        if n == 3:
            k ^= tail[2] << 16
        if n >= 2:
            k ^= tail[1] << 8
        k ^= tail[0]
        k = (k * _C1) & _MASK
        k = ((k << 15) | (k >> 17)) & _MASK
        k = (k * _C2) & _MASK
        h ^= k
    h ^= length & _MASK
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return h


def murmur3_32(data: Item, seed: int = 0) -> int:
    """MurmurHash3 x86_32 of ``data`` (str is hashed as UTF-8) under ``seed`` (taken mod 2**32), unsigned."""
    raw = _as_bytes(data)
    blocks, tail = _split(raw)
    return _murmur3_parts(blocks, tail, len(raw), seed)


def group_hash(key: Item) -> int:
    """The specified group hash: murmur3 x86_32 of the UTF-8 bytes, seed 0 (spec/routing.md section 1)."""
    return murmur3_32(key, 0)


def hash_pair(item: Item) -> tuple[int, int]:
    """(h1, h2) of an item: independent of m and k, so one pair serves every peer's filter."""
    raw = _as_bytes(item)
    blocks, tail = _split(raw)
    n = len(raw)
    return _murmur3_parts(blocks, tail, n, 0), _murmur3_parts(blocks, tail, n, HASH_SEED_2)


def indexes_from_pair(h1: int, h2: int, m: int, k: int) -> list[int]:
    """index_i = (h1 + i*h2) mod m for i in 0..k-1 (exact integers; duplicates are kept)."""
    _check_params(m, k)
    return [(h1 + i * h2) % m for i in range(k)]


def bloom_indexes(item: Item, m: int, k: int) -> list[int]:
    """The k counter indexes an item maps to in a filter of m counters."""
    h1, h2 = hash_pair(item)
    return indexes_from_pair(h1, h2, m, k)


def optimal_parameters(expected_items: int, fpr: float) -> tuple[int, int]:
    """(m, k) for ``expected_items`` at false-positive rate ``fpr``; m is rounded up to a multiple of 8."""
    if expected_items < 1:
        raise ConfigError("expected_items must be at least 1", expected_items=expected_items)
    if not 0.0 < fpr < 1.0:
        raise ConfigError("fpr must be strictly between 0 and 1", fpr=fpr)
    m = math.ceil(-expected_items * math.log(fpr) / (math.log(2) ** 2))
    m = max(8, (m + 7) // 8 * 8)
    if m > MAX_M:
        raise ConfigError(f"a filter of {m} counters exceeds the limit of {MAX_M}", m=m)
    k = min(MAX_K, max(1, round(m / expected_items * math.log(2))))
    return m, k


def _check_params(m: int, k: int) -> None:
    if not 1 <= m <= MAX_M:
        raise ConfigError(f"m (counters) must be in 1..{MAX_M}, got {m}", m=m)
    if not 1 <= k <= MAX_K:
        raise ConfigError(f"k (hashes) must be in 1..{MAX_K}, got {k}", k=k)


def _bits_len(m: int) -> int:
    return (m + 7) >> 3


def _corrupt(what: str, reason: str, **fields: object) -> ClusterError:
    return ClusterError(f"malformed {what}: {reason}", reason=reason, **fields)


class BloomDigest:
    """A peer's filter as received: the bit projection (counter > 0), read-only.

    ``match_all`` is set when the peer holds a wildcard subscription; it then wants every topic.
    """

    __slots__ = ("_m", "_k", "_hash_version", "_bits", "_match_all")

    def __init__(self, bits: bytes, m: int, k: int, hash_version: int = HASH_VERSION,
                 match_all: bool = False) -> None:
        _check_params(m, k)
        if hash_version != HASH_VERSION:
            raise _corrupt("bloom digest", "unsupported-hash-version", hash_version=hash_version)
        bits = bytes(bits)
        if len(bits) != _bits_len(m):
            raise _corrupt("bloom digest", "bits-length", length=len(bits), expected=_bits_len(m))
        if m & 7 and bits[-1] >> (m & 7):
            raise _corrupt("bloom digest", "padding-bits-set")
        self._m, self._k, self._hash_version = m, k, hash_version
        self._bits, self._match_all = bits, bool(match_all)

    @classmethod
    def from_bits(cls, bits: bytes, m: int, k: int, hash_version: int = HASH_VERSION,
                  match_all: bool = False) -> BloomDigest:
        """Rebuild a digest from ``SubscriptionFilter.to_bits()`` and the parameters sent with it."""
        return cls(bits, m, k, hash_version, match_all)

    @classmethod
    def from_bytes(cls, data: bytes) -> BloomDigest:
        """Decode the self-describing wire form (8-byte header + bits) of ``to_bytes``."""
        data = bytes(data)
        if len(data) < _DIGEST_HEADER.size:
            raise _corrupt("bloom digest", "truncated-header", length=len(data))
        fmt, hash_version, k, flags, m = _DIGEST_HEADER.unpack_from(data)
        if fmt != DIGEST_FORMAT:
            raise _corrupt("bloom digest", "unsupported-format", format=fmt)
        if flags & ~FLAG_MATCH_ALL:
            raise _corrupt("bloom digest", "unknown-flags", flags=flags)
        if not (1 <= m <= MAX_M and 1 <= k <= MAX_K):
            raise _corrupt("bloom digest", "bad-parameters", m=m, k=k)
        return cls(data[_DIGEST_HEADER.size:], m, k, hash_version, bool(flags & FLAG_MATCH_ALL))

    def to_bytes(self) -> bytes:
        flags = FLAG_MATCH_ALL if self._match_all else 0
        return _DIGEST_HEADER.pack(DIGEST_FORMAT, self._hash_version, self._k, flags, self._m) + self._bits

    def to_bits(self) -> bytes:
        return self._bits

    @property
    def m(self) -> int:
        return self._m

    @property
    def k(self) -> int:
        return self._k

    @property
    def hash_version(self) -> int:
        return self._hash_version

    @property
    def match_all(self) -> bool:
        return self._match_all

    def might_contain(self, item: Item) -> bool:
        if self._match_all:
            return True
        h1, h2 = hash_pair(item)
        return self.might_contain_pair(h1, h2)

    def might_contain_pair(self, h1: int, h2: int) -> bool:
        """Probe with a precomputed ``hash_pair``: hash a topic once, probe every peer's digest."""
        if self._match_all:
            return True
        bits, m = self._bits, self._m
        for i in range(self._k):
            idx = (h1 + i * h2) % m
            if not bits[idx >> 3] >> (idx & 7) & 1:
                return False
        return True

    def fill_ratio(self) -> float:
        """Fraction of bits set; the false-positive rate is about fill_ratio ** k."""
        return sum(bin(b).count("1") for b in self._bits) / self._m

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BloomDigest):
            return NotImplemented
        return self.to_bytes() == other.to_bytes()

    def __repr__(self) -> str:
        return (f"BloomDigest(m={self._m}, k={self._k}, hash_version={self._hash_version}, "
                f"match_all={self._match_all}, fill={self.fill_ratio():.3f})")


class SubscriptionFilter:
    """Counting bloom filter of the topics a node's local subscribers want (seed 004).

    Callers add a topic once when its first local subscriber appears and remove it once when the last one
    leaves; the counters are a multiset, so ``count`` is adds minus removes.  Wildcard subscriptions do not
    go into the counters: ``add_pattern`` makes the whole filter match-all until the pattern is removed.
    """

    __slots__ = ("_m", "_k", "_counters", "_count", "_patterns")

    def __init__(self, m: int, k: int) -> None:
        _check_params(m, k)
        self._m, self._k = m, k
        self._counters = bytearray(m)
        self._count = 0
        self._patterns: dict[str, int] = {}

    @classmethod
    def for_capacity(cls, expected_topics: int, fpr: float = 0.01) -> SubscriptionFilter:
        """A filter sized for ``expected_topics`` distinct topics at false-positive rate ``fpr``."""
        return cls(*optimal_parameters(expected_topics, fpr))

    @property
    def m(self) -> int:
        return self._m

    @property
    def k(self) -> int:
        return self._k

    @property
    def hash_version(self) -> int:
        return HASH_VERSION

    @property
    def count(self) -> int:
        """Topics held: adds minus successful removes (a topic added twice counts twice)."""
        return self._count

    @property
    def match_all(self) -> bool:
        return bool(self._patterns)

    @property
    def patterns(self) -> dict[str, int]:
        """Wildcard subscriptions held, with how many times each was added."""
        return dict(self._patterns)

    def add(self, item: Item) -> None:
        h1, h2 = hash_pair(item)
        c, m = self._counters, self._m
        for i in range(self._k):
            idx = (h1 + i * h2) % m
            if c[idx] < COUNTER_MAX:
                c[idx] += 1
        self._count += 1

    def remove(self, item: Item) -> bool:
        """Undo one ``add(item)``; False (and nothing changes) if the item is certainly absent.

        Removing an item that was never added but happens to be a false positive would decrement other
        topics' counters: callers remove only what they added.
        """
        h1, h2 = hash_pair(item)
        c, m = self._counters, self._m
        need: dict[int, int] = {}
        for i in range(self._k):
            idx = (h1 + i * h2) % m
            need[idx] = need.get(idx, 0) + 1
        # An index the item maps to twice was incremented twice by add: a held item has every counter
        # at least as high as its multiplicity, or saturated.  Anything less proves it is not held.
        for idx, times in need.items():
            if c[idx] < times:
                return False
        for idx, times in need.items():
            if c[idx] != COUNTER_MAX:
                c[idx] -= times
        self._count -= 1
        return True

    def might_contain(self, item: Item) -> bool:
        if self._patterns:
            return True
        h1, h2 = hash_pair(item)
        return self.might_contain_pair(h1, h2)

    def might_contain_pair(self, h1: int, h2: int) -> bool:
        if self._patterns:
            return True
        c, m = self._counters, self._m
        for i in range(self._k):
            if not c[(h1 + i * h2) % m]:
                return False
        return True

    def add_pattern(self, pattern: str) -> None:
        """Hold a wildcard subscription: the filter (and its digest) match every topic while any is held."""
        if not isinstance(pattern, str):
            raise TypeError("a pattern is a str")
        self._patterns[pattern] = self._patterns.get(pattern, 0) + 1

    def remove_pattern(self, pattern: str) -> bool:
        n = self._patterns.get(pattern, 0)
        if n == 0:
            return False
        if n == 1:
            del self._patterns[pattern]
        else:
            self._patterns[pattern] = n - 1
        return True

    def counters(self) -> bytes:
        """The m counters, one byte each."""
        return bytes(self._counters)

    def to_bits(self) -> bytes:
        """Bit projection: bit i (byte i>>3, bit i&7, least significant first) is set iff counter i > 0."""
        out = bytearray(_bits_len(self._m))
        for idx, value in enumerate(self._counters):
            if value:
                out[idx >> 3] |= 1 << (idx & 7)
        return bytes(out)

    def digest(self) -> BloomDigest:
        """What peers need: the bits, m, k, hash version and the match-all flag."""
        return BloomDigest(self.to_bits(), self._m, self._k, HASH_VERSION, bool(self._patterns))

    def fill_ratio(self) -> float:
        return (self._m - self._counters.count(0)) / self._m

    def to_bytes(self) -> bytes:
        """Full persistence form: header, wildcard patterns, then the m counters (spec/routing.md)."""
        parts = [_FILTER_HEADER.pack(FILTER_MAGIC, FILTER_FORMAT, HASH_VERSION, self._k, 8, self._m,
                                     self._count, len(self._patterns))]
        for pattern in sorted(self._patterns, key=lambda p: p.encode("utf-8")):
            raw = pattern.encode("utf-8")
            parts.append(_PATTERN_HEADER.pack(self._patterns[pattern], len(raw)))
            parts.append(raw)
        parts.append(bytes(self._counters))
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> SubscriptionFilter:
        data = bytes(data)
        if len(data) < _FILTER_HEADER.size:
            raise _corrupt("subscription filter", "truncated-header", length=len(data))
        magic, fmt, hash_version, k, width, m, count, npatterns = _FILTER_HEADER.unpack_from(data)
        if magic != FILTER_MAGIC:
            raise _corrupt("subscription filter", "bad-magic")
        if fmt != FILTER_FORMAT:
            raise _corrupt("subscription filter", "unsupported-format", format=fmt)
        if hash_version != HASH_VERSION:
            raise _corrupt("subscription filter", "unsupported-hash-version", hash_version=hash_version)
        if width != 8:
            raise _corrupt("subscription filter", "unsupported-counter-width", width=width)
        if not (1 <= m <= MAX_M and 1 <= k <= MAX_K):
            raise _corrupt("subscription filter", "bad-parameters", m=m, k=k)
        if count > MAX_COUNT:
            # the encoder never writes one; the compiled twin keeps count in a signed 64-bit integer
            raise _corrupt("subscription filter", "bad-count", count=count)
        self = cls(m, k)
        pos = _FILTER_HEADER.size
        patterns: dict[str, int] = {}
        for _ in range(npatterns):
            if pos + _PATTERN_HEADER.size > len(data):
                raise _corrupt("subscription filter", "truncated-pattern", offset=pos)
            refs, size = _PATTERN_HEADER.unpack_from(data, pos)
            pos += _PATTERN_HEADER.size
            if refs == 0 or pos + size > len(data):
                raise _corrupt("subscription filter", "bad-pattern", offset=pos)
            try:
                pattern = data[pos:pos + size].decode("utf-8")
            except UnicodeDecodeError:
                raise _corrupt("subscription filter", "bad-pattern", offset=pos) from None
            if pattern in patterns:
                raise _corrupt("subscription filter", "duplicate-pattern", offset=pos)
            patterns[pattern] = refs
            pos += size
        if len(data) - pos != m:
            raise _corrupt("subscription filter", "counters-length", length=len(data) - pos, expected=m)
        self._counters[:] = data[pos:]
        self._count = count
        self._patterns = patterns
        return self

    def copy(self) -> SubscriptionFilter:
        other = SubscriptionFilter(self._m, self._k)
        other._counters[:] = self._counters
        other._count = self._count
        other._patterns = dict(self._patterns)
        return other

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SubscriptionFilter):
            return NotImplemented
        return self.to_bytes() == other.to_bytes()

    def __repr__(self) -> str:
        return (f"SubscriptionFilter(m={self._m}, k={self._k}, count={self._count}, "
                f"match_all={self.match_all}, fill={self.fill_ratio():.3f})")


class RendezvousTable:
    """Per-destination seeds for rendezvous routing; ``best(key)`` is the index of the highest score.

    score(destination, key) = murmur3_32(key, seed = murmur3_32(destination, 0)).  The table keeps the
    seeds in the caller's order (group routing passes them sorted by destination name), and ``best``
    returns the first index among equal scores, which is how the name tie-break is realised.
    """

    __slots__ = ("_seeds",)

    def __init__(self, seeds: Sequence[int]) -> None:
        if len(seeds) == 0:
            raise ClusterError("rendezvous routing needs at least one destination")
        self._seeds = tuple(int(s) & _MASK for s in seeds)

    def __len__(self) -> int:
        return len(self._seeds)

    @property
    def seeds(self) -> tuple[int, ...]:
        return self._seeds

    def scores(self, key: Item) -> list[int]:
        raw = _as_bytes(key)
        blocks, tail = _split(raw)
        n = len(raw)
        return [_murmur3_parts(blocks, tail, n, seed) for seed in self._seeds]

    def best(self, key: Item) -> int:
        raw = _as_bytes(key)
        blocks, tail = _split(raw)
        n = len(raw)
        best_i, best_score = 0, -1
        for i, seed in enumerate(self._seeds):
            score = _murmur3_parts(blocks, tail, n, seed)
            if score > best_score:
                best_i, best_score = i, score
        return best_i

