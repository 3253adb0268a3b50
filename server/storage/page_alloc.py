"""The page allocator the file device uses: the compiled twin unless PYMQ_NO_EXTENSIONS=1 or unbuilt.

``_page_alloc_py`` defines the semantics; ``IMPLEMENTATIONS`` exposes both for tests and benchmarks.
"""
from __future__ import annotations

from pymq._accel import load

_py, _c = load("pymq_server.storage._page_alloc_py", "pymq_server.storage._page_alloc_c")
_impl = _c if _c is not None else _py

IMPLEMENTATIONS = {"py": _py, "c": _c}

PageAllocator = _impl.PageAllocator
AllocatorError = _impl.AllocatorError
FREE = _py.FREE
PERSISTENT = _py.PERSISTENT
NON_PERSISTENT = _py.NON_PERSISTENT
SYSTEM = _py.SYSTEM
PENDING = _py.PENDING
RELEASING = _py.RELEASING
KIND_NAMES = _py.KIND_NAMES

__all__ = ["PageAllocator", "AllocatorError", "FREE", "PERSISTENT", "NON_PERSISTENT", "SYSTEM",
           "PENDING", "RELEASING", "KIND_NAMES", "IMPLEMENTATIONS"]
