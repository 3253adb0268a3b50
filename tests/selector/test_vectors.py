"""spec/vectors/selector.json, run against both evaluators."""
from __future__ import annotations

import pytest

from pymq.errors import InvalidSelector
from pymq.selector import compile_selector

from .vectors import RESULTS, case_values, decode, load

DOC = load("selector.json")


def _id(case: dict) -> str:
    return case["selector"][:60] or "<empty>"


@pytest.mark.parametrize("case", DOC["cases"], ids=_id)
def test_case(evaluator, case):
    values = case_values(DOC, case)
    selector = compile_selector(case["selector"], evaluator=evaluator)
    assert selector.implementation == evaluator.IMPLEMENTATION
    assert selector.evaluate(values) is RESULTS[case["result"]]
    assert selector.matches(values) is case["expected"]


@pytest.mark.parametrize("case", DOC["bad_selectors"], ids=lambda c: c["selector"])
def test_bad_selector(evaluator, case):
    with pytest.raises(InvalidSelector) as info:
        compile_selector(case["selector"], evaluator=evaluator)
    err = info.value
    assert (err.position, err.expected) == (case["position"], case["expected"])
    assert str(err).startswith(f"selector error at position {case['position']}: expected {case['expected']} but found ")


def test_vectors_are_consistent():
    # 'expected' must be exactly 'result is TRUE', or a binding could pass one and fail the other
    for case in DOC["cases"]:
        assert case["expected"] == (case["result"] == "TRUE"), case["selector"]
    assert len(DOC["cases"]) > 250 and len(DOC["bad_selectors"]) > 50


@pytest.mark.parametrize("read", DOC["untyped_reads"], ids=lambda r: repr(r["text"])[:40])
def test_untyped_read(read):
    """What an untyped header's text reads as (spec/selector.md §3): the one grammar, in the vectors."""
    from pymq.selector._ir import UntypedNumber, read_number, untyped
    want = decode(read["number"])
    got = read_number(read["text"])
    if want is None:
        assert got is None and type(untyped(read["text"])) is str
    else:
        assert type(got) is type(want) and (got == want or (got != got and want != want))
        value = untyped(read["text"])
        assert type(value) is UntypedNumber and value == read["text"] and value.number == got
