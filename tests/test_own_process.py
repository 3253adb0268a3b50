"""The ``own_process`` marker (tests/conftest.py): a marked test runs in a child pytest, and fails with it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import OWN_PROCESS

PROBE = "tests/test_own_process.py::test_a_marked_test_runs_in_a_child_of_its_own"


@pytest.mark.own_process
def test_a_marked_test_runs_in_a_child_of_its_own():
    assert os.environ.get(OWN_PROCESS) == PROBE          # in the parent this body never runs
    assert os.environ.get("PYMQ_TEST_PROBE_FAILS") != "1", "the probe fails when asked to"


def test_a_child_that_fails_fails_the_marked_test():
    env = {k: v for k, v in os.environ.items() if k != OWN_PROCESS}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", PROBE],
                         cwd=str(Path(__file__).resolve().parent.parent), env={**env, "PYMQ_TEST_PROBE_FAILS": "1"},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout
    assert "in its own process" in run.stdout and "the probe fails when asked to" in run.stdout
