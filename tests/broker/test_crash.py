"""kill -9 a real broker process under mixed persistent/non-persistent load, restart it, and check:
every persistent message that got its receipt is there exactly once, in order; no non-persistent one is."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import RawStomp


def _start(data_dir: str, sync_policy: str) -> tuple[subprocess.Popen, int]:
    os.makedirs(data_dir, exist_ok=True)
    cfg = os.path.join(os.path.dirname(data_dir), f"broker-{sync_policy}.yaml")
    with open(cfg, "w") as fh:
        fh.write(f"sync_policy: {sync_policy}\n")
    proc = subprocess.Popen([sys.executable, "-m", "pymq_server.cli", "--port", "0", "--data-dir", data_dir,
                             "--config", cfg, "--log-level", "WARNING"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()   # keep the pipe drained
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("broker did not start")


@pytest.mark.parametrize("sync_policy", ["always", "grouped"])
def test_kill_9_keeps_exactly_the_receipted_persistent_messages(tmp_path, sync_policy):
    data = str(tmp_path / "data")
    proc, port = _start(data, sync_policy)
    receipted: list[int] = []
    try:
        p = RawStomp(port)
        p.connect()
        stop = threading.Event()

        def read_receipts():
            while not stop.is_set():
                try:
                    f = p.read(0.5)
                except TimeoutError:
                    continue
                except (ConnectionError, OSError):
                    return
                if f.command == "RECEIPT":
                    receipted.append(int(f.headers["receipt-id"]))

        reader = threading.Thread(target=read_receipts, daemon=True)
        reader.start()
        # a sustained mixed load; persistent messages ask for a receipt, so each acknowledged one is
        # known.  The kill lands mid-stream, once receipts flow: some writes are synced, some not.
        n = 0
        start = time.monotonic()
        killed = False
        while time.monotonic() - start < 15 and n < 200_000:
            for _ in range(50):
                body = f"{n:08d}".encode() + b"x" * 200
                if n % 3 == 2:
                    p.send("SEND", {"destination": "/queue/crash", "persistent": "false"}, b"N" + body)
                else:
                    p.send("SEND", {"destination": "/queue/crash", "receipt": str(n)}, b"P" + body)
                n += 1
            time.sleep(0.002)       # the load's pace (a sustained stream, not a flood), not a wait
            if len(receipted) > 2000 and time.monotonic() - start > 1.0:
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
                break
        assert killed, f"no kill: only {len(receipted)} receipts for {n} messages in 15 s"
        proc.wait(10)
        stop.set()
        reader.join(5)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert receipted, "the load produced no receipts before the kill"
    proc, port = _start(data, sync_policy)
    try:
        c = RawStomp(port)
        c.connect()
        c.send("SUBSCRIBE", {"destination": "/queue/crash", "id": "1", "ack": "auto"})
        got = []
        while True:
            try:
                f = c.read(2.0)
            except TimeoutError:
                break
            got.append(f.body)
    finally:
        proc.kill()
        proc.wait(10)
    assert not [b for b in got if b.startswith(b"N")], "a non-persistent message survived the crash"
    numbers = [int(b[1:9]) for b in got]
    assert len(numbers) == len(set(numbers)), "a message was recovered twice"
    assert numbers == sorted(numbers), "recovered messages are out of order"
    missing = set(receipted) - set(numbers)
    assert not missing, f"{len(missing)} receipted persistent messages were lost, e.g. {sorted(missing)[:5]}"
