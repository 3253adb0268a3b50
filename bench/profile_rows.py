"""Where pymq's broker CPU goes, per row of bench_brokers.py: a sampling profile of the broker under each
workload, split into the stages of a message (parse, route, store, encode, write) in µs per message.

    python bench/profile_rows.py [--workloads q,qn,qp,c,d,i] [--seconds 6] [--headers 4]
                                 [--pymq-server PATH] [--json out.json] [--top 12]

The broker is a real `pymq-server` (bench/peers.py), driven by the bench's load client exactly as
bench_brokers.py drives it (same LoadSpec per row, 4 application headers by default). While a row runs,
py-spy samples the broker process (`py-spy record --format raw --nonblocking`, 400 Hz: it reads the
broker's memory without stopping it, so the broker runs at full speed); without py-spy the row is not
profiled and the script says so. Idle samples (the event loop waiting in epoll) are not recorded, so the
samples are the broker's busy time: a stage's share of samples times the broker's CPU per message (from
/proc, like bench_brokers.py) is that stage's µs per message.

Stages, by the innermost pymq frame of each sample (a sample in a library or C function called from pymq
code belongs to the pymq function that called it; one with no pymq frame is the event loop and socket):
    parse    pymq/protocol (scanner, connection state table, frame objects), SEND header mapping
    route    server/broker: session, placement, routing, queues, dispatch, acks
    store    server/storage: holding devices, the WAL, group commit
    encode   MESSAGE/RECEIPT frames built for the wire (header blocks, encode_* functions)
    write    server/net: the TCP adapter's reads and writes, transport calls
    loop     frames with no pymq code: the event loop, epoll, the socket calls it makes itself
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_brokers import APP_HEADERS, WINDOW, WORKLOADS, endpoint  # noqa: E402
from loadclient import LoadSpec, run_load  # noqa: E402
from peers import PeerUnavailable, PymqBroker  # noqa: E402

STAGES = ("parse", "route", "store", "encode", "write", "loop")
RATE_HZ = 400


def classify(frame: str) -> str | None:
    """The stage of one py-spy frame (`function (path:line)`), or None for code outside pymq."""
    fn, _, where = frame.partition(" (")
    # py-spy names files by module path when it can (pymq_server/net/tcp.py), else by full path
    path = ("/" + where.rsplit(":", 1)[0]).replace("/server/", "/pymq_server/")
    fn = fn.rsplit(".", 1)[-1]
    if "/pymq/protocol/" in path or "_scanner" in path:
        return "encode" if "encode" in fn or "serialize" in fn else "parse"
    if "/pymq_server/storage/" in path:
        return "store"
    if "/pymq_server/net/" in path:
        return "encode" if "encode" in fn or "message_frame" in fn else "write"
    if "/pymq_server/broker/" in path:
        if fn in ("header_block", "_encode_block", "frame_headers", "encode_headers", "encode_stored"):
            return "encode" if fn != "encode_stored" else "store"
        if fn in ("message_from_request", "parse_send", "from_frame") or path.endswith("/requests.py"):
            return "parse"
        return "route"
    if "/pymq/" in path and "/site-packages/" not in path:
        return "route"
    return None     # the entry points (cli.py, app.py) and libraries: the event loop's own time


def summarise(raw_path: str, top: int) -> tuple[Counter, Counter, int]:
    """(samples per stage, self samples per pymq function, total samples) of a py-spy raw file."""
    stages: Counter = Counter()
    funcs: Counter = Counter()
    total = 0
    with open(raw_path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(count)
            total += n
            frames = stack.split(";")
            stage, owner = "loop", None
            for frame in reversed(frames):  # innermost first
                s = classify(frame)
                if s is not None:
                    stage, owner = s, frame
                    break
            stages[stage] += n
            leaf = frames[-1]
            funcs[_short(owner or leaf)] += n
    return stages, funcs, total


def _short(frame: str) -> str:
    fn, _, where = frame.partition(" (")
    path = "/" + where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("/pymq_server/", "/server/", "/pymq/"):
        i = path.rfind(marker)
        if i >= 0:
            path = path[i + 1:]
            break
    else:
        path = os.path.basename(path)
    return f"{fn} ({path})"


def report(row: dict) -> None:
    share, us = row["stage_share"], row["broker_us_per_msg"]
    print(f"\n{row['workload']}: {row['title']} — {row['rate']:,.0f} msg/s, broker {us:.1f} µs/msg, "
          f"{row['samples']} samples" + (f"  LOST {row['lost']}" if row["lost"] else "")
          + (f"  DUP {row['duplicated']}" if row["duplicated"] else ""))
    print("  per message: " + ", ".join(f"{s} {share[s] * us:.1f}" for s in STAGES) + " µs")
    for f, frac in row["top"]:
        print(f"    {100 * frac:5.1f}%  {f}")


def reprint(path: str, top: int) -> int:
    with open(path) as f:
        doc = json.load(f)
    for row in doc["rows"]:
        raw = os.path.join(os.path.dirname(path), f"{doc['label'] or 'pymq'}-{row['workload']}.txt")
        if os.path.exists(raw):
            stages, funcs, total = summarise(raw, top)
            row["samples"] = total
            row["stage_share"] = {s: stages[s] / total if total else 0.0 for s in STAGES}
            row["stage_us_per_msg"] = {s: row["stage_share"][s] * row["broker_us_per_msg"] for s in STAGES}
            row["top"] = [(f, n / total) for f, n in funcs.most_common(top)]
        report(row)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="q,qn,qp,c,cn,d,dn,i,in")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--headers", type=int, default=APP_HEADERS)
    ap.add_argument("--pymq-server", default="", help="the pymq-server to profile (default: the one on PATH)")
    ap.add_argument("--label", default="")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json")
    ap.add_argument("--from-json", help="print the stages again from a --json file of an earlier run and the "
                                         "raw stacks kept beside it (PYMQ_PROFILE_KEEP), without running")
    a = ap.parse_args(argv)
    if a.from_json:
        return reprint(a.from_json, a.top)
    pyspy = shutil.which("py-spy")
    if pyspy is None:
        print("py-spy not found (pip install py-spy): nothing profiled")
        return 1
    rows = {w.key: w for w in WORKLOADS}
    keys = [k.strip() for k in a.workloads.split(",") if k.strip()]
    out = []
    with tempfile.TemporaryDirectory(prefix="pymq-prof-") as tmp:
        b = PymqBroker(exe=a.pymq_server, log=lambda m: print(m, file=sys.stderr))
        try:
            b.start(tmp)
        except PeerUnavailable as e:
            print(f"pymq not started: {e}")
            return 1
        try:
            run_load(endpoint(b), LoadSpec(destination="/queue/prof.warmup", count=30_000, duration=3,
                                           app_headers=a.headers))
            for key in keys:
                w = rows[key]
                raw = os.path.join(tmp, f"{key}.txt")
                spec = LoadSpec(destination=f"/{'topic' if w.spec.get('topic') else 'queue'}/prof.{key}",
                                count=w.count, duration=a.seconds, max_in_flight=WINDOW, app_headers=a.headers,
                                **w.spec)
                if spec.rate:
                    spec.count = int(spec.rate * spec.duration)
                keep = os.environ.get("PYMQ_PROFILE_KEEP")  # a directory to keep the raw stacks in
                if keep:
                    raw = os.path.join(keep, f"{a.label or 'pymq'}-{key}.txt")
                spy = subprocess.Popen([pyspy, "record", "--pid", str(b.proc.pid), "--rate", str(RATE_HZ),
                                        "--format", "raw", "--nonblocking", "--output", raw,
                                        "--duration", str(int(a.seconds + 30))],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                time.sleep(0.5)
                cpu = []
                r = run_load(endpoint(b), spec, on_started=lambda cpu=cpu: cpu.append(b.cpu_seconds()))
                cpu_s = b.cpu_seconds() - cpu[0] if cpu else 0.0
                spy.send_signal(2)  # SIGINT: py-spy writes what it has and exits
                try:
                    _, err = spy.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    spy.kill()
                    _, err = spy.communicate()
                us = cpu_s * 1e6 / r.received if r.received else 0.0
                if not os.path.exists(raw):
                    print(f"{key}: py-spy wrote nothing: {err.decode(errors='replace').strip()[-300:]}")
                    continue
                stages, funcs, total = summarise(raw, a.top)
                share = {s: stages[s] / total if total else 0.0 for s in STAGES}
                row = {"workload": key, "title": w.title, "rate": r.rate, "received": r.received,
                       "lost": r.lost, "duplicated": r.duplicated, "broker_us_per_msg": us, "samples": total,
                       "stage_share": share, "stage_us_per_msg": {s: share[s] * us for s in STAGES},
                       "top": [(f, n / total) for f, n in funcs.most_common(a.top)]}
                out.append(row)
                report(row)
        finally:
            b.stop()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"label": a.label, "headers": a.headers, "rows": out}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
