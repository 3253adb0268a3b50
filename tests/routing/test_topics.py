"""Topic patterns (spec/routing.md §5): the compiled PatternIndex and its twin run the same vectors and agree
on random patterns and topics with an oracle written here; hostile patterns cost bounded work."""
from __future__ import annotations

import json
import pathlib
import time
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.routing import topics
from tests.twins import twin_fixture

twin = twin_fixture("pymq.routing._topics_py", "pymq.routing._topics_c")
VECTORS = json.loads((pathlib.Path(__file__).resolve().parents[2] / "spec" / "vectors" /
                      "topic_patterns.json").read_text(encoding="utf-8"))


def test_normalize_vectors(twin):
    for case in VECTORS["normalize"]:
        assert twin.normalize(case["pattern"]) == case["normal"], case


def test_is_pattern_vectors():
    for case in VECTORS["is_pattern"]:
        assert topics.is_pattern(case["name"]) is case["pattern"], case


def test_match_vectors(twin):
    for case in VECTORS["matches"]:
        assert twin.matches(case["pattern"], case["topic"]) is case["match"], case
        assert topics.TopicPattern(case["pattern"]).matches(case["topic"]) is case["match"], case


def test_index_vectors(twin):
    index = twin.PatternIndex()
    for pattern in VECTORS["index"]["patterns"]:
        index.add(pattern)
    for case in VECTORS["index"]["cases"]:
        assert sorted(index.match(case["topic"])) == case["matches"], case


def test_covers_vectors():
    for case in VECTORS["covers"]:
        assert topics.covers(case["general"], case["specific"]) is case["covers"], case


def test_counts_and_removal(twin):
    index = twin.PatternIndex()
    assert index.match("a.b") == [] and len(index) == 0
    assert index.add("a.>") == "a.#"
    index.add("a.#")
    index.add("a.*")
    assert len(index) == 2 and "a.>" in index and index.patterns() == ["a.#", "a.*"]
    assert sorted(index.match("a.b")) == ["a.#", "a.*"]
    assert index.remove("a.#") and sorted(index.match("a.b")) == ["a.#", "a.*"]   # held twice
    assert index.remove("a.>") and index.match("a.b") == ["a.*"]
    assert not index.remove("a.#") and not index.remove("nothing.*")
    assert index.remove("a.*") and len(index) == 0 and index.match("a.b") == []
    index.add("x.y.z")
    assert index.match("x.y.z") == ["x.y.z"] and index.match("x.y") == []


def test_removal_cuts_only_what_nothing_uses(twin):
    index = twin.PatternIndex()
    for p in ("a.b.c", "a.b", "a.#", "a.#.c"):
        index.add(p)
    index.remove("a.b.c")
    assert sorted(index.match("a.b")) == ["a.#", "a.b"] and sorted(index.match("a.b.c")) == ["a.#", "a.#.c"]
    index.remove("a.#")
    assert index.match("a.b") == ["a.b"] and index.match("a.x.c") == ["a.#.c"]


def test_literal_prefix():
    assert topics.TopicPattern("stocks.nyse.*").literal_prefix == ("stocks", "nyse")
    assert topics.TopicPattern("stocks.>.x").literal_prefix == ("stocks",)
    assert topics.TopicPattern("#").literal_prefix == ()
    assert topics.TopicPattern("a.b").literal_prefix == ("a", "b") and not topics.TopicPattern("a.b").is_pattern


# -- random patterns and topics against an oracle ------------------------------------------------------

@lru_cache(maxsize=None)
def _oracle(p: tuple[str, ...], t: tuple[str, ...]) -> bool:
    if not p:
        return not t
    if p[0] in ("#", ">"):
        return _oracle(p[1:], t) or (bool(t) and _oracle(p, t[1:]))
    if not t:
        return False
    return (p[0] == "*" or p[0] == t[0]) and _oracle(p[1:], t[1:])


words = st.sampled_from(["a", "b", "c", "", "a*b"])
pattern_words = st.one_of(words, st.sampled_from(["*", "#", ">"]))
patterns = st.lists(pattern_words, min_size=1, max_size=6).map(".".join)
topic_names = st.lists(words, min_size=1, max_size=7).map(".".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(held=st.lists(patterns, min_size=1, max_size=8), removed=st.lists(patterns, max_size=4),
       probe=st.lists(topic_names, min_size=1, max_size=5))
def test_twins_agree_with_the_oracle(held, removed, probe):
    from pymq.routing import _topics_py
    impls = [_topics_py] + ([topics.IMPLEMENTATIONS["c"]] if "c" in topics.IMPLEMENTATIONS else [])
    for impl in impls:
        index = impl.PatternIndex()
        alive: dict[str, int] = {}
        for p in held:
            key = index.add(p)
            alive[key] = alive.get(key, 0) + 1
        for p in removed:
            key = impl.normalize(p)
            assert index.remove(p) is (alive.get(key, 0) > 0)
            if alive.get(key):
                alive[key] -= 1
                if not alive[key]:
                    del alive[key]
        assert index.patterns() == sorted(alive)
        for t in probe:
            want = sorted(p for p in alive if _oracle(tuple(p.split(".")), tuple(t.split("."))))
            assert sorted(index.match(t)) == want, (impl.IMPLEMENTATION, alive, t)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(general=st.lists(pattern_words, min_size=1, max_size=3).map(".".join),
       specific=st.lists(pattern_words, min_size=1, max_size=3).map(".".join))
def test_covers_agrees_with_brute_force(general, specific):
    import itertools
    g = tuple(topics.normalize(general).split("."))
    s = tuple(topics.normalize(specific).split("."))
    alphabet = sorted({w for w in g + s if w not in ("*", "#")}) + ["\x00fresh"]
    want = True
    for n in range(1, len(g) + len(s) + 3):
        if any(_oracle(s, t) and not _oracle(g, t) for t in itertools.product(alphabet, repeat=n)):
            want = False
            break
    assert topics.covers(general, specific) is want


# -- hostile patterns ----------------------------------------------------------------------------------

def test_hostile_patterns_cost_bounded_work(twin):
    """``#.#.#...`` (normalized to one '#') and ``#.a.#.a...`` over a long topic: the walk visits each trie
    node at most once per word, so both finish at once (a backtracking matcher takes exponential time)."""
    index = twin.PatternIndex()
    index.add(".".join(["#"] * 120))
    index.add(".".join(["#", "a"] * 60) + ".#.b")
    index.add(".".join(["*"] * 127))
    topic = ".".join(["a"] * 127)
    started = time.monotonic()
    for _ in range(20):
        got = sorted(index.match(topic))
    elapsed = time.monotonic() - started
    assert got == ["#", ".".join(["*"] * 127)]
    # not a timing assertion of speed: a backtracking walk would not finish in the test's lifetime
    assert elapsed < 60


def test_hostile_covers_is_bounded():
    g = ".".join(["#", "a", "*"] * 40)
    s = ".".join(["*", "#", "a"] * 40)
    # False: x.a.x.a....x.a (80 words, every '#' empty) is matched by the
    # specific pattern only (its last word but one is not 'a', as the general pattern's last block needs)
    assert topics.covers(g, s) is False
    assert topics.covers(s, s) is True


@pytest.mark.parametrize("name", ["stocks.*", "a.>", "#"])
def test_is_pattern(name):
    assert topics.is_pattern(name)
