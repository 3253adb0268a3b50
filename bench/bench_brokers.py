"""pymq against RabbitMQ (STOMP plugin) and ActiveMQ Classic on the same workloads, in the same run.

    python bench/bench_brokers.py [--quick] [--brokers pymq,rabbitmq,activemq] [--workloads a,b,c,d,i,e,k,sdk]
                                  [--client asyncio,go] [--headers N] [--seconds S] [--pinned]
                                  [--pin-broker CPUS] [--pin-client CPUS]
                                  [--json out.json] [--rounds N] [--window N] [--self-check]

Nothing is pinned by default: every broker runs as its defaults make it, with the cores and threads it
chooses (the JVM's and Erlang's schedulers on every core, pymq in one process unless --pymq-workers),
which is how people run them: the headline figures.  --pinned puts every broker's threads on CPU 0 and the
load client on CPU 1: the CPU-per-message view (what one core of broker does), labelled as such.
--client picks the load client(s): asyncio (bench/loadclient.py, the default), go (bench/goload: go-stomp,
a client nobody here wrote), or both, each row then measured with each, so no row depends on one client.

The brokers are started by this script (bench/peers.py: own temp data dirs, free ports, 127.0.0.1 only) and
warmed up; then each workload runs against each broker in turn, driven by the bench's own load client
(bench/loadclient.py). Only one broker is under load at a time, and because the order is workload by
workload, other load on this shared machine falls on all brokers alike. Every SEND carries --headers
application headers (default 4: an id, the producer index, a sequence number, a timestamp), 128 B bodies.
Rows (groups chosen with --workloads):
    a  q   1 -> 1 queue, SEND without `persistent` (durable in pymq, non-persistent in the peers)
       qn  the same with persistent:false (pymq only; the peers' figure is their q row)
    b  qp  1 -> 1 queue, persistent:true, a RECEIPT every 100 messages, at most 1,000 unconfirmed
    c  c / cn   1 -> 4 topic subscribers (deliveries/s over all subscribers); cn persistent:false, pymq only
    d  d / dn   4 producers + 4 consumers on one queue; dn persistent:false, pymq only
    i  i / in   1 -> 1 queue, client-individual ACK per message, prefetch 1000; in persistent:false, pymq only
    e  e / ep / en   latency at a steady 2,000 msg/s (p50/p99/p99.9): no header, persistent:true, false
       eh / ehp / ehn   the same at half of the broker's own q / qp / qn msg/s of the round (measured
                first when those rows are not in the run); ehn pymq only
       es / esp, ea / eap   2,000 msg/s through the SDK (blocking; pymq.aio), NON_PERSISTENT / PERSISTENT,
                end to end (bench/sdk_latency.py), beside the load client's e / ep; pymq only
    k  k / kp   1 KiB bodies, persistent:false and persistent:true with receipts (not in the default set)
    m  m / md   4 queues, one producer and one consumer each; persistent:false and no header (not in the
                default set; the rows where --pymq-workers 2 can use both workers)
    sdk (pymq only) the SDK's send and receive loops over stomp:// and vm://, beside qn/qp of the same run
Every message is checked (no loss, no duplicate). Exit status: 1 on loss, duplication or a harness error,
never because of speed; a peer that cannot be installed or started is reported and skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from loadclient import Endpoint, LoadSpec, RunResult, run_load, uvloop  # noqa: E402

CLIENTS = ("asyncio", "go")
from peers import (BROKERS, Broker, PeerUnavailable, PymqBroker, machine_busy_seconds, own_cpu_seconds,  # noqa: E402
                   process_tree)

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Workload:
    key: str              # row name, e.g. q
    group: str            # the letter chosen with --workloads
    title: str
    spec: dict            # LoadSpec fields besides destination/limits
    count: int            # per producer, full run
    quick_count: int
    seconds: float = 15.0
    quick_seconds: float = 3.0
    note: str = ""
    # pymq only: the peers' figure for the same stream is their row `peer_row` (the frames mean the same
    # to them: RabbitMQ and ActiveMQ treat a SEND without `persistent` as non-persistent), so running
    # them again would only spend the time of the run.
    peer_row: str = ""
    # latency at half of this broker's own maximum: paced at half the msg/s its row `half_of` reached earlier
    # in the same round with the same load client (measured first, 4 s, when that row is not in the run)
    half_of: str = ""
    # the SDK's end-to-end latency (bench/sdk_latency.py, a subprocess) instead of the load client:
    # "blocking" (pymq) or "aio" (pymq.aio); broker pymq only, once per round (not per load client)
    sdk: str = ""


RECEIPT_EVERY, MAX_UNCONFIRMED = 100, 1000
WINDOW = 1000
APP_HEADERS = 4

# persistent: None = no `persistent` header (frames exactly as a plain STOMP client sends them: durable in
# pymq, the JMS default; non-persistent in RabbitMQ and ActiveMQ), True = `persistent:true`, False =
# `persistent:false`. Rows ending in `n` run on pymq only and are compared with the peers' plain row.
_CAREFUL = dict(receipt_every=RECEIPT_EVERY, max_unconfirmed=MAX_UNCONFIRMED)
WORKLOADS = [
    Workload("q", "a", "1->1 queue, SEND without persistent", dict(size=128, persistent=None), 200_000, 20_000),
    Workload("qn", "a", "1->1 queue, persistent:false", dict(size=128, persistent=False), 200_000, 20_000,
             peer_row="q"),
    Workload("qp", "b", "1->1 queue, persistent:true, RECEIPT every 100", dict(
        size=128, persistent=True, **_CAREFUL), 100_000, 10_000),
    Workload("c", "c", "1->4 topic, SEND without persistent", dict(size=128, topic=True, consumers=4, persistent=None),
             100_000, 10_000, note="deliveries/s over 4 subscribers"),
    Workload("cn", "c", "1->4 topic, persistent:false", dict(size=128, topic=True, consumers=4, persistent=False),
             100_000, 10_000, peer_row="c"),
    Workload("d", "d", "4->4 queue, SEND without persistent", dict(size=128, producers=4, consumers=4, persistent=None),
             50_000, 5_000, note="count is per producer"),
    Workload("dn", "d", "4->4 queue, persistent:false", dict(size=128, producers=4, consumers=4, persistent=False),
             50_000, 5_000, peer_row="d"),
    Workload("i", "i", "1->1 queue, client-individual, prefetch 1000, no persistent", dict(
        size=128, ack="client-individual", persistent=None), 200_000, 20_000),
    Workload("in", "i", "1->1 queue, client-individual, prefetch 1000, persistent:false", dict(
        size=128, ack="client-individual", persistent=False), 200_000, 20_000, peer_row="i"),
    Workload("e", "e", "2,000 msg/s, SEND without persistent", dict(size=128, rate=2000.0, persistent=None),
             20_000, 4_000, seconds=10.0, quick_seconds=2.0),
    Workload("ep", "e", "2,000 msg/s, persistent:true", dict(size=128, rate=2000.0, persistent=True),
             20_000, 4_000, seconds=10.0, quick_seconds=2.0),
    Workload("en", "e", "2,000 msg/s, persistent:false", dict(size=128, rate=2000.0, persistent=False),
             20_000, 4_000, seconds=10.0, quick_seconds=2.0, peer_row="e"),
    # Latency at half of each broker's own maximum (issue 30 item 4): the same paced 1->1 stream, at half
    # the msg/s the broker reached on q / qp / qn in this round.
    Workload("eh", "e", "half of the broker's own q msg/s, SEND without persistent", dict(size=128, persistent=None),
             200_000, 20_000, seconds=10.0, quick_seconds=2.0, half_of="q"),
    Workload("ehp", "e", "half of the broker's own qp msg/s, persistent:true", dict(size=128, persistent=True),
             100_000, 10_000, seconds=10.0, quick_seconds=2.0, half_of="qp"),
    Workload("ehn", "e", "half of the broker's own qn msg/s, persistent:false", dict(size=128, persistent=False),
             200_000, 20_000, seconds=10.0, quick_seconds=2.0, half_of="qn", peer_row="eh"),
    # The SDK's end-to-end latency at 2,000 msg/s beside the load client's e / ep (pymq only).
    Workload("es", "e", "2,000 msg/s through the blocking SDK, NON_PERSISTENT", dict(rate=2000.0, persistent=False),
             20_000, 4_000, seconds=10.0, quick_seconds=2.0, peer_row="e", sdk="blocking"),
    Workload("esp", "e", "2,000 msg/s through the blocking SDK, PERSISTENT (each send waits for its receipt)",
             dict(rate=2000.0, persistent=True), 20_000, 4_000, seconds=10.0, quick_seconds=2.0, peer_row="ep",
             sdk="blocking"),
    Workload("ea", "e", "2,000 msg/s through pymq.aio, NON_PERSISTENT", dict(rate=2000.0, persistent=False),
             20_000, 4_000, seconds=10.0, quick_seconds=2.0, peer_row="e", sdk="aio"),
    Workload("eap", "e", "2,000 msg/s through pymq.aio, PERSISTENT (each send waits for its receipt)",
             dict(rate=2000.0, persistent=True), 20_000, 4_000, seconds=10.0, quick_seconds=2.0, peer_row="ep",
             sdk="aio"),
    # Several independent streams: the rows a multi-worker pymq (--pymq-workers) can spread over its workers
    # (one queue is one worker's, by design: spec/cores.md §4).
    Workload("m", "m", "4 queues, 1->1 each, persistent:false", dict(
        size=128, producers=4, consumers=4, destinations=4, persistent=False), 50_000, 5_000,
        note="count is per producer"),
    Workload("md", "m", "4 queues, 1->1 each, SEND without persistent", dict(
        size=128, producers=4, consumers=4, destinations=4, persistent=None), 50_000, 5_000,
        note="count is per producer"),
    Workload("k", "k", "1->1 queue 1 KiB, persistent:false", dict(size=1024, persistent=False), 150_000, 15_000),
    Workload("kp", "k", "1->1 queue 1 KiB, persistent:true, RECEIPT every 100", dict(
        size=1024, persistent=True, **_CAREFUL), 50_000, 5_000),
]
WARMUP = dict(size=128)
DEFAULT_GROUPS = "a,b,c,d,i,e"


@dataclass
class Row:
    broker: str
    workload: str
    title: str
    result: RunResult
    broker_cpu_s: float = 0.0
    broker_cpu_us_per_msg: float = 0.0
    other_cpu_pct: float = 0.0
    round: int = 0
    extra: dict = field(default_factory=dict)
    client: str = "asyncio"       # the load client that measured it (CLIENTS)

    @property
    def failed(self) -> bool:
        r = self.result
        return bool(r.lost or r.duplicated or r.malformed or r.errors)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def endpoint(b: Broker) -> Endpoint:
    return Endpoint("127.0.0.1", b.stomp_port, b.dialect.connect_host, prefetch_header=b.dialect.prefetch_header,
                    explicit_non_persistent=b.dialect.explicit_non_persistent)


def load_runner(client: str):
    """The load client's run_load: bench/loadclient.py's (asyncio) or bench/goload.py's (go-stomp)."""
    if client == "go":
        import goload

        return goload.run_load
    return run_load


def run_one(b: Broker, w: Workload, quick: bool, run_id: str, window: int, all_brokers: list[Broker],
            app_headers: int = APP_HEADERS, seconds: float = 0.0, client: str = "asyncio") -> Row:
    prefix = b.dialect.topic_prefix if w.spec.get("topic") else b.dialect.queue_prefix
    duration = w.quick_seconds if quick else (min(seconds, w.seconds) if seconds else w.seconds)
    spec = LoadSpec(destination=f"{prefix}bench.{run_id}.{w.key}", count=w.quick_count if quick else w.count,
                    duration=duration, max_in_flight=window, app_headers=app_headers, **w.spec)
    if spec.rate:
        spec.count = int(spec.rate * spec.duration)

    def sample():
        return b.cpu_seconds(), sum(x.cpu_seconds() for x in all_brokers), machine_busy_seconds(), time.monotonic()

    def processes() -> dict[int, float]:
        """CPU seconds of each process of the broker (a multi-worker pymq: the supervisor and each worker)."""
        if b.proc is None:
            return {}
        return {pid: own_cpu_seconds(pid) for pid in process_tree(b.proc.pid)}

    at_start: list = []
    procs_start: list[dict[int, float]] = []
    r = load_runner(client)(endpoint(b), spec,
                            on_started=lambda: (procs_start.append(processes()), at_start.append(sample())))
    row = Row(b.name, w.key, w.title, r, client=client)
    if at_start:
        cpu0, brokers0, busy0, t0 = at_start[0]
        cpu1, brokers1, busy1, t1 = sample()
        row.broker_cpu_s = cpu1 - cpu0
        row.broker_cpu_us_per_msg = row.broker_cpu_s * 1e6 / r.received if r.received else 0.0
        # Whatever else ran on the machine meanwhile (other people's tests share these cores): busy time of
        # all cores minus the brokers (the idle ones too) and the load client. High values make the row's
        # figures suspect.
        others = busy1 - busy0 - (brokers1 - brokers0) - r.producer_cpu_s - r.consumer_cpu_s
        row.other_cpu_pct = max(0.0, 100.0 * others / (t1 - t0)) if t1 > t0 else 0.0
        procs1 = processes()
        if len(procs1) > 1 and procs_start:
            # where a multi-process broker's CPU went, busiest process first (with one destination: the
            # worker that owns it, then the idle worker and the supervisor)
            row.extra["process_cpu_s"] = sorted((round(c - procs_start[0].get(pid, 0.0), 3)
                                                 for pid, c in procs1.items()), reverse=True)
    return row


def half_rate(rows: list[Row], b: Broker, w: Workload, client: str, rnd: int, key: str) -> float:
    """Half the msg/s ``b`` reached on row ``key`` (w.half_of) with ``client``: this round's, else the latest."""
    done = [r for r in rows if r.broker == b.name and r.workload == key and r.client == client and not r.failed
            and r.result.rate]
    same = [r for r in done if r.round == rnd] or done
    return same[-1].result.rate / 2 if same else 0.0


def run_half(b: Broker, w: Workload, quick: bool, run_id: str, window: int, all_brokers: list[Broker],
             app_headers: int, seconds: float, client: str, rate: float) -> Row:
    """Row ``w`` paced at ``rate`` (half the broker's maximum); 0: measure that maximum first (4 s)."""
    if not rate:
        base = next(x for x in WORKLOADS if x.key == w.half_of)
        probe = run_one(b, base, quick, run_id + "max", window, all_brokers, app_headers, min(seconds or 4.0, 4.0),
                        client)
        rate = probe.result.rate / 2
        log(f"  {w.key}: {b.name}'s {w.half_of} maximum measured first: {probe.result.rate:,.0f} msg/s")
    paced = Workload(w.key, w.group, w.title, dict(w.spec, rate=max(1.0, rate)), w.count, w.quick_count, w.seconds,
                     w.quick_seconds, w.note, w.peer_row)
    row = run_one(b, paced, quick, run_id, window, all_brokers, app_headers, seconds, client)
    row.extra["rate"] = rate
    return row


def run_sdk_latency(b: Broker, w: Workload, quick: bool, seconds: float) -> Row:
    """Row ``w`` through the SDK (bench/sdk_latency.py in a subprocess) against ``b``: its end-to-end latency."""
    duration = w.quick_seconds if quick else (min(seconds, w.seconds) if seconds else w.seconds)
    argv = [sys.executable, os.path.join(HERE, "sdk_latency.py"), "--url", f"stomp://127.0.0.1:{b.stomp_port}",
            "--api", w.sdk, "--rate", str(w.spec["rate"]), "--seconds", str(duration), "--json", "-"]
    argv += ["--persistent"] if w.spec.get("persistent") else []
    cpu0 = b.cpu_seconds()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 120)
        lines = p.stdout.strip().splitlines()
        out = json.loads(lines[-1]) if lines else {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        out = {"error": f"{type(e).__name__}: {e}"}
    cpu = b.cpu_seconds() - cpu0
    if "error" in out:
        log(f"  {w.key}: not measured: {out['error']}")
        return Row(b.name, w.key, w.title, RunResult(), extra={"unavailable": out["error"]})
    r = RunResult(sent=out["sent"], received=out["received"], lost=out["lost"], duplicated=out["duplicated"],
                  rate=out["rate"], lat_p50_us=out["lat_p50_us"], lat_p99_us=out["lat_p99_us"],
                  lat_p999_us=out["lat_p999_us"], lat_max_us=out["lat_max_us"], client=f"sdk-{w.sdk}")
    return Row(b.name, w.key, w.title, r, cpu, cpu * 1e6 / r.received if r.received else 0.0, extra=out)


def warm_up(b: Broker, quick: bool, run_id: str) -> Row:
    # The JVM compiles its hot paths during the first seconds; every broker gets the same warm-up so no one
    # pays its start-up in the first measured workload.
    spec = LoadSpec(destination=f"{b.dialect.queue_prefix}bench.{run_id}.warmup", count=5_000 if quick else 50_000,
                    duration=1.0 if quick else 4.0, **WARMUP)
    r = run_load(endpoint(b), spec)
    if r.errors:
        raise PeerUnavailable(f"warm-up failed: {'; '.join(r.errors)}")
    log(f"  warm-up: {r.received} messages, {r.rate:,.0f} msg/s")
    return Row(b.name, "warmup", "warm-up, 1->1 queue 128 B", r)


def run_sdk(b: Broker, quick: bool) -> list[Row]:
    """The SDK's own loops (bench_sdk.py, a subprocess) against the broker just measured and in-process."""
    rows = []
    for url in (f"stomp://127.0.0.1:{b.stomp_port}", "vm://default"):
        for persistent in (False, True):
            scheme = url.split("://")[0]
            key = f"sdk-{scheme}" + ("-p" if persistent else "")
            title = f"SDK send+receive over {scheme}://, {'persistent' if persistent else 'non-persistent'}"
            argv = [sys.executable, os.path.join(HERE, "bench_sdk.py"), "--url", url, "--json", "-"]
            argv += ["--quick"] if quick else ["--count", "20000" if persistent else "50000", "--seconds", "15"]
            argv += ["--persistent"] if persistent else []
            cpu0 = b.cpu_seconds()
            try:
                p = subprocess.run(argv, capture_output=True, text=True, timeout=180)
                lines = p.stdout.strip().splitlines()
                out = json.loads(lines[-1]) if lines else {
                    "error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
            except (subprocess.TimeoutExpired, json.JSONDecodeError) as e:
                out = {"error": f"{type(e).__name__}: {e}"}
            cpu = b.cpu_seconds() - cpu0 if scheme == "stomp" else 0.0
            if "error" in out:
                log(f"  {key}: not measured: {out['error']}")
                rows.append(Row(b.name, key, title, RunResult(), extra={"unavailable": out["error"]}))
                continue
            r = RunResult(sent=out["sent"], received=out["received"], lost=out["lost"],
                          duplicated=out["duplicated"], malformed=out["unreadable"], rate=out["recv_rate"],
                          send_rate=out["send_rate"])
            rows.append(Row(b.name, key, title, r, cpu, cpu * 1e6 / r.received if r.received and cpu else 0.0,
                            extra=out))
            log(f"  {key:11} send {out['send_rate']:10,.0f} msg/s, receive {out['recv_rate']:10,.0f} msg/s")
    return rows


def median_rows(rows: list[Row], rounds: int) -> list[Row]:
    """Per (broker, workload), the row with the median msg/s over the rounds (a failed row always shows)."""
    if rounds <= 1:
        return rows
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((r.broker, r.workload), []).append(r)
    out = []
    for group in groups.values():
        failed = [r for r in group if r.failed or r.extra.get("unavailable")]
        if failed:
            out.append(failed[0])
            continue
        group.sort(key=lambda r: r.result.rate)
        out.append(group[(len(group) - 1) // 2])
    return out


def markdown_workers(rows: list[Row]) -> str:
    """pymq-wN (``--pymq-workers N``) against pymq in Markdown: msg/s and broker µs/msg as min-max over the
    rounds, and the per-round ratios (each within one round) as min-max. Empty without a pymq-wN."""
    ok = [r for r in rows if not r.failed and not r.extra.get("unavailable")]
    multi = sorted({r.broker for r in ok if r.broker.startswith("pymq-w")})
    if not multi:
        return ""
    by = {(r.broker, r.workload, r.round): r for r in ok}
    rounds = sorted({r.round for r in ok})

    def rng(vals, f):
        vals = [v for v in vals if v]
        if not vals:
            return "-"
        lo, hi = f.format(min(vals)), f.format(max(vals))
        return lo if lo == hi else f"{lo}-{hi}"

    out = []
    for w_name in multi:
        out += [f"| row | pymq msg/s | {w_name} msg/s | {w_name} / pymq msg/s | broker µs/msg pymq / {w_name} | "
                f"{w_name} / pymq µs/msg |", "|---|---|---|---|---|---|"]
        for w in WORKLOADS:
            pairs = [(by.get(("pymq", w.key, n)), by.get((w_name, w.key, n))) for n in rounds]
            pairs = [(a, b) for a, b in pairs if a and b]
            if not pairs:
                continue
            cpu_ratios = [b.broker_cpu_us_per_msg / a.broker_cpu_us_per_msg for a, b in pairs
                          if a.broker_cpu_us_per_msg]
            out.append(f"| {w.key}: {w.title} | {rng([a.result.rate for a, _ in pairs], '{:,.0f}')} | "
                       f"{rng([b.result.rate for _, b in pairs], '{:,.0f}')} | "
                       f"{rng([b.result.rate / a.result.rate for a, b in pairs if a.result.rate], '{:.2f}')} | "
                       f"{rng([a.broker_cpu_us_per_msg for a, _ in pairs], '{:.1f}')} / "
                       f"{rng([b.broker_cpu_us_per_msg for _, b in pairs], '{:.1f}')} | "
                       f"{rng(cpu_ratios, '{:.2f}')} |")
    return "\n".join(out)


def markdown_ranges(rows: list[Row]) -> str:
    """The issue-16 table in Markdown: per row, each broker's msg/s and broker µs/msg as min-max over the
    rounds, pymq over the faster peer and over pymq-base as min-max of the per-round ratios (each ratio
    within one round), and pymq's durable/non-durable CPU ratio per round."""
    ok = [r for r in rows if not r.failed and not r.extra.get("unavailable") and not r.workload.startswith("sdk")]
    by: dict[tuple, Row] = {(r.broker, r.workload, r.round): r for r in ok}
    brokers = [b for b in ("pymq", "pymq-base", "rabbitmq", "activemq") if any(r.broker == b for r in ok)]
    rounds = sorted({r.round for r in ok})

    def rng(vals, f="{:,.0f}"):
        vals = [v for v in vals if v]
        if not vals:
            return "-"
        lo, hi = min(vals), max(vals)
        return f.format(lo) if f.format(lo) == f.format(hi) else f"{f.format(lo)}-{f.format(hi)}"

    out = ["| row | " + " | ".join(f"{b} msg/s" for b in brokers) + " | pymq / faster peer | pymq / pymq-base | "
           "broker µs/msg " + " / ".join(brokers) + " | pymq durable / non-durable CPU |",
           "|---" * (len(brokers) + 5) + "|"]
    durable = {"q": "qn", "qp": "qn", "c": "cn", "d": "dn", "i": "in"}
    for w in WORKLOADS:
        if not any(r.workload == w.key for r in ok):
            continue
        peer_row = w.peer_row or w.key
        cells, cpu, best, base, dur = [], [], [], [], []
        for b in brokers:
            src = peer_row if b in ("rabbitmq", "activemq") else w.key
            rs = [by.get((b, src, n)) for n in rounds]
            lat = w.key.startswith("e")
            if lat:
                cells.append(rng([r.result.lat_p99_us / 1000 for r in rs if r], "{:.2f}") + " ms p99 / "
                             + rng([r.result.lat_p999_us / 1000 for r in rs if r], "{:.2f}") + " p99.9")
            else:
                cells.append(rng([r.result.rate for r in rs if r]))
            cpu.append(rng([r.broker_cpu_us_per_msg for r in rs if r], "{:.1f}"))
        for n in rounds:
            me = by.get(("pymq", w.key, n))
            if me is None:
                continue
            peers = [by.get((p, peer_row, n)) for p in ("rabbitmq", "activemq")]
            peers = [p for p in peers if p]
            if peers and not w.key.startswith("e"):
                best.append(me.result.rate / max(p.result.rate for p in peers))
            b_ = by.get(("pymq-base", w.key, n))
            if b_ and b_.result.rate and not w.key.startswith("e"):
                base.append(me.result.rate / b_.result.rate)
            if w.key in durable:
                nd = by.get(("pymq", durable[w.key], n))
                if nd and nd.broker_cpu_us_per_msg:
                    dur.append(me.broker_cpu_us_per_msg / nd.broker_cpu_us_per_msg)
        out.append(f"| {w.key}: {w.title} | " + " | ".join(cells) + f" | {rng(best, '{:.2f}')} | "
                   f"{rng(base, '{:.2f}')} | " + " / ".join(cpu) + f" | {rng(dur, '{:.2f}')} |")
    return "\n".join(out)


def fmt_rate(v: float) -> str:
    return f"{v:,.0f}" if v else "-"


def print_table(rows: list[Row]) -> None:
    hdr = (f"{'workload':11} {'broker':9} {'msg/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>8} "
           f"{'brk µs/msg':>10} {'prod cpu':>8} {'cons cpu':>8} {'others':>6} {'sent':>8} {'recv':>8} "
           f"{'lost':>5} {'dup':>4}")
    print(hdr)
    print("-" * len(hdr))
    for row in sorted(rows, key=lambda r: (order(r.workload), r.broker)):
        r = row.result
        if row.extra.get("unavailable"):
            print(f"{row.workload:11} {row.broker:9} not measured: {row.extra['unavailable']}")
            continue
        if row.workload.startswith("sdk"):
            print(f"{row.workload:11} {row.broker:9} {fmt_rate(r.rate):>9}  receive loop; send loop "
                  f"{fmt_rate(r.send_rate):>7} msg/s {'':>15} {r.sent:8} {r.received:8} {r.lost:5} {r.duplicated:4}")
            continue
        # the Go client is one process: its whole CPU shows under prod cpu, "(all)" under cons cpu
        cons = f"{r.consumer_cpu_pct:7.0f}%" if r.client != "go" else f"{'(all)':>8}"
        print(f"{row.workload:11} {row.broker:9} {fmt_rate(r.rate):>9} {r.lat_p50_us / 1000:8.2f} "
              f"{r.lat_p99_us / 1000:8.2f} {r.lat_p999_us / 1000:8.2f} {row.broker_cpu_us_per_msg:10.1f} "
              f"{r.producer_cpu_pct:7.0f}% {cons} {row.other_cpu_pct:5.0f}% "
              f"{r.sent:8} {r.received:8} "
              f"{r.lost:5} {r.duplicated:4}" + (f"  ERROR {'; '.join(r.errors)[:200]}" if r.errors else ""))


def parse_cpus(spec: str) -> set[int]:
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pin_tree(b: Broker, cpus: str) -> None:
    """Every thread of the broker's process tree onto `cpus` (taskset -a: the JVM's and Erlang's threads)."""
    from peers import process_tree

    roots = ([b.proc.pid] if b.proc else []) + list(b.extra_pids)
    for root in roots:
        for pid in process_tree(root):
            subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], capture_output=True, check=False)


def order(key: str) -> tuple:
    keys = [w.key for w in WORKLOADS]
    return (keys.index(key) if key in keys else len(keys), key)


def ratios(rows: list[Row]) -> dict:
    """pymq / peer, per workload: throughput ratio (>1: pymq faster), CPU-per-message ratio (<1: pymq cheaper),
    and for (e) the p99 ratio (<1: pymq lower latency)."""
    by = {(r.broker, r.workload): r for r in rows if not r.extra.get("unavailable") and not r.failed}
    out: dict = {}
    for (broker, wl), row in by.items():
        if broker != "pymq":
            continue
        if wl.startswith("sdk"):
            # The SDK's loops beside the load client against the same broker in this run: a128 for the
            # non-persistent loops, b128 for the persistent ones.
            base_key = "qp" if wl.endswith("-p") else "qn"
            base = by.get(("pymq", base_key))
            if base and base.result.rate:
                out.setdefault(wl, {})["sdk_over_loadclient"] = {
                    "baseline": base_key, "send": row.result.send_rate / base.result.rate,
                    "receive": row.result.rate / base.result.rate}
            continue
        peer_wl = next((w.peer_row for w in WORKLOADS if w.key == wl and w.peer_row), wl)
        for peer in ("rabbitmq", "activemq", "pymq-base"):
            p = by.get((peer, wl if peer == "pymq-base" else peer_wl))
            if p is None:
                continue
            d = {}
            if p.result.rate:
                d["throughput"] = row.result.rate / p.result.rate
            if p.broker_cpu_us_per_msg:
                d["cpu_per_msg"] = row.broker_cpu_us_per_msg / p.broker_cpu_us_per_msg
            if wl.startswith("e") and p.result.lat_p99_us:
                d["p99_latency"] = row.result.lat_p99_us / p.result.lat_p99_us
            out.setdefault(wl, {})[peer] = d
    # The multi-worker broker over the one-process one, same rows, same run (spec/cores.md §4).
    for (broker, wl), row in by.items():
        if broker.startswith("pymq-w") and ("pymq", wl) in by:
            one = by[("pymq", wl)]
            d = {}
            if one.result.rate:
                d["throughput"] = row.result.rate / one.result.rate
            if one.broker_cpu_us_per_msg:
                d["cpu_per_msg"] = row.broker_cpu_us_per_msg / one.broker_cpu_us_per_msg
            out.setdefault(wl, {})[f"{broker}_over_pymq"] = d
    # What durability costs pymq: broker CPU per message of the durable rows over the same stream with
    # persistent:false (the goal: at most 1.3).
    for durable, plain in (("q", "qn"), ("qp", "qn"), ("c", "cn"), ("d", "dn"), ("i", "in"), ("kp", "k")):
        for who, key in (("pymq", "durable_cpu_over_nondurable"), ("pymq-base", "base_durable_cpu_over_nondurable")):
            a_, b_ = by.get((who, durable)), by.get((who, plain))
            if a_ and b_ and b_.broker_cpu_us_per_msg:
                out.setdefault(durable, {})[key] = {
                    "baseline": plain, "ratio": a_.broker_cpu_us_per_msg / b_.broker_cpu_us_per_msg}
    return out


def print_ratios(rat: dict) -> None:
    if not rat:
        print("\nno pymq/peer ratio (pymq or both peers missing from this run)")
        return
    print("\npymq / peer (throughput >1 = pymq faster; broker CPU per message <1 = pymq cheaper)")
    for wl in sorted(rat, key=order):
        parts = []
        for peer, d in rat[wl].items():
            if peer.endswith("durable_cpu_over_nondurable"):
                who = "pymq-base" if peer.startswith("base") else "pymq"
                parts.append(f"{who} broker CPU/msg over its {d['baseline']} {d['ratio']:.2f}")
                continue
            if peer.endswith("_over_pymq"):
                parts.append(f"{peer[:-len('_over_pymq')]} / pymq: throughput {d.get('throughput', 0):.2f}, "
                             f"cpu/msg {d.get('cpu_per_msg', 0):.2f}")
                continue
            if peer == "sdk_over_loadclient":
                parts.append(f"SDK / load client {d['baseline']} (pymq): send loop {d['send']:.2f}, "
                             f"receive loop {d['receive']:.2f}")
                continue
            s = f"vs {peer}: throughput {d.get('throughput', 0):.2f}, cpu/msg {d.get('cpu_per_msg', 0):.2f}"
            if "p99_latency" in d:
                s += f", p99 {d['p99_latency']:.2f}"
            parts.append(s)
        print(f"  {wl:11} " + " | ".join(parts))


def reprint(path: str) -> int:
    with open(path) as f:
        doc = json.load(f)
    rows = []
    for d in doc["results"]:
        d = dict(d)
        row = Row(d.pop("broker"), d.pop("workload"), d.pop("title"), RunResult(), d.pop("broker_cpu_s"),
                  d.pop("broker_cpu_us_per_msg"), d.pop("other_cpu_pct"), d.pop("round"), d.pop("extra"))
        row.result = RunResult(**{k: v for k, v in d.items() if k in RunResult.__dataclass_fields__})
        row.client = row.result.client
        rows.append(row)
    n = max((r.round for r in rows), default=0) + 1
    clients = [c for c in CLIENTS if any(r.client == c for r in rows)]
    for client in clients:
        if len(clients) > 1:
            print(f"\n=== load client: {client} ===\n")
        report([r for r in rows if r.client == client], n)
    return 0


def report(rows: list[Row], rounds: int) -> dict:
    """The tables of one load client's rows: the median table, the ranges over rounds, the ratios, the
    multi-worker table; returns the ratios."""
    print_table(median_rows(rows, rounds))
    if rounds > 1:
        print(f"\nranges over the {rounds} rounds (ratios within each round; peers' figure for pymq-only rows is "
              "their plain row):\n")
        print(markdown_ranges(rows))
    rat = ratios(median_rows(rows, rounds))
    print_ratios(rat)
    workers_table = markdown_workers(rows)
    if workers_table:
        print(f"\nthe multi-worker broker against pymq, per round ({rounds} rounds):\n")
        print(workers_table)
    return rat


def self_check(clients: list[str]) -> int:
    """Prove the harness counts right: codec round trips, then a toy broker that drops one message and
    duplicates another must be reported as exactly 1 lost and 1 duplicated, and a clean one as 0 and 0,
    by each load client in ``clients``."""
    import multiprocessing as mp

    from loadclient import FrameReader, encode_frame
    from peers import free_port, wait_for_port
    from toybroker import serve

    failures = []
    frames = [encode_frame("MESSAGE", {"destination": "/queue/a", "ack": "ID:x:1"}, b"\0body\0"),
              b"\n", encode_frame("RECEIPT", {"receipt-id": "r1"}),
              b"MESSAGE\r\ndestination:/queue/b\r\n\r\nplain\0\r\n"]
    wire = b"".join(frames)
    for chunking in (len(wire), 1, 7):
        rd, got = FrameReader(), []
        for i in range(0, len(wire), chunking):
            rd.feed(wire[i : i + chunking])
            got.extend(rd.frames())
        want = [(b"MESSAGE", b"\0body\0"), (b"RECEIPT", b""), (b"MESSAGE", b"plain")]
        if [(c, b) for c, _, b in got] != want or got[0][1][b"ack"] != b"ID\\cx\\c1":
            failures.append(f"codec, chunks of {chunking}: {got!r}")
    ctx = mp.get_context("fork")
    for client, label, drop, dup, topic, want in [(c, *case) for c in clients for case in (
        ("clean queue", (), (), False, (0, 0)),
        ("faulty queue", ((0, 10),), ((1, 20),), False, (1, 1)),
        ("faulty topic", ((0, 5),), ((0, 7),), True, (2, 2)),  # 2 subscribers: each misses one, each gets one twice
    )]:
        port = free_port()
        proc = ctx.Process(target=serve, args=(port, drop, dup), daemon=True)
        proc.start()
        try:
            wait_for_port(port, 10, None)
            spec = LoadSpec(destination=f"/{'topic' if topic else 'queue'}/selfcheck", topic=topic,
                            producers=1 if topic else 2, consumers=2, count=2_000, duration=5, idle_timeout=1.0,
                            app_headers=APP_HEADERS)
            r = load_runner(client)(Endpoint("127.0.0.1", port), spec)
        finally:
            proc.kill()
            proc.join(5)
        got = (r.lost, r.duplicated)
        expect_recv = spec.count * spec.producers * (spec.consumers if topic else 1) - want[0] + want[1]
        ok = got == want and not r.errors and r.received == expect_recv
        print(f"self-check {client:7} {label:13}: sent {r.sent} received {r.received} lost {r.lost} "
              f"dup {r.duplicated} -> {'ok' if ok else 'WRONG'}")
        if not ok:
            failures.append(f"{client} {label}: want lost/dup {want}, got {got}, received {r.received}, "
                            f"errors {r.errors}")
    for f in failures:
        print("self-check FAILED:", f)
    print("self-check passed" if not failures else "self-check failed")
    return 1 if failures else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="pymq vs RabbitMQ vs ActiveMQ over STOMP, same workloads, same run")
    ap.add_argument("--quick", action="store_true", help="a few seconds per workload (CI smoke run)")
    ap.add_argument("--brokers", default="pymq,rabbitmq,activemq")
    ap.add_argument("--workloads", default=DEFAULT_GROUPS,
                    help=f"groups of rows (default {DEFAULT_GROUPS}; also k: 1 KiB rows, sdk: the SDK's loops)")
    ap.add_argument("--rows", default="",
                    help="only these rows, by key (e.g. e,ep,eh: the latency rows without the SDK's); "
                         "instead of --workloads")
    ap.add_argument("--headers", default=str(APP_HEADERS),
                    help=f"application headers on every SEND (default {APP_HEADERS}: an id, the producer index, a "
                         "sequence number, a timestamp; more add 16-byte attributes); a list (0,4,8) runs every "
                         "row once per count, in the same run (rows named q@h0, q@h4, ...)")
    ap.add_argument("--seconds", type=float, default=0.0,
                    help="cap every full-run row at this many seconds (default: each row's own, 10-15 s)")
    ap.add_argument("--pymq-base", default="",
                    help="the pymq-server of another build (e.g. a worktree of main with its own venv), run as "
                         "broker pymq-base beside pymq: old and new in the same run")
    ap.add_argument("--pymq-workers", type=int, default=0,
                    help="also run `pymq-server --workers N` as broker pymq-wN beside pymq (spec/cores.md)")
    ap.add_argument("--streams", type=int, default=0,
                    help="rows m/md with this many queues, one producer and one consumer each (default 4), the "
                         "load client in ceil(N/4) producer and consumer processes: the scaling run for a "
                         "machine with more cores (`--pymq-workers W --streams 4W`, spec/cores.md §4.3)")
    ap.add_argument("--client", default="asyncio",
                    help="load client(s), comma-separated: asyncio (bench/loadclient.py), go (bench/goload, "
                         "go-stomp); with both every row runs once per client and each gets its own tables")
    ap.add_argument("--pinned", action="store_true",
                    help="the CPU-per-message view: every broker's threads on CPU 0, the load client on CPU 1 "
                         "(--pin-broker 0 --pin-client 1); the default runs everything unpinned")
    ap.add_argument("--pin-broker", default="",
                    help="CPU list (taskset -c syntax, e.g. 0) for every broker's threads")
    ap.add_argument("--pin-client", default="",
                    help="CPU list for the load client's processes (and this script)")
    ap.add_argument("--json", help="write all figures to this file")
    ap.add_argument("--from-json", help="print the tables again from a --json file of an earlier run")
    ap.add_argument("--self-check", action="store_true", help="check the harness against a toy broker and exit")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat every workload on every broker N times and show the median (all in the JSON)")
    ap.add_argument("--window", type=int, default=WINDOW,
                    help=f"messages in flight per producer, sent but not yet delivered (default {WINDOW}; "
                         "0 = unbounded pipelining, where latency becomes the age of the backlog)")
    a = ap.parse_args(argv)
    clients = [c.strip() for c in a.client.split(",") if c.strip()]
    if not clients or set(clients) - set(CLIENTS):
        ap.error(f"--client: one or more of {', '.join(CLIENTS)}")
    if a.streams:
        procs = -(-a.streams // 4)
        for i, w in enumerate(WORKLOADS):
            if w.group == "m":
                WORKLOADS[i] = Workload(w.key, w.group, w.title.replace("4 queues", f"{a.streams} queues"), dict(
                    w.spec, producers=a.streams, consumers=a.streams, destinations=a.streams, producer_procs=procs,
                    consumer_procs=procs), w.count, w.quick_count, w.seconds, w.quick_seconds, w.note)
    if a.self_check:
        return self_check(clients)
    if a.from_json:
        return reprint(a.from_json)
    if a.pinned:
        a.pin_broker, a.pin_client = a.pin_broker or "0", a.pin_client or "1"
    header_counts = [int(x) for x in str(a.headers).split(",") if x.strip()]
    brokers = [s.strip() for s in a.brokers.split(",") if s.strip()]
    if a.pymq_base and "pymq-base" not in brokers:
        brokers.insert(1 if "pymq" in brokers else 0, "pymq-base")
    workers_name = f"pymq-w{a.pymq_workers}" if a.pymq_workers > 1 else ""
    if workers_name and workers_name not in brokers:
        brokers.insert(brokers.index("pymq") + 1 if "pymq" in brokers else 0, workers_name)
    groups = {s.strip() for s in a.workloads.split(",") if s.strip()}
    only = {s.strip() for s in a.rows.split(",") if s.strip()}
    if only:
        groups = {w.group for w in WORKLOADS if w.key in only}
    unknown = ([b for b in brokers if b not in BROKERS and b not in ("pymq-base", workers_name)]
               + sorted(groups - {w.group for w in WORKLOADS} - {"sdk"})
               + sorted(only - {w.key for w in WORKLOADS}))
    if unknown:
        ap.error(f"unknown broker or workload: {', '.join(unknown)}")
    # A SIGTERM (CI's timeout, kill) must still stop the brokers: they run in sessions of their own and
    # would otherwise outlive the bench.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run_id = f"{int(time.time())}{os.getpid() % 1000}"
    rows: list[Row] = []
    unavailable: dict[str, str] = {}
    versions: dict[str, str] = {}
    load_at_start = os.getloadavg()[0]
    up: list[Broker] = []
    with tempfile.TemporaryDirectory(prefix="pymq-bench-") as tmp:
        try:
            # All brokers up at once (idle, each costs well under 1% of a core), then every workload runs
            # against each in turn: other people's load on this shared machine then hits all brokers alike
            # instead of whichever one happened to run during it.
            for name in brokers:
                if name == "pymq-base":
                    b: Broker = PymqBroker(name=name, exe=a.pymq_base, log=log)
                elif name == workers_name:
                    b = PymqBroker(name=name, workers=a.pymq_workers, log=log)
                else:
                    b = BROKERS[name](log=log)
                try:
                    b.start(tmp)
                    versions[name] = b.version
                    up.append(b)
                    if not a.no_warmup:
                        warm = warm_up(b, a.quick, run_id)
                        if warm.failed:  # its figures mean nothing, but a lost message is still a loss
                            rows.append(warm)
                except PeerUnavailable as e:
                    unavailable[name] = str(e)
                    log(f"  {name} unavailable: {e}")
                    if b in up:
                        up.remove(b)
                    b.stop()
            if a.pin_client:
                # The load client's processes fork from this one and inherit its CPUs.
                os.sched_setaffinity(0, parse_cpus(a.pin_client))
            for rnd in range(a.rounds):
                for w, h, client in [(w, h, c) for w in WORKLOADS for h in header_counts for c in clients]:
                    if w.group not in groups or (only and w.key not in only):
                        continue
                    # Rotate the order each round so no broker always runs first (or right after ActiveMQ's
                    # garbage collector has been fed).
                    order_ = up[rnd % len(up):] + up[: rnd % len(up)] if up else []
                    for b in order_:
                        if w.peer_row and not b.name.startswith("pymq"):
                            continue
                        time.sleep(0.3)  # let the previous broker's after-work (acks, GC) settle
                        if a.pin_broker:
                            pin_tree(b, a.pin_broker)  # threads started since the last row too
                        tag = f"{run_id}r{rnd}h{h}{client}"
                        if w.sdk:
                            if client != clients[0] or b.name != "pymq":
                                continue        # the SDK is its own client: once per round, one broker
                            row = run_sdk_latency(b, w, a.quick, a.seconds)
                            row.client = client
                        elif w.half_of:
                            key = w.half_of if len(header_counts) == 1 else f"{w.half_of}@h{h}"
                            row = run_half(b, w, a.quick, tag, a.window, up, h, a.seconds, client,
                                           half_rate(rows, b, w, client, rnd, key))
                        else:
                            row = run_one(b, w, a.quick, tag, a.window, up, h, a.seconds, client)
                        if len(header_counts) > 1:
                            row.workload = f"{w.key}@h{h}"
                        row.round = rnd
                        r = row.result
                        log(f"  r{rnd} {row.workload:5} {b.name:9} {client:7} {r.rate:10,.0f} msg/s"
                            f"  p50 {r.lat_p50_us / 1000:7.2f} ms"
                            f"  p99 {r.lat_p99_us / 1000:7.2f} ms  broker {row.broker_cpu_us_per_msg:6.1f} µs/msg"
                            f"  client cpu {r.producer_cpu_pct:.0f}%/{r.consumer_cpu_pct:.0f}%"
                            f"  others {row.other_cpu_pct:.0f}%"
                            + ("  processes " + "/".join(f"{c:.2f}" for c in row.extra["process_cpu_s"]) + " s"
                               if "process_cpu_s" in row.extra else "")
                            + (f"  LOST {r.lost}" if r.lost else "")
                            + (f"  DUP {r.duplicated}" if r.duplicated else "")
                            + (f"  ERRORS {r.errors}" if r.errors else ""))
                        rows.append(row)
                pymq_up = next((b for b in up if b.name == "pymq"), None)
                if pymq_up is not None and "sdk" in groups:
                    for row in run_sdk(pymq_up, a.quick):
                        row.round = rnd
                        row.client = clients[0]          # set beside that client's qn/qp
                        rows.append(row)
        finally:
            for b in up:
                b.stop()
    print(f"\nbroker bench ({'quick' if a.quick else 'full'}), {os.cpu_count()} cores, "
          f"python {platform.python_version()}, {'uvloop' if uvloop else 'asyncio'} load client; "
          + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"(b): RECEIPT every {RECEIPT_EVERY} messages, at most {MAX_UNCONFIRMED} unconfirmed. Window: "
          f"{a.window or 'unbounded'} messages in flight per producer. prod/cons cpu: % of one core used by the "
          "load client's producer / consumer process while busy; others: % of one core used by everything else "
          f"on the machine during the row (load average at start {load_at_start:.1f})"
          + (f"; median of {a.rounds} rounds by msg/s" if a.rounds > 1 else "")
          + f". {a.headers} application headers per SEND"
          + (f"; brokers pinned to CPU {a.pin_broker} (the CPU-per-message view, not how the brokers run by "
             "default)" if a.pin_broker else "; nothing pinned (each broker on the cores and threads its "
             "defaults give it)")
          + (f", load client to CPU {a.pin_client}" if a.pin_client else "") + "\n")
    rat: dict = {}
    for client in clients:
        mine = [r for r in rows if r.client == client]
        if len(clients) > 1:
            print(f"\n=== load client: {client} ===\n")
        rat[client] = report(mine, a.rounds)
    for name, why in unavailable.items():
        print(f"\n{name}: not measured: {why}")
    failed = [r for r in rows if r.failed]
    for r in failed:
        print(f"\nFAILED {r.broker} {r.workload}: lost {r.result.lost}, duplicated {r.result.duplicated}, "
              f"malformed {r.result.malformed}, errors {r.result.errors}"
              + (f"; consumers stopped waiting: {r.result.consumers_gave_up}" if r.result.consumers_gave_up else ""))
    if a.json:
        doc = {
            "quick": a.quick, "cores": os.cpu_count(), "python": platform.python_version(),
            "loop": "uvloop" if uvloop else "asyncio", "versions": versions, "unavailable": unavailable,
            "receipt_every": RECEIPT_EVERY, "max_unconfirmed": MAX_UNCONFIRMED, "app_headers": a.headers,
            "pin_broker": a.pin_broker, "pin_client": a.pin_client, "clients": clients,
            "results": [dict(broker=r.broker, workload=r.workload, title=r.title, broker_cpu_s=r.broker_cpu_s,
                             broker_cpu_us_per_msg=r.broker_cpu_us_per_msg, other_cpu_pct=r.other_cpu_pct,
                             round=r.round,
                             **r.result.as_dict(), extra=r.extra)
                        for r in rows],
            # per load client, as report() prints them
            "ratios": rat,
        }
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
