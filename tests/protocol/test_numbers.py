"""The one wire-integer parser: what it accepts, what it refuses, and that the error names the header."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from pymq.errors import InvalidHeader
from pymq.protocol.numbers import INT64_MAX, MAX_DIGITS, header_int, parse_wire_int


@pytest.mark.parametrize("text, expected", [("0", 0), ("7", 7), ("007", 7), (str(INT64_MAX), INT64_MAX)])
def test_accepts_plain_digits(text: str, expected: int) -> None:
    assert parse_wire_int("content-length", text) == expected


@pytest.mark.parametrize("text", ["", "+5", " 5", "5 ", "5_000", "0x10", "1e3", "\u0663", "-1", "--1", "-",
                                  str(INT64_MAX + 1), "9" * (MAX_DIGITS + 1), "1" * 5000])
def test_refuses_what_is_not_a_wire_integer(text: str) -> None:
    with pytest.raises(InvalidHeader) as info:
        parse_wire_int("content-length", text)
    assert info.value.header == "content-length"
    assert "content-length" in str(info.value)
    assert len(str(info.value)) < 200          # a 5000-digit value is not echoed back whole


def test_bounds_and_negatives() -> None:
    assert parse_wire_int("d", "-5", minimum=-10) == -5
    with pytest.raises(InvalidHeader):
        parse_wire_int("d", "-11", minimum=-10)
    with pytest.raises(InvalidHeader):
        parse_wire_int("priority", "10", maximum=9)


def test_header_int_defaults() -> None:
    assert header_int({}, "x", 3) == 3
    assert header_int({"x": ""}, "x") is None
    assert header_int({"x": "12"}, "x", 3) == 12


@given(st.text(max_size=30))
def test_agrees_with_a_regular_expression(text: str) -> None:
    import re
    ok = re.fullmatch(r"[0-9]{1,19}", text) is not None and int(text) <= INT64_MAX
    try:
        value = parse_wire_int("h", text)
    except InvalidHeader:
        assert not ok
    else:
        assert ok and value == int(text)


def test_a_minus_sign_is_refused_where_negatives_are_not_even_on_zero() -> None:
    """``-0`` is 0 in value but not a non-negative wire integer: the sign alone is refused (issue 31: a
    mutant that checked the sign only for a positive minimum let it through)."""
    with pytest.raises(InvalidHeader, match="non-negative integer"):
        parse_wire_int("content-length", "-0")
    with pytest.raises(InvalidHeader, match="must be an integer"):
        parse_wire_int("d", "5x", minimum=-1)
    assert parse_wire_int("d", "-0", minimum=-1) == 0


def test_header_int_passes_its_name_and_both_bounds() -> None:
    assert header_int({"n": "0"}, "n") == 0                       # the default minimum is 0
    assert header_int({"n": "-5"}, "n", minimum=-10) == -5
    with pytest.raises(InvalidHeader) as info:
        header_int({"n": "11"}, "n", maximum=10)
    assert info.value.header == "n" and "'n'" in str(info.value)
    with pytest.raises(InvalidHeader):
        header_int({"n": "-1"}, "n")


def test_at_most_nineteen_characters_even_for_a_small_value() -> None:
    with pytest.raises(InvalidHeader, match="at most 19"):
        parse_wire_int("content-length", "0" * 19 + "1")
    assert parse_wire_int("content-length", "0" * 18 + "1") == 1
