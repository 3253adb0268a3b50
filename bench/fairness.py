"""Fair service under a flood: a bystander's round trips with and without a flooding producer.

    python bench/fairness.py                 # 10 s per phase against a fresh pymq-server (uvloop)
    python bench/fairness.py --quick         # 2 s per phase: the CI smoke run
    python bench/fairness.py --seconds 20 --json /tmp/fairness.json
    python bench/fairness.py --url 127.0.0.1:61613   # an already running broker instead
    python bench/fairness.py --flooder ws-fragments  # the flooder speaks STOMP over WebSocket in 1-byte fragments

Two phases against the same broker, in the same run (so the shared machine's load falls on both):

1. **alone**: a *bystander* connection does persistent SEND + RECEIPT round trips, one at a time, for
   ``--seconds``; its round-trip times are recorded.
2. **flood**: a *flooder* connection pipelines persistent SEND+receipt frames as fast as the broker
   reads them (never waiting for a receipt), while the bystander does the same round trips again.

Reported: the bystander's p50/p99/max round trip in both phases and their ratio; the flooder's frames
sent, receipts received *during* the flood, its receipt rate, the time to its first receipt and the
longest gap between two receipts.  The issue this answers (issue 10 item 4): on the landed broker the
flooder got no receipt in its first 2 s (505 of ~142,000 in 5 s) and the bystander completed 2-3 round
trips in 4 s.  Each client runs in its own process, so the clients do not share an interpreter with each
other or with the broker.

``--flooder ws-fragments`` (issue 24 item 7): the flooder speaks STOMP over WebSocket and sends each of its
frames as a fragmented WebSocket message of one-byte fragments (7 bytes on the wire per payload byte); on
the landed main of issue 24 a TCP bystander got 24 round trips in 10 s against it (991 against the TCP
flooder).  ``--flooder both`` runs the two flood phases one after the other in the same run.
"""
from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def frame(command: str, headers: dict, body: bytes = b"") -> bytes:
    head = "".join(f"{k}:{v}\n" for k, v in headers.items())
    if body:
        head += f"content-length:{len(body)}\n"
    return f"{command}\n{head}\n".encode() + body + b"\x00"


def connect(addr) -> socket.socket:
    sock = socket.create_connection(addr, timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(frame("CONNECT", {"accept-version": "1.2", "host": "/", "login": "guest",
                                   "passcode": "guest"}))
    data = b""
    while b"\x00" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed during CONNECT")
        data += chunk
    if not data.startswith(b"CONNECTED"):
        raise ConnectionError(data[:200].decode(errors="replace"))
    sock.settimeout(None)
    return sock


class FrameReader:
    """Counts complete frames (by their NUL) and hands receipt ids to a callback."""

    RECEIPT = re.compile(rb"receipt-id:([^\n]*)\n")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def frames(self, timeout: float):
        # select, not a socket timeout: a timeout would make the shared descriptor non-blocking under
        # the writer thread's feet
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return []
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed")
        self.buf += chunk
        *done, self.buf = self.buf.split(b"\x00")
        return [f.lstrip(b"\r\n") for f in done if f.strip(b"\r\n")]


def bystander(addr, seconds: float, queue: str, out) -> None:
    sock = connect(addr)
    reader = FrameReader(sock)
    rtts = []
    body = b"b" * 128
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
        t0 = time.perf_counter()
        sock.sendall(frame("SEND", {"destination": queue, "persistent": "true", "receipt": f"b{n}"}, body))
        got = False
        while not got:
            for f in reader.frames(max(0.01, deadline + 30 - time.monotonic())):
                if f.startswith(b"RECEIPT") and f"receipt-id:b{n}\n".encode() in f:
                    got = True
                elif f.startswith(b"ERROR"):
                    raise ConnectionError(f.decode(errors="replace"))
            if time.monotonic() > deadline + 30:
                break
        if got:
            rtts.append(time.perf_counter() - t0)
    sock.close()
    out.put({"round_trips": len(rtts), "rtts": rtts})


def flooder(addr, seconds: float, queue: str, out, batch: int = 100, size: int = 128) -> None:
    sock = connect(addr)
    reader = FrameReader(sock)
    stop = threading.Event()
    sent = [0]
    body = b"f" * size

    def write():
        n = 0
        try:
            while not stop.is_set():
                chunk = b"".join(frame("SEND", {"destination": queue, "persistent": "true",
                                                "receipt": f"f{n + i}"}, body) for i in range(batch))
                sock.sendall(chunk)
                n += batch
                sent[0] = n
        except OSError:
            pass

    start = time.monotonic()
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    stamps = []
    end = start + seconds
    while time.monotonic() < end:
        for f in reader.frames(0.05):
            if f.startswith(b"RECEIPT"):
                stamps.append(time.monotonic() - start)
    stop.set()
    flood_sent = sent[0]
    flood_receipts = len(stamps)
    # after the flood: how long until every receipt is in
    drain_deadline = time.monotonic() + 60
    while len(stamps) < sent[0] and time.monotonic() < drain_deadline:
        for f in reader.frames(0.2):
            if f.startswith(b"RECEIPT"):
                stamps.append(time.monotonic() - start)
    sock.close()
    during = [t for t in stamps if t <= seconds]
    gaps = [b - a for a, b in itertools.pairwise([0.0, *during])] or [seconds]
    out.put({"sent": flood_sent, "receipts_during": flood_receipts, "receipts_total": len(stamps),
             "sent_total": sent[0], "first_receipt_s": during[0] if during else None,
             "max_gap_s": max(gaps + ([seconds - during[-1]] if during else [])),
             "receipt_rate": flood_receipts / seconds})


def ws_connect(addr) -> socket.socket:
    """A WebSocket (v12.stomp) to the broker's listener, logged in: the upgrade by hand, no library."""
    import base64
    sock = socket.create_connection(addr, timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /stomp HTTP/1.1\r\nHost: {addr[0]}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                  f"Sec-WebSocket-Protocol: v12.stomp\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed during the upgrade")
        head += chunk
    if not head.startswith(b"HTTP/1.1 101"):
        raise ConnectionError(head[:200].decode(errors="replace"))
    sock.sendall(ws_fragments(frame("CONNECT", {"accept-version": "1.2", "host": "/", "login": "guest",
                                                "passcode": "guest"}), whole=True))
    data = head.split(b"\r\n\r\n", 1)[1]
    while b"CONNECTED" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed during CONNECT")
        data += chunk
    sock.settimeout(None)
    return sock


def ws_fragments(payload: bytes, whole: bool = False) -> bytes:
    """``payload`` as one masked text message: one frame (``whole``) or one-byte fragments."""
    if whole:
        return bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big") + b"\0\0\0\0" + payload \
            if len(payload) >= 126 else bytes([0x81, 0x80 | len(payload)]) + b"\0\0\0\0" + payload
    out = bytearray()
    last = len(payload) - 1
    for i, byte in enumerate(payload):
        opcode = 0x1 if i == 0 else 0x0
        out += bytes([(0x80 if i == last else 0) | opcode, 0x81, 0, 0, 0, 0, byte])   # mask key 0
    return bytes(out)


def ws_flooder(addr, seconds: float, queue: str, out, batch: int = 10, size: int = 128) -> None:
    """The flooder over WebSocket: each SEND a message of one-byte fragments; receipts counted in the raw
    stream (the broker's frames are unmasked text)."""
    sock = ws_connect(addr)
    stop = threading.Event()
    sent = [0]
    body = b"f" * size

    def write():
        n = 0
        try:
            while not stop.is_set():
                chunk = b"".join(ws_fragments(frame("SEND", {"destination": queue, "persistent": "true",
                                                             "receipt": f"f{n + i}"}, body)) for i in range(batch))
                sock.sendall(chunk)
                n += batch
                sent[0] = n
        except OSError:
            pass

    start = time.monotonic()
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    stamps: list[float] = []
    tail = b""
    end = start + seconds
    while time.monotonic() < end:
        ready, _, _ = select.select([sock], [], [], 0.05)
        if ready:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data = tail + chunk
            stamps += [time.monotonic() - start] * data.count(b"receipt-id:")
            tail = data[-16:]
    stop.set()
    sock.close()
    during = [t for t in stamps if t <= seconds]
    gaps = [b - a for a, b in itertools.pairwise([0.0, *during])] or [seconds]
    out.put({"sent": sent[0], "receipts_during": len(during), "receipts_total": len(stamps),
             "sent_total": sent[0], "first_receipt_s": during[0] if during else None,
             "max_gap_s": max(gaps + ([seconds - during[-1]] if during else [])),
             "receipt_rate": len(during) / seconds})


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def start_broker(tmp: str, uvloop: bool, config: str | None = None):
    args = [sys.executable, "-m", "pymq_server.cli", "--port", "0", "--data-dir", os.path.join(tmp, "data")]
    if config:
        args += ["--config", config]
    if not uvloop:
        args.append("--no-uvloop")
    log = open(os.path.join(tmp, "broker.log"), "w+")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, cwd=tmp)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        log.seek(0)
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read())
        if m:
            return proc, ("127.0.0.1", int(m.group(1)))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    log.seek(0)
    raise SystemExit("broker did not start:\n" + log.read())


def run(addr, seconds: float, flood_with=None, flood_addr=None) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    alone = ctx.Process(target=bystander, args=(addr, seconds, "/queue/fair-bystander-alone", out))
    alone.start()
    base = out.get(timeout=seconds + 120)
    alone.join(30)
    fout = ctx.Queue()
    flood = ctx.Process(target=flood_with or flooder, args=(flood_addr or addr, seconds + 1.0, "/queue/fair-flood",
                                                           fout))
    flood.start()
    time.sleep(0.5)                       # the flood is on before the bystander starts
    by = ctx.Process(target=bystander, args=(addr, seconds, "/queue/fair-bystander", out))
    by.start()
    under = out.get(timeout=seconds + 120)
    flood_result = fout.get(timeout=seconds + 180)
    for p in (by, flood):
        p.join(30)
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
    summary = {
        "seconds": seconds,
        "alone": {"round_trips": base["round_trips"], "p50_ms": _ms(pct(base["rtts"], 50)),
                  "p99_ms": _ms(pct(base["rtts"], 99)), "max_ms": _ms(max(base["rtts"], default=None))},
        "flood": {"round_trips": under["round_trips"], "p50_ms": _ms(pct(under["rtts"], 50)),
                  "p99_ms": _ms(pct(under["rtts"], 99)), "max_ms": _ms(max(under["rtts"], default=None))},
        "flooder": flood_result,
    }
    a, f = summary["alone"]["p99_ms"], summary["flood"]["p99_ms"]
    summary["p99_ratio"] = round(f / a, 1) if a and f else None
    return summary


def _ms(v):
    return None if v is None else round(v * 1000, 2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--quick", action="store_true", help="2 s per phase")
    p.add_argument("--url", help="host:port of a running broker (default: start pymq-server)")
    p.add_argument("--no-uvloop", action="store_true", help="start the broker on the default asyncio loop")
    p.add_argument("--config", help="a broker YAML file for the broker this starts (e.g. read_budget: 16KiB)")
    p.add_argument("--flooder", choices=["tcp", "ws-fragments", "both"], default="tcp",
                   help="how the flooder speaks (ws-fragments: STOMP over WebSocket in 1-byte fragments)")
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args(argv)
    seconds = 2.0 if args.quick else args.seconds
    proc = None
    tmp = tempfile.mkdtemp(prefix="pymq-fairness-")
    try:
        ws_addr = None
        if args.url:
            host, port = args.url.rsplit(":", 1)
            addr = (host, int(port))
        else:
            config = args.config
            if args.flooder != "tcp":
                config = os.path.join(tmp, "broker.yaml")
                with open(config, "w") as fh:
                    if args.config:
                        fh.write(open(args.config).read() + "\n")
                    fh.write("websocket: {port: 0}\n")
            proc, addr = start_broker(tmp, not args.no_uvloop, config)
            if args.flooder != "tcp":
                with open(os.path.join(tmp, "broker.log")) as fh:
                    m = re.search(r"STOMP over WebSocket on ws://127\.0\.0\.1:(\d+)", fh.read())
                ws_addr = ("127.0.0.1", int(m.group(1))) if m else None
        results = {}
        if args.flooder in ("tcp", "both"):
            results["tcp"] = run(addr, seconds)
        if args.flooder in ("ws-fragments", "both"):
            results["ws-fragments"] = run(addr, seconds, ws_flooder, ws_addr)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    for kind, result in results.items():
        a, f, fl = result["alone"], result["flood"], result["flooder"]
        print(f"[{kind} flooder]")
        print(f"bystander alone : {a['round_trips']:6d} round trips, p50 {a['p50_ms']} ms, p99 {a['p99_ms']} ms, "
              f"max {a['max_ms']} ms")
        print(f"bystander flood : {f['round_trips']:6d} round trips, p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms, "
              f"max {f['max_ms']} ms  (p99 x{result['p99_ratio']})")
        print(f"flooder         : {fl['sent']} SENDs in {seconds + 1:.0f} s, {fl['receipts_during']} receipts "
              f"meanwhile ({fl['receipt_rate']:.0f}/s), first after {fl['first_receipt_s']} s, longest gap "
              f"{fl['max_gap_s']:.2f} s; {fl['receipts_total']} of {fl['sent_total']} by the end")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results if len(results) > 1 else next(iter(results.values())), fh, indent=2)
    ok = fl["receipts_during"] > 0 and f["round_trips"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
