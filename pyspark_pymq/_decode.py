"""Picker for the MESSAGE frames -> Arrow decoder: the compiled ``_ext/arrow_decode.pyx`` if built, else
its pure-Python twin (``PYMQ_NO_EXTENSIONS=1`` forces the twin).  Both give the same batch (spec/spark.md §4)."""
from __future__ import annotations

from types import ModuleType

from pymq._accel import load

_py, _c = load("pyspark_pymq._decode_py", "pyspark_pymq._decode_c")

IMPLEMENTATIONS: dict[str, ModuleType] = {"py": _py} if _c is None else {"py": _py, "c": _c}
#: the module in use
implementation: ModuleType = _c if _c is not None else _py
COMPILED = _c is not None

frames_to_batch = implementation.frames_to_batch
