"""Hostile filter announcements from a cluster peer (spec/routing.md §3.4-3.5): digests and pattern lists
that are truncated, nested, oversized, of the wrong types or of names that are no patterns. Each is refused
with a ClusterError or read so that the peer still gets every topic it may want (tests/hostile/
filter_announcements.py states the property); also a coverage-guided target (``bench/fuzz_targets.py
filter``, ``python -m bench.fuzz``)."""
from __future__ import annotations

import json
import random

from tests.hostile.filter_announcements import check_announcement

from pymq.routing.bloom import SubscriptionFilter


def _digest(topics: list[str], patterns: list[str]) -> bytes:
    f = SubscriptionFilter.for_capacity(16, 0.01)
    for topic in topics:
        f.add(topic)
    for pattern in patterns:
        f.add_pattern(pattern)
    return f.digest().to_bytes()


def test_named_hostile_announcements():
    good = _digest(["bonds.x"], ["stocks.*"])
    cases = {
        "list": (good, '["stocks.*"]', "patterns"),
        "earlier version, no list": (good, None, "match-all"),
        "not json": (good, "stocks.*", "match-all"),
        "deep nesting": (good, "[" * 100_000, "match-all"),
        "an object": (good, '{"a": 1}', "match-all"),
        "a number": (good, "[1]", "match-all"),
        "no wildcard": (good, '["stocks.ibm"]', "match-all"),
        "empty name": (good, '[""]', "match-all"),
        "too many": (good, json.dumps([f"p{i}.*" for i in range(1_001)]), "match-all"),
        "too long": (good, json.dumps(["a" * 70_000 + ".*"]), "match-all"),
        "empty list": (_digest(["bonds.x"], []), "[]", "digest"),
        "a list with a digest that is not match-all": (_digest(["bonds.x"], []), '["stocks.*"]', "digest"),
        "truncated digest": (good[:6], '["stocks.*"]', "refused"),
        "unknown flags": (good[:3] + bytes([0x81]) + good[4:], '["stocks.*"]', "refused"),
    }
    for name, (body, raw, outcome) in cases.items():
        assert check_announcement(body, raw) == outcome, name


def test_random_announcements_keep_the_property():
    rng = random.Random(26_27)
    good = _digest(["a.b", "x"], ["stocks.*", "a.#"])
    words = ["stocks", "a", "b", "*", "#", ">", "", "x.y", "\u00e9", "\x00", "\n", "\\c", "[", "]", '"']
    outcomes = set()
    for _ in range(2_000):
        body = bytearray(good if rng.random() < 0.7 else rng.randbytes(rng.randrange(0, 40)))
        for _ in range(rng.randrange(0, 3)):
            if body:
                body[rng.randrange(len(body))] = rng.randrange(256)
        kind = rng.random()
        if kind < 0.5:
            raw = json.dumps([".".join(rng.choice(words) for _ in range(rng.randrange(1, 4)))
                              for _ in range(rng.randrange(0, 5))])
        elif kind < 0.8:
            raw = "".join(rng.choice(words + [",", ":", "{", "}"]) for _ in range(rng.randrange(0, 20)))
        else:
            raw = None
        outcomes.add(check_announcement(bytes(body), raw))
    assert outcomes == {"refused", "match-all", "patterns", "digest"}
