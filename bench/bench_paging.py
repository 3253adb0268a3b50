"""Paging (issue 11 item 6): a queue filled with 10 x max_memory of 1 KiB messages, then drained.

    python bench/bench_paging.py [--max-memory 32MiB] [--factor 10] [--size 1024] [--checkpoint-bytes N]
                                 [--variants non-persistent,persistent] [--quick] [--json out.json]

For each variant a fresh ``pymq-server`` (its own temp data dir, a free port, ``max_memory`` from the
option) takes ``factor x max_memory`` of ``size``-byte messages from one pipelined producer (a receipt
every 1,000 messages, at most 20,000 unconfirmed); nobody consumes meanwhile.  Then one consumer
(``client-individual``, prefetch 1,000, one ACK per message) drains the queue and checks that every
message comes back once and in order.  The broker's RSS is read from ``/proc/<pid>/status`` every 50 ms:
before the fill, its peak during the fill and the drain, and at the end; and the figures are put against
``max_memory``: the target is RSS below 2 x max_memory plus the broker's fixed overhead (its RSS when
idle, before the fill, after one client logged in and left: the first login's password check, scrypt at
n=16384, r=8, works in 16 MiB that glibc keeps afterwards and every later login reuses, a fixed step of about
16 MiB that is not what paging holds; printed apart as ``login``). The broker's own CPU time (user +
system, ``/proc/<pid>/stat``) is read before and
after each phase and given per message: a figure the load moves much less than msg/s (on 2 shared cores a
one-second drain swings by a quarter between runs of one tree; its CPU µs a message by a few per cent).

A producer that stalls (no receipt for 60 s: paused for good, as the landed main did with 6 MB sent into
a 2 MB max_memory) ends the variant with ``stalled``.  Exit status 1 on a loss, duplicate, disorder or
stall; never because of speed or memory (those are reported).  ``--quick`` uses 8 MiB and factor 3.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from loadclient import FrameReader, encode_frame  # noqa: E402
from peers import free_port, wait_for_port  # noqa: E402

MiB = 1 << 20
RECEIPT_EVERY = 1000
MAX_UNCONFIRMED = 20_000
STALL_S = 60.0


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]i?B)?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    unit = (m[2] or "B").upper()
    return int(m[1]) * {"B": 1, "KB": 1000, "KIB": 1 << 10, "MB": 10**6, "MIB": 1 << 20,
                        "GB": 10**9, "GIB": 1 << 30}[unit]


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()      # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.current = 0
        self._stop = threading.Event()

    def reset_peak(self) -> None:
        self.peak = self.current

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.current = rss(self.pid)
            except OSError:
                return
            self.peak = max(self.peak, self.current)
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()


class Conn:
    """A blocking STOMP 1.2 connection, just enough for this bench."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=STALL_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = FrameReader()
        self.pending: list = []
        self.send("CONNECT", {"accept-version": "1.2", "host": "/", "login": "guest", "passcode": "guest"})
        command, headers, _ = self.read()
        if command != b"CONNECTED":
            raise RuntimeError(f"CONNECT answered {command!r} {headers!r}")

    def send(self, command: str, headers: dict, body: bytes = b"") -> None:
        self.sock.sendall(encode_frame(command, headers, body))

    def read(self):
        while not self.pending:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed by the broker")
            self.reader.feed(data)
            self.pending.extend(self.reader.frames())
        return self.pending.pop(0)

    def close(self) -> None:
        try:
            self.send("DISCONNECT", {})
        except OSError:
            pass
        self.sock.close()


def fill(port: int, count: int, size: int, persistent: bool) -> tuple[float, str]:
    """Send ``count`` messages; (seconds, outcome: ok | stalled | error ...)."""
    conn = Conn(port)
    headers = {"destination": "/queue/paging", "persistent": "true" if persistent else "false"}
    pad = b"x" * (size - 12)
    confirmed = -1
    started = time.monotonic()
    try:
        for i in range(count):
            h = dict(headers)
            if i % RECEIPT_EVERY == RECEIPT_EVERY - 1 or i == count - 1:
                h["receipt"] = str(i)
            conn.send("SEND", h, b"%012d" % i + pad)
            while i - confirmed > MAX_UNCONFIRMED or (i == count - 1 and confirmed < i):
                command, hdrs, body = conn.read()
                if command == b"RECEIPT":
                    confirmed = int(hdrs[b"receipt-id"])
                elif command == b"ERROR":
                    return time.monotonic() - started, f"error: {hdrs.get(b'message', body)!r}"
    except TimeoutError:
        return time.monotonic() - started, f"stalled (no receipt for {STALL_S:.0f} s after {confirmed + 1} confirmed)"
    finally:
        conn.close()
    return time.monotonic() - started, "ok"


def drain(port: int, count: int) -> tuple[float, dict]:
    conn = Conn(port)
    conn.send("SUBSCRIBE", {"destination": "/queue/paging", "id": "1", "ack": "client-individual",
                            "prefetch-count": "1000"})
    expected = 0
    problems = {"duplicates": 0, "out_of_order": 0, "missing": 0}
    seen_max = -1
    started = time.monotonic()
    try:
        while expected < count:
            command, headers, body = conn.read()
            if command != b"MESSAGE":
                continue
            n = int(body[:12])
            if n < expected:
                problems["duplicates"] += 1
            elif n > expected:
                problems["out_of_order"] += 1
                expected = n + 1
            else:
                expected += 1
            seen_max = max(seen_max, n)
            conn.send("ACK", {"id": headers[b"ack"].decode()})
    except TimeoutError:
        problems["missing"] = count - expected
    finally:
        conn.close()
    return time.monotonic() - started, problems


def run_variant(name: str, persistent: bool, max_memory: int, factor: float, size: int,
                checkpoint_bytes: int | None = None) -> dict:
    exe = shutil.which("pymq-server")
    if exe is None:
        raise SystemExit("pymq-server is not on PATH (pip install -e . in the repo)")
    work = tempfile.mkdtemp(prefix="pymq-paging-")
    config = os.path.join(work, "broker.yaml")
    with open(config, "w") as fh:
        fh.write(f"max_memory: {max_memory}\n")
        if checkpoint_bytes is not None:      # the file device's page buffers wait for checkpoints
            fh.write(f"storage: {{devices: {{memory: {{}}, file: {{checkpoint_bytes: {checkpoint_bytes}}}}}}}\n")
    port = free_port()
    log = open(os.path.join(work, "broker.log"), "wb")
    proc = subprocess.Popen([exe, "--host", "127.0.0.1", "--port", str(port), "--data-dir",
                             os.path.join(work, "data"), "--config", config], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, 30, proc)
        time.sleep(0.5)
        before_login = rss(proc.pid)
        Conn(port).close()              # the first login's step (see the docstring) is not the fill's
        time.sleep(0.5)
        idle = rss(proc.pid)
        sampler = RssSampler(proc.pid)
        sampler.start()
        count = int(factor * max_memory / size)
        cpu_start = cpu_s(proc.pid)
        fill_s, outcome = fill(port, count, size, persistent)
        cpu_filled = cpu_s(proc.pid)
        fill_peak = sampler.peak
        after_fill = sampler.current
        sampler.reset_peak()
        if outcome == "ok":
            drain_s, problems = drain(port, count)
        else:
            drain_s, problems = 0.0, {}
        cpu_drained = cpu_s(proc.pid)
        drain_peak = sampler.peak
        sampler.stop()
        end = rss(proc.pid)
        peak = max(fill_peak, drain_peak)
        return {
            "variant": name, "messages": count, "size": size, "max_memory": max_memory, "outcome": outcome,
            "fill_s": round(fill_s, 2), "fill_rate": round(count / fill_s) if fill_s else 0,
            "drain_s": round(drain_s, 2), "drain_rate": round(count / drain_s) if drain_s else 0,
            "fill_cpu_us": round((cpu_filled - cpu_start) * 1e6 / count, 1),
            "drain_cpu_us": round((cpu_drained - cpu_filled) * 1e6 / count, 1) if drain_s else 0.0,
            "rss_before_login": before_login, "rss_idle": idle, "rss_after_fill": after_fill,
            "rss_peak_fill": fill_peak,
            "rss_peak_drain": drain_peak, "rss_end": end,
            "peak_over_idle_x_max_memory": round((peak - idle) / max_memory, 2),
            "within_target": peak <= 2 * max_memory + idle,
            "problems": problems,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-memory", type=parse_size, default=32 * MiB)
    parser.add_argument("--factor", type=float, default=10.0)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--variants", default="non-persistent,persistent")
    parser.add_argument("--checkpoint-bytes", type=parse_size, default=None,
                        help="the file device's checkpoint_bytes (default: the broker's, 32 MiB)")
    parser.add_argument("--quick", action="store_true", help="8 MiB, factor 3 (a smoke run)")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.quick:
        args.max_memory, args.factor = 8 * MiB, 3.0
    print(f"paging bench, {os.cpu_count()} cores, python {platform.python_version()}; max_memory "
          f"{args.max_memory / MiB:.0f} MiB, {args.factor:g} x max_memory of {args.size} B messages "
          f"(load average at start {os.getloadavg()[0]:.1f})")
    results = []
    for name in args.variants.split(","):
        result = run_variant(name, name == "persistent", args.max_memory, args.factor, args.size,
                             args.checkpoint_bytes)
        results.append(result)
        mb = lambda n: f"{n / MiB:6.1f} MiB"  # noqa: E731
        print(f"{name:15s} {result['messages']:>9,} msgs  {result['outcome']}")
        print(f"  fill  {result['fill_s']:7.1f} s  {result['fill_rate']:>8,} msg/s   drain {result['drain_s']:7.1f} s "
              f"{result['drain_rate']:>8,} msg/s")
        print(f"  broker CPU per message: fill {result['fill_cpu_us']:.1f} µs, drain {result['drain_cpu_us']:.1f} µs")
        print(f"  RSS login {mb(result['rss_idle'] - result['rss_before_login'])}  "
              f"idle {mb(result['rss_idle'])}  peak fill {mb(result['rss_peak_fill'])}  after fill "
              f"{mb(result['rss_after_fill'])}  peak drain {mb(result['rss_peak_drain'])}  end {mb(result['rss_end'])}")
        print(f"  peak - idle = {result['peak_over_idle_x_max_memory']} x max_memory "
              f"({'within' if result['within_target'] else 'ABOVE'} the 2 x max_memory target); "
              f"problems {result['problems'] or 'none (drain skipped)'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    bad = any(r["outcome"] != "ok" or any(r["problems"].values()) for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
