"""A real multi-worker broker (``pymq-server --workers 2``) per test, and connections pinned to a worker.

The kernel spreads connections over the workers (SO_REUSEPORT); CONNECTED names the home worker
(``pymq-worker``), so a test opens connections until it has one on the worker it wants (bounded).
Destination names owned by a worker are found with the specified rule (spec/cores.md §2: the rendezvous hash
of spec/routing.md §2.2 over the worker ids, a numbered name ``<stem>.<n>`` round-robin from its stem's
winner), computed here with the routing module, not with the broker's own lookup.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from pymq.routing import GroupRouter
from tests.conftest import RawStomp

WORKERS = 2


@dataclass
class Cluster:
    """One multi-worker broker process (the supervisor) and what it printed."""

    proc: subprocess.Popen
    port: int
    data_dir: str
    stderr: list[str] = field(default_factory=list)
    conns: list[RawStomp] = field(default_factory=list)

    def connect(self, worker: int, version: str = "1.2", login: str = "guest", passcode: str = "guest",
                **headers: str) -> RawStomp:
        """A logged-in connection whose home is ``worker`` (at most 200 tries)."""
        spare = []
        try:
            for _ in range(200):
                c = RawStomp(self.port, version=version)
                frame = c.connect(login, passcode, **headers)
                assert frame.command == "CONNECTED", frame
                if frame.headers.get("pymq-worker") == str(worker):
                    self.conns.append(c)
                    return c
                # a clean DISCONNECT: whatever it held (a client id) is free again before we go on
                c.send("DISCONNECT", {"receipt": "spare"})
                c.read()
                spare.append(c)
            raise AssertionError(f"no connection landed on worker {worker} in 200 tries")
        finally:
            for c in spare:
                c.sock.close()

    def workers_alive(self) -> list[int]:
        """Pids of the worker processes still running (children of the supervisor)."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return [int(x) for x in out.stdout.split()]


def spec_owner(name: str, workers: int = WORKERS) -> int:
    """spec/cores.md §2's owner of an ordinary destination name (not a temporary, admin or DLQ name)."""
    router = GroupRouter([f"w{k}" for k in range(workers)])
    stem, dot, number = name.rpartition(".")
    if dot and 0 < len(number) <= 18 and all("0" <= ch <= "9" for ch in number):
        return (int(router.route(stem)[1:]) + int(number)) % workers
    return int(router.route(name)[1:])


def owned_by(worker: int, prefix: str = "/queue/cores.", count: int = 1, start: int = 0) -> list[str]:
    names = []
    i = start
    while len(names) < count and i < start + 10_000:
        name = f"{prefix}{i}"
        if spec_owner(name) == worker:
            names.append(name)
        i += 1
    return names


def start_broker(data_dir: str, *extra: str, workers: int = WORKERS, port: int = 0,
                 env: dict | None = None) -> Cluster:
    env = dict(env or {})
    if "TMPDIR" not in env:
        # the channel directory under the test's own directory: a supervisor killed with -9 cannot
        # remove it, and it must not be left in the machine's /tmp
        run = os.path.join(os.path.dirname(data_dir), "run")
        os.makedirs(run, exist_ok=True)
        env["TMPDIR"] = run
    proc = subprocess.Popen([sys.executable, "-m", "pymq_server.cli", "--port", str(port), "--data-dir", data_dir,
                             "--workers", str(workers), "--log-level", "WARNING", *extra],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, **env}, start_new_session=True)
    lines: list[str] = []
    deadline = time.monotonic() + 60
    found = None
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        m = re.search(r"pymq-server listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            found = int(m.group(1))
        if found and line.startswith("pymq-server workers:"):
            cluster = Cluster(proc, found, data_dir, lines)

            def drain() -> None:
                assert proc.stderr is not None
                for rest in proc.stderr:
                    lines.append(rest)
            threading.Thread(target=drain, daemon=True).start()
            return cluster
    proc.kill()
    raise RuntimeError("multi-worker broker did not start:\n" + "".join(lines))


def stop_broker(cluster: Cluster) -> int:
    for c in cluster.conns:
        try:
            c.sock.close()
        except OSError:
            pass
    if cluster.proc.poll() is None:
        cluster.proc.send_signal(signal.SIGTERM)
        try:
            cluster.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.proc.pid, signal.SIGKILL)
            cluster.proc.wait(10)
    return cluster.proc.returncode


@pytest.fixture
def broker(tmp_path) -> Iterator[Cluster]:
    cluster = start_broker(str(tmp_path / "data"))
    try:
        yield cluster
    finally:
        stop_broker(cluster)
