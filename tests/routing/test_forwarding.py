"""PeerFilters: the forwarding decision never misses a peer that has a subscriber."""
from __future__ import annotations

import random

import pytest

from pymq.errors import ClusterError
from pymq.routing import PeerFilters
from tests.twins import twin_fixture

bloom = twin_fixture("pymq.routing._bloom_py", "pymq.routing._bloom_c")


def _node(bloom, topics):
    f = bloom.SubscriptionFilter.for_capacity(1000, 0.01)
    for t in topics:
        f.add(t)
    return f


def test_forwards_exactly_where_subscribers_are_up_to_false_positives(bloom):
    rng = random.Random(4)
    universe = [f"topic-{i}" for i in range(3000)]
    wanted = {n: set(rng.sample(universe, 400)) for n in ("n1", "n2", "n3")}
    peers = PeerFilters(implementation=bloom)
    for n, ts in wanted.items():
        peers.update(n, _node(bloom, ts).digest())
    extra = 0
    for t in universe:
        targets = peers.targets(t)
        truth = [n for n in sorted(wanted) if t in wanted[n]]
        assert set(truth) <= set(targets)          # no subscriber is ever missed
        assert targets == sorted(targets)
        extra += len(targets) - len(truth)
    assert extra < 0.05 * len(universe) * 3        # configured at 1 %: false forwards stay rare


def test_peer_without_digest_receives_everything(bloom):
    peers = PeerFilters(implementation=bloom)
    peers.update("n1", _node(bloom, ["a"]).digest())
    peers.add_peer("n2")
    assert peers.targets("zzz") == ["n2"]
    assert peers.targets("a") == ["n1", "n2"]
    assert peers.digest("n2") is None


def test_unknown_digest_version_falls_back_to_match_all(bloom):
    peers = PeerFilters(implementation=bloom)
    wire = bytearray(_node(bloom, ["a"]).digest().to_bytes())
    wire[1] = 9  # a hash version from the future
    assert peers.update_from_bytes("n1", bytes(wire)) is False
    assert peers.targets("zzz") == ["n1"]
    wire[1] = 1
    assert peers.update_from_bytes("n1", bytes(wire)) is True
    assert peers.targets("zzz") == [] and peers.targets("a") == ["n1"]


def test_malformed_digest_raises(bloom):
    peers = PeerFilters(implementation=bloom)
    with pytest.raises(ClusterError):
        peers.update_from_bytes("n1", b"\x01\x01")


def test_popular_topics_go_everywhere_without_probing(bloom):
    peers = PeerFilters(popular=["celebrity"], implementation=bloom)
    peers.update("n1", _node(bloom, ["a"]).digest())
    peers.update("n2", _node(bloom, ["b"]).digest())
    assert peers.targets("celebrity") == ["n1", "n2"]
    peers.unmark_popular("celebrity")
    assert peers.targets("celebrity") == []
    peers.mark_popular("a")
    assert peers.popular == {"a"}


def test_wildcard_peer_and_leaving_peer(bloom):
    peers = PeerFilters(implementation=bloom)
    wild = _node(bloom, [])
    wild.add_pattern("prices.>")
    peers.update("n1", wild.digest())
    peers.update("n2", _node(bloom, ["a"]).digest())
    assert peers.targets("anything") == ["n1"]
    peers.remove_peer("n1")
    assert peers.peers == ("n2",)
    assert peers.targets("anything") == [] and peers.targets("a") == ["n2"]
