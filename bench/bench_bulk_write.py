"""The broker's cost of a bulk write into a retained topic (issue 12's retained write), without Spark.

    python bench/bench_bulk_write.py                    # 1M rows, 2 writers, 5 rounds
    python bench/bench_bulk_write.py --rows 200000 --rounds 1

Starts its own ``pymq-server`` for each round (temporary data directory: the paged file device, ``sync_policy: always``,
topics ``/topic/bench.*`` kept as retained logs, as bench_spark.py does) and writes ``--rows`` rows
(``value`` 100 bytes, ``key``: the rows bench_spark.py writes) as bulk SENDs of about 4 MiB built the way
the Spark sink builds them (``pyspark_pymq._bulk.rows_to_bulk`` on Spark-sized Arrow batches of 10,000
rows, joined per frame), from ``--writers`` connections at once (``local[2]``: two tasks), each keeping
two frames in flight and waiting for every receipt (durable). The frames are built before timing, so
what is measured is the broker: its CPU seconds per 1M rows (utime + stime of the broker process from
/proc, 10 ms resolution; from the first frame until it is idle again, so a checkpoint that runs after
the last receipt counts) and the rows/s the writers saw. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import pyarrow as pa  # noqa: E402

from bench_spark import start_broker  # noqa: E402

FRAME_BYTES = 4 * 1024 * 1024          # pyspark_pymq.sink.BULK_FRAME_BYTES
SPARK_BATCH = 10_000                   # spark.sql.execution.arrow.maxRecordsPerBatch's default


def build_frames(rows: int, first_row: int) -> list[tuple[bytes, int]]:
    """(IPC stream, rows) of the bulk SENDs one task of ``rows`` rows sends, as the sink cuts them."""
    from pyspark_pymq._bulk import rows_to_bulk
    defaults = {"delivery_mode": 2, "priority": 4, "time_to_live": 0}
    frames: list[tuple[bytes, int]] = []
    parts: list[pa.RecordBatch] = []
    size = 0

    def flush() -> None:
        nonlocal parts, size
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, parts[0].schema) as writer:
            writer.write_batch(parts[0] if len(parts) == 1 else
                               pa.Table.from_batches(parts).combine_chunks().to_batches()[0])
        frames.append((sink.getvalue().to_pybytes(), sum(p.num_rows for p in parts)))
        parts, size = [], 0

    sent = 0
    while sent < rows:
        n = min(SPARK_BATCH, rows - sent)
        ids = range(first_row + sent, first_row + sent + n)
        batch = pa.RecordBatch.from_pydict({
            "key": pa.array([str(i % 1000) for i in ids]),
            "value": pa.array([str(i).rjust(100, "x").encode() for i in ids], pa.binary())})
        for _, bulk in rows_to_bulk(batch, "/topic/bench.rows", defaults, sent, None, int(time.time() * 1000)):
            parts.append(bulk)
            size += bulk.nbytes
            if size >= FRAME_BYTES:
                flush()
        sent += n
    if parts:
        flush()
    return frames


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process ``pid`` so far, all its threads."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    return sum(cpu_times(pid))


def write(url: str, frames: list[tuple[bytes, int]], errors: list) -> None:
    import pymq
    from pymq.client.blocking import start_send_arrow
    try:
        conn = pymq.connect(url)
        try:
            session = conn.create_session()
            in_flight = []
            for data, _ in frames:
                while len(in_flight) >= 2:
                    in_flight.pop(0).result(60)
                in_flight.append(start_send_arrow(session, "/topic/bench.rows", data))
            for receipt in in_flight:
                receipt.result(60)
        finally:
            conn.close()
    except Exception as exc:  # noqa: BLE001 - reported by the main thread
        errors.append(exc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", metavar="FILE", help="py-spy record the broker during each round "
                        "(collapsed stacks, native frames included) into FILE.<round>")
    parser.add_argument("--perf", metavar="FILE", help="perf record the broker (kernel included) during each "
                        "round into FILE.<round>")
    args = parser.parse_args()
    per = args.rows // args.writers
    tasks = [build_frames(per, w * per) for w in range(args.writers)]
    rows = per * args.writers
    frame_sizes = [len(d) for t in tasks for d, _ in t]
    print(f"{rows} rows in {len(frame_sizes)} frames of {sum(frame_sizes) / len(frame_sizes) / 2**20:.2f} MiB "
          f"(~{rows // len(frame_sizes)} rows each), {args.writers} writers")
    cpu_total = rows_total = 0.0
    best = 0.0
    for r in range(args.rounds):
        # a fresh broker per round (bench_spark.py's write also meets an almost empty broker)
        work = tempfile.mkdtemp(prefix="bench-bulk-")
        broker, url = start_broker(work)
        spy = None
        try:
            write(url, tasks[0][:2], [])                   # warm-up: connections, the topic, imports
            if args.profile or args.perf:
                import subprocess
                command = ["py-spy", "record", "-p", str(broker.pid), "--native", "--threads", "--format", "raw",
                           "-r", "250", "-o", f"{args.profile}.{r + 1}"] if args.profile else \
                    ["perf", "record", "-g", "-p", str(broker.pid), "-o", f"{args.perf}.{r + 1}"]
                spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            errors: list = []
            threads = [threading.Thread(target=write, args=(url, t, errors)) for t in tasks]
            (user0, sys0), t0 = cpu_times(broker.pid), time.perf_counter()
            cpu0 = user0 + sys0
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed, cpu = time.perf_counter() - t0, cpu_seconds(broker.pid) - cpu0
            if errors:
                print("error:", errors[0])
                return 1
            # and what the broker still does for these rows after the last receipt (a checkpoint)
            deadline, last = time.monotonic() + 10, cpu_seconds(broker.pid)
            while time.monotonic() < deadline:
                time.sleep(0.5)
                now = cpu_seconds(broker.pid)
                if now - last < 0.02:
                    break
                last = now
            after = last - cpu0 - cpu
            cpu += after
            system = cpu_times(broker.pid)[1] - sys0
            cpu_total += cpu
            rows_total += rows
            best = max(best, rows / elapsed)
            print(f"round {r + 1}: {rows / elapsed:,.0f} rows/s, broker {cpu / rows * 1e6:.3f} CPU-s per 1M rows "
                  f"({cpu:.2f} CPU-s, {system:.2f} of them in the kernel, {after:.2f} after the last receipt; "
                  f"{elapsed:.2f} s; load {os.getloadavg()[0]:.1f})", flush=True)
        finally:
            if spy is not None:
                spy.send_signal(2)
                spy.wait(60)
            broker.terminate()
            broker.wait(30)
            shutil.rmtree(work, ignore_errors=True)
    print(f"all rounds: broker {cpu_total / rows_total * 1e6:.3f} CPU-s per 1M rows, best {best:,.0f} rows/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
