"""Picks the selector evaluator: the compiled ``_evaluator_c`` unless PYMQ_NO_EXTENSIONS=1 or not built.

Both implementations expose the same surface (see ``_evaluator_py`` and the stub ``_evaluator_c.pyi``):
``build(ir) -> Program`` with ``Program.evaluate(values) -> True | False | None`` and
``Program.matches(values) -> bool``, and the batch helpers ``first_match(programs, values) -> int`` and
``all_matches(programs, values) -> list[int]`` used by the storage-rule evaluator.  Programs of one
implementation must not be mixed with the other's helpers.  A plain import, so the type checker reads the
stub and checks the twin against it.
"""
from __future__ import annotations

from types import ModuleType

from pymq._accel import NO_EXTENSIONS, note_missing
from pymq.selector import _evaluator_py as _py

try:
    if NO_EXTENSIONS:
        raise ImportError("PYMQ_NO_EXTENSIONS=1")
    from pymq.selector import _evaluator_c as _c
    from pymq.selector._evaluator_c import IMPLEMENTATION, Program, all_matches, build, first_match
except ImportError:
    _c = None  # type: ignore[assignment]
    note_missing("pymq.selector._evaluator_c")
    from pymq.selector._evaluator_py import (IMPLEMENTATION, Program, all_matches,  # type: ignore[assignment]
                                             build, first_match)

#: every implementation, for tests and benchmarks ("c" is None when not built or disabled)
IMPLEMENTATIONS: dict[str, ModuleType | None] = {"py": _py, "c": _c}

#: the implementation in use
impl: ModuleType = _c if _c is not None else _py

__all__ = ["IMPLEMENTATION", "IMPLEMENTATIONS", "Program", "all_matches", "build", "first_match", "impl"]
