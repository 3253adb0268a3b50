"""The broker bench's second load client (issue 30): bench/goload/main.go, a Go program on go-stomp, driven
with the same LoadSpec and returning the same RunResult as loadclient.run_load, so every row can be
measured with a client nobody here wrote (``bench_brokers.py --client go`` or ``--client asyncio,go``).

What differs from loadclient.py, on purpose (a different client's behaviour is the point):
- go-stomp writes and flushes one frame per ``Send`` (loadclient.py joins 64 SENDs per socket write), and
  hands each MESSAGE to a Go channel; a receipt is awaited inside ``Send``, so a careful producer runs each
  receipt-carrying SEND in a goroutine, at most max_unconfirmed / receipt_every at once.
- Producers and consumers are goroutines of one process (on every core Go's scheduler gets), not two
  processes: its CPU is reported as one figure (``RunResult.producer_cpu_s``/``_pct`` hold the whole
  process, the consumer's fields stay 0; ``RunResult.client`` is ``go``).
- The send timestamp is the Go process's own monotonic clock, read by its consumers: latency is measured
  the same way (send to the moment the consumer got the message).
Not supported (refused): several endpoints (cluster runs), rotated headers, backlog-first runs.
"""
from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict

from loadclient import Endpoint, LoadSpec, RunResult

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "goload")


class GoClientUnavailable(RuntimeError):
    """No Go toolchain, or the build failed."""


def find_go() -> str | None:
    for go in (shutil.which("go"), "/usr/local/go/bin/go", "/usr/lib/go/bin/go"):
        if go and os.access(go, os.X_OK):
            return go
    return None


def build() -> str:
    """The goload binary, built once per source and Go version into the cache (as .ci/interop-clients.sh
    builds the interop driver; go-stomp comes from Go's module cache, downloaded on the first build)."""
    go = find_go()
    if go is None:
        raise GoClientUnavailable("no Go toolchain (go on PATH, /usr/local/go, /usr/lib/go); "
                                  "eval \"$(.ci/interop-clients.sh)\" installs one")
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout.strip()
    digest = hashlib.sha256(version.encode())
    for name in ("go.mod", "go.sum", "main.go"):
        with open(os.path.join(SOURCE, name), "rb") as f:
            digest.update(f.read())
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pymq-bench")
    os.makedirs(cache, exist_ok=True)
    out = os.path.join(cache, f"goload-{digest.hexdigest()[:16]}")
    if not os.access(out, os.X_OK):
        tmp = f"{out}.{os.getpid()}.tmp"
        p = subprocess.run([go, "build", "-o", tmp, "."], cwd=SOURCE, capture_output=True, text=True, check=False)
        if p.returncode != 0:
            raise GoClientUnavailable(f"go build in bench/goload failed: {p.stderr.strip()[-400:]}")
        os.replace(tmp, out)
    return out


def _spec_json(ep: Endpoint, spec: LoadSpec, samples_path: str = "", runtime_sleep: bool = False) -> str:
    if spec.rotate_send_headers or spec.subscribe_headers or spec.backlog_first or spec.extra_send_headers:
        raise ValueError("the Go load client runs the broker bench's workloads only (no rotation, extra "
                         "headers or backlog-first runs)")
    d = asdict(spec)
    d.update(host=ep.host, port=ep.port, connect_host=ep.connect_host, login=ep.login, passcode=ep.passcode,
             prefetch_header=ep.prefetch_header or "", explicit_non_persistent=ep.explicit_non_persistent,
             samples_path=samples_path, runtime_sleep=runtime_sleep)
    return json.dumps(d)


def _read_line(proc: subprocess.Popen, timeout: float) -> dict:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer from the Go load client within {timeout:.0f} s")
        ready, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
        if ready:
            line = proc.stdout.readline()
            if not line:
                raise EOFError("the Go load client ended without an answer")
            return json.loads(line)


def run_load(ep: Endpoint | list[Endpoint], spec: LoadSpec, on_started=None, samples_path: str = "",
             runtime_sleep: bool = False) -> RunResult:
    """loadclient.run_load's contract, through go-stomp: one workload to completion, every message checked;
    ``on_started()`` is called just before the producers are released. ``samples_path``: the client writes
    every delivery's send and arrival time there (CLOCK_MONOTONIC ns, int64 pairs; latency_trace.py);
    ``runtime_sleep``: pace with Go's time.Sleep as goload did before session 38 (bursts; a comparison)."""
    if isinstance(ep, (list, tuple)):
        if len(ep) != 1:
            raise ValueError("the Go load client drives one broker")
        ep = ep[0]
    result = RunResult(client="go")
    try:
        exe = build()
    except GoClientUnavailable as e:
        result.errors.append(str(e))
        return result
    hard = spec.duration + spec.idle_timeout + 120
    errlog = tempfile.TemporaryFile(mode="w+")       # go-stomp's own log; a pipe nobody reads could fill
    proc = subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog,
                            text=True, bufsize=1)
    assert proc.stdin is not None
    try:
        proc.stdin.write(_spec_json(ep, spec, samples_path, runtime_sleep) + "\n")
        proc.stdin.flush()
        first = _read_line(proc, 60)
        if not first.get("ready"):
            result.errors.extend(first.get("errors") or ["the Go load client did not get ready"])
            return result
        if on_started:
            on_started()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out = _read_line(proc, hard)
    except (OSError, ValueError, TimeoutError, EOFError) as e:
        result.errors.append(f"go load client: {type(e).__name__}: {e}")
        return result
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()               # our own child, by its handle
            proc.wait(5)
            result.errors.append(f"go load client {proc.pid} overstayed and was killed")
        if proc.returncode and not result.errors:
            errlog.seek(0)
            result.errors.append(f"go load client exited {proc.returncode}: {errlog.read().strip()[-300:]}")
        errlog.close()
    for key in ("sent", "received", "lost", "duplicated", "malformed", "elapsed_s", "rate", "send_rate",
                "lat_p50_us", "lat_p99_us", "lat_p999_us", "lat_max_us", "confirm_wait_s", "consumers_gave_up"):
        setattr(result, key, out.get(key, getattr(result, key)))
    result.errors.extend(out.get("errors") or [])
    result.producer_cpu_s = out.get("client_cpu_s", 0.0)       # the whole process (see the module doc)
    result.producer_cpu_pct = out.get("client_cpu_pct", 0.0)
    if result.sent:
        result.producer_us_per_msg = result.producer_cpu_s * 1e6 / max(result.sent, result.received)
    return result
