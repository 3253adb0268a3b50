"""The public surface of pymq.selector: Selector attributes, errors, value classes, batch helpers."""
from __future__ import annotations

import enum
import types
from collections.abc import Mapping

import pytest

from pymq.errors import ERROR_CODES, InvalidSelector, PymqError, error_from_headers, error_headers
from pymq.selector import IMPLEMENTATION, IMPLEMENTATIONS, Selector, compile_selector


def test_selector_attributes(evaluator):
    text = "JMSType = 'car' AND color = 'blue' AND weight > 2500"
    sel = compile_selector(text, evaluator=evaluator)
    assert isinstance(sel, Selector)
    assert sel.text == text
    assert sel.identifiers == frozenset({"JMSType", "color", "weight"})
    assert isinstance(sel.identifiers, frozenset)
    assert sel.matches({"JMSType": "car", "color": "blue", "weight": 3000}) is True
    assert sel.matches({"JMSType": "car", "color": "blue", "weight": 2000}) is False
    assert sel.matches({}) is False


@pytest.mark.parametrize("text, names", [
    ("a = 1 AND b LIKE 'x%' OR c IS NULL", {"a", "b", "c"}),
    ("x BETWEEN lo AND hi", {"x", "lo", "hi"}),
    ("NOT (p IN ('a')) AND q * 2 > r", {"p", "q", "r"}),
    ("TRUE", set()),
    ("1 = 1", set()),
])
def test_identifiers(evaluator, text, names):
    assert compile_selector(text, evaluator=evaluator).identifiers == frozenset(names)


@pytest.mark.parametrize("text", ["", " ", "\t\n  "])
def test_empty_selector_selects_everything(evaluator, text):
    sel = compile_selector(text, evaluator=evaluator)
    assert sel.selects_all
    assert sel.identifiers == frozenset()
    assert sel.matches({}) and sel.matches({"a": None})


def test_compiled_once_per_text():
    assert compile_selector("a = 1") is compile_selector("a = 1")
    assert compile_selector("a = 1").implementation == IMPLEMENTATION


def test_error_fields_and_wire_round_trip():
    with pytest.raises(InvalidSelector) as info:
        compile_selector("color = 'red' AND (weight > 10")
    err = info.value
    assert isinstance(err, PymqError)
    assert err.position == 30 and err.expected == "')'"
    assert str(err) == "selector error at position 30: expected ')' but found end of input"
    assert ERROR_CODES["invalid-selector"] is InvalidSelector
    back = error_from_headers(error_headers(err))
    assert isinstance(back, InvalidSelector)
    assert back.position == "30" and back.expected == "')'"


def test_position_points_into_the_text():
    text = "a = 1 AND b IN ('x', 'y' 'z')"
    with pytest.raises(InvalidSelector) as info:
        compile_selector(text)
    assert text[info.value.position:].startswith("'z'")


def test_not_a_string_is_an_invalid_selector():
    with pytest.raises(InvalidSelector):
        compile_selector(None)  # type: ignore[arg-type]


class Colour(str, enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 7


class FrozenValues(Mapping):
    """Not a dict: the evaluators must go through .get()."""

    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


@pytest.mark.parametrize("wrap", [dict, types.MappingProxyType, FrozenValues])
def test_any_mapping(evaluator, wrap):
    sel = compile_selector("color = 'red' AND level > 5 AND gone IS NULL", evaluator=evaluator)
    assert sel.matches(wrap({"color": "red", "level": 7}))
    assert not sel.matches(wrap({"color": "red", "level": 5}))


def test_subclasses_of_str_and_int_are_their_base_types(evaluator):
    sel = compile_selector("color = 'red' AND level = 7 AND level + 1 = 8 AND color LIKE 'r%'", evaluator=evaluator)
    assert sel.evaluate({"color": Colour.RED, "level": Level.HIGH}) is True


@pytest.mark.parametrize("value", [b"red", 2 ** 64, -(2 ** 63) - 1, [1], object()])
def test_values_of_no_jms_type_are_unknown_but_not_null(evaluator, value):
    for text in ("x = 1", "x <> 1", "x = 'red'", "x + 1 > 0", "x LIKE '%'", "x IN ('a')", "x IN (1)",
                 "x BETWEEN 0 AND 1", "x"):
        assert compile_selector(text, evaluator=evaluator).evaluate({"x": value}) is None, text
    assert compile_selector("x IS NULL", evaluator=evaluator).evaluate({"x": value}) is False


def test_bool_is_not_a_number(evaluator):
    for text in ("x = 1", "x + 0 = 1", "x > 0", "x IN (1)", "-x = -1"):
        assert compile_selector(text, evaluator=evaluator).evaluate({"x": True}) is None, text


def test_evaluate_is_three_valued_and_matches_is_strict(evaluator):
    sel = compile_selector("a > 1", evaluator=evaluator)
    assert (sel.evaluate({"a": 2}), sel.evaluate({"a": 0}), sel.evaluate({})) == (True, False, None)
    assert (sel.matches({"a": 2}), sel.matches({"a": 0}), sel.matches({})) == (True, False, False)


def test_batch_helpers(evaluator):
    programs = [evaluator.build(compile_selector(t).ir) for t in ("a = 1", "a = 2", "a > 0", "b IS NULL")]
    assert evaluator.first_match(programs, {"a": 2}) == 1
    assert evaluator.first_match(programs, {"a": -1, "b": 1}) == -1
    assert evaluator.all_matches(programs, {"a": 2}) == [1, 2, 3]
    assert evaluator.all_matches([], {"a": 2}) == []


def test_implementations_registry():
    assert IMPLEMENTATIONS["py"].IMPLEMENTATION == "py"
    if IMPLEMENTATIONS["c"] is not None:
        assert IMPLEMENTATIONS["c"].IMPLEMENTATION == "c"
        assert IMPLEMENTATION == "c"


def test_ir_is_plain_data():
    # the compiled form is tuples of str/number/bool, so it can be logged, compared and shipped
    ir = compile_selector("a NOT BETWEEN 1 AND 2 OR b LIKE 'x!_%' ESCAPE '!'").ir
    assert ir == ("or", (("notbetween", ("prop", "a"), ("lit", 1), ("lit", 2)),
                         ("like", ("prop", "b"), (("lit", "x_"), ("any", "")))))
