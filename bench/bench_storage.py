"""Benchmark the file device: write throughput per commit policy, recovery time, bytes and memory per message.

Run by hand: ``python bench/bench_storage.py [--quick] [--dir PATH] [--messages N]``.

Sections (figures, and ratios against a baseline measured in the same run):
1. page allocator: allocate+free pairs per second, compiled vs twin;
2. write throughput of 1 KiB persistent messages: ``never`` (flush only), ``always`` done naively (one
   fsync per message, one producer), and through the holding store's group commit (the broker's path) with 64
   concurrent producers under ``always`` and ``grouped`` (5 ms); receipts are counted only once durable under
   the policy;
3. recovery of N persistent messages (1,000,000; 100,000 with --quick): open after a clean close (index
   from page directories), open after a crash (plus log replay since the last checkpoint), and a full
   ``recover()`` pass that reads every message back;
4. bytes on disk and resident memory per stored message.
No timing is asserted anywhere; tests/storage asserts behaviour.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from pymq_server.net.runtime import AsyncioRuntime             # noqa: E402
from pymq_server.storage.store import HoldingStore             # noqa: E402
from pymq_server.storage.device import StoredMessage           # noqa: E402
from pymq_server.storage.file import FileDevice                # noqa: E402
from pymq_server.storage.file.crc import IMPLEMENTATION as CRC_IMPL  # noqa: E402
from pymq_server.storage.page_alloc import IMPLEMENTATIONS, NON_PERSISTENT, PERSISTENT  # noqa: E402

BODY = os.urandom(1024)


def bench_allocator(quick: bool) -> None:
    print("\n1. page allocator (allocate + free of 64 live pages, lowest-free-first)")
    rounds = 20_000 if quick else 200_000
    rates = {}
    for name, mod in IMPLEMENTATIONS.items():
        if mod is None:
            print(f"   {name:3}: not built")
            continue
        alloc = mod.PageAllocator(3)
        live = [alloc.allocate(PERSISTENT) for _ in range(64)]
        start = time.perf_counter()
        for i in range(rounds):
            page = live[i & 63]
            alloc.free(page)
            if i % 1000 == 999:
                alloc.begin_checkpoint()
                alloc.end_checkpoint()
            live[i & 63] = alloc.allocate(NON_PERSISTENT if i & 1 else PERSISTENT)
        rates[name] = rounds / (time.perf_counter() - start)
        print(f"   {name:3}: {rates[name] / 1e6:6.2f} M pairs/s  (file end at page {alloc.page_count})")
    if len(rates) == 2:
        print(f"   compiled / twin: {rates['c'] / rates['py']:.2f}x")


def bench_writes(root: str, quick: bool) -> None:
    print(f"\n2. write throughput, 1 KiB persistent messages (crc32c: {CRC_IMPL})")
    results = {}

    def fresh(name: str) -> FileDevice:
        path = os.path.join(root, name)
        shutil.rmtree(path, ignore_errors=True)
        device = FileDevice("file", path)
        device.open()
        return device

    n = 20_000 if quick else 200_000
    device = fresh("never")
    start = time.perf_counter()
    for key in range(1, n + 1):
        device.write(StoredMessage(key, "/queue/b", key, True, BODY), ["/queue/b"])
        device.flush()
    results["never"] = (n / (time.perf_counter() - start), 0)
    device.close()

    n = 300 if quick else 2_000
    device = fresh("always-naive")
    start = time.perf_counter()
    for key in range(1, n + 1):
        device.write(StoredMessage(key, "/queue/b", key, True, BODY), ["/queue/b"])
        device.flush()
        device.sync()
    results["always, 1 producer"] = (n / (time.perf_counter() - start), n)
    device.close()

    async def driven(policy: str, window_ms: float, count: int, producers: int) -> tuple[float, int]:
        device = fresh(policy)
        runtime = AsyncioRuntime(asyncio.get_running_loop())
        store = HoldingStore([device], persistent_device=device.name, sync_policy=policy,
                             sync_window_ms=window_ms, call_later=runtime.call_later,
                             run_in_thread=runtime.run_in_thread)
        keys = iter(range(1, count + 1))
        loop = asyncio.get_running_loop()

        async def producer() -> None:
            for key in keys:
                device.write(StoredMessage(key, "/queue/b", key, True, BODY), ["/queue/b"])
                store.mark_dirty(device)       # what HoldingStore.hold records for the broker
                durable = loop.create_future()
                store.barrier(durable.set_result)
                await durable                  # the receipt: durable under the policy

        start = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(producers)))
        elapsed = time.perf_counter() - start
        runtime.shutdown()
        syncs = store.syncs
        device.close()
        return count / elapsed, syncs

    n = 5_000 if quick else 50_000
    for label, policy, window in (("always, 64 producers", "always", 2.0),
                                  ("grouped 5 ms, 64 producers", "grouped", 5.0)):
        results[label] = asyncio.run(driven(policy, window, n, 64))
    for label, (rate, syncs) in results.items():
        messages = n if "producers" in label else 300 if quick else 2000
        extra = f"  fsyncs {syncs:6d} ({1000 * syncs / messages:.0f} per 1000 msg)" if syncs else ""
        print(f"   {label:28}: {rate:10.0f} msg/s{extra}")
    base = results["always, 1 producer"][0]
    print(f"   grouped / always (1 producer, fsync per message): "
          f"{results['grouped 5 ms, 64 producers'][0] / base:.1f}x")
    print(f"   grouped / always (64 producers, store) :          "
          f"{results['grouped 5 ms, 64 producers'][0] / results['always, 64 producers'][0]:.2f}x")
    print(f"   never / grouped:                                  "
          f"{results['never'][0] / results['grouped 5 ms, 64 producers'][0]:.1f}x")


def bench_recovery(root: str, count: int) -> None:
    print(f"\n3. recovery of {count:,} persistent 1 KiB messages (4 queues)")
    path = os.path.join(root, "recovery")
    shutil.rmtree(path, ignore_errors=True)
    device = FileDevice("file", path, checkpoint_bytes=64 << 20)
    device.open()
    start = time.perf_counter()
    for key in range(1, count + 1):
        q = f"/queue/q{key & 3}"
        device.write(StoredMessage(key, q, key >> 2, True, BODY), [q])
        if key % 1000 == 0:
            device.flush()
            if key % 20_000 == 0:
                device.sync()
    device.flush()
    device.sync()
    fill = time.perf_counter() - start
    log_tail = device.status().extra["log_bytes"]
    print(f"   fill: {count / fill:,.0f} msg/s; log since last checkpoint at the crash: {log_tail / 1e6:.1f} MB")
    snapshot = os.path.join(root, "recovery-crash")
    shutil.rmtree(snapshot, ignore_errors=True)
    device._simulate_crash()
    shutil.copytree(path, snapshot)

    device = FileDevice("file", snapshot)
    start = time.perf_counter()
    device.open()
    crash_open = time.perf_counter() - start
    rec = device.status().extra["recovery"]
    device.close()
    print(f"   open after crash: {crash_open:6.2f} s  (directories {rec['directories_s']:.2f} s, "
          f"log replay {rec['replay_s']:.2f} s of {rec['frames_replayed']:,} frames, "
          f"pages read {rec['pages_read']:,})")
    del device
    gc.collect()

    device = FileDevice("file", snapshot)
    start = time.perf_counter()
    device.open()
    clean_open = time.perf_counter() - start
    status = device.status()
    print(f"   open after clean close: {clean_open:6.2f} s  ({count / clean_open:,.0f} msg/s indexed, "
          f"{status.extra['pages_persistent']:,} page directories read)")
    start = time.perf_counter()
    seen = 0
    for _message, _refs in device.recover():
        seen += 1
    full = time.perf_counter() - start
    print(f"   recover() reading every message back: {full:6.2f} s  ({seen / full:,.0f} msg/s)")
    disk = sum(os.path.getsize(os.path.join(snapshot, f)) for f in os.listdir(snapshot))
    print(f"\n4. footprint of {count:,} messages of {len(BODY)} bytes")
    print(f"   on disk: {disk / count:7.1f} bytes/message ({disk / count / len(BODY):.3f}x the payload; "
          f"page file {status.extra['file_bytes'] / 1e6:,.0f} MB)")
    device.close()
    del device
    gc.collect()
    tracemalloc.start()
    device = FileDevice("file", snapshot)
    device.open()
    held, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"   memory held by the open device (tracemalloc): {held / count:7.1f} bytes/message")
    print(f"   crash-open / clean-open: {crash_open / clean_open:.2f}x")
    device.close()
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(snapshot, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp directory)")
    parser.add_argument("--messages", type=int, default=None, help="messages for the recovery section")
    args = parser.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="pymq-bench-storage-")
    os.makedirs(root, exist_ok=True)
    count = args.messages or (100_000 if args.quick else 1_000_000)
    try:
        bench_allocator(args.quick)
        bench_writes(root, args.quick)
        bench_recovery(root, count)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
