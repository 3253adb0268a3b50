"""Run hostile input where a crash cannot take pytest down: in a child interpreter.

A segfault in compiled code (a stack overflow, an out-of-bounds read) kills the process that meets it.
Tests for such defects run the input in a child with :func:`run_isolated`, so that on a build with the
defect the child dies and the *test* fails with the signal named, while the rest of the suite runs on.
A freeze (a regular expression backtracking for ever) is caught the same way, by the child's timeout.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass


@dataclass
class Outcome:
    returncode: int | None      # None: killed at the timeout
    stdout: str
    stderr: str

    def describe(self) -> str:
        if self.returncode is None:
            how = "did not finish in time (frozen)"
        elif self.returncode < 0:
            how = f"died of {signal.Signals(-self.returncode).name}"
        else:
            how = f"exited with {self.returncode}"
        return f"the child {how}; stdout={self.stdout[-800:]!r} stderr={self.stderr[-1500:]!r}"

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_isolated(code: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> Outcome:
    """Run ``code`` (dedented) in a fresh interpreter with this one's environment (so
    ``PYMQ_NO_EXTENSIONS`` carries over) and return how it ended."""
    child_env = dict(os.environ)
    child_env.update(env or {})
    # the code goes in on stdin: hostile inputs are often longer than an argument may be
    proc = subprocess.Popen([sys.executable, "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env)
    try:
        out, err = proc.communicate(textwrap.dedent(code), timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return Outcome(None, out, err)
    return Outcome(proc.returncode, out, err)
