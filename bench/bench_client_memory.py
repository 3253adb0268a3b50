"""What one authenticated client can make the broker hold, measured from outside (issue 24 item 4).

    python bench/bench_client_memory.py                      # every scenario, the issue's sizes
    python bench/bench_client_memory.py --quick              # smaller sizes: the CI smoke run
    python bench/bench_client_memory.py --scenario fanout --scenario transaction --json /tmp/mem.json

Each scenario starts a fresh ``pymq-server`` child (file store, ``max_memory`` 64 MiB unless
``--max-memory``), reads its RSS (``/proc/<pid>/status``: VmRSS now, VmHWM the peak) and the broker's own
figures (admin ``status``: ``held_bytes``, ``client_bytes``) before and after one client does the thing
the issue measured, and says how the broker answered (RECEIPTs, ERROR codes, how far the client got):

* ``fanout``: durable subscriptions (made by one connection, each SUBSCRIBE followed by an UNSUBSCRIBE
  that keeps it), then 1 KiB persistent publishes to their topic that nobody reads;
* ``transaction``: one transaction of 1 MiB SENDs, never committed;
* ``selectors``: subscriptions whose selector is at the documented limits (16,384 characters, 2,048
  terms), while a bystander on another connection does SEND + RECEIPT round trips (its longest wait);
* ``temporaries``: temporary queues made by SUBSCRIBE + UNSUBSCRIBE of ``/temp-queue/<n>``;
* ``browse-ids``: browses (``browser:true``) of an empty queue with a new id each, never unsubscribed.

The client is raw STOMP over a socket, pipelined, reading every frame the broker sends (so the broker's
write buffer never pauses it); it stops at the first ERROR (the connection closes after one) or when it
is done. Figures go to bench/README.md ("What one client can make the broker hold").
"""
from __future__ import annotations

import argparse
import json
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from pymq.errors import PymqError

KiB, MiB = 1024, 1024 * 1024

#: the issue's sizes, and the --quick ones
FULL = {"fanout": (20_000, 200), "transaction": 512, "selectors": 400, "temporaries": 50_000,
        "browse-ids": 300_000}
QUICK = {"fanout": (2_000, 50), "transaction": 96, "selectors": 40, "temporaries": 5_000,
         "browse-ids": 30_000}


def frame(command: str, headers: dict, body: bytes = b"") -> bytes:
    head = "".join(f"{k}:{v}\n" for k, v in headers.items())
    if body:
        head += f"content-length:{len(body)}\n"
    return f"{command}\n{head}\n".encode() + body + b"\x00"


def big_selector() -> str:
    """A selector at the documented limits that takes longest to compile: ~16,370 characters of comparisons
    each 28 parentheses deep (the parser descends through every precedence level for each)."""
    parts: list[str] = []
    for n in range(10_000):
        part = "(" * 28 + f"a = {n}" + ")" * 28
        if sum(map(len, parts)) + 4 * len(parts) + len(part) > 16_384 - 8:
            break
        parts.append(part)
    return " OR ".join(parts)


class Client:
    """A pipelining raw STOMP connection with a reader thread that takes every frame."""

    def __init__(self, port: int, **connect_headers: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.receipts: set[str] = set()
        self.error: dict | None = None
        self.frames = 0
        self.closed = False
        self._buf = b""
        self._cond = threading.Condition()
        headers = {"accept-version": "1.2", "host": "/", "login": "guest", "passcode": "guest",
                   **connect_headers}
        self.sock.sendall(frame("CONNECT", headers))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self.wait(lambda: self.frames >= 1, 30) or self.error is not None:
            raise ConnectionError(f"CONNECT failed: {self.error}")

    def _read(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.sock], [], [], 0.5)
                if not ready:
                    continue
                chunk = self.sock.recv(1 << 20)
            except (OSError, ValueError):        # reset, or closed by close() meanwhile
                chunk = b""
            if not chunk:
                with self._cond:
                    self.closed = True
                    self._cond.notify_all()
                return
            self._buf += chunk
            *done, self._buf = self._buf.split(b"\x00")
            with self._cond:
                for raw in done:
                    raw = raw.lstrip(b"\r\n")
                    if not raw:
                        continue
                    self.frames += 1
                    if raw.startswith(b"RECEIPT"):
                        m = re.search(rb"receipt-id:([^\n]*)\n", raw)
                        if m:
                            self.receipts.add(m.group(1).decode())
                    elif raw.startswith(b"ERROR") and self.error is None:
                        head = raw.split(b"\n\n", 1)[0].decode(errors="replace")
                        self.error = dict(line.split(":", 1) for line in head.splitlines()[1:] if ":" in line)
                self._cond.notify_all()

    def wait(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                if self.closed or self.error is not None:
                    return predicate()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def batch(self, frames: list[bytes], receipt: str, timeout: float = 120) -> bool:
        """Send ``frames`` and a receipt request behind them; True once the receipt came."""
        if not self.send(b"".join(frames) + _receipt_frame(receipt)):
            return False
        return self.wait(lambda: receipt in self.receipts, timeout)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _receipt_frame(receipt: str) -> bytes:
    # a frame that changes nothing and asks for a receipt: an empty SEND would place a message, so a
    # BEGIN/ABORT pair of a throwaway transaction carries it
    return frame("BEGIN", {"transaction": f"r-{receipt}"}) + frame("ABORT", {"transaction": f"r-{receipt}",
                                                                           "receipt": receipt})


def start_broker(tmp: str, max_memory: str, extra: dict | None = None) -> tuple[subprocess.Popen, int]:
    config = os.path.join(tmp, "broker.yaml")
    with open(config, "w") as fh:
        fh.write(f"max_memory: {max_memory}\n")
        for key, value in (extra or {}).items():
            fh.write(f"{key}: {value}\n")
    log = open(os.path.join(tmp, "broker.log"), "w+")
    proc = subprocess.Popen([sys.executable, "-m", "pymq_server.cli", "--port", "0", "--data-dir",
                             os.path.join(tmp, "data"), "--config", config], stdout=subprocess.DEVNULL,
                            stderr=log, cwd=tmp)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        log.seek(0)
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    log.seek(0)
    raise RuntimeError("broker did not start:\n" + log.read())


def rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, bytes."""
    fields = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * KiB
    return fields["VmRSS"], fields["VmHWM"]


def figures(port: int) -> dict:
    """The broker's own memory figures (admin ``status`` over STOMP)."""
    import pymq
    with pymq.connect(f"stomp://127.0.0.1:{port}") as conn:
        memory = conn.queue_manager().call("status", timeout=60)["memory"]
    return {k: memory.get(k) for k in ("held_bytes", "resident_bytes", "client_bytes", "entries", "memory_high")}


# -- the scenarios ---------------------------------------------------------------------------------------
def fanout(port: int, probe: Callable[[str], None], subscriptions: int, publishes: int) -> dict[str, Any]:
    sub = Client(port, **{"client-id": "fan"})
    made = 0
    step = 1000
    for start in range(0, subscriptions, step):
        frames = []
        for i in range(start, min(subscriptions, start + step)):
            frames.append(frame("SUBSCRIBE", {"destination": "/topic/fan", "id": f"s{i}", "ack": "client",
                                              "durable-subscription-name": f"d{i}"}))
            frames.append(frame("UNSUBSCRIBE", {"id": f"s{i}"}))
        if not sub.batch(frames, f"subs-{start}"):
            break
        made = min(subscriptions, start + step)
    sub.close()
    probe("subscribed")
    out: dict[str, Any] = {"subscriptions": made, "subscribe_error": sub.error}
    pub = Client(port)
    body = b"p" * KiB
    sent = 0
    for start in range(0, publishes, 10):
        frames = [frame("SEND", {"destination": "/topic/fan", "persistent": "true"}, body)
                  for _ in range(start, min(publishes, start + 10))]
        if not pub.batch(frames, f"pub-{start}", timeout=30):
            break
        sent = min(publishes, start + 10)
    out.update(publishes_receipted=sent, publish_error=pub.error)
    out["_clients"] = [pub]
    return out


def transaction(port: int, probe: Callable[[str], None], megabytes: int) -> dict[str, Any]:
    client = Client(port)
    body = b"t" * MiB
    client.send(frame("BEGIN", {"transaction": "big"}))
    sent = 0
    for start in range(0, megabytes, 8):
        frames = [frame("SEND", {"destination": "/queue/tx", "transaction": "big"}, body)
                  for _ in range(start, min(megabytes, start + 8))]
        if not client.batch(frames, f"tx-{start}", timeout=60):
            break
        sent = min(megabytes, start + 8)
    return {"mib_receipted": sent, "error": client.error, "_clients": [client]}


def selectors(port: int, probe: Callable[[str], None], count: int) -> dict[str, Any]:
    text = big_selector()
    stop = threading.Event()
    waits: list[float] = []
    alone = _bystander_alone(port, 2.0)
    client = Client(port)

    def bystander() -> None:
        by = Client(port)
        n = 0
        while not stop.is_set():
            n += 1
            t0 = time.perf_counter()
            tag = f"b{n}"
            by.send(frame("SEND", {"destination": "/queue/bystander", "persistent": "false",
                                   "receipt": tag}, b"x"))
            if not by.wait(lambda tag=tag: tag in by.receipts, 30):
                break
            waits.append(time.perf_counter() - t0)
            time.sleep(0.005)
        by.close()

    thread = threading.Thread(target=bystander, daemon=True)
    thread.start()
    made = 0
    for start in range(0, count, 10):
        frames = [frame("SUBSCRIBE", {"destination": "/topic/sel", "id": f"s{i}", "selector": text})
                  for i in range(start, min(count, start + 10))]
        if not client.batch(frames, f"sel-{start}", timeout=120):
            break
        made = min(count, start + 10)
    stop.set()
    thread.join(60)
    return {"selector_chars": len(text), "subscribed": made, "error": client.error,
            "bystander_alone": _latencies(alone), "bystander_while_subscribing": _latencies(waits),
            "_clients": [client]}


def _bystander_alone(port: int, seconds: float) -> list[float]:
    """SEND + RECEIPT round trips of a client alone with the broker: the baseline of the same run."""
    by = Client(port)
    waits: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        tag = f"a{len(waits)}"
        t0 = time.perf_counter()
        by.send(frame("SEND", {"destination": "/queue/bystander", "persistent": "false", "receipt": tag}, b"x"))
        if not by.wait(lambda tag=tag: tag in by.receipts, 30):
            break
        waits.append(time.perf_counter() - t0)
        time.sleep(0.005)
    by.close()
    return waits


def _latencies(waits: list[float]) -> dict[str, Any]:
    waits = sorted(waits)
    if not waits:
        return {"round_trips": 0}
    return {"round_trips": len(waits), "p50_ms": round(1000 * waits[len(waits) // 2], 1),
            "p99_ms": round(1000 * waits[min(len(waits) - 1, int(len(waits) * 0.99))], 1),
            "max_ms": round(1000 * waits[-1], 1)}


def temporaries(port: int, probe: Callable[[str], None], count: int) -> dict[str, Any]:
    client = Client(port)
    made = 0
    for start in range(0, count, 1000):
        frames = []
        for i in range(start, min(count, start + 1000)):
            frames.append(frame("SUBSCRIBE", {"destination": f"/temp-queue/t{i}", "id": f"s{i}"}))
            frames.append(frame("UNSUBSCRIBE", {"id": f"s{i}"}))
        if not client.batch(frames, f"tmp-{start}"):
            break
        made = min(count, start + 1000)
    return {"temporaries": made, "error": client.error, "_clients": [client]}


def browse_ids(port: int, probe: Callable[[str], None], count: int) -> dict[str, Any]:
    client = Client(port)
    client.send(frame("SEND", {"destination": "/queue/browsed", "receipt": "made"}, b""))
    client.wait(lambda: "made" in client.receipts, 30)
    # the queue exists (and holds one message): browse it with a new id each time
    made = 0
    for start in range(0, count, 2000):
        frames = [frame("SUBSCRIBE", {"destination": "/queue/browsed", "id": f"b{i}", "browser": "true"})
                  for i in range(start, min(count, start + 2000))]
        if not client.batch(frames, f"br-{start}"):
            break
        made = min(count, start + 2000)
    return {"browses": made, "error": client.error, "_clients": [client]}


SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {
    "fanout": fanout, "transaction": transaction, "selectors": selectors, "temporaries": temporaries,
    "browse-ids": browse_ids}


def run(name: str, sizes: dict, max_memory: str, extra: dict | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="pymq-mem-") as tmp:
        proc, port = start_broker(tmp, max_memory, extra)
        try:
            time.sleep(0.5)
            before = rss(proc.pid)
            held_before = figures(port)
            size = sizes[name]
            args = size if isinstance(size, tuple) else (size,)
            marks: dict[str, dict] = {}

            def probe(label: str) -> None:
                time.sleep(0.5)
                marks[label] = {"rss_mib": round(rss(proc.pid)[0] / MiB, 1), **figures(port)}

            t0 = time.monotonic()
            result = SCENARIOS[name](port, probe, *args)
            if marks:
                result["marks"] = marks
            result["seconds"] = round(time.monotonic() - t0, 1)
            time.sleep(0.5)
            after = rss(proc.pid)
            try:
                held_after = figures(port)
            except (PymqError, OSError) as exc:    # a broker that stopped answering is a finding too
                held_after = {"error": repr(exc)}
            for client in result.pop("_clients", []):
                client.close()
            result.update(rss_before_mib=round(before[0] / MiB, 1), rss_after_mib=round(after[0] / MiB, 1),
                          rss_growth_mib=round((after[0] - before[0]) / MiB, 1),
                          rss_peak_mib=round(after[1] / MiB, 1), held_before=held_before,
                          held_after=held_after, broker_alive=proc.poll() is None)
            return result
        finally:
            proc.kill()
            proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--quick", action="store_true", help="smaller sizes (CI smoke run)")
    parser.add_argument("--max-memory", default="64MiB")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="another broker setting for every scenario (YAML value)")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    extra = dict(item.split("=", 1) for item in args.set)
    results = {}
    for name in args.scenario or list(SCENARIOS):
        results[name] = run(name, sizes, args.max_memory, extra)
        print(f"{name}: {json.dumps(results[name], default=str)}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2, default=str)
    return 0 if all(r["broker_alive"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
