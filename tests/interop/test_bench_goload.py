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


def test_the_go_load_client_samples_are_on_the_probes_clock():
    """bench/latency_trace.py splits each message's latency at the broker's probes (time.monotonic_ns in
    the broker's process) from the Go client's own send and arrival times: those must be CLOCK_MONOTONIC
    readings, one (send, arrival) pair per delivery, sends in order, each arrival after its send."""
    if goload.find_go() is None:
        if os.environ.get("CI"):
            pytest.fail("no Go toolchain: .ci/interop-clients.sh installs one")
        pytest.skip("no Go toolchain (eval \"$(.ci/interop-clients.sh)\")")
    import array
    import multiprocessing as mp
    import tempfile
    import time

    from loadclient import Endpoint, LoadSpec
    from peers import free_port, wait_for_port
    from toybroker import serve

    goload.build()                      # not inside the measured window below
    port = free_port()
    proc = mp.get_context("fork").Process(target=serve, args=(port,), daemon=True)
    proc.start()
    try:
        wait_for_port(port, 10, None)
        spec = LoadSpec(destination="/queue/samples", size=128, rate=2000, count=400, duration=5,
                        persistent=None, app_headers=4, idle_timeout=2.0)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "samples")
            before = time.monotonic_ns()
            r = goload.run_load(Endpoint("127.0.0.1", port), spec, samples_path=path)
            after = time.monotonic_ns()
            pairs = array.array("q")
            with open(path, "rb") as f:
                pairs.frombytes(f.read())
    finally:
        proc.kill()
        proc.join(5)
    assert not r.errors and r.received == r.sent == 400, (r.errors, r.sent, r.received)
    sends, arrivals = list(pairs[0::2]), list(pairs[1::2])
    assert len(sends) == len(arrivals) == 400
    assert sends == sorted(sends)       # one producer, one queue, one consumer: delivered in order
    assert all(before < s <= a < after for s, a in zip(sends, arrivals, strict=True))
