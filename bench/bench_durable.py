"""What a persistent message costs the broker beyond a non-persistent one, stage by stage (issue 16).

    python bench/bench_durable.py [--messages 20000] [--rounds 5]

In-process, no sockets: the holding store (``server/storage/store.py``) over a real file device in a
temporary directory, fed broker messages with the load client's four application headers and a 128-byte
body (as bench_brokers.py sends them). Each stage is timed alone over ``--messages`` messages and reported
as CPU µs per message (process time, the median of the rounds), so two builds can be compared by running
this script from each checkout back to back; a shared machine moves these figures far less than
throughput. The stages:

* hold: ``HoldingStore.hold`` of a persistent message (the device's choice, the room check, write-behind
  bookkeeping) against the same for a non-persistent one (the heap);
* room check: the file device's per-message check alone (``check_room``, or ``allocate`` in builds
  without it);
* release unwritten / release (heap): ``release`` + ``forget`` of a message consumed before it was written,
  against a heap-held one;
* write behind: ``write_waiting`` for messages still waiting (the stored form, the slot, the PUT frame
  and its CRCs), per message;
* flush: handing the buffered log frames to the OS, per message;
* release written: ``release`` + ``forget`` of a written message (the REMOVE frame, the slot);
* sync: one fdatasync of the log (CPU and wall time, per sync);
* checkpoint: writing the pages and the checkpoint payload, per message written since the last one.

Which stages a message pays depends on the row: one consumed before the write-behind timer ticks twice
pays hold + release unwritten only; one still waiting at a receipt, a tick or the bounds pays write
behind + flush + release written and its share of the sync and the checkpoint.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pymq_server.broker.message import BrokerMessage  # noqa: E402
from pymq_server.broker.stored_form import STORED_CODEC  # noqa: E402
from pymq_server.storage.file import FileDevice  # noqa: E402
from pymq_server.storage import behind as behind_module  # noqa: E402
from pymq_server.storage.store import HoldingStore  # noqa: E402

QUEUE = "/queue/bench.durable"


def message(key: int, persistent: bool) -> BrokerMessage:
    headers = {"app-id": "0c6b2f1e-7c1a-4b7e-9a1d-3f2e5d6c7b8a", "app-producer": "0", "app-seq": str(key),
               "app-ts": "1732460000000", "persistent": "true" if persistent else "false", "priority": "4",
               "timestamp": "1732460000000", "expires": "0"}
    return BrokerMessage(key, f"ID:bench-durable-{key}", QUEUE, key, headers, b"x" * 128, persistent, 4,
                         1732460000000, 0)


def cpu_us(fn, n: int) -> float:
    gc.collect()
    started = time.process_time_ns()
    fn()
    return (time.process_time_ns() - started) / n / 1000


def one_round(n: int, tmp: str) -> dict[str, float]:
    # every message waits until this bench writes it (the bounds would write them while they are held)
    behind_module.WRITE_BEHIND_MESSAGES = behind_module.WRITE_BEHIND_BYTES = 1 << 62
    device = FileDevice("file", os.path.join(tmp, "file"), checkpoint_in_sync=False)
    store = HoldingStore([device], persistent_device="file", sync_policy="always", codec=STORED_CODEC)
    store.open()
    refs = [QUEUE]
    out: dict[str, float] = {}
    try:
        key = 0

        def batch(persistent: bool) -> list[BrokerMessage]:
            nonlocal key
            msgs = [message(key + i + 1, persistent) for i in range(n)]
            key += n
            for m in msgs:           # the MESSAGE header block every delivery encodes anyway
                m.header_block("1.2")
            return msgs

        heap = batch(False)
        out["hold (heap, non-persistent)"] = cpu_us(lambda: [store.hold(m, refs) for m in heap], n)
        out["release (heap)"] = cpu_us(lambda: [(store.release(m, QUEUE), store.forget(m)) for m in heap], n)

        behind = batch(True)

        # a consumer keeping up: at most 100 messages waiting at a time; the releases timed alone
        gc.collect()
        clock = time.process_time_ns
        held_ns = released_ns = 0
        for i in range(0, n, 100):
            chunk = behind[i:i + 100]
            started = clock()
            for m in chunk:
                store.hold(m, refs)
            between = clock()
            for m in chunk:
                store.release(m, QUEUE)
                store.forget(m)
            held_ns += between - started
            released_ns += clock() - between
        out["hold (persistent, behind)"] = held_ns / n / 1000
        out["release unwritten"] = released_ns / n / 1000
        again = batch(True)
        check = getattr(device, "check_room", None) or (lambda size: device.allocate(size, True))
        out["room check"] = cpu_us(lambda: [check(m.size) for m in again], n)
        for m in again:              # they wait, then are written behind at once
            store.hold(m, refs)
        out["write behind"] = cpu_us(store.write_waiting, n)
        out["flush (log write)"] = cpu_us(device.flush, n)
        syncs = 5
        started = time.perf_counter()
        out["sync (per sync, CPU)"] = cpu_us(lambda: [device.sync() for _ in range(syncs)], 1) / syncs
        out["sync (per sync, wall)"] = (time.perf_counter() - started) * 1e6 / syncs
        out["checkpoint"] = cpu_us(device.checkpoint, n)
        out["release written"] = cpu_us(lambda: [(store.release(m, QUEUE), store.forget(m)) for m in again], n)
        out["flush of the removals"] = cpu_us(device.flush, n)
    finally:
        store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    import pymq_server
    rounds = []
    for _ in range(a.rounds):
        with tempfile.TemporaryDirectory(prefix="pymq-bench-durable-") as tmp:
            rounds.append(one_round(a.messages, tmp))
    print(f"durable-only stages, {os.path.dirname(pymq_server.__file__)}: {a.messages} messages x {a.rounds} "
          f"rounds, CPU µs per message (median, min-max)")
    for stage in rounds[0]:
        values = [r[stage] for r in rounds]
        print(f"  {stage:30s} {statistics.median(values):9.2f}   ({min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
