"""The broker bench's second load client (bench/goload: go-stomp) counts right: against the bench's toy
broker, which drops one message and delivers another twice, it must report exactly 1 lost and 1 duplicated
on a queue, 2 and 2 on a topic with two subscribers, and 0 and 0 on a clean run — the same self-check the
asyncio load client passes (``bench_brokers.py --self-check --client go``).  Issue 30: no row of the broker
benchmark depends on one client, so the second one must be as trustworthy as the first."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import goload  # noqa: E402


def test_the_go_load_client_counts_loss_and_duplicates_exactly():
    if goload.find_go() is None:
        if os.environ.get("CI"):
            pytest.fail("no Go toolchain: .ci/interop-clients.sh installs one")
        pytest.skip("no Go toolchain (eval \"$(.ci/interop-clients.sh)\")")
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_brokers.py"), "--self-check", "--client", "go"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    lines = [line for line in p.stdout.splitlines() if line.startswith("self-check go")]
    assert p.returncode == 0 and "self-check passed" in p.stdout, p.stdout + p.stderr[-2000:]
    assert len(lines) == 3 and all(line.endswith("-> ok") for line in lines), lines
