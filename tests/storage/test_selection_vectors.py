"""spec/vectors/storage_selection.json: the seed's worked example, strategies, fallbacks and scoring."""
from __future__ import annotations

import pytest

from pymq_server.storage.device import DeviceStatus
from pymq_server.storage.selection import RuleBook, RuleEvaluator, ScoringPolicy, SelectionRule, StaticHealth
from tests.selector.vectors import load
from tests.twins import twin_fixture

impl = twin_fixture("pymq.selector._evaluator_py", "pymq.selector._evaluator_c")

DOC = load("storage_selection.json")


def _book() -> RuleBook:
    return RuleBook(SelectionRule.from_mapping(r) for r in DOC["rules"])


def _health(scores: dict | None = None, unavailable: dict | None = None) -> StaticHealth:
    merged = {**DOC["scores"], **(scores or {})}
    return StaticHealth(merged, unavailable or {})


def test_seed_sorted_order(impl):
    ev = RuleEvaluator(_book(), _health(), implementation=impl)
    assert [[r.id, r.adjusted] for r in ev.ranking()] == DOC["sorted"]


@pytest.mark.parametrize("case", DOC["selections"], ids=lambda c: c["name"][:70])
def test_selection(impl, case):
    ev = RuleEvaluator(_book(), _health(case.get("scores"), case.get("unavailable")), strategy=case["strategy"],
                       default_device=case["default_device"], implementation=impl)
    decision = ev.select(case["context"])
    assert (decision.device, decision.rule_id, decision.weight, decision.fallback) == \
        (case["device"], case["rule_id"], case["weight"], case["fallback"])
    assert decision.strategy == case["strategy"]
    if "matched" in case:
        assert list(decision.matched) == case["matched"]
        if case["matched"]:
            assert dict(decision.aggregates) == case["aggregates"]
    elif case["fallback"] is None:
        assert decision.matched == (case["rule_id"],)


@pytest.mark.parametrize("case", DOC["aggregations"], ids=lambda c: c["name"][:70])
def test_aggregation(impl, case):
    ev = RuleEvaluator(_book(), _health(), strategy=case["strategy"], match_bonus=case["match_bonus"],
                       implementation=impl)
    decision = ev.aggregate(case["matched"])
    assert dict(decision.aggregates) == pytest.approx(case["aggregates"])
    assert (decision.device, decision.rule_id) == (case["device"], case["rule_id"])
    assert decision.weight == pytest.approx(case["weight"])


@pytest.mark.parametrize("case", DOC["scoring"], ids=lambda c: c["name"])
def test_scoring(case):
    policy = ScoringPolicy.from_mapping(case["policy"])
    status = DeviceStatus(name="d", kind="test", **case["status"])
    previous = None
    if case["previous_errors"] is not None:
        previous = DeviceStatus(name="d", kind="test", errors=case["previous_errors"])
    score, available, _reason = policy.assess(status, previous, case["elapsed_s"])
    assert (score, available) == (case["score"], case["available"])
    assert str(score) != "-0.0"
