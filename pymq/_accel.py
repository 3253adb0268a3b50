"""Pick the compiled implementation of a hot path, or its pure-Python twin.

Every accelerated module comes as a pair: ``<name>_py.py`` defines the semantics, ``_ext/<name>.pyx``
compiles to ``<name>_c``.  ``PYMQ_NO_EXTENSIONS=1`` forces the twin (as yarl and multidict do), which is
also what a machine without a compiler gets.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

NO_EXTENSIONS = os.environ.get("PYMQ_NO_EXTENSIONS", "") not in ("", "0")

#: compiled modules that were asked for but are not installed (a build without a C compiler):
#: ``pymq-server`` names them in a warning at start-up
MISSING: list[str] = []


def note_missing(c_name: str) -> None:
    """A static picker (``pymq/protocol/scanner.py``...) could not import compiled ``c_name``."""
    if not NO_EXTENSIONS and c_name not in MISSING:
        MISSING.append(c_name)


def load(py_name: str, c_name: str) -> tuple[ModuleType, ModuleType | None]:
    """Return (twin, compiled-or-None); the compiled one is None when disabled or not built."""
    py_mod = importlib.import_module(py_name)
    if NO_EXTENSIONS:
        return py_mod, None
    try:
        c_mod = importlib.import_module(c_name)
    except ImportError:
        c_mod = None
        MISSING.append(c_name)
    return py_mod, c_mod
