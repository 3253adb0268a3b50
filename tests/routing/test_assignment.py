"""Assignment of recipients to nodes (seed 004, pymq/routing/assignment.py): the hash baseline, the
similar policy's consolidation under its capacity bound, and what joins and leaves move."""
from __future__ import annotations

import bisect
import itertools
import random

import pytest

from pymq.errors import ConfigError
from pymq.routing import GroupRouter
from pymq.routing.assignment import (AssignmentPolicy, HashPolicy, Placement, SimilarPolicy, make_policy,
                                     parse_policy, place_all, recipient_of, reconsider, shed)

NODES = [f"n{i}" for i in range(8)]


def _zipf_recipients(n: int, topics: int, per: int, seed: int = 7):
    rng = random.Random(seed)
    cum = list(itertools.accumulate(1 / (i + 1) for i in range(topics)))
    out = []
    for i in range(n):
        out.append((f"r{i}", tuple(sorted({f"t{bisect.bisect(cum, rng.random() * cum[-1])}" for _ in range(per)}))))
    return out


def _copies(p: Placement) -> int:
    return sum(len(h) for h in p.holders.values())


def test_recipient_of_a_subscription_key():
    assert recipient_of("sub:alice:inbox") == "alice"
    assert recipient_of("sub:alice:with:colons") == "alice"
    assert recipient_of("sub:shared:orders") == "shared:orders"


def test_policy_names():
    assert parse_policy("similar") is AssignmentPolicy.SIMILAR
    assert make_policy("balance") is None
    with pytest.raises(ConfigError):
        parse_policy("random")
    with pytest.raises(ConfigError):
        SimilarPolicy(slack=-1)
    with pytest.raises(ConfigError):
        Placement([])


def test_placement_bookkeeping():
    p = Placement(["b", "a"])
    assert p.nodes == ("a", "b")
    p.assign("r1", ["x", "y"], "a")
    p.assign("r2", ["y"], "b")
    assert p.holders == {"x": {"a": 1}, "y": {"a": 1, "b": 1}} and p.load == {"a": 1, "b": 1}
    assert p.overlap(["y", "z"]) == {"a": 1, "b": 1} and p.stored_on("y") == 2
    p.assign("r1", ["y"], "b")                                       # re-assigning moves it
    assert p.holders == {"y": {"a": 0, "b": 2}} or p.holders == {"y": {"b": 2}}
    assert p.holders == {"y": {"b": 2}} and p.load == {"a": 0, "b": 2}
    assert p.least_loaded() == "a" and p.least_loaded(below=0) is None
    assert p.remove_node("b") == ["r1", "r2"] or sorted(p.where) == []
    assert p.holders == {} and p.nodes == ("a",)


def test_hash_is_the_rendezvous_of_the_recipient():
    p = Placement(NODES)
    recipients = _zipf_recipients(500, 200, 5)
    place_all(p, HashPolicy(), recipients)
    router = GroupRouter(NODES)
    assert all(p.where[r] == router.route(r) for r, _ in recipients)


def test_similar_stores_fewer_copies_than_hash_and_respects_its_capacity():
    recipients = _zipf_recipients(4000, 400, 6)
    hashed, similar = Placement(NODES), Placement(NODES)
    place_all(hashed, HashPolicy(), recipients)
    policy = SimilarPolicy(slack=0.1)
    place_all(similar, policy, recipients)
    assert _copies(similar) < 0.8 * _copies(hashed)
    assert max(similar.load.values()) <= policy.capacity(similar, adding=0)


def test_similar_consolidates_communities_onto_single_nodes():
    """Recipients in 8 interest groups, each following its group's 5 topics: hash spreads every group over
    every node, similar puts each group on one node (so each topic is stored once)."""
    recipients = [(f"g{g}-r{i}", tuple(f"g{g}.t{j}" for j in range(5))) for i in range(50) for g in range(8)]
    random.Random(3).shuffle(recipients)
    hashed, similar = Placement(NODES), Placement(NODES)
    place_all(hashed, HashPolicy(), recipients)
    place_all(similar, SimilarPolicy(slack=0.1, expected=len(recipients)), recipients)
    assert max(similar.stored_on(f"g{g}.t0") for g in range(8)) == 1
    assert min(hashed.stored_on(f"g{g}.t0") for g in range(8)) == 8


def test_reconsider_keeps_pinned_recipients_and_only_moves_for_a_gain():
    recipients = [("a1", ("x",)), ("a2", ("x",)), ("b1", ("y",)), ("b2", ("y",))]
    p = Placement(["n0", "n1"])
    for (r, topics), node in zip(recipients, ["n0", "n1", "n0", "n1"]):    # each topic split over both nodes
        p.assign(r, topics, node)
    policy = SimilarPolicy(slack=0.5, expected=4)         # at most 3 recipients per node
    moves = reconsider(p, policy, ["a1", "a2", "b1", "b2"], movable=lambda r: r != "a2")
    assert p.where["a2"] == "n1"                                              # pinned: a consumer is attached
    assert p.where["a1"] == "n1" and {p.where["b1"], p.where["b2"]} == {"n0"}
    assert {p.stored_on("x"), p.stored_on("y")} == {1}
    assert reconsider(p, policy, sorted(p.where)) == []                        # converged: nothing more moves
    assert len(moves) == 2


def test_a_leave_moves_only_the_leavers_recipients():
    recipients = _zipf_recipients(2000, 300, 5)
    for policy in (HashPolicy(), SimilarPolicy()):
        p = Placement(NODES)
        place_all(p, policy, recipients)
        before = dict(p.where)
        orphans = p.remove_node("n3")
        place_all(p, policy, [(r, dict(recipients)[r]) for r in orphans])
        moved = [r for r in before if before[r] != p.where[r]]
        assert sorted(moved) == sorted(orphans) and "n3" not in p.where.values()


def test_a_join_moves_about_one_share():
    recipients = _zipf_recipients(2000, 300, 5)
    for policy in (HashPolicy(), SimilarPolicy()):
        p = Placement(NODES)
        place_all(p, policy, recipients)
        p.add_node("n8")
        if isinstance(policy, SimilarPolicy):
            policy.expected = len(p)
        moves = shed(p, policy)
        assert all(target == "n8" or isinstance(policy, SimilarPolicy) for _, _, target in moves)
        assert 0.05 < len(moves) / len(recipients) < 0.2, (type(policy).__name__, len(moves))
        assert p.load["n8"] > 0
