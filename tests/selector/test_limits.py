"""Selectors with bounded cost: limits checked before compiling, no unbounded recursion, linear LIKE.

Regressions (issue 10), each run where a crash or a freeze fails the test instead of killing pytest:
* ``x + 1 + 1 + ...`` with 80,000 terms built a left-deep tree that the compiled evaluator walked
  recursively until the C stack overflowed (a segfault);
* ``NOT NOT ...`` and ``((((...`` ×5000 raised RecursionError: a generic internal error, not
  ``invalid-selector``;
* ``p LIKE '%a%a%a%a%a%a%b'`` compiled to a backtracking regular expression: one 3,000-character value
  froze the evaluating thread for good.
"""
from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.errors import ConfigError, InvalidSelector
from pymq.selector import DEFAULT_LIMITS, IMPLEMENTATIONS, SelectorLimits, compile_rule, compile_selector
from pymq.selector._ir import MAX_HEIGHT
from tests.isolated import run_isolated

EVALUATOR_MODULES = {"c": "pymq.selector._evaluator_c", "py": "pymq.selector._evaluator_py"}

HOSTILE = {
    "sum of 80,000 terms": "x" + " + 1" * 80_000 + " > 0",
    "NOT x5000": "NOT " * 5000 + "b",
    "parentheses x5000": "(" * 5000 + "x" + ")" * 5000 + " > 0",
    "signs x5000": "- " * 5000 + "x > 0",
    "5000-digit integer": "x = " + "9" * 5000,
}


def _name(which: str) -> str:
    from pymq._accel import NO_EXTENSIONS
    if which == "c" and NO_EXTENSIONS:
        pytest.skip("PYMQ_NO_EXTENSIONS=1: the compiled twin is disabled on purpose")
    return EVALUATOR_MODULES[which]


@pytest.mark.parametrize("which", ["c", "py"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("generous", [False, True], ids=["default-limits", "only-depth-limited"])
def test_hostile_selectors_are_invalid_selectors_not_crashes(which, case, generous):
    """With generous length and term limits, the depth limit alone must stop each of them."""
    outcome = run_isolated(f"""
        import importlib
        from pymq.errors import InvalidSelector
        from pymq.selector import compile_selector
        evaluator = importlib.import_module({_name(which)!r})
        kw = {{}}
        if {generous!r}:
            from pymq.selector import SelectorLimits
            kw["limits"] = SelectorLimits(max_length=10 ** 7, max_terms=10 ** 7)
        try:
            s = compile_selector({HOSTILE[case]!r}, evaluator=evaluator, **kw)
            print("compiled", s.evaluate({{"x": 1, "b": True}}))
        except InvalidSelector as exc:
            print("invalid-selector", exc.position)
        except BaseException as exc:
            print("other", type(exc).__name__)
        """)
    assert outcome.ok, outcome.describe()
    assert outcome.stdout.startswith("invalid-selector"), outcome.stdout


@pytest.mark.parametrize("which", ["c", "py"])
def test_like_with_many_percent_signs_is_linear_not_a_freeze(which):
    outcome = run_isolated(f"""
        import importlib
        from pymq.selector import compile_selector
        evaluator = importlib.import_module({_name(which)!r})
        s = compile_selector("p LIKE '%a%a%a%a%a%a%b'", evaluator=evaluator)
        print(s.evaluate({{"p": "a" * 3000}}), s.evaluate({{"p": "a" * 3000 + "b"}}))
        t = compile_selector("p LIKE '%" + "a_" * 400 + "b%'", evaluator=evaluator)
        print(t.evaluate({{"p": "a" * 200_000}}))
        """, timeout=60)
    assert outcome.ok, outcome.describe()
    assert outcome.stdout.split() == ["False", "True", "False"]


@pytest.mark.parametrize("which", ["c", "py"])
def test_a_tree_higher_than_the_evaluators_bound_is_refused_by_build(which):
    """A tree that did not come from the parser (hand-built IR) meets the same bound in ``build``."""
    outcome = run_isolated(f"""
        import importlib
        from pymq.errors import InvalidSelector
        evaluator = importlib.import_module({_name(which)!r})
        ir = ("prop", "b")
        for _ in range(100_000):
            ir = ("not", ir)
        try:
            evaluator.build(ir)
            print("built")
        except InvalidSelector:
            print("invalid-selector")
        """)
    assert outcome.ok, outcome.describe()
    assert outcome.stdout.strip() == "invalid-selector"


# -- each limit, at and over its value ---------------------------------------------------------------


def test_defaults_are_stated():
    assert DEFAULT_LIMITS == SelectorLimits(max_length=16_384, max_depth=64, max_terms=2_048,
                                            max_like_length=1_024)
    assert DEFAULT_LIMITS.max_depth <= MAX_HEIGHT


def _at_limit_and_over(make, limit):
    return make(limit), make(limit + 1)


def test_length_limit(evaluator):
    limits = SelectorLimits(max_length=40)
    ok, over = "a = '" + "x" * 34 + "'", "a = '" + "x" * 35 + "'"
    assert len(ok) == 40
    compile_selector(ok, evaluator=evaluator, limits=limits)
    with pytest.raises(InvalidSelector) as info:
        compile_selector(over, evaluator=evaluator, limits=limits)
    assert info.value.position == 40 and info.value.expected == "at most 40 characters"


def test_terms_limit_counts_identifiers_and_literals(evaluator):
    limits = SelectorLimits(max_terms=6)
    compile_selector("a IN (1, 2, 3, 4, 5)", evaluator=evaluator, limits=limits)        # 6 terms
    with pytest.raises(InvalidSelector) as info:
        compile_selector("a IN (1, 2, 3, 4, 5, 6)", evaluator=evaluator, limits=limits)
    assert info.value.position == 21 and info.value.expected == "at most 6 identifiers and literals"


@pytest.mark.parametrize("shape, answer", [
    (lambda n: "(" * (n - 1) + "x > 0" + ")" * (n - 1), lambda n: True),   # n-1 parentheses + the comparison
    (lambda n: "NOT " * (n - 2) + "b", lambda n: n % 2 == 0),              # n-2 NOTs over cond(prop)
    (lambda n: "x" + " + 1" * (n - 2) + " > 0", lambda n: True),          # cmp over n-2 levels of '+' over prop
])
def test_depth_limit_at_the_default_and_over(evaluator, shape, answer):
    n = DEFAULT_LIMITS.max_depth
    ok, over = shape(n), shape(n + 2)
    assert compile_selector(ok, evaluator=evaluator).evaluate({"x": 1, "b": True}) is answer(n)
    with pytest.raises(InvalidSelector) as info:
        compile_selector(over, evaluator=evaluator)
    assert info.value.expected == f"expressions nested at most {n} deep"


def test_depth_limit_is_configurable_downwards_only(evaluator):
    limits = SelectorLimits(max_depth=3)
    compile_selector("a = 1 AND b = 2", evaluator=evaluator, limits=limits)    # and(cmp(prop, lit))
    with pytest.raises(InvalidSelector) as info:
        compile_selector("a + 1 + 1 = 2", evaluator=evaluator, limits=limits)
    assert info.value.position == 10                                 # the '=' that makes it 4 deep
    with pytest.raises(ConfigError):
        SelectorLimits(max_depth=MAX_HEIGHT + 1)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError):
            SelectorLimits(max_terms=bad)


def test_like_pattern_limit(evaluator):
    limits = SelectorLimits(max_like_length=8)
    compile_selector("p LIKE '%abc_ef%'", evaluator=evaluator, limits=limits)
    with pytest.raises(InvalidSelector) as info:
        compile_selector("p LIKE '%abc_efg%'", evaluator=evaluator, limits=limits)
    assert info.value.position == 7


def test_storage_rules_have_the_same_limits(evaluator):
    with pytest.raises(InvalidSelector):
        compile_rule("(" * 100 + "SIZE > 1" + ")" * 100, evaluator=evaluator)
    with pytest.raises(InvalidSelector):
        compile_rule("HEADER('a').isPresent()", evaluator=evaluator, limits=SelectorLimits(max_depth=2))
    assert compile_rule("HEADER('a').isPresent()", evaluator=evaluator,
                        limits=SelectorLimits(max_depth=3)).matches({"headers": {"a": "1"}})


def test_errors_never_echo_a_huge_literal(evaluator):
    with pytest.raises(InvalidSelector) as info:
        compile_selector("x = " + "1" * 3000, evaluator=evaluator)
    assert len(str(info.value)) < 300


# -- LIKE: one meaning in both twins, checked against an independent oracle ----------------------------

def _oracle(pattern: str, escape: str | None, value: str) -> bool:
    """LIKE by a regular expression, on inputs small enough for backtracking not to matter."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape and i + 1 < len(pattern) and pattern[i + 1] in ("%", "_", escape):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.fullmatch("".join(out), value, re.DOTALL) is not None


_alphabet = st.sampled_from("ab%_!\u00e9\U0001f600\n")


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=st.text(_alphabet, max_size=10), value=st.text(st.sampled_from("ab!%_\u00e9\U0001f600\n"), max_size=14),
       escape=st.sampled_from([None, "!", "%", "_"]))
def test_like_agrees_with_the_oracle_in_both_twins(pattern, value, escape):
    text = "p LIKE '" + pattern.replace("'", "''") + "'" + (f" ESCAPE '{escape}'" if escape else "")
    expected = _oracle(pattern, escape, value)
    for name, module in IMPLEMENTATIONS.items():
        if module is None:
            continue
        got = compile_selector(text, evaluator=module).evaluate({"p": value})
        assert got is expected, (name, text, value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(group=st.text(st.sampled_from("a_b"), min_size=1, max_size=150),
       value=st.text(st.sampled_from("ab"), max_size=400))
def test_long_groups_cross_the_64_bit_word_boundary_identically(group, value):
    """Groups longer than 64 characters span several machine words in the compiled scan."""
    text = f"p LIKE '%{group}%'"
    expected = _oracle("%" + group + "%", None, value)
    for module in IMPLEMENTATIONS.values():
        if module is not None:
            assert compile_selector(text, evaluator=module).evaluate({"p": value}) is expected


# -- the twins agree on hostile selectors ----------------------------------------------------------------

@st.composite
def _hostile_selectors(draw):
    kind = draw(st.sampled_from(["parens", "nots", "signs", "sum", "like", "number", "in"]))
    n = draw(st.integers(0, 80))
    if kind == "parens":
        return "(" * n + "x > 0" + ")" * draw(st.integers(max(0, n - 1), n + 1))
    if kind == "nots":
        return "NOT " * n + "b"
    if kind == "signs":
        return "-" * n + "x > 0"
    if kind == "sum":
        return "x" + draw(st.sampled_from([" + 1", " * 2", " - x", " / 3"])) * n + " > 0"
    if kind == "like":
        body = draw(st.text(st.sampled_from("a%_\\"), max_size=n * 20))
        return f"p LIKE '{body}'" + draw(st.sampled_from(["", " ESCAPE '\\'"]))
    if kind == "number":
        return "x = " + draw(st.sampled_from(["-", ""])) + draw(st.text("0123456789", min_size=1, max_size=40))
    return "x IN (" + ", ".join(["1"] * (n * 40 + 1)) + ")"


def _outcome(module, text):
    try:
        s = compile_selector(text, evaluator=module, limits=SelectorLimits(max_terms=1_000))
    except InvalidSelector as exc:
        return ("invalid", exc.position, exc.expected)
    values = {"x": 3, "b": True, "p": "a" * 50 + "%_"}
    return ("ok", s.evaluate(values))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_hostile_selectors())
def test_twins_agree_on_hostile_selectors(text):
    results = {name: _outcome(m, text) for name, m in IMPLEMENTATIONS.items() if m is not None}
    assert len(set(results.values())) == 1, (text[:200], results)
