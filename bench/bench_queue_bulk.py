"""Bulk SENDs into a queue while a live consumer takes the messages (issue 12's queue write, without Spark).

A real broker (``pymq-server``, file store in a temporary directory) per build; a pymq consumer
(auto-acknowledge) on the queue from the start; a producer writing ``--rows`` rows as Arrow bulk SENDs of
``--frame`` rows (100-byte bodies, two application properties per row, persistent), each waiting for its
receipt. Printed per build: the write's rows/s and the broker's CPU per row during it, and the consumer's
rate to its last message with the broker's CPU per row to then. ``--base`` names another build's
``pymq-server`` (for example the landed main's) run in the same invocation: the ratios are what to read.
Baselines in the same run: the same rows sent one by one (``--single``, in transactions of 1,000, the
sink's way before bulk SENDs; 50,000 at most) through the same broker.

    python bench/bench_queue_bulk.py --rows 200000 [--base /path/to/old/pymq-server] [--single]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pyarrow as pa

import pymq


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(server: str, data: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([server, "--port", "0", "--data-dir", data], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", proc.stderr.readline())
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
            return proc, f"stomp://127.0.0.1:{m.group(1)}"
    proc.kill()
    raise SystemExit(f"{server} did not start")


def frame(n: int) -> bytes:
    batch = pa.RecordBatch.from_pydict({
        "body": pa.array([b"x" * 100] * n),
        "properties": pa.array([[("k", str(j)), ("src", "bench")] for j in range(n)],
                               pa.map_(pa.string(), pa.string())),
    })
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def run(server: str, rows: int, frame_rows: int, single: bool) -> dict:
    data = tempfile.mkdtemp(prefix="bench-qbulk-")
    proc, url = start(server, data)
    done: dict = {}

    def consume() -> None:
        with pymq.connect(url) as conn:
            consumer = conn.create_session().create_consumer(pymq.Queue("bench.bulk"))
            done["ready"] = True
            got = 0
            while got < rows and consumer.receive(10) is not None:
                got += 1
            done["got"], done["at"] = got, time.perf_counter()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    while "ready" not in done:
        time.sleep(0.01)
    payload = frame(frame_rows)
    c0, t0 = cpu_seconds(proc.pid), time.perf_counter()
    with pymq.connect(url) as conn:
        if single:
            # the same messages one by one, committed 1,000 at a time (what the sink did before bulk SENDs)
            session = conn.create_session(transacted=True)
            producer = session.create_producer(pymq.Queue("bench.bulk"))
            for i in range(rows):
                message = pymq.TextMessage("x" * 100)
                message.set_property("k", str(i))
                message.set_property("src", "bench")
                producer.send(message)
                if i % 1000 == 999:
                    session.commit()
            session.commit()
        else:
            session = conn.create_session()
            for _ in range(rows // frame_rows):
                session.send_arrow("/queue/bench.bulk", payload)
    t_write, c_write = time.perf_counter() - t0, cpu_seconds(proc.pid) - c0
    thread.join(600)
    c_all = cpu_seconds(proc.pid) - c0
    proc.terminate()
    proc.wait(30)
    shutil.rmtree(data, ignore_errors=True)
    if done.get("got") != rows:
        raise SystemExit(f"{server}: the consumer received {done.get('got')} of {rows}")
    return {"write rows/s": rows / t_write, "broker us/row (write)": c_write / rows * 1e6,
            "consumer msg/s": rows / (done["at"] - t0), "broker us/row (to the last)": c_all / rows * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--frame", type=int, default=25_000, help="rows per bulk SEND")
    ap.add_argument("--server", default=shutil.which("pymq-server") or "pymq-server")
    ap.add_argument("--base", help="another build's pymq-server, run in turns with --server")
    ap.add_argument("--single", action="store_true", help="also the same rows sent one by one")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    rows = args.rows - args.rows % args.frame
    builds = [("this build", args.server)] + ([("base", args.base)] if args.base else [])
    results: dict = {}
    for _ in range(args.rounds):
        for name, server in builds:
            results.setdefault((name, "bulk"), []).append(run(server, rows, args.frame, False))
            if args.single:
                results.setdefault((name, "one by one"), []).append(run(server, min(rows, 50_000), args.frame,
                                                                        True))
    print(f"{rows:,} rows of 100 B with two properties, frames of {args.frame:,} rows, {args.rounds} rounds "
          f"(best; broker CPU from /proc)")
    for (name, how), runs in results.items():
        best = max(runs, key=lambda r: r["write rows/s"])
        print(f"{name:>10} {how:>10}: " + ", ".join(f"{k} {v:,.1f}" for k, v in best.items()))
    if args.base:
        new, old = results[("this build", "bulk")], results[("base", "bulk")]
        ratio = max(r["write rows/s"] for r in new) / max(r["write rows/s"] for r in old)
        print(f"write rows/s, this build / base: {ratio:.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
