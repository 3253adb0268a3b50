"""Mutated bulk SEND bodies against real brokers (one process and ``--workers 2``): issue 24's "Done means"
for Arrow input, in a short run (``PYMQ_BULK_MUTATIONS`` bodies per broker, 150 by default; the figures of
longer runs are in bench/README.md).

Every body is a valid one (each bulk column type, plain and ZSTD-compressed) with one to three random
mutations (tests/hostile/bulk_bodies.py: bit flips, edge values over offsets, lengths and counts, cuts,
raised row counts and field nodes).  Checked: the broker never dies (0 crashes); every SEND gets a RECEIPT
or a ``message-format`` ERROR (0 generic internal errors, no traceback in the log); every queue they went
to is drained to depth 0 by an ordinary consumer that is never refused (0 poisoned queues); the broker's
peak RSS grows by less than 256 MiB; and a valid bulk SEND after them all is kept through kill -9, with
nothing quarantined at the restart.
"""
from __future__ import annotations

import os
import random
import time

import pytest

pytest.importorskip("pyarrow")

import pymq
from tests.arrow_rows import rows
from tests.conftest import RawStomp
from tests.hostile.bulk_bodies import bulk_send_headers, mutate, seed_bodies

BODIES = int(os.environ.get("PYMQ_BULK_MUTATIONS", "150"))
QUEUES = [f"mutated-{i}" for i in range(4)]


def _rss(pid: int) -> int:
    """Peak RSS (VmHWM) of ``pid`` and of its children (the workers of ``--workers``), bytes."""
    total = 0
    pids = [pid]
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as fh:
            pids += [int(p) for p in fh.read().split()]
    for p in pids:
        with open(f"/proc/{p}/status") as fh:
            total += next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
    return total


class Sender:
    """One raw connection at a time: a bulk SEND with a receipt, the answer read; reconnect after an ERROR."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.raw: RawStomp | None = None
        self.figures = {"bodies": 0, "receipted": 0, "rows": 0, "refused": 0, "internal_errors": 0}
        self.other_errors: list[dict] = []

    def send(self, queue: str, body: bytes) -> None:
        if self.raw is None:
            self.raw = RawStomp(self.port)
            assert self.raw.connect().command == "CONNECTED"
        n = self.figures["bodies"]
        self.figures["bodies"] += 1
        self.raw.send("SEND", bulk_send_headers(f"/queue/{queue}", receipt=f"r{n}"), body)
        frame = self.raw.read(timeout=30)
        if frame.command == "RECEIPT":
            self.figures["receipted"] += 1
            self.figures["rows"] += int(frame.headers["pymq-count"])
            return
        assert frame.command == "ERROR", frame
        self.raw.close()
        self.raw = None
        if frame.headers.get("pymq-code") == "message-format":
            self.figures["refused"] += 1
        else:
            self.figures["internal_errors"] += 1
            self.other_errors.append(dict(frame.headers))

    def close(self) -> None:
        if self.raw is not None:
            self.raw.close()


def _drain(url: str, queue: str, deadline: float) -> int:
    """Consume ``queue`` until its depth is 0; how many messages came.  Any error is a poisoned queue."""
    got = 0
    with pymq.connect(url, timeout=20) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue(queue))
        manager = conn.queue_manager()
        while time.monotonic() < deadline:
            if consumer.receive(timeout=1) is not None:
                got += 1
                continue
            if int(manager.metrics(queue)["depth"]) == 0:
                return got
    raise AssertionError(f"/queue/{queue} still holds messages at the deadline ({got} consumed)")


@pytest.mark.parametrize("workers", [(), ("--workers", "2")], ids=["one", "workers2"])
def test_mutated_bulk_bodies_crash_nothing_poison_nothing_lose_nothing(broker_processes, tmp_path, workers):
    data = tmp_path / "data"
    bp = broker_processes(data, *workers)
    rng = random.Random(f"issue-24-{len(workers)}")
    seeds = seed_bodies()
    before = _rss(bp.proc.pid)
    sender = Sender(bp.port)
    try:
        for i in range(BODIES):
            body = rng.choice(seeds)
            for _ in range(rng.randrange(1, 4)):
                body = mutate(body, rng)
            sender.send(QUEUES[i % len(QUEUES)], body)
            assert bp.proc.poll() is None, f"the broker died after {i + 1} bodies:\n{bp.log[-3000:]}"
    finally:
        sender.close()
    figures = sender.figures
    assert figures["internal_errors"] == 0, sender.other_errors
    assert "Traceback" not in bp.log and "internal error" not in bp.log, bp.log[-5000:]
    grown = _rss(bp.proc.pid) - before
    assert grown < 256 * 1024 * 1024, f"peak RSS grew by {grown} bytes"
    deadline = time.monotonic() + 120
    drained = {queue: _drain(bp.url, queue, deadline) for queue in QUEUES}
    assert bp.proc.poll() is None
    # a valid bulk SEND after all of them is kept through kill -9; nothing was quarantined
    with pymq.connect(bp.url, timeout=20) as conn:
        assert conn.create_session().send_arrow("/queue/after", rows(3), timeout=20)["pymq-count"] == "3"
    bp.kill()
    again = broker_processes(data, *workers)
    with pymq.connect(again.url, timeout=20) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue("after"))
        assert [consumer.receive(timeout=20).text for _ in range(3)] == ["r0", "r1", "r2"]
        assert conn.queue_manager().call("list-quarantine") == []
    print(f"\nbulk mutations ({'workers 2' if workers else 'one process'}): {figures}, delivered "
          f"{sum(drained.values())} rows, peak RSS +{grown / 2**20:.1f} MiB")
