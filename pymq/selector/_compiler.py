"""Compile selector and storage-rule text into :class:`Selector` objects.

Parsing (pure Python) happens once per subscription or rule; evaluation runs in the evaluator the
picker chose (Cython unless disabled).  Compiled selectors are immutable and cached by text, so a
thousand subscriptions with the same selector share one compiled program (selectors up to
``CACHED_LENGTH`` characters: the cache must not become a way to hold memory).
"""
from __future__ import annotations

from functools import lru_cache
from types import ModuleType
from collections.abc import Mapping

from . import _evaluator
from ._parser import DEFAULT_LIMITS, JMS, Dialect, SelectorLimits, parse
from ._rules import STORAGE_RULES


class Selector:
    """A compiled selector (or storage-rule condition).

    ``text`` is the source, ``identifiers`` the names of the value mapping it reads (so the broker can
    skip building values nobody reads), ``ir`` the compiled tree both evaluators take, and
    ``implementation`` which evaluator runs it (``"c"`` or ``"py"``).
    """

    def __init__(self, text: str, dialect: Dialect = JMS, evaluator: ModuleType | None = None,
                 limits: SelectorLimits = DEFAULT_LIMITS) -> None:
        result = parse(text, dialect, limits)      # every limit is checked here, before building
        evaluator = evaluator or _evaluator.impl
        self.text = text
        self.identifiers: frozenset[str] = result.reads
        self.ir = result.ir
        self.dialect = dialect.label
        self.implementation: str = evaluator.IMPLEMENTATION
        self.program = evaluator.build(result.ir)
        # Bind the evaluator's methods straight onto the instance: a call to selector.matches(...) then
        # goes to the compiled method with no Python frame in between (the hot path of dispatch).
        self.matches = self.program.matches  # type: ignore[method-assign]
        self.evaluate = self.program.evaluate  # type: ignore[method-assign]

    def matches(self, values: Mapping[str, object]) -> bool:  # replaced per instance in __init__
        """True when the selector evaluates to TRUE for ``values`` (identifier -> value; absent is NULL)."""
        return bool(self.program.matches(values))

    def evaluate(self, values: Mapping[str, object]) -> bool | None:
        """The three-valued result: True, False, or None for unknown."""
        result: bool | None = self.program.evaluate(values)
        return result

    @property
    def selects_all(self) -> bool:
        """True for the empty selector (no filtering at all)."""
        return self.ir is None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.dialect} {self.text!r} [{self.implementation}]>"


#: selectors up to this many characters are cached (almost all of them); longer ones are compiled each
#: time, so the cache holds at most 4096 small programs, never 4096 selectors at the length limit
CACHED_LENGTH = 1024


@lru_cache(maxsize=4096)
def _cached_small(text: str, dialect: Dialect, limits: SelectorLimits) -> Selector:
    return Selector(text, dialect, limits=limits)


def _cached(text: str, dialect: Dialect, limits: SelectorLimits) -> Selector:
    if len(text) > CACHED_LENGTH:
        return Selector(text, dialect, limits=limits)
    return _cached_small(text, dialect, limits)


def compile_selector(text: str, *, evaluator: ModuleType | None = None,
                     limits: SelectorLimits = DEFAULT_LIMITS) -> Selector:
    """Compile a JMS message selector; an empty or blank one selects every message.

    Raises :class:`pymq.errors.InvalidSelector` with ``position`` and ``expected``, also for a selector
    over ``limits`` (length, nesting depth, number of terms: spec/selector.md §7).  ``evaluator`` forces
    one implementation (a module from ``pymq.selector.IMPLEMENTATIONS``), for tests and benchmarks.
    """
    if evaluator is not None:
        return Selector(text, JMS, evaluator, limits)
    if not isinstance(text, str):
        return Selector(text, JMS, limits=limits)          # raises the typed error
    return _cached(text, JMS, limits)


def compile_rule(text: str, *, evaluator: ModuleType | None = None,
                 limits: SelectorLimits = DEFAULT_LIMITS) -> Selector:
    """Compile a storage-rule condition (seed 000 dialect); ``.matches(ctx)`` takes a rule context."""
    if evaluator is not None:
        return Selector(text, STORAGE_RULES, evaluator, limits)
    if not isinstance(text, str):
        return Selector(text, STORAGE_RULES, limits=limits)
    return _cached(text, STORAGE_RULES, limits)
