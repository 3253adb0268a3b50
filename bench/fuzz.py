"""The long fuzzing run: generated traffic against real brokers, and coverage-guided fuzzing of the codecs.

    python -m bench.fuzz --minutes 10             # from the repository root
    python -m bench.fuzz --minutes 2 --json /tmp/fuzz.json
    python -m bench.fuzz --minutes 5 --only broker     # or: --only admin, --only atheris

Half the time goes to the broker state machine of tests/hostile/fuzzing.py (the same rules the test suite
checks in a short run: the broker stays up, a refused stream gets ERROR then close, a normal client is
still served), split between a ``pymq-server`` with the compiled core and one with
``PYMQ_NO_EXTENSIONS=1``, and the compiled one again over its WebSocket listener (``c/ws``: the same
traffic in WebSocket fragments); it runs in batches with fresh seeds and restarts a broker that died (and counts
that as a failure).  A share goes to the admin HTTP port (tests/hostile/admin_fuzzing.py: generated
requests — every route and operation, right and wrong credentials, broken framing, hostile JSON, mutated
bytes — against a real broker; each must be answered or closed within the request deadline, never with
500, never 2xx without credentials, no traceback, nothing an unauthenticated request names created;
``--only admin``).  The rest goes to the atheris targets of ``bench/fuzz_targets.py`` — the
compiled scanner against its twin, the selector front end with both evaluators, the broker's reader of
bulk SEND bodies (Arrow IPC, spec/spark.md §7), and a multi-worker broker's HANDOVER envelope (a moved
connection's state, spec/cores.md §2.4) — each in its own
process with a corpus kept under ``--corpus`` (default ``.fuzz-corpus/``, ignored by git) so later runs
start where earlier ones stopped.  Without atheris (``pip install atheris``) that half is skipped and
said so.  ``--asan`` builds AddressSanitizer copies of the compiled scanner and evaluator with gcc from
the C files ``pip install -e .`` left in ``_ext/``, runs the twin tests of tests/protocol and
tests/selector (hypothesis on hostile input included) against them, then the atheris targets (the ASan
runtime is preloaded): an out-of-bounds read or write is reported even where it would not crash.  Under
gcc's ASan runtime atheris loses its coverage hooks, so those atheris runs mutate the corpus the guided
runs built without guidance of their own (clang would keep both).  When the JVM Spark source's jar is
built (bindings/spark, or ``PYMQ_SPARK_JAR``), a share goes to its fuzz target (``io.pymq.spark.Fuzz``:
mutated range answers read as a task reads them; anything but a message-format refusal is a failure);
``--only jvm`` runs just that.  Exit status 1 if anything failed.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_broker_fuzz(what: str, seconds: float, steps: int) -> dict:
    """``what``: the twin (``c`` or ``py``), with ``/ws`` for the WebSocket listener instead of TCP."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from tests.hostile.conftest import start_broker
    from tests.hostile.fuzzing import BrokerFuzz

    twin, _, transport = what.partition("/")
    env = {"PYMQ_NO_EXTENSIONS": "1" if twin == "py" else "0"}
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"pymq-fuzz-{twin}-"))
    result = {"twin": what, "batches": 0, "failures": [], "broker_restarts": 0}
    BrokerFuzz.transport = transport or "tcp"
    BrokerFuzz.stats = {"steps": 0, "connections": 0, "refused_streams": 0, "errors_seen": 0, "bytes": 0}
    deadline = time.monotonic() + seconds
    def fresh_broker(n: int):
        where = tmp / f"broker-{n}"
        where.mkdir()
        return start_broker(where, env=env, websocket=bool(transport))

    broker = fresh_broker(0)
    started = time.monotonic()
    try:
        while time.monotonic() < deadline:
            if not broker.alive():
                result["failures"].append(f"broker died: {broker.describe()}")
                result["broker_restarts"] += 1
                broker = fresh_broker(result["broker_restarts"])
            BrokerFuzz.broker = broker
            result["batches"] += 1
            try:
                run_state_machine_as_test(BrokerFuzz, settings=settings(
                    max_examples=20, stateful_step_count=steps, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True,
                    phases=[Phase.generate]))            # no shrinking here: report and go on
            except Exception as exc:  # noqa: BLE001 - one finding must not end the run: record it, go on
                result["failures"].append(f"{type(exc).__name__}: {str(exc)[:2000]}")
    finally:
        broker.stop()
    result.update(BrokerFuzz.stats)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def _rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next(round(int(line.split()[1]) / 1024, 1) for line in fh if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def run_admin_fuzz(seconds: float, examples: int = 50) -> dict:
    """Generated requests against a real broker's admin HTTP port (tests/hostile/admin_fuzzing.py), in
    batches with fresh seeds; a broker that died is counted as a failure and started again."""
    from tests.hostile import admin_fuzzing

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="pymq-fuzz-admin-"))
    result: dict = {"batches": 0, "failures": [], "broker_restarts": 0}
    stats: dict = {"requests": 0, "bytes": 0}
    started = time.monotonic()
    broker = admin_fuzzing.start(tmp / "broker-0")
    result["rss_start_mib"] = _rss_mib(broker.proc.pid)
    try:
        while time.monotonic() - started < seconds:
            if broker.proc.poll() is not None:
                result["broker_restarts"] += 1
                broker = admin_fuzzing.start(tmp / f"broker-{result['broker_restarts']}")
            result["batches"] += 1
            result["failures"] += admin_fuzzing.run_batch(broker, examples, stats)
            broker.log[:] = [line for line in broker.log if "Traceback" not in line]   # reported once
        result["rss_end_mib"] = _rss_mib(broker.proc.pid)
    finally:
        broker.stop()
    result.update(stats, seconds=round(time.monotonic() - started, 1))
    return result


STAT = re.compile(r"stat::(\w+):\s+(\d+)")


def asan_tree() -> tuple[pathlib.Path, dict[str, str]]:
    """A copy of the pymq package whose compiled scanner and evaluator are built with AddressSanitizer,
    and the environment that loads them (ASan runtime preloaded, the copy first on the path)."""
    import shutil
    import sysconfig
    tree = pathlib.Path(tempfile.mkdtemp(prefix="pymq-asan-"))
    for part in ("pymq", "tests", "spec"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    include = sysconfig.get_paths()["include"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for source, target in (("scanner", "protocol/_scanner_c"), ("selector", "selector/_evaluator_c")):
        c_file = ROOT / "_ext" / f"{source}.c"
        if not c_file.exists():
            raise SystemExit(f"{c_file} is missing: run `pip install -e .` first (it writes the C files)")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer",
                        "-w", f"-I{include}", str(c_file), "-o", str(tree / "pymq" / f"{target}{suffix}")],
                       check=True)
    runtime = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True,
                             check=True).stdout.strip()
    env = {"LD_PRELOAD": runtime, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "PYTHONPATH": str(tree)}
    return tree, env


def run_atheris(target: str, seconds: float, corpus: pathlib.Path, asan: tuple | None = None) -> dict:
    directory = corpus / target
    directory.mkdir(parents=True, exist_ok=True)
    before = len(list(directory.iterdir()))
    artifacts = pathlib.Path(tempfile.mkdtemp(prefix=f"pymq-atheris-{target}-"))
    cmd = [sys.executable, str(ROOT / "bench" / "fuzz_targets.py"), target, f"-max_total_time={int(seconds)}",
           "-print_final_stats=1", f"-artifact_prefix={artifacts}/", "-timeout=10", "-rss_limit_mb=2048",
           str(directory)]
    started = time.monotonic()
    env, cwd = None, ROOT
    if asan is not None:
        tree, extra = asan
        env, cwd = {**os.environ, **extra}, tree          # not the repository root: its pymq would win
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=seconds + 300)
    stats = {k: int(v) for k, v in STAT.findall(proc.stderr)}
    cov = re.findall(r"cov: (\d+) ft: (\d+)", proc.stderr)
    found = sorted(str(p) for p in artifacts.iterdir())
    failure = None
    if proc.returncode != 0 or found:
        m = re.search(r"=== Uncaught Python exception: ===\n(.*?)\nTraceback", proc.stderr, re.S)
        sanitizer = re.search(r"(ERROR: AddressSanitizer.*?)(?:\n\n|$)", proc.stderr, re.S)
        failure = (m.group(1) if m else sanitizer.group(1) if sanitizer else proc.stderr[-2000:]).strip()
    return {"target": target, "asan": asan is not None, "seconds": round(time.monotonic() - started, 1),
            "executions": stats.get("number_of_executed_units"),
            "exec_per_s": stats.get("average_exec_per_sec"),
            "coverage": int(cov[-1][0]) if cov else None, "features": int(cov[-1][1]) if cov else None,
            "corpus_before": before, "corpus_after": len(list(directory.iterdir())),
            "artifacts": found, "failure": failure}


def jvm_fuzz_command() -> list[str] | None:
    """``java -cp <jar>:<pyspark jars> io.pymq.spark.Fuzz``, or None without the jar (or pyspark)."""
    jar = os.environ.get("PYMQ_SPARK_JAR") or str(ROOT / "bindings" / "spark" / "target" / "pymq-spark.jar")
    if not os.path.isfile(jar):
        return None
    try:
        import pyspark
    except ImportError:
        return None
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
    return ["java", "--add-opens=java.base/java.nio=ALL-UNNAMED", "-cp", f"{jar}{os.pathsep}{jars}",
            "io.pymq.spark.Fuzz"]


def run_jvm_fuzz(command: list[str], seconds: float) -> dict:
    started = time.monotonic()
    seed = str(int(time.time()))
    proc = subprocess.run([*command, str(max(1.0, seconds - 5)), seed], capture_output=True, text=True,
                          timeout=seconds + 300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    missing = f"no result (exit {proc.returncode}): {proc.stderr[-2000:]}"
    result = json.loads(lines[-1]) if lines else {"rounds": 0, "read": 0, "refused": 0, "finding": missing}
    if proc.returncode != 0 and not result.get("finding"):
        result["finding"] = f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    result.update(seed=seed, seconds=round(time.monotonic() - started, 1))
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--only", choices=["broker", "admin", "atheris", "jvm"])
    p.add_argument("--steps", type=int, default=40, help="steps per generated broker session")
    p.add_argument("--corpus", default=str(ROOT / ".fuzz-corpus"))
    p.add_argument("--asan", action="store_true", help="atheris targets against AddressSanitizer builds")
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args(argv)
    total = args.minutes * 60
    try:
        import atheris  # noqa: F401
        have_atheris = True
    except ImportError:
        have_atheris = False
    parts = []
    if args.only in (None, "broker"):
        parts += [("broker", "c"), ("broker", "py"), ("broker", "c/ws")]
    if args.only in (None, "admin"):
        parts += [("admin", "http")]
    if args.only in (None, "atheris") and have_atheris:
        parts += [("atheris", "scanner"), ("atheris", "selector"), ("atheris", "bulk"), ("atheris", "definitions"),
                  ("atheris", "filter"), ("atheris", "handover"), ("atheris", "send")]
    jvm = jvm_fuzz_command()
    if args.only in (None, "jvm") and jvm is not None:
        parts += [("jvm", "answers")]
    if args.only == "jvm" and jvm is None:
        print("jvm: the JVM Spark source's jar is not built (bindings/spark/build.sh)", flush=True)
        return 1
    share = total / max(1, len(parts))
    report: dict = {"minutes": args.minutes, "broker": [], "admin": [], "atheris": [], "jvm": [],
                    "atheris_available": have_atheris, "asan": args.asan}
    asan = asan_tree() if args.asan else None
    if asan is not None:
        tree, extra = asan
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/protocol",
                               "tests/selector"], cwd=tree, env={**os.environ, **extra}, capture_output=True,
                              text=True, timeout=3600)
        tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
        report["asan_tests"] = {"returncode": proc.returncode, "summary": tail,
                                "seconds": round(time.monotonic() - started, 1)}
        print(f"ASan: tests/protocol and tests/selector against the ASan builds: {tail}", flush=True)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:], flush=True)
    for kind, what in parts:
        if kind == "broker":
            r = run_broker_fuzz(what, share, args.steps)
            report["broker"].append(r)
            print(f"broker [{what}]: {r['batches']} batches, {r['steps']} steps, {r['connections']} connections, "
                  f"{r['refused_streams']} refused streams answered with ERROR + close, {r['errors_seen']} "
                  f"ERRORs seen, {r['bytes']} bytes sent in {r['seconds']} s; "
                  f"{len(r['failures'])} failure(s), {r['broker_restarts']} broker restart(s)", flush=True)
            for failure in r["failures"]:
                print("   FAILURE:", failure, flush=True)
        elif kind == "admin":
            r = run_admin_fuzz(share)
            report["admin"].append(r)
            print(f"admin HTTP port: {r['batches']} batches, {r['requests']} requests ({r['bytes']} bytes) in "
                  f"{r['seconds']} s, broker RSS {r['rss_start_mib']} -> {r.get('rss_end_mib')} MiB; "
                  f"{len(r['failures'])} failure(s), {r['broker_restarts']} broker restart(s)",
                  flush=True)
            for failure in r["failures"]:
                print("   FAILURE:", failure[:2000], flush=True)
        elif kind == "jvm":
            r = run_jvm_fuzz(jvm, share)
            report["jvm"].append(r)
            verdict = "FAILURE: " + r["finding"] if r["finding"] else "no failure"
            print(f"jvm [range answers]: {r['rounds']} rounds ({r['read']} read, {r['refused']} refused with a "
                  f"message-format error) in {r['seconds']} s; {verdict}", flush=True)
        else:
            r = run_atheris(what, share, pathlib.Path(args.corpus), asan)
            report["atheris"].append(r)
            print(f"atheris [{what}{', ASan' if asan else ''}]: {r['executions']} executions "
                  f"({r['exec_per_s']}/s) in {r['seconds']} s, "
                  f"coverage {r['coverage']} edges / {r['features']} features, corpus {r['corpus_before']} -> "
                  f"{r['corpus_after']}; {'FAILURE: ' + r['failure'] if r['failure'] else 'no failure'}",
                  flush=True)
    if not have_atheris and args.only != "broker":
        print("atheris: not installed (pip install atheris), coverage-guided part skipped", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    failed = any(r["failures"] for r in report["broker"]) or any(r["failure"] for r in report["atheris"]) \
        or any(r["failures"] for r in report["admin"]) \
        or any(r["finding"] for r in report["jvm"]) \
        or report.get("asan_tests", {}).get("returncode", 0) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
