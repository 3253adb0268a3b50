"""What handing a message from one broker worker process to another costs (issue 16, "cores").

    python bench/bench_handover.py [--messages 200000] [--batch 64] [--headers 4] [--rounds 3]

A broker split into worker processes that each own a shard of destinations (spec/cores.md) must pass a
frame that arrived at one worker to the worker owning its destination. This measures that hand-over on
this machine, with the frames bench_brokers.py sends (SEND, 4 application headers, 128 B body), each
process pinned to its own core:

* ``parse``: the frames parsed by pymq's frame scanner in one process (what the owner would do anyway if
  the frame had arrived there): the baseline;
* ``unix``: the accepting worker writes the frames as it received them, ``--batch`` per write, to a Unix
  stream socket; the owner reads and parses them. The sender's and the receiver's CPU per message are
  measured separately (getrusage in each process). The accepting worker must parse a frame anyway to
  find its destination (that is the work the owner would have done had the frame arrived there), so the
  hand-over adds the sender's write and the owner's read and second parse: H = sender + receiver.
  Wall time is printed too, but on a shared machine it is mostly the wait for the other core.

It prints µs per message and the predicted throughput of W workers from a per-message broker cost C
(``--broker-us``, measured by bench_brokers.py as broker CPU µs/msg): with destinations spread evenly and
connections accepted by any worker, a message crosses to another worker with probability (W-1)/W on the
way in and again on the way out to a consumer connected elsewhere, so each worker spends
C + 2 (W-1)/W * H per message and W workers on W cores move W / (C + 2 (W-1)/W * H) messages per µs.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loadclient import _app_header_maker, _body_maker  # noqa: E402


def frames(n: int, headers: int) -> list[bytes]:
    app = _app_header_maker(headers)
    body = _body_maker(128)
    head = b"SEND\ndestination:/queue/bench.handover\npersistent:false\n"
    tail = b"content-length:128\n\n"
    return [head + (app(0, i) if app else b"") + tail + body(0, i, time.monotonic_ns()) + b"\0" for i in range(n)]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _scanner():
    from pymq.protocol.scanner import FrameScanner

    return FrameScanner(max_frame_size=1 << 20, version="1.2")


def parse_only(data: list[bytes], batch: int) -> float:
    sc = _scanner()
    chunks = [b"".join(data[i:i + batch]) for i in range(0, len(data), batch)]
    got = 0
    t = _cpu()
    for chunk in chunks:
        got += len(sc.feed(chunk))
    cpu = _cpu() - t
    assert got == len(data), (got, len(data))
    return cpu * 1e6 / len(data)


def owner(sock_fd: int, out_fd: int, count: int, cpu: int) -> None:
    """The owner process: read ``count`` frames from the socket and parse them; its CPU to ``out_fd``."""
    b = socket.socket(fileno=sock_fd)
    if cpu >= 0:
        os.sched_setaffinity(0, {cpu})
    sc = _scanner()
    os.write(out_fd, b"R")          # ready: the sender's clock starts now, not during this start-up
    got = 0
    t = _cpu()
    while got < count:
        chunk = b.recv(1 << 18)
        if not chunk:
            break
        got += len(sc.feed(chunk))
    cpu_s = _cpu() - t
    os.write(out_fd, json.dumps({"cpu": cpu_s, "got": got}).encode())


def unix(data: list[bytes], batch: int, cpus: tuple[int, int] | None) -> tuple[float, float, float]:
    """(sender µs/msg, receiver µs/msg, wall µs/msg) over a Unix stream socket between two processes.

    The owner is a process of its own (this interpreter started again, the same ``sys.path``), not a fork of
    this one: a forked owner allocates into this process's heap pages (every frame's dict and strings), each
    first write a copy-on-write fault, so its figure grew with the sender's
    heap (which pymq package it had imported, how fragmented the frames left it), where a worker owning a
    destination is a long-running process of its own (session 39: old/new recv 1.05-1.20x on the same
    instructions, bench/results/issue25-handover-counts-s39.txt)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    chunks = [b"".join(data[i:i + batch]) for i in range(0, len(data), batch)]
    r, w = os.pipe()
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--owner", str(b.fileno()), str(w),
                              str(len(data)), str(cpus[1] if cpus else -1)], pass_fds=(b.fileno(), w))
    b.close()
    os.close(w)
    if cpus:
        os.sched_setaffinity(0, {cpus[0]})
    if os.read(r, 1) != b"R":
        raise RuntimeError("the owner process did not start")
    t, wall = _cpu(), time.perf_counter()
    for chunk in chunks:
        a.sendall(chunk)
    sender = _cpu() - t
    out = json.loads(os.read(r, 1000))
    wall = time.perf_counter() - wall
    child.wait()
    a.close()
    os.close(r)
    if cpus:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    assert out["got"] == len(data), out
    n = len(data)
    return sender * 1e6 / n, out["cpu"] * 1e6 / n, wall * 1e6 / n


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--owner"]:
        owner(*(int(x) for x in argv[1:5]))
        return 0
    ap = argparse.ArgumentParser(description="cost of handing a frame to another worker process")
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--headers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--broker-us", type=float, default=0.0,
                    help="broker CPU µs/msg of one worker (bench_brokers.py) for the scaling prediction")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    from pymq.protocol.scanner import COMPILED
    IMPLEMENTATION = "compiled" if COMPILED else "pure Python"

    data = frames(a.messages, a.headers)
    cpus = (0, 1) if (os.cpu_count() or 1) >= 2 else None
    rows = []
    for _ in range(a.rounds):
        p = parse_only(data, a.batch)
        s, rcv, wall = unix(data, a.batch, cpus)
        rows.append({"parse": p, "send": s, "recv": rcv, "wall": wall, "handover": s + rcv})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    lo = {k: min(r[k] for r in rows) for k in rows[0]}
    hi = {k: max(r[k] for r in rows) for k in rows[0]}
    size = sum(map(len, data)) / len(data)
    print(f"hand-over of {a.messages:,} SEND frames ({size:.0f} B each, {a.headers} application headers), "
          f"batches of {a.batch}, scanner {IMPLEMENTATION}, {a.rounds} rounds (median, range), "
          f"sender on CPU {cpus[0] if cpus else '-'} and owner on CPU {cpus[1] if cpus else '-'}")
    for k, label in (("parse", "parse only (the owner's own work)"), ("send", "sender: write to the socket"),
                     ("recv", "owner: read + parse"), ("handover", "hand-over H = send + recv"),
                     ("wall", "wall time per message")):
        print(f"  {label:36} {med[k]:6.2f} µs/msg  ({lo[k]:.2f}-{hi[k]:.2f})")
    if a.broker_us:
        c, h = a.broker_us, med["handover"]
        print(f"\npredicted, one worker costing C = {c:.1f} µs/msg, hand-over H = {h:.2f} µs/msg "
              "(2 (W-1)/W hand-overs per message, one core per worker, nothing else shared):")
        for w in (1, 2, 4, 8, 16):
            per = c + 2 * (w - 1) / w * h
            print(f"  {w:2} workers: {w * 1e6 / per:10,.0f} msg/s  ({w * c / per:.2f} x one worker, "
                  f"{c / per:.2f} of linear)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rounds": rows, "median": med, "frame_bytes": size, "batch": a.batch}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
