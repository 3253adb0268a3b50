"""The suite's two CI rules (tests/conftest.py) tested from outside: a small pytest run in a child process
with the suite's conftest loaded as a plugin, under ``CI=1`` and without it.

* a skip under CI is a failure — at run time, from a mark, and a module that skips as a whole at import
  (module-level ``pytest.importorskip``) — and the rest of the run still goes on;
* an allow-listed skip stays a skip, but only while its condition holds (the twin skip only under
  ``PYMQ_NO_EXTENSIONS=1``);
* without CI a skip is a skip;
* under CI hypothesis is derandomized, and ``HYPOTHESIS_PROFILE=nightly`` draws more examples.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FILES = {
    "test_runtime_skip.py": """
        import pytest
        def test_needs_a_server():
            pytest.skip("PYMQ_TEST_FAKE_URL is not set")
    """,
    "test_marked_skip.py": """
        import pytest
        @pytest.mark.skipif(True, reason="POSIX sockets")
        def test_platform_mark_whose_condition_is_not_the_platform():
            pass
    """,
    "test_module_skip.py": """
        import pytest
        pytest.importorskip("no_such_module_pymq_ci_rule")
        def test_never_collected():
            pass
    """,
    "test_twin_skip.py": """
        import pytest
        def test_compiled_half():
            pytest.skip("PYMQ_NO_EXTENSIONS=1: the compiled twin is disabled on purpose")
    """,
    "test_ordinary.py": """
        def test_still_runs():
            assert True
    """,
    "test_profile.py": """
        import os
        from hypothesis import settings
        def test_profile():
            current = settings()
            with open(os.environ["PROFILE_OUT"], "w") as fh:
                fh.write(f"{current.derandomize} {current.max_examples}")
    """,
}


def _run(tmp_path: Path, **env: str) -> tuple[int, dict[str, str], str]:
    """Run the files with the suite's conftest as a plugin; returns (exit code, outcome by test, output)."""
    for name, text in FILES.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    child_env = {k: v for k, v in os.environ.items()
                 if k not in ("CI", "HYPOTHESIS_PROFILE", "PYMQ_NO_EXTENSIONS", "PYTEST_ADDOPTS")}
    child_env.update(env, PROFILE_OUT=str(tmp_path / "profile.txt"),
                     PYTHONPATH=os.pathsep.join([str(ROOT), child_env.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                          "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), "-rA", "-q",
                          *sorted(FILES)], cwd=tmp_path, env=child_env, capture_output=True, text=True,
                         timeout=240)
    outcomes: dict[str, str] = {}
    for line in run.stdout.splitlines():
        m = re.match(r"(PASSED|FAILED|ERROR|SKIPPED) (?:\[\d+\] )?(test_\w+)\.py", line)
        if m:
            outcomes.setdefault(m.group(2), m.group(1))
    return run.returncode, outcomes, run.stdout + run.stderr


def test_under_ci_every_skip_fails_except_the_allowed_ones(tmp_path):
    code, outcomes, out = _run(tmp_path, CI="1")
    assert code == 1, out
    # a skip at run time, a skip mark whose condition is not the platform, a module skipped at import
    assert outcomes["test_runtime_skip"] == "FAILED", out
    assert outcomes["test_marked_skip"] in ("FAILED", "ERROR"), out     # marks skip in setup: an error
    assert outcomes["test_module_skip"] == "FAILED", out
    assert "skipped under CI: PYMQ_TEST_FAKE_URL is not set" in out
    assert "skipped under CI: could not import 'no_such_module_pymq_ci_rule'" in out
    # the twin skip is allowed only while PYMQ_NO_EXTENSIONS=1 asks for it: here it does not
    assert outcomes["test_twin_skip"] == "FAILED", out
    # the rest of the run went on
    assert outcomes["test_ordinary"] == "PASSED", out
    assert outcomes["test_profile"] == "PASSED", out
    assert (tmp_path / "profile.txt").read_text() == "True 100"      # derandomized under CI


def test_under_ci_an_allowed_skip_stays_a_skip(tmp_path):
    code, outcomes, out = _run(tmp_path, CI="1", PYMQ_NO_EXTENSIONS="1")
    assert outcomes["test_twin_skip"] == "SKIPPED", out
    assert outcomes["test_runtime_skip"] == "FAILED", out     # the allow-list is by reason, not a blanket
    assert code == 1, out


@pytest.mark.parametrize("env", [{}, {"CI": "0"}], ids=["unset", "zero"])
def test_without_ci_a_skip_is_a_skip(tmp_path, env):
    code, outcomes, out = _run(tmp_path, HYPOTHESIS_PROFILE="nightly", **env)
    assert code == 0, out
    for name in ("test_runtime_skip", "test_marked_skip", "test_module_skip", "test_twin_skip"):
        assert outcomes[name] == "SKIPPED", (name, out)
    assert outcomes["test_ordinary"] == "PASSED", out
    assert (tmp_path / "profile.txt").read_text() == "False 1000"    # the nightly profile: random, longer
