"""Every benchmark of bench/README.md, old tree against new tree, interleaved in one run, at a bounded size.

    python bench/old_vs_new.py --old /tmp/old --new . [--rounds 3] [--only core,queues] [--json out.json]

``--old`` and ``--new`` are checkouts (``git archive <commit> | tar -x -C DIR``), each with its compiled
modules built in place (``python setup.py build_ext --inplace``: a tree without them runs its pure-Python
twins, which is no comparison).  Each tree runs with ``PYTHONPATH`` pointing at a directory of links to its
``pymq``, ``server`` (as ``pymq_server``) and ``pyspark_pymq``: ahead of any editable install, so the bench
process, the ``pymq-server`` it starts (``sys.executable -m pymq_server.cli`` or the ``pymq-server`` script)
and every child import that tree.  By default both trees run the *new* tree's copy of a bench, so both are
measured by the same workload; a bench that imports the broker's insides in-process (bench_durable) runs each
tree's own copy.  A bench the old tree cannot run (a feature it lacks) is reported as such.

Rounds alternate the order (old, new / new, old) so drift of a shared machine's load falls on both; every
figure is the median over rounds and the ratio is new/old, with "better" saying which way is good.  The
machine's load average is printed beside each run: on a shared machine read the ratios and their spread, not
the absolute figures.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

Figures = dict[str, tuple[float, str]]          # name -> (value, "low" | "high": which way is better


def _json(path: str) -> object:
    with open(path) as fh:
        return json.load(fh)


def _core(out: str, _: str) -> Figures:
    return {f"{m[1]} µs/msg": (float(m[2]), "low")
            for m in re.finditer(r"^\s+(\S+)\s+median\s+([\d.]+) µs/msg", out, re.M)}


def _durable(out: str, _: str) -> Figures:
    return {f"{m[1].strip()} µs": (float(m[2]), "low")
            for m in re.finditer(r"^  (\S.*?)\s{2,}([\d.]+)\s+\(", out, re.M) if "wall" not in m[1]}


def _bulk_write(out: str, _: str) -> Figures:
    m = re.search(r"all rounds: broker ([\d.]+) CPU-s per 1M rows, best ([\d,]+) rows/s", out)
    return {} if m is None else {"broker CPU-s per 1M rows": (float(m[1]), "low"),
                                 "rows/s": (float(m[2].replace(",", "")), "high")}


def _queue_bulk(out: str, _: str) -> Figures:
    figures: Figures = {}
    for m in re.finditer(r"^this build\s+(bulk|single): (.*)$", out, re.M):
        for part in m[2].split(", "):
            name, _, value = part.rpartition(" ")
            figures[f"{m[1]} {name}"] = (float(value.replace(",", "")), "low" if "us/" in name else "high")
    return figures


def _handover(_: str, path: str) -> Figures:
    median = _json(path)["median"]  # type: ignore[index]
    return {f"{k} µs/msg": (float(v), "low") for k, v in median.items() if k != "wall"}


def _sim(out: str, path: str) -> Figures:
    figures: Figures = {}
    for run in _json(path)["runs"]:  # type: ignore[index]
        key = f"{run.get('model', '')} {run.get('policy', '')} {run['nodes']}n".strip()
        figures[f"{key} forwarded"] = (float(run["forwarded"]), "low")
        figures[f"{key} missed"] = (float(run["missed"]), "low")
    m = re.search(r"wall ([\d.]+) s", out)
    if m:
        figures["wall s"] = (float(m[1]), "low")
    return figures


def _paging(_: str, path: str) -> Figures:
    figures: Figures = {}
    for i, row in enumerate(_json(path)):  # type: ignore[arg-type]
        name = ("non-persistent", "persistent")[i] if i < 2 else str(i)
        figures[f"{name} fill msg/s"] = (float(row["fill_rate"]), "high")
        figures[f"{name} drain msg/s"] = (float(row["drain_rate"]), "high")
        if "fill_cpu_us" in row:         # the broker's CPU a message (bench_paging since session 37)
            figures[f"{name} broker CPU µs/msg fill"] = (float(row["fill_cpu_us"]), "low")
            figures[f"{name} broker CPU µs/msg drain"] = (float(row["drain_cpu_us"]), "low")
        figures[f"{name} peak RSS over idle / max_memory"] = (float(row["peak_over_idle_x_max_memory"]), "low")
        figures[f"{name} problems"] = (float(sum(row["problems"].values())), "low")
    return figures


def _fairness(_: str, path: str) -> Figures:
    doc = _json(path)
    return {"bystander alone p99 ms": (float(doc["alone"]["p99_ms"]), "low"),  # type: ignore[index]
            "bystander under flood p99 ms": (float(doc["flood"]["p99_ms"]), "low"),  # type: ignore[index]
            "flooder receipts/s": (float(doc["flooder"]["receipt_rate"]), "high")}  # type: ignore[index]


def _queues(_: str, path: str) -> Figures:
    doc: dict = _json(path)  # type: ignore[assignment]
    figures: Figures = {}
    for i, row in enumerate(doc.get("selectors", [])):
        figures[f"selectors {i} ({row.get('arrangement')}) broker µs/msg"] = (float(row["broker_us_per_msg"]), "low")
    for row in doc.get("depth", []):
        for phase in row.get("phases", []):
            key = f"depth {row['variant']} {phase['name']}"
            figures[f"{key} broker µs/event"] = (float(phase["broker_us_per_event"]), "low")
        figures[f"depth {row['variant']} fill s"] = (float(row["fill_s"]), "low")
        figures[f"depth {row['variant']} lost"] = (float(row.get("lost", 0)), "low")
    return figures


def _sdk(out: str, _: str) -> Figures:
    figures: Figures = {}
    for m in re.finditer(r"^(\S+)\s+(non-persistent|persistent)\s+(blocking|aio)\s+send\s+(\d+) msg/s\s+"
                         r"receive\s+(\d+) msg/s", out, re.M):
        key = f"{m[1]} {m[2]} {m[3]}"
        figures[f"{key} send msg/s"] = (float(m[4]), "high")
        figures[f"{key} receive msg/s"] = (float(m[5]), "high")
    return figures


def _brokers(_: str, path: str) -> Figures:
    figures: Figures = {}
    for row in _json(path)["results"]:  # type: ignore[index]
        if row.get("broker") != "pymq":
            continue
        figures[f"{row['workload']} broker µs/msg"] = (float(row["broker_cpu_us_per_msg"]), "low")
        figures[f"{row['workload']} msg/s"] = (float(row["rate"]), "high")
        figures[f"{row['workload']} lost+dup"] = (float(row["lost"] + row["duplicated"]), "low")
    return figures


def _cluster(_: str, path: str) -> Figures:
    doc: dict = _json(path)  # type: ignore[assignment]
    figures: Figures = {}
    for row in doc.get("filters", []):
        figures[f"filters {row['mode']} cluster CPU s"] = (float(row["cluster_cpu_s"]), "low")
        figures[f"filters {row['mode']} lost+dup+misrouted"] = (
            float(row["lost"] + row["duplicated"] + row["misrouted"]), "low")
    for row in doc.get("throughput", []):
        key = f"throughput {row['variant']} {row['nodes']} nodes"
        figures[f"{key} msg/s"] = (float(row["rate"]), "high")
        figures[f"{key} cluster µs/msg"] = (float(row["cluster_us_per_msg"]), "low")
        figures[f"{key} lost+dup+misrouted"] = (float(row["lost"] + row["duplicated"] + row["misrouted"]), "low")
    return figures


def _memory_growth(_: str, path: str) -> Figures:
    figures: Figures = {}
    for scenario, row in _json(path).items():  # type: ignore[union-attr]
        if not isinstance(row, dict):
            continue
        for key in ("rss_growth_mib", "still_open", "held_by_broker_after_2s", "held_after_close_mib", "tracebacks"):
            if isinstance(row.get(key), (int, float)):
                figures[f"{scenario} {key}"] = (float(row[key]), "low")
    return figures


@dataclass
class Bench:
    name: str
    argv: list[str]                  # after the interpreter; {json} is a file for this run's figures
    figures: Callable[[str, str], Figures]
    script: str = "new"              # "new": both trees run the new tree's copy; "own": each its own
    rounds: int | None = None        # fewer rounds for the slow ones
    services: bool = False           # needs PostgreSQL/Redis (.ci/services.sh)


BENCHES = [
    Bench("core", ["bench/bench_core.py", "--messages", "5000", "--rounds", "3"], _core, rounds=4),
    Bench("durable", ["bench/bench_durable.py", "--messages", "5000", "--rounds", "3"], _durable, script="own"),
    Bench("handover", ["bench/bench_handover.py", "--messages", "40000", "--rounds", "1", "--json", "{json}"],
          _handover),
    Bench("cluster_sim", ["bench/bench_cluster_sim.py", "--recipients", "20000", "--sources", "5000",
                          "--messages", "5000", "--nodes", "16", "--models", "zipf", "--json", "{json}"], _sim,
          script="own"),
    Bench("bulk_write", ["bench/bench_bulk_write.py", "--rows", "400000", "--rounds", "1"], _bulk_write),
    Bench("queue_bulk", ["bench/bench_queue_bulk.py", "--rows", "100000", "--rounds", "1"], _queue_bulk),
    Bench("paging", ["bench/bench_paging.py", "--quick", "--json", "{json}"], _paging),
    Bench("fairness", ["bench/fairness.py", "--quick", "--json", "{json}"], _fairness),
    Bench("brokers", ["bench/bench_brokers.py", "--quick", "--brokers", "pymq", "--json", "{json}"], _brokers),
    Bench("sdk", ["bench/bench_sdk.py", "--compare", "--quick"], _sdk, rounds=2),
    Bench("queues", ["bench/bench_queues.py", "--quick", "--json", "{json}"], _queues, rounds=2),
    Bench("cluster", ["bench/bench_cluster.py", "--quick", "--json", "{json}"], _cluster, rounds=2, services=True),
    Bench("client_memory", ["bench/bench_client_memory.py", "--quick", "--json", "{json}"], _memory_growth,
          rounds=1),
    Bench("admin_port", ["bench/admin_port.py", "--quick", "--json", "{json}"], _memory_growth, rounds=1),
]

#: benches of bench/README.md this driver does not run, and why
NOT_RUN = {
    "profile_rows": "a sampling profile (where the CPU goes), no figure with a direction; the per-row broker "
                    "CPU it explains is bench_brokers'",
    "bench_failover": "high availability does not exist in the old tree (spec/ha.md landed after it)",
    "bench_spark": "a JVM Spark run of tens of minutes; the broker's side of its bulk writes and reads is "
                   "bench_bulk_write's and bench_queue_bulk's",
    "fuzz, mutation": "test tools, not benchmarks",
    "opcodes": "a count, not a timing: run it in each tree (its docstring) and compare with --compare",
}


@dataclass
class Run:
    tree: str
    round: int
    seconds: float
    load: float
    figures: Figures = field(default_factory=dict)
    error: str = ""


def shim(tree: str, where: str) -> str:
    os.makedirs(where, exist_ok=True)
    for name, inside in (("pymq", "pymq"), ("pymq_server", "server"), ("pyspark_pymq", "pyspark_pymq")):
        link = os.path.join(where, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(tree, inside), link)
    return where


def run_one(bench: Bench, tree: str, trees: dict[str, str], shims: dict[str, str], tmp: str,
            rnd: int, timeout: float) -> Run:
    home = trees["new"] if bench.script == "new" else trees[tree]
    out_json = os.path.join(tmp, f"{bench.name}-{tree}-{rnd}.json")
    argv = [sys.executable, *[a.replace("{json}", out_json) for a in bench.argv]]
    argv[1] = os.path.join(home, argv[1])
    env = {**os.environ, "PYTHONPATH": shims[tree], "PYTHONDONTWRITEBYTECODE": "1"}
    load = os.getloadavg()[0]
    start = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Run(tree, rnd, time.monotonic() - start, load, error=f"timed out after {timeout:.0f} s")
    run = Run(tree, rnd, time.monotonic() - start, load)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
        run.error = f"exit {done.returncode}: {tail[0][:200]}"
        return run
    try:
        run.figures = bench.figures(done.stdout + done.stderr, out_json)
    except (OSError, KeyError, ValueError, TypeError) as exc:
        run.error = f"figures not read: {exc!r}"
    if not run.figures and not run.error:
        run.error = "no figures in its output"
    return run


def summarize(bench: Bench, runs: list[Run]) -> list[dict]:
    rows = []
    names = sorted({n for r in runs for n in r.figures}, key=lambda n: next(
        i for r in runs for i, k in enumerate(r.figures) if k == n))
    for name in names:
        got = {t: [r.figures[name][0] for r in runs if r.tree == t and name in r.figures] for t in ("old", "new")}
        better = next(r.figures[name][1] for r in runs if name in r.figures)
        row = {"bench": bench.name, "figure": name, "better": better,
               "old": statistics.median(got["old"]) if got["old"] else None,
               "new": statistics.median(got["new"]) if got["new"] else None,
               "old_all": got["old"], "new_all": got["new"]}
        if row["old"] and row["new"] is not None:
            row["ratio"] = row["new"] / row["old"]
        elif row["old"] == 0 and row["new"] == 0:
            row["ratio"] = 1.0
        rows.append(row)
    return rows


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the old checkout (compiled modules built in place)")
    ap.add_argument("--new", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", help="comma-separated bench names: " + ", ".join(b.name for b in BENCHES))
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one bench run may take")
    ap.add_argument("--json", help="write every run and the summary here")
    a = ap.parse_args()
    trees = {"old": os.path.abspath(a.old), "new": os.path.abspath(a.new)}
    chosen = [b for b in BENCHES if not a.only or b.name in a.only.split(",")]
    tmp = tempfile.mkdtemp(prefix="pymq-old-vs-new-")
    shims = {t: shim(path, os.path.join(tmp, f"path-{t}")) for t, path in trees.items()}
    doc: dict = {"trees": trees, "cpus": os.cpu_count(), "rounds": a.rounds, "not_run": NOT_RUN, "benches": {}}
    print(f"old {trees['old']}\nnew {trees['new']}\n{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
          flush=True)
    for bench in chosen:
        runs: list[Run] = []
        for rnd in range(bench.rounds or a.rounds):
            for tree in (("old", "new") if rnd % 2 == 0 else ("new", "old")):
                run = run_one(bench, tree, trees, shims, tmp, rnd, a.timeout)
                runs.append(run)
                print(f"  {bench.name:<13} round {rnd + 1} {tree}: {run.seconds:5.1f} s, load {run.load:4.1f}"
                      + (f"  ERROR {run.error}" if run.error else f", {len(run.figures)} figures"), flush=True)
        rows = summarize(bench, runs)
        doc["benches"][bench.name] = {"runs": [r.__dict__ for r in runs], "summary": rows}
        print(f"{bench.name}: median of {bench.rounds or a.rounds} round(s), new/old "
              "(better: which way is good)")
        for row in rows:
            ratio = row.get("ratio")
            print(f"    {row['figure']:<52} old {_fmt(row['old']):>9}  new {_fmt(row['new']):>9}  "
                  f"{'-' if ratio is None else f'{ratio:.2f}x':>6}  ({row['better']}er is better)", flush=True)
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(doc, fh, indent=1)
    for name, why in NOT_RUN.items():
        print(f"not run: {name}: {why}")
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
