"""The Python functions a call runs, in order: the tests that pin a hot path's steps (a removal's look-ups,
a paged read's file layers, a cluster route's frames) read them from here."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import CodeType
from typing import Any


def qualname(code: CodeType) -> str:
    return code.co_qualname


def file_and_name(code: CodeType) -> str:
    return f"{os.path.basename(code.co_filename)}:{code.co_name}"


def python_calls(fn: Callable[[], Any], label: Callable[[CodeType], str] = qualname) -> tuple[Any, list[str]]:
    """``fn()``'s result and every Python function it called (each named by ``label``), under a profile hook."""
    calls: list[str] = []

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call":
            calls.append(label(frame.f_code))

    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return result, calls
