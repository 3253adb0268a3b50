"""The page allocator the file device uses: the compiled twin unless PYMQ_NO_EXTENSIONS=1 or unbuilt.

``_page_alloc_py`` defines the semantics; ``IMPLEMENTATIONS`` exposes both for tests and benchmarks.  A
plain import, so the type checker reads the compiled module's stub (``_page_alloc_c.pyi``).
"""
from __future__ import annotations

from types import ModuleType

from pymq._accel import NO_EXTENSIONS, note_missing
from pymq_server.storage import _page_alloc_py as _py
from pymq_server.storage._page_alloc_py import (FREE, KIND_NAMES, NON_PERSISTENT, PENDING, PERSISTENT, RELEASING,
                                                SYSTEM)

try:
    if NO_EXTENSIONS:
        raise ImportError("PYMQ_NO_EXTENSIONS=1")
    from pymq_server.storage import _page_alloc_c as _c
    from pymq_server.storage._page_alloc_c import AllocatorError, PageAllocator
    _stale = [name for name in vars(_py.PageAllocator) if not name.startswith("_") and not hasattr(PageAllocator, name)]
    if _stale:
        # built from older sources (an editable install not rebuilt after _ext/page_alloc.pyx changed): the
        # twin, never a compiled module that lacks what the twin defines
        raise ImportError(f"_page_alloc_c is stale (no {', '.join(_stale)}): rerun pip install -e .")
except ImportError:
    _c = None  # type: ignore[assignment]
    note_missing("pymq_server.storage._page_alloc_c")
    from pymq_server.storage._page_alloc_py import AllocatorError, PageAllocator  # type: ignore[assignment]

IMPLEMENTATIONS: dict[str, ModuleType | None] = {"py": _py, "c": _c}

__all__ = ["PageAllocator", "AllocatorError", "FREE", "PERSISTENT", "NON_PERSISTENT", "SYSTEM",
           "PENDING", "RELEASING", "KIND_NAMES", "IMPLEMENTATIONS"]
