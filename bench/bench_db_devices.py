"""Benchmark the SQL device (SQLite, PostgreSQL) and the grid device (Redis).

Run by hand: ``python bench/bench_db_devices.py [--quick] [--messages N]``.  SQLite always runs (in a temp
directory); PostgreSQL and Redis run when PYMQ_TEST_POSTGRES_URL / PYMQ_TEST_REDIS_URL name servers
(``eval "$(.ci/services.sh)"``).  Each test server's own settings apply (the CI PostgreSQL runs with
fsync off, Redis with appendfsync everysec): compare devices with care, batch sizes within a device freely.

For every device, with 1 KiB persistent messages:
1. the baseline: one ``sync`` per message (what a broker without group commit would do);
2. group commit: ``sync`` every 10 / 100 / 1000 writes, and the ratio to the baseline;
3. a queue whose consumer keeps up: each message removed before the next ``sync`` (never stored);
4. ``recover()`` of everything written, messages per second;
5. SQL only: the application transaction, ``send_in_transaction`` + commit per message, then claims.
No timing is asserted anywhere; tests/storage asserts behaviour.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from pymq_server.storage.device import StoredMessage  # noqa: E402

BODY = os.urandom(1024)


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:10,.0f} msg/s" if seconds > 0 else "       n/a"


class Target:
    def __init__(self, label: str, make, cleanup) -> None:
        self.label, self.make, self.cleanup = label, make, cleanup


def targets() -> list[Target]:
    found = []
    tmp = tempfile.mkdtemp(prefix="pymq-bench-db-")
    from pymq_server.storage.sql import SqlDevice, drop_tables

    found.append(Target("sqlite (WAL, synchronous=FULL)",
                        lambda: SqlDevice("db", f"sqlite:///{tmp}/bench.db", broker_id="bench"),
                        lambda: None))
    found.append(Target("sqlite (WAL, synchronous=NORMAL)",
                        lambda: SqlDevice("db", f"sqlite:///{tmp}/bench-normal.db", broker_id="bench",
                                          synchronous="NORMAL"),
                        lambda: None))
    pg = os.environ.get("PYMQ_TEST_POSTGRES_URL")
    if pg:
        import sqlalchemy as sa

        prefix = f"bench{uuid.uuid4().hex[:8]}_"
        found.append(Target("postgresql", lambda: SqlDevice("db", pg, broker_id="bench", table_prefix=prefix),
                            lambda: drop_tables(sa.create_engine(pg), prefix)))
    else:
        print("(PostgreSQL not measured: PYMQ_TEST_POSTGRES_URL is not set)")
    rd = os.environ.get("PYMQ_TEST_REDIS_URL")
    if rd:
        import redis

        from pymq_server.storage.grid import GridDevice

        ns = f"bench{uuid.uuid4().hex[:8]}"

        def clean_redis() -> None:
            client = redis.Redis.from_url(rd)
            for key in client.scan_iter(f"{ns}:*", count=1000):
                client.delete(key)

        found.append(Target("redis", lambda: GridDevice("grid", rd, broker_id="bench", namespace=ns), clean_redis))
    else:
        print("(Redis not measured: PYMQ_TEST_REDIS_URL is not set)")
    return found


def bench_target(target: Target, messages: int, quick: bool) -> None:
    print(f"\n== {target.label}")
    keys = itertools.count(1)
    device = target.make()
    device.open()
    try:
        baseline_n = max(50, messages // 20)
        start = time.perf_counter()
        for _ in range(baseline_n):
            key = next(keys)
            device.write(StoredMessage(key, "/queue/a", key, True, BODY), ["/queue/a"])
            device.sync()
        base = baseline_n / (time.perf_counter() - start)
        print(f"   1. sync per message        {rate(baseline_n, baseline_n / base)}   (baseline)")
        for every in (10, 100, 1000):
            n = max(every, messages if every >= 100 else messages // 4)
            start = time.perf_counter()
            for i in range(n):
                key = next(keys)
                device.write(StoredMessage(key, "/queue/a", key, True, BODY), ["/queue/a"])
                if i % every == every - 1:
                    device.sync()
            device.sync()
            seconds = time.perf_counter() - start
            print(f"   2. sync every {every:<4} writes  {rate(n, seconds)}   x{n / seconds / base:6.1f} baseline")
        n = messages
        start = time.perf_counter()
        for i in range(n):
            key = next(keys)
            device.write(StoredMessage(key, "/queue/b", key, True, BODY), ["/queue/b"])
            device.remove(key, "/queue/b")
            if i % 100 == 99:
                device.sync()
        device.sync()
        seconds = time.perf_counter() - start
        print(f"   3. consumer keeps up       {rate(n, seconds)}   x{n / seconds / base:6.1f} baseline")
        held = device.status().messages
    finally:
        device.close()
    device = target.make()
    start = time.perf_counter()
    device.open()
    recovered = sum(1 for _ in device.recover())
    seconds = time.perf_counter() - start
    device.close()
    print(f"   4. open + recover          {rate(recovered, seconds)}   ({recovered} of {held} held)")
    if device.kind == "sql":
        bench_app_transaction(target, max(50, messages // 10))
    target.cleanup()


def bench_app_transaction(target: Target, n: int) -> None:
    import sqlalchemy as sa

    from pymq_server.storage.sql import send_in_transaction

    device = target.make()
    device.open()
    engine = sa.create_engine(device.url)
    keys = itertools.count(10_000_000)
    try:
        start = time.perf_counter()
        for _ in range(n):
            with engine.begin() as conn:
                send_in_transaction(conn, "/queue/app", BODY, table_prefix=device.table_prefix)
        sent = time.perf_counter() - start
        start = time.perf_counter()
        claimed = 0
        while batch := device.claim_pending(
                lambda p: (StoredMessage(next(keys), p.destination, 0, True, p.data), [p.destination]), limit=500):
            claimed += len(batch)
        took = time.perf_counter() - start
        print(f"   5. app transactions        {rate(n, sent)}   (one commit each); claims {rate(claimed, took)}")
    finally:
        engine.dispose()
        device.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds: the CI smoke run")
    parser.add_argument("--messages", type=int, default=None)
    args = parser.parse_args()
    messages = args.messages or (1000 if args.quick else 20_000)
    for target in targets():
        bench_target(target, messages, args.quick)


if __name__ == "__main__":
    main()
