"""The storage-rule dialect (seed 000): spec/vectors/storage_rules.json and the dialect's API, both evaluators."""
from __future__ import annotations

import pytest

from pymq.errors import InvalidSelector
from pymq.selector import compile_rule, compile_selector, rule_context

from .vectors import RESULTS, decode, load

DOC = load("storage_rules.json")


def _ctx(case: dict) -> dict:
    return decode(DOC["contexts"][case["context_ref"]])


@pytest.mark.parametrize("case", DOC["cases"], ids=lambda c: f"{c['context_ref']}:{c['rule'][:50]}")
def test_case(evaluator, case):
    rule = compile_rule(case["rule"], evaluator=evaluator)
    ctx = _ctx(case)
    assert rule.evaluate(ctx) is RESULTS[case["result"]]
    assert rule.matches(ctx) is case["expected"]


@pytest.mark.parametrize("case", DOC["bad_rules"], ids=lambda c: c["rule"])
def test_bad_rule(evaluator, case):
    with pytest.raises(InvalidSelector) as info:
        compile_rule(case["rule"], evaluator=evaluator)
    assert (info.value.position, info.value.expected) == (case["position"], case["expected"])
    assert str(info.value).startswith(f"storage rule error at position {case['position']}: expected ")


@pytest.mark.parametrize("rule", DOC["seed_rules"], ids=lambda r: r["id"])
def test_every_seed_condition_parses(evaluator, rule):
    compiled = compile_rule(rule["condition"], evaluator=evaluator)
    assert compiled.text == rule["condition"]
    assert compiled.identifiers   # each seed rule reads something from the message


def test_identifiers_are_context_keys():
    assert compile_rule("SIZE > 10 AND TYPE == TEXT").identifiers == {"size_bytes", "body_type"}
    assert compile_rule("HEADER('a').isPresent() OR HEADER('b') = 'x'").identifiers == {"headers"}
    assert compile_rule("DESTINATION = QUEUE AND DESTINATION_NAME LIKE '/queue/%'").identifiers == \
        {"destination_type", "destination"}
    assert compile_rule("CLIENT_ID = 'x' OR PRIORITY > 1 OR PERSISTENT OR PRODUCER = 'p'").identifiers == \
        {"client_id", "priority", "persistent", "producer"}


def test_dialect_spellings_are_not_jms():
    # the rule dialect's extra operators and keywords stay out of plain selectors
    for text in ("a == 1", "a = 1 && b = 2", "a = \"x\"", "!a"):
        with pytest.raises(InvalidSelector):
            compile_selector(text)
    # ... and in a selector SIZE is just a property name
    assert compile_selector("SIZE > 10").identifiers == {"SIZE"}


def test_rule_context_builder():
    ctx = rule_context(size_bytes=2048, body_type="TEXT", destination="/topic/prices", headers={"h": "v"})
    assert ctx["destination_type"] == "TOPIC"
    assert rule_context(size_bytes=1, destination="/queue/a")["destination_type"] == "QUEUE"
    assert rule_context(size_bytes=1)["destination_type"] is None
    assert compile_rule("SIZE = 2 AND DESTINATION = TOPIC AND HEADER('h') = 'v' AND TYPE = TEXT").matches(ctx)
    assert set(ctx) == {"size_bytes", "body_type", "headers", "destination", "destination_type", "client_id",
                        "priority", "persistent", "producer"}


def test_missing_headers_mapping_is_null(evaluator):
    rule = compile_rule("HEADER('a').isPresent()", evaluator=evaluator)
    assert rule.evaluate({"size_bytes": 1}) is False
    assert rule.evaluate({"headers": None}) is False
    assert compile_rule("HEADER('a') = 'x'", evaluator=evaluator).evaluate({}) is None


def test_batch_first_match_over_rules(evaluator):
    rules = [compile_rule(t, evaluator=evaluator).program
             for t in ("CLIENT_ID = 'privileged'", "SIZE < 20", "SIZE > 10000")]
    assert evaluator.first_match(rules, rule_context(size_bytes=10 * 1024)) == 1
    assert evaluator.first_match(rules, rule_context(size_bytes=50 * 1024)) == -1
    assert evaluator.all_matches(rules, rule_context(size_bytes=5 * 1024, client_id="privileged")) == [0, 1]
