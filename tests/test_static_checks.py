"""mypy and ruff, run by the test suite (CI runs ``python -m pytest``, so CI runs both).

mypy uses ``[tool.mypy]`` of pyproject.toml (strict for pymq.protocol, pymq.selector and pymq.routing; the
``pymq_server`` name maps to server/ through tools/mypy); ruff uses ``[tool.ruff]``.  Each runs over the
paths that are clean today, listed below: a path joins its list in the same commit that makes it clean,
so these tests only ever fail on a regression.  Both tools come with the ``test`` extra
(``pip install -e '.[test]'``, which .ci/run installs); locally a missing tool skips, under CI it fails.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: packages (import names, mypy's ``-p``) at 0 mypy errors: everything issue 9 asks for (pymq_server is
#: server/, through tools/mypy).
MYPY_CLEAN = ["pymq", "pymq_server", "pyspark_pymq"]

#: files and directories (relative to the repository) that ``ruff check`` passes.  To extend: add the path
#: once ``ruff check <path>`` passes.
RUFF_CLEAN = ["pymq", "server", "pyspark_pymq", "tools", "bench", "tests/client", "tests/cores", "tests/cluster",
              "tests/test_static_checks.py"]

#: files inside a RUFF_CLEAN directory that are not clean yet, excluded from the check until they are.
RUFF_NOT_YET: list[str] = []


def _tool(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is not installed: it is in the test extra (pip install -e '.[test]')")
        pytest.skip(f"{module} is in the test extra: pip install -e '.[test]'")


def test_mypy_is_clean():
    _tool("mypy")
    # silent: a clean package may import one that is not clean yet (pymq.client.vm annotates with
    # pymq_server types); only the listed packages' own errors count
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
               "--cache-dir", str(ROOT / ".mypy_cache"), "--follow-imports=silent"]
    for package in MYPY_CLEAN:
        command += ["-p", package]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout


def test_ruff_is_clean():
    _tool("ruff")
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    not_yet = [arg for path in RUFF_NOT_YET for arg in ("--extend-exclude", path)]
    done = subprocess.run([ruff, "check", "--no-cache", *not_yet, *RUFF_CLEAN], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_clean_lists_name_real_paths():
    """A misspelt entry would check nothing and pass."""
    for package in MYPY_CLEAN:
        assert (ROOT / package).is_dir() or (ROOT / "tools/mypy" / package).is_dir(), package
    for path in RUFF_CLEAN + RUFF_NOT_YET:
        assert (ROOT / path).exists(), path
