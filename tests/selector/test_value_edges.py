"""Values at the edges of the selector's types (spec/selector.md §3; issue 31), in both evaluators: ``bytes``
(and the other byte buffers) are of no selector type — UNKNOWN in every comparison, even with an equal
``bytes`` value or under NOT, yet not NULL — and the exact ends of the long type."""
from __future__ import annotations

import pytest

from pymq.selector import compile_selector

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def _eval(evaluator, text: str, values: dict):
    return compile_selector(text, evaluator=evaluator).evaluate(values)


@pytest.mark.parametrize("value", [b"red", bytearray(b"red"), memoryview(b"red"), b""],
                         ids=["bytes", "bytearray", "memoryview", "empty-bytes"])
def test_byte_values_compare_as_unknown_even_with_each_other(evaluator, value):
    same = {"x": value, "y": value, "s": "red"}
    for text in ("x = y", "x <> y", "x = s", "x <> s", "NOT (x = y)", "NOT (x = 'red')", "x IN ('red', '')",
                 "x NOT IN ('red')", "x LIKE 'r%'", "x NOT LIKE 'r%'", "x > y", "x BETWEEN y AND y", "x = x"):
        assert _eval(evaluator, text, same) is None, text
    assert _eval(evaluator, "x IS NULL", same) is False
    assert _eval(evaluator, "x IS NOT NULL", same) is True
    # three-valued logic around the unknown: TRUE OR UNKNOWN, FALSE AND UNKNOWN decide; the others do not
    assert _eval(evaluator, "x = y OR s = 'red'", same) is True
    assert _eval(evaluator, "x = y AND s = 'blue'", same) is False
    assert _eval(evaluator, "x = y AND s = 'red'", same) is None
    assert compile_selector("x = y", evaluator=evaluator).matches(same) is False


@pytest.mark.parametrize("value, number", [(INT64_MAX, True), (INT64_MIN, True), (INT64_MAX + 1, False),
                                           (INT64_MIN - 1, False)],
                         ids=["int64-max", "int64-min", "one-above", "one-below"])
def test_the_exact_ends_of_the_long_type(evaluator, value, number):
    expected = True if number else None
    assert _eval(evaluator, "x = x", {"x": value}) is expected
    assert _eval(evaluator, "x >= -9223372036854775808", {"x": value}) is expected
    assert _eval(evaluator, "x IS NULL", {"x": value}) is False


def test_strings_are_not_ordered(evaluator):
    # ordering a string literal is refused when compiled; two string values meet only at run time
    for text in ("s < t", "t > s", "s <= s", "s >= s"):
        assert _eval(evaluator, text, {"s": "b", "t": "z"}) is None, text
