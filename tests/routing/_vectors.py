"""Load the routing vectors from spec/vectors (the same files every binding runs)."""
from __future__ import annotations

import json
import pathlib

import pytest

from pymq._accel import NO_EXTENSIONS

SPEC = pathlib.Path(__file__).resolve().parents[2] / "spec" / "vectors"


def load(name: str) -> dict:
    with open(SPEC / name, encoding="utf-8") as fh:
        return json.load(fh)


def both_implementations():
    """(twin, compiled) for agreement tests; the compiled one missing fails unless disabled on purpose."""
    from pymq.routing import _bloom_py
    if NO_EXTENSIONS:
        pytest.skip("PYMQ_NO_EXTENSIONS=1: the compiled twin is disabled on purpose")
    try:
        from pymq.routing import _bloom_c
    except ImportError as exc:
        pytest.fail(f"pymq.routing._bloom_c is not built ({exc}); run `pip install -e .`")
    return _bloom_py, _bloom_c
