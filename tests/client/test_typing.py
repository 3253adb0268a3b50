"""The SDK's public API is typed (issue 9 item 6): a user script under ``mypy --strict
--disallow-any-expr`` sees no ``Any``; ``help()`` shows the real signatures and docstrings through the
session guard; the twin pickers are static imports.  (mypy and ruff over the packages:
tests/test_static_checks.py.)"""
from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pymq
import pymq.aio

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("typed_usage.py")

try:
    import mypy.api as mypy_api
except ImportError:  # locally a skip that says how to get it; under CI (CI set) a failure
    if os.environ.get("CI"):
        raise
    pytest.skip("mypy is in the test extra: pip install -e '.[test]'", allow_module_level=True)

#: what the type checker must infer at each reveal_type in typed_usage.py, in order
EXPECTED = [
    "pymq.client.blocking.Connection",
    "pymq.client.blocking.Session",
    "pymq.message.Message",
    "pymq.client.blocking.MessageConsumer",
    "pymq.message.Message | None",
    "builtins.list[pymq.message.Message]",
    "pymq.client._core.RangeResult",
    "pymq.message.Message",
    "pymq.destination.Queue",
    "builtins.int",
    "builtins.list[builtins.dict[builtins.str, builtins.object]]",
    "pymq.destination.Queue",
    "pymq.aio.client.AsyncConnection",
    "pymq.message.Message",
    "pymq.aio.client.AsyncMessageConsumer",
    "pymq.message.Message | None",
    "builtins.list[pymq.message.Message]",
    "pymq.client._core.RangeResult",
    "pymq.message.Message",
    "pymq.destination.Queue",
    "builtins.int",
    "pymq.destination.Queue",
    "pymq.destination.TemporaryQueue",
]


def _mypy(*args: str) -> tuple[str, int]:
    out, err, status = mypy_api.run([*args, "--cache-dir", str(ROOT / ".mypy_cache"),
                                     "--config-file", str(ROOT / "pyproject.toml")])
    return out + err, status


def test_a_user_script_sees_no_any():
    # errors inside pymq are test_pymq_is_mypy_clean's business; here only the script's view counts
    out, status = _mypy("--strict", "--disallow-any-expr", "--follow-imports=silent", str(SCRIPT))
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert not errors, "\n".join(errors)
    # mypy versions differ on spelling builtins: compare without the prefix
    revealed = [t.replace("builtins.", "") for t in re.findall(r'Revealed type is "([^"]+)"', out)]
    assert revealed == [t.replace("builtins.", "") for t in EXPECTED]


def test_help_shows_the_real_signatures_and_docstrings():
    for method in (pymq.MessageProducer.send, pymq.MessageConsumer.receive, pymq.Session.create_consumer,
                   pymq.Session.commit, pymq.aio.AsyncMessageProducer.send, pymq.aio.AsyncMessageConsumer.receive,
                   pymq.aio.AsyncSession.create_consumer):
        signature = inspect.signature(method)
        assert "args" not in signature.parameters and "kwargs" not in signature.parameters, signature
        assert method.__doc__ and "(*args" not in method.__doc__
    send = inspect.signature(pymq.MessageProducer.send)
    assert list(send.parameters)[:3] == ["self", "message", "destination"]
    assert "delivery_mode" in send.parameters and send.return_annotation in ("Message", pymq.Message)
    assert pymq.MessageProducer.send.__doc__.startswith("Send ``message``")
    assert inspect.iscoroutinefunction(pymq.aio.AsyncMessageProducer.send)
    assert list(inspect.signature(pymq.aio.AsyncSession.create_consumer).parameters)[:3] == \
        ["self", "destination", "selector"]


def test_twin_pickers_are_static_imports():
    """The type checker follows the pickers (so the compiled modules' .pyi stubs are read): a plain
    import, no importlib."""
    for path in ("pymq/protocol/scanner.py", "pymq/selector/_evaluator.py", "pymq/routing/bloom.py",
                 "server/storage/page_alloc.py"):
        source = (ROOT / path).read_text()
        assert "importlib" not in source and "load(" not in source, path
    for stub in ("pymq/protocol/_scanner_c.pyi", "pymq/selector/_evaluator_c.pyi", "pymq/routing/_bloom_c.pyi",
                 "server/storage/_page_alloc_c.pyi"):
        assert (ROOT / stub).exists(), stub


def test_a_missing_compiled_module_is_noted_and_its_twin_used():
    """A build without a compiler: the pickers fall back to the twins and pymq._accel.MISSING names the
    compiled modules (pymq-server warns about them at start-up)."""
    code = ("import sys\n"
            "for name in ('pymq.protocol._scanner_c', 'pymq.selector._evaluator_c', 'pymq.routing._bloom_c'):\n"
            "    sys.modules[name] = None\n"
            "import pymq.protocol.scanner as s, pymq.selector._evaluator as e, pymq.routing.bloom as b\n"
            "from pymq._accel import MISSING\n"
            "print(s.COMPILED, s.FrameScanner.__module__, e.impl.__name__, b.implementation.__name__,\n"
            "      sorted(MISSING))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYMQ_NO_EXTENSIONS"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "pymq.protocol._scanner_py", "pymq.selector._evaluator_py",
                                   "pymq.routing._bloom_py", "['pymq.protocol._scanner_c',",
                                   "'pymq.routing._bloom_c',", "'pymq.selector._evaluator_c']"]
