"""The frame scanner and encoder in use: compiled (``_ext/scanner.pyx``) unless unavailable or disabled.

A plain import the type checker follows: it reads the compiled module's stub (``_scanner_c.pyi``) and
checks the twin's functions against it.  ``PYMQ_NO_EXTENSIONS=1``, or a build without a compiler, takes
the pure-Python twin (``_scanner_py``), which defines the semantics.
"""
from __future__ import annotations

from types import ModuleType

from pymq._accel import NO_EXTENSIONS, note_missing
from pymq.protocol import _scanner_py as _py
from pymq.protocol._scanner_py import DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_HEADERS, escape, unescape

try:
    if NO_EXTENSIONS:
        raise ImportError("PYMQ_NO_EXTENSIONS=1")
    from pymq.protocol import _scanner_c as _c
    from pymq.protocol._scanner_c import FrameScanner, encode_frame, encode_headers
except ImportError:
    _c = None  # type: ignore[assignment]
    note_missing("pymq.protocol._scanner_c")
    from pymq.protocol._scanner_py import FrameScanner, encode_frame, encode_headers  # type: ignore[assignment]

#: both implementations, for tests and benchmarks ("c" is None when not built or disabled)
IMPLEMENTATIONS: dict[str, ModuleType | None] = {"py": _py, "c": _c}
COMPILED = _c is not None

__all__ = ["FrameScanner", "encode_frame", "encode_headers", "escape", "unescape", "DEFAULT_MAX_FRAME_SIZE",
           "DEFAULT_MAX_HEADERS", "IMPLEMENTATIONS", "COMPILED"]
