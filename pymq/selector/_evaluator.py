"""Picks the selector evaluator: the compiled ``_evaluator_c`` unless PYMQ_NO_EXTENSIONS=1 or not built.

Both implementations expose the same surface (see ``_evaluator_py``): ``build(ir) -> Program`` with
``Program.evaluate(values) -> True | False | None`` and ``Program.matches(values) -> bool``, and the batch
helpers ``first_match(programs, values) -> int`` and ``all_matches(programs, values) -> list[int]`` used by
the storage-rule evaluator.  Programs of one implementation must not be mixed with the other's helpers.
"""
from __future__ import annotations

from pymq._accel import load

_py, _c = load("pymq.selector._evaluator_py", "pymq.selector._evaluator_c")

#: every implementation, for tests and benchmarks ("c" is None when not built or disabled)
IMPLEMENTATIONS = {"py": _py, "c": _c}

#: the implementation in use
impl = _c if _c is not None else _py
build = impl.build
first_match = impl.first_match
all_matches = impl.all_matches
IMPLEMENTATION: str = impl.IMPLEMENTATION
