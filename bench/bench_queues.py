"""Queue benchmarks of the queues issue: selectors that split a stream, and queue operations at depth.

    python bench/bench_queues.py [--quick] [--parts selectors,depth] [--depth N] [--json out.json]

selectors  One producer, 8 consumers on one queue. Message k carries the integer property `part = k % 8`
           (`part:<i>` with `pymq-types: part=i`, so the selector compares numbers, not strings); consumer i
           subscribes with `selector: part = <i>`. The baseline is the same load (same headers) with 8
           consumers without selectors, in the same run. Two arrangements:
             live     consumers subscribed first, the producer keeps at most 1,000 messages in flight
                      (bench_brokers' window): the queue stays short;
             backlog  the producer sends everything first, then the 8 consumers subscribe and drain it;
                      measured at several depths, because pymq's dispatcher scans the ready messages for
                      each consumer's first match (server/broker/queue.py ReadyIndex.take_first), so the
                      cost per message grows with the depth.
           Every consumer must get exactly its eighth: a message outside its part counts as misrouted.
depth      Fill one queue to 1,000,000 waiting messages (--quick: 100,000), then two measured phases
           while the depth stays there:
             load       a producer and a client-acknowledging consumer (prefetch 1,000) together, as fast
                        as they go (the producer is paced by what the consumer takes, so the depth holds);
             seed-rate  only the two probes below, every 4 ms: about the seed's 600 events/s.
           Events per second = enqueue + acquire + ack, from the broker's own queue figures (added,
           delivered, removed) over the window, compared with the seed's 600 events/s per queue. The
           probes measure latency at that depth: a SEND with a receipt (enqueue round trip) and a
           prefetch-1 consumer that times its ACK to its next MESSAGE (ack + acquire, one round trip).
           Broker memory per waiting message is VmRSS (/proc/<pid>/status) after the fill minus before,
           over the count. Non-persistent and persistent (the default file store), a fresh broker each.
           Afterwards the queue is drained and every message is accounted for (fill, producer, probes).

Every message is checked (loss, duplicates, misrouting). Exit status: 1 on any of those or a harness
error, never because of speed. Never run by pytest.
"""
from __future__ import annotations

import argparse
import array
import asyncio
import json
import multiprocessing as mp
import os
import platform
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from loadclient import (Endpoint, LoadSpec, RunResult, StompError, _body_maker, _new_loop,  # noqa: E402
                        _produce, _Tally, close_connection, encode_frame, open_connection, run_load,
                        uvloop)
from peers import PeerUnavailable, PymqBroker, machine_busy_seconds, process_tree  # noqa: E402

PARTS = 8
SEED_EVENTS_PER_S = 600          # seed 001: "at least 600 events per second per queue at peak time"
SIZE = 128


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ selectors
@dataclass
class SelectorRow:
    arrangement: str       # live | backlog
    depth: int             # backlog: messages waiting when the consumers subscribe; live: 0
    selectors: bool
    result: RunResult
    rate: float = 0.0      # live: deliveries/s (first send to last delivery); backlog: drain rate
    broker_us_per_msg: float = 0.0
    other_cpu_pct: float = 0.0

    @property
    def failed(self) -> bool:
        r = self.result
        return bool(r.lost or r.duplicated or r.malformed or r.misrouted or r.errors)


def selector_spec(dest: str, selectors: bool, count: int, seconds: float, backlog: bool) -> LoadSpec:
    return LoadSpec(
        destination=dest, consumers=PARTS, count=count, duration=seconds, size=SIZE,
        rotate_send_headers=[{"part": str(i), "pymq-types": "part=i"} for i in range(PARTS)],
        subscribe_headers=[{"selector": f"part = {i}"} for i in range(PARTS)] if selectors else [],
        check_rotation=selectors, backlog_first=backlog, max_in_flight=0 if backlog else 1000)


def run_measured(broker: PymqBroker, ep: Endpoint, spec: LoadSpec) -> tuple[RunResult, float, float]:
    """run_load plus the broker's CPU per delivery and everyone else's CPU share (as bench_brokers)."""
    at_start = []

    def sample():
        return broker.cpu_seconds(), machine_busy_seconds(), time.monotonic()

    r = run_load(ep, spec, on_started=lambda: at_start.append(sample()))
    cpu1, busy1, t1 = sample()
    cpu0, busy0, t0 = at_start[0] if at_start else (cpu1, busy1, t1)
    brk = cpu1 - cpu0
    others = busy1 - busy0 - brk - r.producer_cpu_s - r.consumer_cpu_s
    return r, (brk * 1e6 / r.received if r.received else 0.0), (100 * max(0.0, others) / (t1 - t0) if t1 > t0 else 0.0)


def bench_selectors(broker: PymqBroker, run_id: str, quick: bool) -> list[SelectorRow]:
    ep = Endpoint("127.0.0.1", broker.stomp_port)
    rows = []
    live_count, live_s = (20_000, 3.0) if quick else (200_000, 15.0)
    for selectors in (False, True):
        spec = selector_spec(f"/queue/bq.{run_id}.live.{'sel' if selectors else 'plain'}", selectors,
                             live_count, live_s, backlog=False)
        r, us, others = run_measured(broker, ep, spec)
        rows.append(SelectorRow("live", 0, selectors, r, r.rate, us, others))
        log(f"  live     {'selectors' if selectors else 'plain':9} {r.rate:10,.0f} msg/s  broker {us:7.1f} µs/msg"
            f"  others {others:3.0f}%  sent {r.sent} recv {r.received}" + _faults(r))
    # The drain with selectors costs about depth² selector evaluations (each consumer rescans the other
    # parts' messages in front of its next match); depths stay where one drain takes seconds.
    for depth in ((500, 1000) if quick else (1000, 2000, 4000)):
        for selectors in (False, True):
            spec = selector_spec(f"/queue/bq.{run_id}.backlog{depth}.{'sel' if selectors else 'plain'}",
                                 selectors, depth, 60.0, backlog=True)
            r, us, others = run_measured(broker, ep, spec)
            rows.append(SelectorRow("backlog", depth, selectors, r, r.drain_rate, us, others))
            log(f"  backlog {depth:6} {'selectors' if selectors else 'plain':9} {r.drain_rate:10,.0f} msg/s"
                f"  broker {us:7.1f} µs/msg  others {others:3.0f}%  recv {r.received}" + _faults(r))
    return rows


def _faults(r: RunResult) -> str:
    return ((f"  LOST {r.lost}" if r.lost else "") + (f"  DUP {r.duplicated}" if r.duplicated else "")
            + (f"  MISROUTED {r.misrouted}" if r.misrouted else "") + (f"  ERRORS {r.errors}" if r.errors else ""))


def print_selectors(rows: list[SelectorRow]) -> dict:
    print(f"\nselectors: 1 producer, {PARTS} consumers, {SIZE} B non-persistent, ack:auto; "
          f"selector `part = <i>` on the integer property part (pymq-types: part=i). brk µs/msg: the broker's CPU "
          "from the producer's start to the last delivery, per message (enqueue + dispatch); others: % of a core "
          "used by everything else on the machine")
    hdr = (f"{'arrangement':13} {'consumers':10} {'msg/s':>10} {'brk µs/msg':>10} {'others':>6} "
           f"{'sent':>8} {'recv':>8} {'lost':>5} {'dup':>4} {'misrt':>5}")
    print(hdr)
    print("-" * len(hdr))
    for row in rows:
        r = row.result
        where = "live" if row.arrangement == "live" else f"backlog {row.depth}"
        print(f"{where:13} {'selectors' if row.selectors else 'plain':10} {row.rate:10,.0f} "
              f"{row.broker_us_per_msg:10.1f} {row.other_cpu_pct:5.0f}% {r.sent:8} {r.received:8} {r.lost:5} "
              f"{r.duplicated:4} {r.misrouted:5}" + (f"  ERROR {'; '.join(r.errors)[:160]}" if r.errors else ""))
    ratios: dict = {}
    by = {(row.arrangement, row.depth, row.selectors): row for row in rows if not row.failed}
    print("\nselectors / plain (throughput >1: selectors faster; broker CPU per message >1: selectors dearer)")
    for (arr, depth, sel), row in by.items():
        base = by.get((arr, depth, False))
        if not sel or base is None or not base.rate or not base.broker_us_per_msg:
            continue
        key = "live" if arr == "live" else f"backlog {depth}"
        ratios[key] = {"throughput": row.rate / base.rate,
                       "cpu_per_msg": row.broker_us_per_msg / base.broker_us_per_msg}
        print(f"  {key:13} throughput {ratios[key]['throughput']:.3f}, broker cpu/msg {ratios[key]['cpu_per_msg']:.1f}")
    backlog = sorted((row.depth, row.broker_us_per_msg) for row in by.values()
                     if row.arrangement == "backlog" and row.selectors and row.broker_us_per_msg)
    if len(backlog) >= 2:
        # Fit cost per message = a * depth (a drain of D messages costing ~ a * D^2 in all) through the
        # deepest point, and say what a 100k backlog would take: that one is not run.
        d, us = backlog[-1]
        a = us / d
        print("  cost per message with selectors grows with depth "
              f"({', '.join(f'{d}: {u:.0f} µs' for d, u in backlog)});"
              f" at that slope a 100,000-message backlog would take ~{a * 100_000 * 100_000 / 1e6 / 60:,.0f} min"
              " of broker CPU to drain (not run)")
        ratios["backlog_us_per_msg_per_waiting_msg"] = a
    return ratios


# ---------------------------------------------------------------------------------------------- depth
def vm_rss_kb(root_pid: int) -> int:
    """VmRSS of the broker's process tree (the console-script shim may sit above the interpreter)."""
    total = 0
    for pid in process_tree(root_pid):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


def admin(port: int, op: str, **args):
    """One admin operation over the SDK (its own short connection: no SDK thread lives across a fork)."""
    import pymq

    with pymq.connect(f"stomp://127.0.0.1:{port}") as conn:
        return conn.queue_manager().call(op, timeout=60, **args)


def queue_metrics(port: int, name: str) -> dict:
    return admin(port, "queue-info", name=name)["metrics"]


FILL, LOAD, LOAD_PROBE, SEED_PROBE = 0, 1, 2, 3   # producer ids in message bodies
N_PIDS = 4
MAIN, ACQUIRE_PROBE = 0, 1                        # consumer slots in the shared counters
LOAD_PROBE_PAUSE = 0.010       # under full load: a probe every 10 ms
SEED_PROBE_PAUSE = 0.004       # at the seed's rate: ~200 enqueues + ~200 acquires + ~200 acks per second


@dataclass
class Phase:
    """One measured window at depth: the broker's own queue figures, the probes' round trips."""

    name: str                  # load | seed-rate
    window_s: float = 0.0
    depth_start: int = 0
    depth_end: int = 0
    enqueued: int = 0
    acquired: int = 0
    acked: int = 0
    events_per_s: float = 0.0
    seed_multiple: float = 0.0
    broker_us_per_event: float = 0.0
    other_cpu_pct: float = 0.0
    enqueue_rtt_p50_ms: float = 0.0
    enqueue_rtt_p99_ms: float = 0.0
    ack_next_rtt_p50_ms: float = 0.0
    ack_next_rtt_p99_ms: float = 0.0
    probes: int = 0


@dataclass
class DepthResult:
    variant: str
    target: int
    fill_sent: int = 0
    fill_s: float = 0.0
    depth: int = 0
    rss_before_kb: int = 0
    rss_after_kb: int = 0
    rss_bytes_per_msg: float = 0.0
    held_bytes_per_msg: float = 0.0
    phases: list = field(default_factory=list)
    sent: int = 0
    accounted: int = 0
    lost: int = 0
    duplicated: int = 0
    malformed: int = 0
    errors: list = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.lost or self.duplicated or self.malformed or self.errors)


def _child(target, args, out_q, kind: str) -> None:
    """A child process: one asyncio loop running `target(*args)`; its result or error goes to out_q."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    try:
        out_q.put((kind, loop.run_until_complete(target(*args)), None))
    except BaseException as e:  # noqa: BLE001 - to the parent, which counts it as a harness error
        out_q.put((kind, None, f"{type(e).__name__}: {e}"))


async def _fill(ep: Endpoint, spec: LoadSpec) -> dict:
    result: dict = {}
    shared = SimpleNamespace(sent=[0] * N_PIDS, received=[0] * 2)   # no window: never read
    await _produce(ep, spec, FILL, time.monotonic_ns(), result, shared)
    return result[FILL]


async def _load_producer(ep: Endpoint, spec: LoadSpec, shared) -> dict:
    await asyncio.get_running_loop().run_in_executor(None, shared.go.wait, 120)
    result: dict = {}
    await _produce(ep, spec, LOAD, time.monotonic_ns(), result, shared)
    return result[LOAD]


async def _subscribe(ep: Endpoint, dest: str, tally, prefetch: int, ack: str):
    conn = await open_connection(ep, on_message=tally)
    fut = conn.expect_receipt("sub")
    conn.write(encode_frame("SUBSCRIBE", {"id": "0", "destination": dest, "ack": ack,
                                          "prefetch-count": str(prefetch), "receipt": "sub"}))
    await asyncio.wait_for(fut, 60)
    return conn


async def _leave(conn) -> None:
    """Stop consuming without losing count: messages that reach us from now on are neither counted nor
    acknowledged, and go back to the queue when the subscription ends (the drain counts them there).

    UNSUBSCRIBE (confirmed) comes before DISCONNECT, in a write of its own: a pymq broker that reads
    ACKs and a DISCONNECT in one batch fails the connection when an ACK frees credit for one more
    MESSAGE ("cannot send MESSAGE in state disconnecting"), and the ACKs after that one are dropped, so
    acknowledged messages are delivered again (a broker bug; see bench/README.md)."""
    conn.on_message = None
    fut = conn.expect_receipt("unsub")
    conn.write(encode_frame("UNSUBSCRIBE", {"id": "0", "receipt": "unsub"}))
    await asyncio.wait_for(fut, 60)
    await close_connection(conn, timeout=10)


def _tally_report(t: _Tally, conn) -> dict:
    return {"received": t.received, "dups": t.dups, "bad": t.bad, "seen": [bytes(s) for s in t.seen],
            "error": conn.error}


async def _load_consumer(ep: Endpoint, dest: str, capacity: int, shared, ready) -> dict:
    tally = _Tally(N_PIDS, capacity, "client-individual", MAIN, shared.received)
    conn = await _subscribe(ep, dest, tally, 1000, "client-individual")
    ready.set()
    await asyncio.get_running_loop().run_in_executor(None, shared.stop.wait, 600)
    await _leave(conn)
    return _tally_report(tally, conn)


class _AcquireProbe(_Tally):
    """A prefetch-1 consumer that acknowledges each message after a pause and times ACK -> next MESSAGE:
    the broker's ack plus the acquisition of the next message from the deep queue, one round trip."""

    def __init__(self, capacity: int, shared_received, pause: float) -> None:
        super().__init__(N_PIDS, capacity, "client", ACQUIRE_PROBE, shared_received)  # acks: ours, paced
        self.pause = pause
        self.conn = None
        self.ack_sent = 0
        self.rtt = array.array("q")
        self.pending: bytes | None = None      # the ack id of the message we hold (counted, not acked)
        self.timer: asyncio.TimerHandle | None = None

    def __call__(self, headers, body, now):
        if self.ack_sent:
            self.rtt.append(now - self.ack_sent)
            self.ack_sent = 0
        super().__call__(headers, body, now)
        self.pending = headers[b"ack"]
        self.timer = asyncio.get_running_loop().call_later(self.pause, self.ack_now)

    def ack_now(self) -> None:
        """Acknowledge the message held (also before leaving: a counted message must not come back)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.pending is None or self.conn is None or self.conn.on_message is None:
            return
        self.ack_sent = time.monotonic_ns()
        self.conn.write(b"ACK\nid:" + self.pending + b"\n\n\0")
        self.pending = None


async def _probes(ep: Endpoint, dest: str, capacity: int, persistent: bool, pause: float, pid: int,
                  shared, ready) -> dict:
    """The enqueue probe (a SEND with a receipt every `pause` s, producer id `pid`) and the acquire probe."""
    loop = asyncio.get_running_loop()
    probe = _AcquireProbe(capacity, shared.received, pause)
    sub = await _subscribe(ep, dest, probe, 1, "client-individual")
    probe.conn = sub
    conn = await open_connection(ep)
    ready.set()
    await loop.run_in_executor(None, shared.go.wait, 120)
    make = _body_maker(SIZE)
    rtts = array.array("q")
    seq = 0
    while not shared.stop.is_set():
        t0 = time.monotonic_ns()
        fut = conn.expect_receipt(f"p{seq}")
        conn.write(encode_frame("SEND", {"destination": dest, "persistent": "true" if persistent else "false",
                                         "receipt": f"p{seq}"}, make(pid, seq, t0)))
        seq += 1
        rtts.append(await asyncio.wait_for(fut, 60) - t0)
        await asyncio.sleep(pause)
    if not await close_connection(conn, timeout=30):
        raise StompError("the broker did not confirm the enqueue probe's DISCONNECT")
    probe.ack_now()
    await _leave(sub)
    return {**_tally_report(probe, sub), "sent": seq, "enqueue_rtt": rtts.tobytes(),
            "acquire_rtt": probe.rtt.tobytes()}


async def _drain(ep: Endpoint, dest: str, capacity: int, expected: int, idle_timeout: float) -> dict:
    """Take everything left in the queue (ack:auto) and count it."""
    tally = _Tally(N_PIDS, capacity, "auto", 0, [0])
    conn = await _subscribe(ep, dest, tally, 0, "auto")
    last, last_n = time.monotonic(), -1
    while tally.received < expected:
        await asyncio.sleep(0.05)
        if tally.received != last_n:
            last, last_n = time.monotonic(), tally.received
        elif time.monotonic() - last > idle_timeout:
            break
    await asyncio.sleep(0.05)     # a late duplicate would still be counted
    await _leave(conn)
    return _tally_report(tally, conn)


def _percentiles_ms(raw: bytes) -> tuple[float, float]:
    vals = sorted(array.array("q", raw))
    if not vals:
        return 0.0, 0.0
    return tuple(vals[min(len(vals) - 1, int(round(q * (len(vals) - 1))))] / 1e6 for q in (0.50, 0.99))


class _DepthRun:
    """One broker, one queue filled to the target depth, the measured phases, then the count."""

    def __init__(self, broker: PymqBroker, res: DepthResult, dest: str, persistent: bool, quick: bool) -> None:
        self.broker, self.res, self.dest, self.persistent = broker, res, dest, persistent
        self.name = dest[len("/queue/"):]
        self.port = broker.stomp_port
        self.ep = Endpoint("127.0.0.1", self.port)
        self.ctx = mp.get_context("fork")
        self.out_q = self.ctx.Queue()
        self.procs: list = []
        self.window_s, self.warm_s = (3.0, 0.5) if quick else (15.0, 1.0)
        self.load_max = 500_000 if quick else 1_500_000      # the load producer's count bound
        self.capacity = max(res.target, self.load_max) + 1
        self.sent: dict[int, int] = {}
        self.tallies: list[dict] = []

    def spawn(self, kind: str, fn, *args) -> None:
        p = self.ctx.Process(target=_child, args=(fn, args, self.out_q, kind), daemon=True)
        self.procs.append(p)
        p.start()

    def collect(self, kinds: set, timeout: float = 180) -> dict:
        reports: dict = {}
        while kinds - set(reports):
            kind, payload, err = self.out_q.get(timeout=timeout)
            if err:
                raise StompError(f"{kind}: {err}")
            reports[kind] = payload
        return reports

    def metrics(self) -> dict:
        return queue_metrics(self.port, self.name)

    def fill(self) -> None:
        res = self.res
        time.sleep(0.5)
        res.rss_before_kb = vm_rss_kb(self.broker.proc.pid)
        spec = LoadSpec(destination=self.dest, producers=N_PIDS, count=res.target, duration=600.0, size=SIZE,
                        persistent=self.persistent, max_in_flight=0, idle_timeout=60.0)
        t0 = time.monotonic()
        self.spawn("fill", _fill, self.ep, spec)
        res.fill_sent = self.collect({"fill"}, timeout=900)["fill"]["sent"]
        self.sent[FILL] = res.fill_sent
        deadline = time.monotonic() + 120
        while (depth := self.metrics()["depth"]) < res.fill_sent and time.monotonic() < deadline:
            time.sleep(0.2)
        res.fill_s, res.depth = time.monotonic() - t0, depth
        time.sleep(1.0)
        res.rss_after_kb = vm_rss_kb(self.broker.proc.pid)
        res.rss_bytes_per_msg = (res.rss_after_kb - res.rss_before_kb) * 1024 / max(1, depth)
        res.held_bytes_per_msg = admin(self.port, "metrics")["broker"]["held_bytes"] / max(1, depth)
        log(f"  {res.variant}: filled {depth:,} messages in {res.fill_s:.1f} s ({res.fill_sent / res.fill_s:,.0f} "
            f"msg/s), RSS {res.rss_before_kb / 1024:,.0f} -> {res.rss_after_kb / 1024:,.0f} MiB "
            f"({res.rss_bytes_per_msg:,.0f} B per waiting message)")

    def phase(self, name: str, load: bool) -> Phase:
        """load: producer + client-ack consumer as fast as they go (the producer paced by the consumer, so
        the depth stays), probes every 10 ms. seed-rate: only the probes, every 4 ms (~600 events/s)."""
        ctx = self.ctx
        shared = SimpleNamespace(go=ctx.Event(), stop=ctx.Event(), sent=ctx.Array("q", N_PIDS, lock=False),
                                 received=ctx.Array("q", 2, lock=False))
        ready = [ctx.Event() for _ in range(2 if load else 1)]
        probe_pid = LOAD_PROBE if load else SEED_PROBE
        self.spawn("probe", _probes, self.ep, self.dest, self.capacity, self.persistent,
                   LOAD_PROBE_PAUSE if load else SEED_PROBE_PAUSE, probe_pid, shared, ready[0])
        if load:
            self.spawn("consumer", _load_consumer, self.ep, self.dest, self.capacity, shared, ready[1])
        for ev in ready:
            if not ev.wait(120):
                raise StompError("a consumer did not subscribe within 120 s")
        if load:
            # At most 1,000 x N_PIDS messages sent and not yet received: the depth stays within a few
            # thousand of the fill.
            spec = LoadSpec(destination=self.dest, producers=N_PIDS, count=self.load_max, size=SIZE,
                            duration=self.warm_s + self.window_s + 0.5, persistent=self.persistent,
                            max_in_flight=1000, idle_timeout=60.0)
            self.spawn("producer", _load_producer, self.ep, spec, shared)
        ph = Phase(name)
        shared.go.set()
        time.sleep(self.warm_s)
        m0, cpu0, busy0, t0 = self.metrics(), self.broker.cpu_seconds(), machine_busy_seconds(), time.monotonic()
        time.sleep(self.window_s)
        m1, cpu1, busy1, t1 = self.metrics(), self.broker.cpu_seconds(), machine_busy_seconds(), time.monotonic()
        ph.window_s, ph.depth_start, ph.depth_end = t1 - t0, m0["depth"], m1["depth"]
        ph.enqueued, ph.acquired, ph.acked = (m1[k] - m0[k] for k in ("added", "delivered", "removed"))
        events = ph.enqueued + ph.acquired + ph.acked
        ph.events_per_s = events / ph.window_s
        ph.seed_multiple = ph.events_per_s / SEED_EVENTS_PER_S
        ph.broker_us_per_event = (cpu1 - cpu0) * 1e6 / events if events else 0.0
        # the bench's own client processes count as "others" here: the figure only shows how busy it was
        ph.other_cpu_pct = 100 * max(0.0, busy1 - busy0 - (cpu1 - cpu0)) / ph.window_s
        if load:
            self.sent[LOAD] = self.collect({"producer"})["producer"]["sent"]
        shared.stop.set()
        reports = self.collect({"probe", "consumer"} if load else {"probe"})
        probe = reports["probe"]
        self.sent[probe_pid] = probe["sent"]
        self.tallies += list(reports.values())
        ph.enqueue_rtt_p50_ms, ph.enqueue_rtt_p99_ms = _percentiles_ms(probe["enqueue_rtt"])
        ph.ack_next_rtt_p50_ms, ph.ack_next_rtt_p99_ms = _percentiles_ms(probe["acquire_rtt"])
        ph.probes = probe["sent"]
        self.wait_unconsumed()
        log(f"  {self.res.variant} {name}: {ph.events_per_s:,.0f} events/s at depth {ph.depth_start:,}-"
            f"{ph.depth_end:,} ({ph.seed_multiple:,.1f}x the seed's 600/s); enqueue round trip p50 "
            f"{ph.enqueue_rtt_p50_ms:.2f} ms, ack->next p50 {ph.ack_next_rtt_p50_ms:.2f} ms")
        return ph

    def wait_unconsumed(self) -> dict:
        deadline = time.monotonic() + 60
        while (m := self.metrics())["in_flight"] or m["consumers"]:
            if time.monotonic() > deadline:
                raise StompError(f"messages still in flight 60 s after the consumers left: {m}")
            time.sleep(0.1)
        return m

    def account(self) -> None:
        """Drain what is left, then check every message sent was taken exactly once."""
        res = self.res
        left = self.wait_unconsumed()["depth"]
        self.spawn("drain", _drain, self.ep, self.dest, self.capacity, left, 30.0)
        self.tallies.append(self.collect({"drain"}, timeout=900)["drain"])
        res.sent = sum(self.sent.values())
        res.duplicated = sum(t["dups"] for t in self.tallies)
        res.malformed = sum(t["bad"] for t in self.tallies)
        for pid in range(N_PIDS):
            n = self.sent.get(pid, 0)
            merged = 0
            for t in self.tallies:
                bits = int.from_bytes(t["seen"][pid], "little")
                res.duplicated += (merged & bits).bit_count()
                merged |= bits
            mask = int.from_bytes(b"\x01" * n, "little")
            got = (merged & mask).bit_count()
            res.accounted += got
            res.lost += n - got
            res.malformed += (merged & ~mask).bit_count()
        res.errors += [f"a consumer's connection failed: {t['error']}" for t in self.tallies if t.get("error")]
        remaining = self.metrics()["depth"]
        if remaining:
            res.errors.append(f"{remaining} messages still in the queue after the drain")
        log(f"  {res.variant}: accounted for {res.accounted:,} of {res.sent:,} messages"
            + (f"  LOST {res.lost}" if res.lost else "") + (f"  DUP {res.duplicated}" if res.duplicated else ""))

    def stop_children(self) -> None:
        for p in self.procs:             # our own children, by their handles
            if p.is_alive():
                p.kill()
            p.join(5)


def bench_depth(tmp: str, run_id: str, target: int, persistent: bool, quick: bool) -> DepthResult:
    variant = "persistent" if persistent else "non-persistent"
    res = DepthResult(variant, target)
    broker = PymqBroker(log=log)
    run = None
    try:
        # A fresh broker per variant, so the memory figure is this fill's alone.
        broker.start(os.path.join(tmp, f"depth-{'p' if persistent else 'np'}"))
        name = f"bq.{run_id}.depth.{'p' if persistent else 'np'}"
        # Messages a consumer held when it left come back once more; never dead-letter them.
        admin(broker.stomp_port, "create-queue", name=name, config={"max_deliveries": 0})
        run = _DepthRun(broker, res, "/queue/" + name, persistent, quick)
        run.fill()
        res.phases.append(run.phase("load", load=True))
        res.phases.append(run.phase("seed-rate", load=False))
        run.account()
    # broker start, SDK, a child's error, queue.Empty: any of them is a harness error, reported with the run
    except Exception as e:  # noqa: BLE001 - recorded in the run's errors; the other runs go on
        res.errors.append(f"{type(e).__name__}: {e}")
    finally:
        if run is not None:
            run.stop_children()
        broker.stop()
    return res


def print_depth(rows: list[DepthResult]) -> None:
    if not rows:
        return
    print(f"\nqueue at depth: {SIZE} B messages. load = a producer and a client-ack consumer (prefetch 1,000) "
          "together, as fast as they go; seed-rate = only the probes, ~600 events/s. events = enqueue + "
          "acquire + ack (the broker's queue figures). enq rtt = SEND -> RECEIPT of a probe message; "
          "ack->next = a prefetch-1 consumer's ACK -> its next MESSAGE")
    hdr = (f"{'variant':15} {'phase':9} {'depth':>9} {'events/s':>9} {'x seed':>7} {'brk µs/ev':>9} "
           f"{'enq rtt p50/p99 ms':>19} {'ack->next p50/p99 ms':>21} {'others':>6}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        for ph in r.phases:
            print(f"{r.variant:15} {ph.name:9} {ph.depth_start:9,} {ph.events_per_s:9,.0f} {ph.seed_multiple:7,.1f} "
                  f"{ph.broker_us_per_event:9.1f} {ph.enqueue_rtt_p50_ms:8.2f} / {ph.enqueue_rtt_p99_ms:8.2f} "
                  f"{ph.ack_next_rtt_p50_ms:9.2f} / {ph.ack_next_rtt_p99_ms:8.2f} {ph.other_cpu_pct:5.0f}%")
        if r.errors and not r.phases:
            print(f"{r.variant:15} ERROR {'; '.join(r.errors)[:200]}")
    print(f"\n{'variant':15} {'waiting':>9} {'fill msg/s':>10} {'RSS MiB':>15} {'RSS B/msg':>9} {'body B/msg':>10} "
          f"{'sent':>9} {'accounted':>9} {'lost':>5} {'dup':>4}")
    for r in rows:
        print(f"{r.variant:15} {r.depth:9,} {r.fill_sent / r.fill_s if r.fill_s else 0:10,.0f} "
              f"{r.rss_before_kb / 1024:6,.0f} -> {r.rss_after_kb / 1024:5,.0f} {r.rss_bytes_per_msg:9,.0f} "
              f"{r.held_bytes_per_msg:10,.0f} {r.sent:9,} {r.accounted:9,} {r.lost:5} {r.duplicated:4}"
              + (f"  ERROR {'; '.join(r.errors)[:200]}" if r.errors else ""))
    for r in rows:
        for ph in r.phases:
            print(f"  {r.variant} {ph.name}: {ph.enqueued:,} enqueued, {ph.acquired:,} acquired, {ph.acked:,} acked "
                  f"in {ph.window_s:.1f} s; depth {ph.depth_start:,} -> {ph.depth_end:,}; "
                  f"{ph.seed_multiple:,.1f}x the seed's {SEED_EVENTS_PER_S} events/s per queue")


# ----------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="selectors splitting a queue; queue operations at 1M depth")
    ap.add_argument("--quick", action="store_true", help="a few seconds per part (CI smoke run)")
    ap.add_argument("--parts", default="selectors,depth")
    ap.add_argument("--depth", type=int, help="waiting messages for the depth part (default 1,000,000; "
                                              "--quick 100,000)")
    ap.add_argument("--variants", default="non-persistent,persistent")
    ap.add_argument("--json", help="write all figures to this file")
    a = ap.parse_args(argv)
    parts = {s.strip() for s in a.parts.split(",") if s.strip()}
    variants = [s.strip() for s in a.variants.split(",") if s.strip()]
    if parts - {"selectors", "depth"} or set(variants) - {"non-persistent", "persistent"}:
        ap.error("--parts takes selectors,depth; --variants takes non-persistent,persistent")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # still stops the brokers (finally blocks)
    run_id = f"{int(time.time())}{os.getpid() % 1000}"
    target = a.depth or (100_000 if a.quick else 1_000_000)
    doc: dict = {"quick": a.quick, "cores": os.cpu_count(), "python": platform.python_version(),
                 "loop": "uvloop" if uvloop else "asyncio", "load_at_start": os.getloadavg()[0]}
    failed = []
    sel_rows: list[SelectorRow] = []
    depth_rows: list[DepthResult] = []
    with tempfile.TemporaryDirectory(prefix="pymq-bench-queues-") as tmp:
        if "selectors" in parts:
            broker = PymqBroker(log=log)
            try:
                broker.start(os.path.join(tmp, "selectors"))
                sel_rows = bench_selectors(broker, run_id, a.quick)
            except PeerUnavailable as e:
                failed.append(f"selectors: pymq unavailable: {e}")
            finally:
                broker.stop()
        if "depth" in parts:
            for v in variants:
                depth_rows.append(bench_depth(tmp, run_id, target, v == "persistent", a.quick))
    print(f"\nqueue bench ({'quick' if a.quick else 'full'}), {os.cpu_count()} cores, python "
          f"{platform.python_version()}, {'uvloop' if uvloop else 'asyncio'} load client, load average at start "
          f"{doc['load_at_start']:.1f}")
    if sel_rows:
        doc["selector_ratios"] = print_selectors(sel_rows)
        doc["selectors"] = [{**r.result.as_dict(), "arrangement": r.arrangement, "depth": r.depth,
                             "selectors": r.selectors, "rate": r.rate, "broker_us_per_msg": r.broker_us_per_msg,
                             "other_cpu_pct": r.other_cpu_pct} for r in sel_rows]
        failed += [f"selectors {r.arrangement} {r.depth} {'selectors' if r.selectors else 'plain'}: lost "
                   f"{r.result.lost}, duplicated {r.result.duplicated}, misrouted {r.result.misrouted}, "
                   f"malformed {r.result.malformed}, errors {r.result.errors}" for r in sel_rows if r.failed]
    print_depth(depth_rows)
    doc["depth"] = [dict(asdict(r)) for r in depth_rows]
    failed += [f"depth {r.variant}: lost {r.lost}, duplicated {r.duplicated}, malformed {r.malformed}, "
               f"errors {r.errors}" for r in depth_rows if r.failed]
    for f in failed:
        print(f"\nFAILED {f}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(doc, fh, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
