"""The admin HTTP port under hostile and careless clients: what a real ``pymq-server`` holds for them.

    python bench/admin_port.py                 # every scenario, default sizes
    python bench/admin_port.py --quick         # smaller numbers: the CI smoke run
    python bench/admin_port.py --only unauth,browse --json /tmp/admin.json

Each scenario starts a fresh ``pymq-server`` (admin port, a users file) and plays real clients against
it from this process over raw sockets; memory is the broker process's resident set (``VmRSS`` of
``/proc/<pid>/status``), read before, at the worst moment and after the clients went.

* ``unauth``: ``--conns`` connections each send ``POST /api/create-queue`` with no credentials and a
  1 MiB body (as much of it as the broker takes in 5 s), then never read.  Reported: RSS growth, and how
  many of the connections the broker still holds ``--hold`` seconds later.
* ``slow``: ``--conns`` connections each send one byte of a request head per second.  Reported: how many
  are still open after ``--hold`` seconds.
* ``declared``: a POST declaring a 200 MiB body, head only.  Reported: whether an answer (413) came
  before any body byte was sent, and after how long.
* ``malformed``: ``--bad`` malformed requests of several kinds.  Reported: the broker log's lines and
  tracebacks they caused.
* ``browse``: a queue of ``--messages`` 4 MiB messages; 4 authenticated clients ask for
  ``browse-queue`` with ``limit=500&body_limit=4194304`` and never read (a 4 KiB receive buffer).
  Reported: RSS while they wait, and 5 s after they closed.
* ``flood``: ``--conns`` × 3 idle connections opened at once.  Reported: how many the broker accepted
  and kept (the admin port's connection cap).

The machine is shared: figures vary between runs; compare before and after in the same run or take
several runs.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import pathlib
import socket
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024
ADMIN, ADMIN_PW = "root", "root-secret"


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


EXTRA: dict = {}      # --set key=value: broker settings for every scenario


def start(tmp: pathlib.Path, name: str, config: dict | None = None):
    from tests.admin.conftest import BrokerProcess
    return BrokerProcess(tmp / name, users={ADMIN: (ADMIN_PW, ["admin"])},
                         config={"log_level": "INFO", **EXTRA, **(config or {})}).start()


def _open(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


def still_open(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the broker has not closed (no EOF, no reset; anything it sent is drained)."""
    n = 0
    for s in socks:
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n


def _pump(socks: list[socket.socket], payloads: list[bytes], seconds: float) -> int:
    """Send each socket its payload, as far as the broker takes it within ``seconds``; bytes sent."""
    sent = [0] * len(socks)
    deadline = time.monotonic() + seconds
    total = 0
    while time.monotonic() < deadline:
        progress = False
        for i, (s, p) in enumerate(zip(socks, payloads, strict=True)):
            if sent[i] >= len(p):
                continue
            try:
                n = s.send(memoryview(p)[sent[i]:sent[i] + 256 * 1024])
                sent[i] += n
                total += n
                progress = True
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                sent[i] = len(p)
        if all(x >= len(p) for x, p in zip(sent, payloads, strict=True)):
            break
        if not progress:
            time.sleep(0.05)
    return total


def scenario_unauth(tmp, args) -> dict:
    bp = start(tmp, "unauth")
    try:
        before = rss_mib(bp.proc.pid)
        body = b"{" + b" " * (MiB - 2) + b"}"
        head = (b"POST /api/create-queue HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body))
        socks = []
        for _ in range(args.conns):
            try:
                socks.append(_open(bp.admin_port))
            except OSError:
                break
        sent = _pump(socks, [head + body] * len(socks), 5.0)
        peak = max(rss_mib(bp.proc.pid), before)
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.hold:
            peak = max(peak, rss_mib(bp.proc.pid))
            time.sleep(0.5)
        held = still_open(socks)
        after_hold = rss_mib(bp.proc.pid)
        for s in socks:
            s.close()
        return {"connections": len(socks), "bytes_sent_mib": round(sent / MiB, 1), "rss_before_mib": round(before),
                "rss_peak_mib": round(peak), "rss_growth_mib": round(peak - before),
                "still_open_after_s": args.hold, "still_open": held, "rss_after_hold_mib": round(after_hold)}
    finally:
        bp.stop()


def scenario_slow(tmp, args) -> dict:
    bp = start(tmp, "slow")
    try:
        request = b"GET /api/list-queues HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
        socks = []
        for _ in range(args.conns):
            try:
                socks.append(_open(bp.admin_port))
            except OSError:
                break
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < args.hold:
            for s in socks:
                try:
                    s.send(request[i:i + 1])
                except OSError:
                    pass
            i = min(i + 1, len(request) - 5)
            time.sleep(1.0)
        held = still_open(socks)
        for s in socks:
            s.close()
        return {"connections": len(socks), "seconds": args.hold, "still_open": held}
    finally:
        bp.stop()


def scenario_declared(tmp, args) -> dict:
    bp = start(tmp, "declared")
    try:
        auth = base64.b64encode(f"{ADMIN}:{ADMIN_PW}".encode()).decode()
        out = {}
        for who, extra in (("unauthenticated", b""), ("authenticated", f"Authorization: Basic {auth}\r\n".encode())):
            s = _open(bp.admin_port)
            s.setblocking(True)
            s.settimeout(3)
            s.sendall(b"POST /api/create-queue HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
                      b"Content-Length: %d\r\n\r\n" % (200 * MiB))
            t0 = time.monotonic()
            try:
                answer = s.recv(4096)
                status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") else repr(answer[:40])
                out[who] = {"answer": status, "after_s": round(time.monotonic() - t0, 3)}
            except TimeoutError:
                out[who] = {"answer": "none within 3 s", "after_s": None}
            s.close()
        return out
    finally:
        bp.stop()


MALFORMED = [
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
    b"G\x00T / HTTP/1.1\r\n\r\n",
    b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
    b"POST /api/purge-queue HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"POST /api/purge-queue HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,
    b"POST /api/session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n{{{{{",
]


def scenario_malformed(tmp, args) -> dict:
    bp = start(tmp, "malformed")
    try:
        before = len(bp.log)
        for i in range(args.bad):
            s = _open(bp.admin_port)
            s.setblocking(True)
            s.settimeout(3)
            try:
                s.sendall(MALFORMED[i % len(MALFORMED)])
                s.recv(4096)
            except OSError:
                pass
            s.close()
        time.sleep(1.0)
        lines = bp.log[before:]
        text = "".join(lines)
        return {"requests": args.bad, "log_lines": len(lines), "tracebacks": text.count("Traceback"),
                "still_serving": _healthy(bp.admin_port)}
    finally:
        bp.stop()


def _healthy(port: int) -> bool:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        s.close()
        return data.startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def scenario_browse(tmp, args) -> dict:
    import pymq
    bp = start(tmp, "browse")
    try:
        with pymq.connect(bp.url, username=ADMIN, password=ADMIN_PW) as conn:
            producer = conn.create_session().create_producer(pymq.Queue("big"))
            for _ in range(args.messages):
                producer.send(os.urandom(4 * MiB))
        time.sleep(1.0)
        before = rss_mib(bp.proc.pid)
        auth = base64.b64encode(f"{ADMIN}:{ADMIN_PW}".encode()).decode()
        request = (f"GET /api/browse-queue?name=big&limit=500&body_limit={4 * MiB} HTTP/1.1\r\nHost: x\r\n"
                   f"Authorization: Basic {auth}\r\n\r\n").encode()
        socks = [_open(bp.admin_port, rcvbuf=4096) for _ in range(4)]
        for s in socks:
            s.send(request)
        peak = before
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            peak = max(peak, rss_mib(bp.proc.pid))
            time.sleep(0.25)
        for s in socks:
            s.close()
        time.sleep(5.0)
        after = rss_mib(bp.proc.pid)
        return {"messages": args.messages, "message_mib": 4, "clients": 4, "rss_before_mib": round(before),
                "rss_peak_mib": round(peak), "rss_growth_mib": round(peak - before),
                "rss_5s_after_close_mib": round(after), "held_after_close_mib": round(after - before)}
    finally:
        bp.stop()


def scenario_flood(tmp, args) -> dict:
    bp = start(tmp, "flood")
    try:
        socks = []
        for _ in range(args.conns * 3):
            try:
                socks.append(_open(bp.admin_port))
            except OSError:
                break
        time.sleep(2.0)
        held = still_open(socks)
        serving = _healthy(bp.admin_port)
        for s in socks:
            s.close()
        return {"opened": len(socks), "held_by_broker_after_2s": held, "healthz_meanwhile": serving}
    finally:
        bp.stop()


SCENARIOS = {"unauth": scenario_unauth, "slow": scenario_slow, "declared": scenario_declared,
             "malformed": scenario_malformed, "browse": scenario_browse, "flood": scenario_flood}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", help="comma-separated scenarios: " + ", ".join(SCENARIOS))
    p.add_argument("--conns", type=int, default=600)
    p.add_argument("--hold", type=float, default=75.0)
    p.add_argument("--bad", type=int, default=200)
    p.add_argument("--messages", type=int, default=40)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a broker setting for every scenario (YAML value), e.g. admin_max_connections=1000")
    p.add_argument("--json")
    args = p.parse_args(argv)
    import yaml
    for item in args.set:
        key, _, value = item.partition("=")
        EXTRA[key] = yaml.safe_load(value)
    if args.quick:
        args.conns, args.hold, args.bad, args.messages = 60, 15.0, 24, 4
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.conns * 3 + 256)), hard))
    names = args.only.split(",") if args.only else list(SCENARIOS)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="pymq-admin-bench-"))
    report = {}
    for name in names:
        t0 = time.monotonic()
        report[name] = SCENARIOS[name](tmp, args)
        print(f"{name} ({time.monotonic() - t0:.0f} s): {json.dumps(report[name])}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
