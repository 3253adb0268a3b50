# cython: auto_pickle=False
"""Compiled routing hash and counting bloom filter: the hot half of pymq.routing (spec/routing.md).

Semantics are those of the twin ``pymq/routing/_bloom_py.py``; this module only makes them fast.  The
hash reads blocks as explicit little-endian bytes, so the result never depends on the host's byte order;
all arithmetic is on uint32 (wrapping, as the algorithm requires) and the bloom indexes on uint64
(h1 + i*h2 < 2**37 for k <= 32, so no intermediate ever wraps).

Invariants (shared with the twin):
- str items are hashed as their UTF-8 bytes (a lone surrogate raises UnicodeEncodeError), bytes as is.
- A counter at 255 is saturated: never incremented past, never decremented again.
- Decoders reject anything the encoders would not produce.
"""
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.unicode cimport PyUnicode_AsUTF8AndSize

import struct

from pymq.errors import ClusterError, ConfigError
from pymq.routing._bloom_py import optimal_parameters  # sizing math runs once per filter, not hot

HASH_VERSION = 1
HASH_SEED_2 = 0x9E3779B9
COUNTER_MAX = 255
MAX_K = 32
MAX_M = 1 << 30
MAX_COUNT = (1 << 63) - 1
DIGEST_FORMAT = 1
FILTER_FORMAT = 1
FILTER_MAGIC = b"PMQC"
FLAG_MATCH_ALL = 0x01

cdef uint32_t _C1 = 0xCC9E2D51
cdef uint32_t _C2 = 0x1B873593
cdef uint32_t _SEED2 = 0x9E3779B9
cdef uint8_t _SATURATED = 255
cdef enum:
    _MAX_K = 32

_DIGEST_HEADER = struct.Struct(">BBBBI")
_FILTER_HEADER = struct.Struct(">4sBBBBIQI")
_PATTERN_HEADER = struct.Struct(">IH")


cdef inline uint32_t _rotl32(uint32_t x, int r) noexcept nogil:
    return (x << r) | (x >> (32 - r))


cdef uint32_t _murmur3(const unsigned char* data, Py_ssize_t n, uint32_t seed) noexcept nogil:
    cdef Py_ssize_t nblocks = n >> 2
    cdef Py_ssize_t i
    cdef uint32_t h = seed
    cdef uint32_t k
    cdef const unsigned char* p = data
    for i in range(nblocks):
        k = (<uint32_t>p[0]) | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)
        p += 4
        k *= _C1
        k = _rotl32(k, 15)
        k *= _C2
        h ^= k
        h = _rotl32(h, 13)
        h = h * 5 + <uint32_t>0xE6546B64
    cdef int tail = n & 3
    if tail:
        k = 0
        if tail == 3:
            k ^= <uint32_t>p[2] << 16
        if tail >= 2:
            k ^= <uint32_t>p[1] << 8
        k ^= <uint32_t>p[0]
        k *= _C1
        k = _rotl32(k, 15)
        k *= _C2
        h ^= k
    h ^= <uint32_t>n
    h ^= h >> 16
    h *= <uint32_t>0x85EBCA6B
    h ^= h >> 13
    h *= <uint32_t>0xC2B2AE35
    h ^= h >> 16
    return h


cdef inline const unsigned char* _key(object item, Py_ssize_t* n) except NULL:
    """Pointer to the bytes of a str (its cached UTF-8) or of a bytes; callers pass _as_bytes(item)."""
    if isinstance(item, str):
        return <const unsigned char*>PyUnicode_AsUTF8AndSize(item, n)
    n[0] = PyBytes_GET_SIZE(item)
    return <const unsigned char*>PyBytes_AS_STRING(item)


cdef object _as_bytes(object item):
    if isinstance(item, (str, bytes)):
        return item
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    raise TypeError(f"a routing key is str or bytes, not {type(item).__name__}")


cdef inline int _pair(object item, uint32_t* h1, uint32_t* h2) except -1:
    cdef Py_ssize_t n
    cdef const unsigned char* p
    item = _as_bytes(item)
    p = _key(item, &n)
    h1[0] = _murmur3(p, n, 0)
    h2[0] = _murmur3(p, n, _SEED2)
    return 0


def murmur3_32(data, seed=0):
    """MurmurHash3 x86_32 of ``data`` (str is hashed as UTF-8) under ``seed`` (taken mod 2**32), unsigned."""
    cdef Py_ssize_t n
    cdef uint32_t s = <uint32_t>(int(seed) & 0xFFFFFFFF)
    data = _as_bytes(data)
    cdef const unsigned char* p = _key(data, &n)
    return _murmur3(p, n, s)


def group_hash(key):
    """The specified group hash: murmur3 x86_32 of the UTF-8 bytes, seed 0."""
    cdef Py_ssize_t n
    key = _as_bytes(key)
    cdef const unsigned char* p = _key(key, &n)
    return _murmur3(p, n, 0)


def hash_pair(item):
    """(h1, h2) of an item: independent of m and k, so one pair serves every peer's filter."""
    cdef uint32_t h1, h2
    _pair(item, &h1, &h2)
    return h1, h2


cdef int _check_params(object m, object k) except -1:
    if not 1 <= m <= MAX_M:
        raise ConfigError(f"m (counters) must be in 1..{MAX_M}, got {m}", m=m)
    if not 1 <= k <= MAX_K:
        raise ConfigError(f"k (hashes) must be in 1..{MAX_K}, got {k}", k=k)
    return 0


cdef inline void _indexes(uint32_t h1, uint32_t h2, uint64_t m, int k, uint32_t* out) noexcept nogil:
    # (h1 + i*h2) mod m, stepped: idx_{i+1} = idx_i + (h2 mod m), wrapped once.
    cdef uint64_t idx = h1 % m
    cdef uint64_t step = h2 % m
    cdef int i
    for i in range(k):
        out[i] = <uint32_t>idx
        idx += step
        if idx >= m:
            idx -= m


def indexes_from_pair(h1, h2, m, k):
    """index_i = (h1 + i*h2) mod m for i in 0..k-1 (duplicates are kept)."""
    _check_params(m, k)
    cdef uint32_t out[_MAX_K]
    _indexes(<uint32_t>h1, <uint32_t>h2, <uint64_t>m, <int>k, out)
    return [out[i] for i in range(<int>k)]


def bloom_indexes(item, m, k):
    """The k counter indexes an item maps to in a filter of m counters."""
    cdef uint32_t h1, h2
    _pair(item, &h1, &h2)
    return indexes_from_pair(h1, h2, m, k)


cdef object _corrupt(str what, str reason, dict fields=None):
    return ClusterError(f"malformed {what}: {reason}", reason=reason, **(fields or {}))


cdef class BloomDigest:
    """A peer's filter as received: the bit projection (counter > 0), read-only."""

    cdef readonly uint32_t m
    cdef readonly int k
    cdef readonly int hash_version
    cdef readonly bint match_all
    cdef bytes _bits
    cdef const unsigned char* _b

    def __init__(self, bits, m, k, hash_version=HASH_VERSION, match_all=False):
        _check_params(m, k)
        if hash_version != HASH_VERSION:
            raise _corrupt("bloom digest", "unsupported-hash-version", {"hash_version": hash_version})
        bits = bytes(bits)
        expected = (m + 7) >> 3
        if len(bits) != expected:
            raise _corrupt("bloom digest", "bits-length", {"length": len(bits), "expected": expected})
        if m & 7 and bits[-1] >> (m & 7):
            raise _corrupt("bloom digest", "padding-bits-set")
        self.m = m
        self.k = k
        self.hash_version = hash_version
        self.match_all = bool(match_all)
        self._bits = bits
        self._b = <const unsigned char*>PyBytes_AS_STRING(self._bits)

    @classmethod
    def from_bits(cls, bits, m, k, hash_version=HASH_VERSION, match_all=False):
        return cls(bits, m, k, hash_version, match_all)

    @classmethod
    def from_bytes(cls, data):
        data = bytes(data)
        if len(data) < _DIGEST_HEADER.size:
            raise _corrupt("bloom digest", "truncated-header", {"length": len(data)})
        fmt, hash_version, k, flags, m = _DIGEST_HEADER.unpack_from(data)
        if fmt != DIGEST_FORMAT:
            raise _corrupt("bloom digest", "unsupported-format", {"format": fmt})
        if flags & ~FLAG_MATCH_ALL:
            raise _corrupt("bloom digest", "unknown-flags", {"flags": flags})
        if not (1 <= m <= MAX_M and 1 <= k <= MAX_K):
            raise _corrupt("bloom digest", "bad-parameters", {"m": m, "k": k})
        return cls(data[_DIGEST_HEADER.size:], m, k, hash_version, bool(flags & FLAG_MATCH_ALL))

    def to_bytes(self):
        flags = FLAG_MATCH_ALL if self.match_all else 0
        return _DIGEST_HEADER.pack(DIGEST_FORMAT, self.hash_version, self.k, flags, self.m) + self._bits

    def to_bits(self):
        return self._bits

    cdef bint _probe(self, uint32_t h1, uint32_t h2) noexcept:
        cdef uint64_t m = self.m
        cdef uint64_t idx = h1 % m
        cdef uint64_t step = h2 % m
        cdef int i
        for i in range(self.k):
            if not (self._b[idx >> 3] >> (idx & 7)) & 1:
                return False
            idx += step
            if idx >= m:
                idx -= m
        return True

    def might_contain(self, item):
        cdef uint32_t h1, h2
        if self.match_all:
            return True
        _pair(item, &h1, &h2)
        return self._probe(h1, h2)

    def might_contain_pair(self, h1, h2):
        if self.match_all:
            return True
        return self._probe(<uint32_t>h1, <uint32_t>h2)

    def fill_ratio(self):
        cdef Py_ssize_t i, ones = 0
        cdef unsigned char b
        for i in range(PyBytes_GET_SIZE(self._bits)):
            b = self._b[i]
            while b:
                b &= b - 1
                ones += 1
        return ones / <double>self.m

    def __eq__(self, other):
        if not isinstance(other, BloomDigest):
            return NotImplemented
        return self.to_bytes() == other.to_bytes()

    def __hash__(self):
        return hash(self.to_bytes())

    def __repr__(self):
        return (f"BloomDigest(m={self.m}, k={self.k}, hash_version={self.hash_version}, "
                f"match_all={bool(self.match_all)}, fill={self.fill_ratio():.3f})")


cdef class SubscriptionFilter:
    """Counting bloom filter of the topics a node's local subscribers want (seed 004).

    Add a topic once when its first local subscriber appears, remove it once when the last leaves;
    wildcard subscriptions go to ``add_pattern`` and make the filter match-all while held.
    """

    cdef readonly uint32_t m
    cdef readonly int k
    cdef readonly long long count
    cdef bytearray _buf
    cdef unsigned char* _c
    cdef dict _patterns

    def __init__(self, m, k):
        _check_params(m, k)
        self.m = m
        self.k = k
        self.count = 0
        self._buf = bytearray(m)
        self._c = <unsigned char*>PyByteArray_AS_STRING(self._buf)
        self._patterns = {}

    @classmethod
    def for_capacity(cls, expected_topics, fpr=0.01):
        return cls(*optimal_parameters(expected_topics, fpr))

    @property
    def hash_version(self):
        return HASH_VERSION

    @property
    def match_all(self):
        return bool(self._patterns)

    @property
    def patterns(self):
        return dict(self._patterns)

    def add(self, item):
        cdef uint32_t h1, h2
        cdef uint32_t idx[_MAX_K]
        cdef int i
        _pair(item, &h1, &h2)
        _indexes(h1, h2, self.m, self.k, idx)
        for i in range(self.k):
            if self._c[idx[i]] != _SATURATED:
                self._c[idx[i]] += 1
        self.count += 1

    def remove(self, item):
        """Undo one ``add(item)``; False (and nothing changes) if the item is certainly absent."""
        cdef uint32_t h1, h2
        cdef uint32_t idx[_MAX_K]
        cdef int i, j, times
        cdef bint seen
        _pair(item, &h1, &h2)
        _indexes(h1, h2, self.m, self.k, idx)
        for i in range(self.k):
            seen = False
            for j in range(i):
                if idx[j] == idx[i]:
                    seen = True
                    break
            if seen:
                continue
            times = 1
            for j in range(i + 1, self.k):
                if idx[j] == idx[i]:
                    times += 1
            if self._c[idx[i]] < times:
                return False
        for i in range(self.k):
            if self._c[idx[i]] != _SATURATED:
                self._c[idx[i]] -= 1
        self.count -= 1
        return True

    cdef bint _probe(self, uint32_t h1, uint32_t h2) noexcept:
        cdef uint64_t m = self.m
        cdef uint64_t idx = h1 % m
        cdef uint64_t step = h2 % m
        cdef int i
        for i in range(self.k):
            if not self._c[idx]:
                return False
            idx += step
            if idx >= m:
                idx -= m
        return True

    def might_contain(self, item):
        cdef uint32_t h1, h2
        if self._patterns:
            return True
        _pair(item, &h1, &h2)
        return self._probe(h1, h2)

    def might_contain_pair(self, h1, h2):
        if self._patterns:
            return True
        return self._probe(<uint32_t>h1, <uint32_t>h2)

    def add_pattern(self, pattern):
        if not isinstance(pattern, str):
            raise TypeError("a pattern is a str")
        self._patterns[pattern] = self._patterns.get(pattern, 0) + 1

    def remove_pattern(self, pattern):
        n = self._patterns.get(pattern, 0)
        if n == 0:
            return False
        if n == 1:
            del self._patterns[pattern]
        else:
            self._patterns[pattern] = n - 1
        return True

    def counters(self):
        return bytes(self._buf)

    def to_bits(self):
        cdef Py_ssize_t nbytes = (self.m + 7) >> 3
        cdef bytearray out = bytearray(nbytes)
        cdef unsigned char* o = <unsigned char*>PyByteArray_AS_STRING(out)
        cdef uint32_t i
        for i in range(self.m):
            if self._c[i]:
                o[i >> 3] |= <unsigned char>(1 << (i & 7))
        return bytes(out)

    def digest(self):
        return BloomDigest(self.to_bits(), self.m, self.k, HASH_VERSION, bool(self._patterns))

    def fill_ratio(self):
        cdef uint32_t i, used = 0
        for i in range(self.m):
            if self._c[i]:
                used += 1
        return used / <double>self.m

    def to_bytes(self):
        parts = [_FILTER_HEADER.pack(FILTER_MAGIC, FILTER_FORMAT, HASH_VERSION, self.k, 8, self.m,
                                     self.count, len(self._patterns))]
        for pattern in sorted(self._patterns, key=lambda p: p.encode("utf-8")):
            raw = pattern.encode("utf-8")
            parts.append(_PATTERN_HEADER.pack(self._patterns[pattern], len(raw)))
            parts.append(raw)
        parts.append(bytes(self._buf))
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data):
        data = bytes(data)
        if len(data) < _FILTER_HEADER.size:
            raise _corrupt("subscription filter", "truncated-header", {"length": len(data)})
        magic, fmt, hash_version, k, width, m, count, npatterns = _FILTER_HEADER.unpack_from(data)
        if magic != FILTER_MAGIC:
            raise _corrupt("subscription filter", "bad-magic")
        if fmt != FILTER_FORMAT:
            raise _corrupt("subscription filter", "unsupported-format", {"format": fmt})
        if hash_version != HASH_VERSION:
            raise _corrupt("subscription filter", "unsupported-hash-version", {"hash_version": hash_version})
        if width != 8:
            raise _corrupt("subscription filter", "unsupported-counter-width", {"width": width})
        if not (1 <= m <= MAX_M and 1 <= k <= MAX_K):
            raise _corrupt("subscription filter", "bad-parameters", {"m": m, "k": k})
        if count > MAX_COUNT:
            # the encoder never writes one (count is a signed 64-bit counter here)
            raise _corrupt("subscription filter", "bad-count", {"count": count})
        cdef SubscriptionFilter flt = cls(m, k)
        pos = _FILTER_HEADER.size
        patterns = {}
        for _ in range(npatterns):
            if pos + _PATTERN_HEADER.size > len(data):
                raise _corrupt("subscription filter", "truncated-pattern", {"offset": pos})
            refs, size = _PATTERN_HEADER.unpack_from(data, pos)
            pos += _PATTERN_HEADER.size
            if refs == 0 or pos + size > len(data):
                raise _corrupt("subscription filter", "bad-pattern", {"offset": pos})
            try:
                pattern = data[pos:pos + size].decode("utf-8")
            except UnicodeDecodeError:
                raise _corrupt("subscription filter", "bad-pattern", {"offset": pos}) from None
            if pattern in patterns:
                raise _corrupt("subscription filter", "duplicate-pattern", {"offset": pos})
            patterns[pattern] = refs
            pos += size
        if len(data) - pos != m:
            raise _corrupt("subscription filter", "counters-length", {"length": len(data) - pos, "expected": m})
        cdef Py_ssize_t start = pos
        memcpy(flt._c, PyBytes_AS_STRING(data) + start, <size_t>m)
        flt.count = count
        flt._patterns = patterns
        return flt

    def copy(self):
        cdef SubscriptionFilter other = SubscriptionFilter(self.m, self.k)
        memcpy(other._c, self._c, self.m)
        other.count = self.count
        other._patterns = dict(self._patterns)
        return other

    def __eq__(self, other):
        if not isinstance(other, SubscriptionFilter):
            return NotImplemented
        return self.to_bytes() == other.to_bytes()

    __hash__ = None

    def __repr__(self):
        return (f"SubscriptionFilter(m={self.m}, k={self.k}, count={self.count}, "
                f"match_all={self.match_all}, fill={self.fill_ratio():.3f})")


cdef class RendezvousTable:
    """Per-destination seeds for rendezvous routing; ``best(key)`` is the index of the highest score
    (the first one among equal scores)."""

    cdef uint32_t* _seeds
    cdef Py_ssize_t _n
    cdef tuple _seed_tuple

    def __cinit__(self, seeds):
        self._seeds = NULL
        self._n = 0

    def __init__(self, seeds):
        cdef Py_ssize_t i
        values = tuple(int(s) & 0xFFFFFFFF for s in seeds)
        if len(values) == 0:
            raise ClusterError("rendezvous routing needs at least one destination")
        self._seeds = <uint32_t*>PyMem_Malloc(len(values) * sizeof(uint32_t))
        if self._seeds == NULL:
            raise MemoryError()
        for i in range(len(values)):
            self._seeds[i] = values[i]
        self._n = len(values)
        self._seed_tuple = values

    def __dealloc__(self):
        PyMem_Free(self._seeds)

    def __len__(self):
        return self._n

    @property
    def seeds(self):
        return self._seed_tuple

    def scores(self, key):
        cdef Py_ssize_t n, i
        key = _as_bytes(key)
        cdef const unsigned char* p = _key(key, &n)
        return [_murmur3(p, n, self._seeds[i]) for i in range(self._n)]

    def best(self, key):
        cdef Py_ssize_t n, i, best_i = 0
        cdef uint32_t score, best_score
        key = _as_bytes(key)
        cdef const unsigned char* p = _key(key, &n)
        best_score = _murmur3(p, n, self._seeds[0])
        for i in range(1, self._n):
            score = _murmur3(p, n, self._seeds[i])
            if score > best_score:
                best_score = score
                best_i = i
        return best_i
