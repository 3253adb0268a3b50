"""Run one suite against both implementations of an accelerated module (ids ``c`` and ``py``).

Usage in a test module::

    from tests.twins import twin_fixture
    scanner = twin_fixture("pymq.protocol._scanner_py", "pymq.protocol._scanner_c")

    def test_x(scanner): scanner.FrameScanner(...)

The compiled twin missing is a failure, not a skip, unless PYMQ_NO_EXTENSIONS=1 asked for that: a
build that silently fell back to Python would otherwise pass unnoticed.
"""
from __future__ import annotations

import importlib

import pytest

from pymq._accel import NO_EXTENSIONS


def _load(name: str):
    return importlib.import_module(name)


def twin_fixture(py_name: str, c_name: str, scope: str = "session"):
    @pytest.fixture(params=["c", "py"], scope=scope)
    def _fixture(request):
        if request.param == "py":
            return _load(py_name)
        if NO_EXTENSIONS:
            pytest.skip("PYMQ_NO_EXTENSIONS=1: the compiled twin is disabled on purpose")
        try:
            return _load(c_name)
        except ImportError as exc:
            pytest.fail(f"compiled module {c_name} is not built ({exc}); run `pip install -e .`")
    return _fixture


def compiled(implementations: dict, what: str):
    """The compiled entry of a picker's ``IMPLEMENTATIONS``-style table (keys ``c`` and ``py``): a failure when it
    was not built, a skip only when PYMQ_NO_EXTENSIONS=1 asked for that, as ``twin_fixture`` decides."""
    module = implementations["c"]
    if module is None:
        if NO_EXTENSIONS:
            pytest.skip("PYMQ_NO_EXTENSIONS=1: the compiled twin is disabled on purpose")
        pytest.fail(f"the compiled {what} is not built: run `pip install -e .`")
    return module
