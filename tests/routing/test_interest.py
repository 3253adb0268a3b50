"""Filters that keep their false-positive target (seed 004, spec/routing.md §3.8) and versioned digest
announcements (spec/cluster.md §2): the twins resize at the same moments to the same bits."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from pymq.errors import ClusterError, ConfigError
from pymq.routing import IMPLEMENTATIONS
from pymq.routing.forwarding import FilterVersion, PeerFilters
from pymq.routing.interest import InterestFilter, estimated_fpr
from tests.routing._vectors import both_implementations
from tests.twins import twin_fixture

bloom = twin_fixture("pymq.routing._bloom_py", "pymq.routing._bloom_c")


def _probe_fpr(f: InterestFilter, n: int = 20_000) -> float:
    return sum(f.might_contain(f"absent-{i}") for i in range(n)) / n


def test_a_filter_sized_for_10k_holding_100k_topics_is_regenerated(bloom):
    """The landed filter was sized once: 10k topics at 1 %, then 100k subscribed topics made it match
    99.5 % of everything (filtering had silently become broadcast)."""
    f = InterestFilter(10_000, 0.01, implementation=bloom)
    for i in range(100_000):
        f.add(f"topic-{i}")
    assert f.measured_fpr() > 0.99                    # what the one-size filter does at 100k topics
    assert _probe_fpr(f) > 0.99
    assert f.check() is True and f.epoch == 1
    assert f.measured_fpr() <= 0.01
    assert _probe_fpr(f) < 0.01
    assert all(f.might_contain(f"topic-{i}") for i in range(0, 100_000, 7))   # no false negatives
    assert f.check() is False                          # stable once it meets the target
    assert f.resizes == [(100_000, 95_856, f.filter.m)]


def test_shrinks_when_topics_leave_but_never_below_its_configured_capacity(bloom):
    f = InterestFilter.of((f"t{i}" for i in range(20_000)), 1_000, 0.01, implementation=bloom)
    grown = f.filter.m
    assert f.capacity >= 20_000 and f.epoch >= 1
    for i in range(19_950):
        f.remove(f"t{i}")
    assert f.check() is True                            # 50 topics in a filter sized for 20k+
    assert f.filter.m < grown and f.capacity == 1_000
    assert all(f.might_contain(f"t{i}") for i in range(19_950, 20_000))
    assert f.check() is False


def test_small_changes_do_not_regenerate(bloom):
    f = InterestFilter(1_000, 0.01, implementation=bloom)
    for i in range(900):
        f.add(f"t{i}")
        assert f.check() is False
    assert f.epoch == 0 and not f.add("t1") and not f.remove("never")


def test_patterns_survive_regeneration(bloom):
    f = InterestFilter(10, 0.01, implementation=bloom)
    f.add_pattern("prices.*")
    for i in range(500):
        f.add(f"t{i}")
    assert f.check()
    assert f.digest().match_all and f.filter.patterns == {"prices.*": 1}
    assert f.remove_pattern("prices.*") and not f.digest().match_all


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError):
        InterestFilter(0)
    with pytest.raises(ConfigError):
        InterestFilter(True)
    with pytest.raises(ConfigError):
        InterestFilter(10, 1.5)
    with pytest.raises(ConfigError):
        InterestFilter(10, 0.01, tolerance=0.5)


def test_estimated_fpr_is_fill_to_the_k():
    assert estimated_fpr(0.5, 7) == 0.5 ** 7
    assert estimated_fpr(0.0, 3) == 0.0


# -- the twins agree, including on when and how they resize ----------------------------------------------
OPS = st.lists(st.tuples(st.sampled_from(["add", "add", "add", "remove", "check"]),
                         st.integers(min_value=0, max_value=400)), max_size=300)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, capacity=st.integers(min_value=1, max_value=60))
def test_twins_resize_at_the_same_moments_to_the_same_bits(ops, capacity):
    py, c = both_implementations()
    a = InterestFilter(capacity, 0.02, implementation=py)
    b = InterestFilter(capacity, 0.02, implementation=c)
    for op, n in ops:
        topic = f"topic/{n}"
        if op == "add":
            assert a.add(topic) == b.add(topic)
        elif op == "remove":
            assert a.remove(topic) == b.remove(topic)
        else:
            assert a.check() == b.check()
        assert a.measured_fpr() == b.measured_fpr()
        assert (a.filter.m, a.filter.k, a.epoch, a.capacity) == (b.filter.m, b.filter.k, b.epoch, b.capacity)
    assert a.digest().to_bytes() == b.digest().to_bytes()
    assert a.filter.to_bytes() == b.filter.to_bytes()
    assert a.resizes == b.resizes


def test_twins_agree_on_the_100k_regeneration():
    py, c = both_implementations()
    fs = [InterestFilter(10_000, 0.01, implementation=impl) for impl in (py, c)]
    for f in fs:
        for i in range(100_000):
            f.add(f"topic-{i}")
        assert f.check()
    assert fs[0].digest().to_bytes() == fs[1].digest().to_bytes()


# -- versioned announcements ------------------------------------------------------------------------------
def _digest(topics, capacity):
    f = InterestFilter(capacity, 0.01)
    for t in topics:
        f.add(t)
    f.check()
    return f


def test_a_stale_announcement_never_replaces_a_newer_one_of_another_size():
    small = _digest(["a"], 10)
    big = _digest([f"t{i}" for i in range(5_000)] + ["b"], 10)
    assert small.filter.m != big.filter.m
    peers = PeerFilters()
    peers.add_peer("n1")
    assert peers.announce("n1", big.digest().to_bytes(), FilterVersion(100, 7, big.epoch)) == "applied"
    # an older announcement (a lower serial, or the same one again) arriving late is ignored
    assert peers.announce("n1", small.digest().to_bytes(), FilterVersion(100, 6, 0)) == "stale"
    assert peers.announce("n1", small.digest().to_bytes(), FilterVersion(100, 7, 0)) == "stale"
    assert peers.digest("n1").m == big.filter.m and peers.targets("b") == ["n1"]
    assert peers.stale == 2
    # a restarted peer (a later incarnation) counts its serials from 1 again
    assert peers.announce("n1", small.digest().to_bytes(), FilterVersion(200, 1, 0)) == "applied"
    assert peers.digest("n1").m == small.filter.m and peers.version("n1") == (200, 1, 0)


def test_a_size_change_without_a_new_epoch_is_refused():
    one = _digest(["a"], 10)
    other = _digest(["a"], 10_000)
    peers = PeerFilters()
    peers.add_peer("n1")
    peers.announce("n1", one.digest().to_bytes(), FilterVersion(1, 1, 0))
    with pytest.raises(ClusterError) as info:
        peers.announce("n1", other.digest().to_bytes(), FilterVersion(1, 2, 0))
    assert info.value.reason == "filter-size-mismatch"
    assert peers.digest("n1").m == one.filter.m          # nothing applied
    assert peers.announce("n1", other.digest().to_bytes(), FilterVersion(1, 2, 1)) == "applied"


def test_an_announcement_in_an_unknown_format_makes_the_peer_match_all():
    peers = PeerFilters()
    data = bytearray(_digest(["a"], 10).digest().to_bytes())
    data[1] = 9                                            # hash_version 9
    assert peers.announce("n1", bytes(data), FilterVersion(1, 1, 0)) == "match-all"
    assert peers.digest("n1") is None and peers.targets("anything") == ["n1"]
    with pytest.raises(ClusterError):
        peers.announce("n1", b"\x01", FilterVersion(1, 2, 0))   # malformed: an error, not match-all


@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
def test_memory_is_one_byte_per_counter(impl):
    f = InterestFilter(10_000, 0.01, implementation=IMPLEMENTATIONS[impl])
    assert f.memory_bytes() == f.filter.m == 95_856
