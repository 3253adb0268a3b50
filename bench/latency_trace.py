"""Where a message's time goes at a steady rate (issue 30 item 4): per-message timestamps through the broker.

A paced 1 -> 1 queue (bench_brokers' `e` row: 2,000 msg/s, 128 B bodies, 4 application headers, no
`persistent` header) between one producer and one consumer process (uvloop, the load client's codec). The
consumer keeps every message's send time and arrival time. With ``--trace`` the broker is pymq run in this
script's process tree with probes on (no change to the broker's code): every read of the producer's
connection, every write handed to the consumer's transport and every cyclic-GC pass, with their
CLOCK_MONOTONIC times (the clock the load client stamps bodies with). Each message's latency is then split
into client -> broker (send to the broker's read), in the broker (read to the write of its MESSAGE) and
broker -> client (that write to the consumer's read), and the slowest 1 % are listed by the part that made
them slow and by the GC passes they overlapped.

The ``toy`` target (bench/toybroker.py, a relay that does nothing but re-frame) is the floor: what the
load client, uvloop and loopback TCP cost with no broker work at all, so a figure above it is the broker's.

    python bench/latency_trace.py --target pymq --trace          # probes on, the split printed
    python bench/latency_trace.py --target activemq              # the best peer at this row, same client
    python bench/latency_trace.py --target toy                    # the load client's own tail
    python bench/latency_trace.py --target pymq --exe PATH        # another build, no probes
    python bench/latency_trace.py --target port:61613             # any running broker

Timings only: nothing here is asserted.
"""
from __future__ import annotations

import argparse
import array
import asyncio
import gc
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from loadclient import Endpoint, _app_header_maker, _body_maker, _new_loop, encode_frame, open_connection  # noqa: E402
from peers import ActiveMQBroker, Dialect, free_port, wait_for_port  # noqa: E402

NS = 1_000_000_000
DEST = "/queue/latency.trace"


# ------------------------------------------------------------------------------------------ the clients
class _GcClock:
    """Every cyclic-GC pass of this process: (start ns, end ns, generation)."""

    def __init__(self) -> None:
        self.passes: list[tuple[int, int, int]] = []
        self._start = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.monotonic_ns()
        else:
            self.passes.append((self._start, time.monotonic_ns(), info["generation"]))


def _endpoint(port: int, dialect) -> Endpoint:
    return Endpoint("127.0.0.1", port, connect_host=dialect.connect_host)


def _producer(port: int, rate: float, seconds: float, persistent: str, dialect, steps: bool, go, out) -> None:
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    clock = _GcClock()
    gc.callbacks.append(clock)

    async def run() -> int:
        conn = await open_connection(_endpoint(port, dialect))
        make, app = _body_maker(128), _app_header_maker(4)
        headers = {"destination": DEST}
        if persistent != "none":
            headers["persistent"] = persistent
        head = encode_frame("SEND", headers)[:-2]
        tail = b"content-length:128\n\n"
        go.wait()
        interval = NS / rate
        start = time.monotonic_ns()
        deadline = start + int(seconds * NS)
        seq = 0
        while True:
            now = time.monotonic_ns()
            if now >= deadline:
                break
            due = start + int(seq * interval)
            if due > now:
                if steps:
                    await asyncio.sleep(max(0.001, (due - now) / NS))   # the load client before s37
                else:
                    time.sleep((due - now) / NS)  # noqa: ASYNC251 - to the due time, as the load client
                continue
            if not steps:
                await asyncio.sleep(0)
            conn.write(head + app(0, seq) + tail + make(0, seq, time.monotonic_ns()) + b"\0")
            seq += 1
        await asyncio.sleep(0.2)
        conn.transport.close()
        return seq

    sent = loop.run_until_complete(run())
    out.put(("producer", sent, clock.passes))


def _consumer(port: int, dialect, expected_by, ready, out) -> None:
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    clock = _GcClock()
    gc.callbacks.append(clock)
    sent_ns = array.array("q")
    got_ns = array.array("q")

    def on_message(headers, body, now):
        sent_ns.append(int(body[16:36]))
        got_ns.append(now)

    async def run() -> None:
        conn = await open_connection(_endpoint(port, dialect), on_message=on_message)
        fut = conn.expect_receipt("sub")
        conn.write(encode_frame("SUBSCRIBE", {"id": "0", "destination": DEST, "ack": "auto",
                                              dialect.prefetch_header: "1000", "receipt": "sub"}))
        await asyncio.wait_for(fut, 30)
        ready.set()
        while time.monotonic() < expected_by.value:  # noqa: ASYNC110 - a value another process sets
            await asyncio.sleep(0.05)
        conn.transport.close()

    loop.run_until_complete(run())
    out.put(("consumer", sent_ns.tobytes(), got_ns.tobytes(), clock.passes))


def measure(port: int, rate: float, seconds: float, persistent: str = "none", dialect=None,
            steps: bool = False) -> dict:
    dialect = dialect or Dialect()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    ready, go = ctx.Event(), ctx.Event()
    expected_by = ctx.Value("d", time.monotonic() + seconds + 60)
    cons = ctx.Process(target=_consumer, args=(port, dialect, expected_by, ready, out))
    cons.start()
    if not ready.wait(30):
        raise RuntimeError("consumer not subscribed")
    prod = ctx.Process(target=_producer, args=(port, rate, seconds, persistent, dialect, steps, go, out))
    prod.start()
    time.sleep(0.3)                 # the producer's CONNECT done: pacing starts at go
    expected_by.value = time.monotonic() + seconds + 1.0
    go.set()
    got: dict = {}
    for _ in range(2):
        item = out.get(timeout=seconds + 90)
        got[item[0]] = item[1:]
    prod.join(10)
    cons.join(10)
    sent = array.array("q")
    sent.frombytes(got["consumer"][0])
    recv = array.array("q")
    recv.frombytes(got["consumer"][1])
    return {"sent": got["producer"][0], "send_ns": list(sent), "recv_ns": list(recv),
            "gc_producer": got["producer"][1], "gc_consumer": got["consumer"][2]}


def measure_go(port: int, rate: float, seconds: float, persistent: str, dialect, steps: bool = False) -> dict:
    """The same paced row through the Go load client (go-stomp; bench/goload.py), every delivery's send and
    arrival time included (the Go process's CLOCK_MONOTONIC, the clock of the probes)."""
    import goload
    from loadclient import LoadSpec
    spec = LoadSpec(destination=DEST, size=128, rate=rate, duration=seconds, count=int(rate * seconds),
                    persistent={"none": None, "true": True, "false": False}[persistent], app_headers=4)
    ep = Endpoint("127.0.0.1", port, connect_host=dialect.connect_host, prefetch_header=dialect.prefetch_header)
    with tempfile.TemporaryDirectory(prefix="pymq-lat-go-") as tmp:
        path = os.path.join(tmp, "samples")
        result = goload.run_load(ep, spec, samples_path=path, runtime_sleep=steps)
        pairs = array.array("q")
        if os.path.exists(path):
            with open(path, "rb") as f:
                pairs.frombytes(f.read())
    return {"result": result, "sent": result.sent, "send_ns": list(pairs[0::2]), "recv_ns": list(pairs[1::2]),
            "gc_producer": [], "gc_consumer": []}


# ---------------------------------------------------------------------------------------- a traced pymq
def serve_traced(port: int, data_dir: str, out_path: str, no_uvloop: bool) -> None:
    """pymq-server's own start-up, with probes: reads of every connection, writes to every transport,
    GC passes. Written to ``out_path`` (JSON) once the broker has stopped (SIGTERM)."""
    from pymq_server import cli
    from pymq_server.net import output as output_mod
    from pymq_server.net import tcp

    reads: dict[int, list] = {}
    writes: dict[int, list] = {}
    clock = _GcClock()
    gc.callbacks.append(clock)
    mono = time.monotonic_ns

    original_received = tcp.StompServerProtocol.data_received

    nodelay: dict[int, int] = {}
    loop_kind: list[str] = []

    def data_received(self, data):
        if id(self) not in nodelay:
            import socket
            sock = self.transport.get_extra_info("socket")
            nodelay[id(self)] = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) if sock else -1
            loop_kind[:] = [c.__module__ + "." + c.__name__ for c in type(self.loop).__mro__[:2]]
        t = mono()
        original_received(self, data)
        reads.setdefault(id(self), []).append((t, len(data), mono() - t))

    tcp.StompServerProtocol.data_received = data_received
    original_flush = output_mod.Output.flush

    def flush(self, force=False):
        n, t = self.bytes, mono()     # before the write: the consumer can read before it returns
        original_flush(self, force)
        if n:
            writes.setdefault(id(self.link), []).append((t, n, mono() - t))

    output_mod.Output.flush = flush

    fine: dict[str, list[int]] = {}
    if os.environ.get("LATENCY_TRACE_FINE"):
        # where a read's time goes, by step (each adds a clock read or two: a little slower)
        from pymq_server.broker import intake, router

        def timed(owner, name: str, label: str) -> None:
            original = getattr(owner, name)
            spent = fine.setdefault(label, [])

            def wrapper(*args, **kwargs):
                t0 = mono()
                try:
                    return original(*args, **kwargs)
                finally:
                    spent.append(mono() - t0)

            setattr(owner, name, wrapper)

        timed(intake.FrameIntake, "_consume",
              "session: parse + handle")
        from pymq.protocol import connection as stomp_connection
        from pymq_server.broker import session as session_mod
        timed(stomp_connection.StompConnection, "parse", "  frame scanner (parse)")
        timed(stomp_connection.StompConnection, "receive_frame", "  state table (receive_frame)")
        timed(session_mod, "parse_send", "  SEND headers (parse_send)")
        timed(router.Router, "send", "  router.send")
        timed(output_mod.Output, "write", "output.write (queue a MESSAGE)")

    # every timer callback the broker schedules (chores, watchdogs, write-behind, heart-beats), timed: a
    # chore that holds the loop for a millisecond every 100 ms is 1 % of a 2,000 msg/s stream's messages
    callbacks: dict[str, list[int]] = {}
    from pymq_server import app as app_mod

    def wrap(callback, kind: str):
        label = kind + " " + getattr(callback, "__qualname__", type(callback).__name__)
        spent = callbacks.setdefault(label, [])

        def timed_callback(*args):
            t0 = mono()
            try:
                return callback(*args)
            finally:
                spent.append(mono() - t0)
        return timed_callback

    def traced_loop_class(base):
        class TracedLoop(base):
            def call_later(self, delay, callback, *args, context=None):
                return super().call_later(delay, wrap(callback, "timer"), *args, context=context)

            def call_at(self, when, callback, *args, context=None):
                return super().call_at(when, wrap(callback, "timer"), *args, context=context)
        return TracedLoop

    def install_traced_uvloop() -> bool:
        import uvloop
        cls = traced_loop_class(uvloop.Loop)

        class Policy(uvloop.EventLoopPolicy):
            def _loop_factory(self):
                return cls()
        asyncio.set_event_loop_policy(Policy())
        return True

    app_mod.install_uvloop = install_traced_uvloop

    def dump() -> None:
        with open(out_path, "w") as f:
            json.dump({"reads": {str(k): v for k, v in reads.items()},
                       "writes": {str(k): v for k, v in writes.items()},
                       "gc": clock.passes, "thresholds": gc.get_threshold(),
                       "frozen": gc.get_freeze_count(), "fine": fine,
                       "timers": callbacks, "nodelay": list(nodelay.values()),
                       "loop": loop_kind}, f)

    argv = ["--host", "127.0.0.1", "--port", str(port), "--data-dir", data_dir]
    if no_uvloop:
        argv.append("--no-uvloop")
    try:
        cli.main(argv)              # its own SIGTERM handling stops the broker; then the probes are written
    finally:
        dump()


# ------------------------------------------------------------------------------------------ the analysis
def pct(vals: list[int], q: float) -> float:
    if not vals:
        return 0.0
    s = sorted(vals)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000


def summary(label: str, lat: list[int]) -> str:
    return (f"{label:40} n={len(lat):6d}  p50 {pct(lat, .5):7.1f} µs  p90 {pct(lat, .9):7.1f}  "
            f"p99 {pct(lat, .99):7.1f}  p99.9 {pct(lat, .999):8.1f}  max {max(lat) / 1000 if lat else 0:8.1f}")


def pacing(send_ns: list[int], rate: float) -> str:
    """How evenly the client sent: the gaps between consecutive sends against the interval. A client that
    sleeps in its runtime's millisecond timer steps sends bursts (gaps near 0, then ~1 ms), and a broker
    then handles several SENDs per read: the row is no longer the steady rate it is named after."""
    ordered = sorted(send_ns)
    gaps = [b - a for a, b in zip(ordered, ordered[1:], strict=False)]
    if not gaps:
        return "  sends: none"
    interval = 1e9 / rate if rate else 0
    close = sum(1 for g in gaps if g < interval / 5) if interval else 0
    return (f"  sends: gaps p10 {pct(gaps, .1):.0f} / p50 {pct(gaps, .5):.0f} / p90 {pct(gaps, .9):.0f} µs "
            f"(interval {interval / 1000:.0f}); {100 * close / len(gaps):.1f} % under a fifth of it (bursts)")


def split(m: dict, trace: dict) -> None:
    """Each message's latency in three parts, from the broker's probes."""
    import bisect

    lo, hi = min(m["send_ns"]), max(m["recv_ns"])
    # this measurement's connections (a warm-up's came before): the most events inside its window
    reads = [[r for r in v if lo <= r[0] <= hi] for v in trace["reads"].values()]
    writes = [[w for w in v if lo <= w[0] <= hi] for v in trace["writes"].values()]
    # the producer's connection: the one with the most reads; the consumer's: the most writes
    prod = max(reads, key=len)
    prod_reads = [r[0] for r in prod]
    cons = max(writes, key=len)
    cons_writes = [w[0] for w in cons]
    print(summary("  a flush (join + transport.write)", [w[2] for w in cons]))
    print(summary("  the SEND's read handled", [r[2] for r in prod])
          + f"  (bytes per read: median {sorted(r[1] for r in prod)[len(prod) // 2]})")
    gc_broker = trace["gc"]
    parts = {"to broker": [], "in broker": [], "to client": []}
    rows = []
    by_size: dict[int, list[int]] = {}
    for s, r in zip(m["send_ns"], m["recv_ns"], strict=True):
        i = bisect.bisect_left(prod_reads, s)
        j = bisect.bisect_left(cons_writes, prod_reads[i] if i < len(prod_reads) else s)
        if i >= len(prod_reads) or j >= len(cons_writes) or cons_writes[j] > r:
            continue
        a, b = prod_reads[i] - s, cons_writes[j] - prod_reads[i]
        c = r - cons_writes[j]
        parts["to broker"].append(a)
        parts["in broker"].append(b)
        parts["to client"].append(c)
        rows.append((r - s, a, b, c, s, r))
        by_size.setdefault(prod[i][1], []).append(b)     # bytes of the read: SENDs x their size
    for k, v in parts.items():
        print(summary("  " + k, v))
    frame = min(by_size)            # a read of one SEND (sizes vary by a few bytes: app-seq's digits)
    by_count: dict[int, list[int]] = {}
    for size, spent in by_size.items():
        by_count.setdefault(round(size / frame), []).extend(spent)
    for count in sorted(by_count):
        if len(by_count[count]) >= 20:
            print(summary(f"  in broker, reads of {count} SEND(s)", by_count[count]))
    rows.sort(reverse=True)
    worst = rows[: max(1, len(rows) // 100)]
    blame = {"to broker": 0, "in broker": 0, "to client": 0}
    for row in worst:
        blame[max(zip(row[1:4], blame, strict=True), key=lambda x: x[0])[1]] += 1

    def overlaps(passes, s, r):
        return [p for p in passes if p[1] >= s and p[0] <= r]

    gcs = {name: sum(1 for row in worst if overlaps(passes, row[4], row[5]))
           for name, passes in (("broker", gc_broker), ("producer", m["gc_producer"]),
                                ("consumer", m["gc_consumer"]))}
    print(f"  slowest 1 % ({len(worst)}): largest part {blame}; overlapping a GC pass of {gcs}")
    for name, passes in (("broker", gc_broker), ("producer", m["gc_producer"]), ("consumer", m["gc_consumer"])):
        durs = sorted(p[1] - p[0] for p in passes)
        gens = {g: sum(1 for p in passes if p[2] == g) for g in (0, 1, 2)}
        if durs:
            per_gen = ", ".join(f"gen{g} x{n} max {max(p[1] - p[0] for p in passes if p[2] == g) / 1000:.0f} µs"
                                for g, n in gens.items() if n)
            print(f"  GC {name:8}: {len(durs)} passes ({per_gen}), median {durs[len(durs) // 2] / 1000:.1f} µs")
        else:
            print(f"  GC {name:8}: none")
    print(f"  broker thresholds {trace['thresholds']}, frozen objects {trace['frozen']}, loop "
          f"{trace.get('loop')}, TCP_NODELAY on its sockets: {trace.get('nodelay')}")
    for label, spent in sorted(trace.get("timers", {}).items(), key=lambda kv: -sum(kv[1])):
        if spent:
            print(summary(f"  {label[:38]}", spent) + f"  total {sum(spent) / 1e6:.1f} ms")
    for label, spent in trace.get("fine", {}).items():
        print(summary(f"  {label}", spent))
    print("  slowest 10 (µs: total / to broker / in broker / to client):")
    for row in rows[:10]:
        print("   " + " / ".join(f"{x / 1000:7.1f}" for x in row[:4]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="pymq", help="pymq | toy | activemq | port:N (a running broker)")
    ap.add_argument("--exe", default="", help="another pymq-server to run (no probes)")
    ap.add_argument("--trace", action="store_true", help="pymq in this tree with probes: the split")
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--client", default="asyncio", choices=("asyncio", "go"),
                    help="go: bench/goload.py's go-stomp client drives the row (with --trace: the same split)")
    ap.add_argument("--steps", action="store_true",
                    help="pace in the runtime's 1 ms timer steps, as the clients did before (asyncio before "
                         "session 37, go before 38): bursts of 2-4")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds at 5,000 msg/s first (not counted)")
    ap.add_argument("--persistent", default="none", choices=("none", "true", "false"),
                    help="the SENDs' persistent header (none: no header, the e row; durable in pymq)")
    ap.add_argument("--no-uvloop", action="store_true", help="the broker on asyncio's default loop")
    ap.add_argument("--serve-traced", nargs=3, metavar=("PORT", "DATA", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve_traced:
        serve_traced(int(a.serve_traced[0]), a.serve_traced[1], a.serve_traced[2], a.no_uvloop)
        return 0
    for rnd in range(a.rounds):
        with tempfile.TemporaryDirectory(prefix="pymq-lat-") as tmp:
            port = free_port()
            proc = None
            dialect = Dialect()
            trace_path = os.path.join(tmp, "trace.json")
            if a.target.startswith("port:"):
                port = int(a.target[5:])
            elif a.target == "activemq":
                proc = ActiveMQBroker(log=lambda *_: None)
                proc.start(tmp)
                port, dialect = proc.stomp_port, proc.dialect
            elif a.target == "toy":
                from toybroker import serve
                proc = mp.get_context("fork").Process(target=serve, args=(port,), daemon=True)
                proc.start()
            elif a.trace:
                argv = [sys.executable, os.path.abspath(__file__), "--serve-traced", str(port),
                        os.path.join(tmp, "data"), trace_path] + (["--no-uvloop"] if a.no_uvloop else [])
                proc = subprocess.Popen(argv)
            else:
                argv = [a.exe or "pymq-server", "--host", "127.0.0.1", "--port", str(port),
                        "--data-dir", os.path.join(tmp, "data")] + (["--no-uvloop"] if a.no_uvloop else [])
                proc = subprocess.Popen(argv)
            try:
                wait_for_port(port, 30, None)
                if a.warmup:
                    measure(port, 5000, a.warmup, "false", dialect)
                if a.client == "go":
                    m = measure_go(port, a.rate, a.seconds, a.persistent, dialect, a.steps)
                else:
                    m = measure(port, a.rate, a.seconds, a.persistent, dialect, a.steps)
            finally:
                if isinstance(proc, ActiveMQBroker):
                    proc.stop()
                elif isinstance(proc, subprocess.Popen):
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(30)
                elif proc is not None:
                    proc.kill()
                    proc.join(5)
            load = os.getloadavg()[0]
            if a.client == "go" and m["result"].errors:
                print(f"r{rnd} {a.target} go client: errors {m['result'].errors}")
            lat = [r - s for s, r in zip(m["send_ns"], m["recv_ns"], strict=True)]
            label = (f"r{rnd} {a.target}{' traced' if a.trace else ''} {a.client} client p:{a.persistent} "
                     f"(load {load:.1f})")
            print(summary(label, lat)
                  + f"  sent {m['sent']}")
            print(pacing(m["send_ns"], a.rate))
            if a.trace and os.path.exists(trace_path):
                with open(trace_path) as f:
                    split(m, json.load(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
