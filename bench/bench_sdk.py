"""Throughput of the pymq SDK itself: a send loop and then a receive loop through the public JMS-style API,
over `stomp://` (to a running pymq-server) and over `vm://` (the broker in the same process), with the
blocking SDK (`pymq`) or the asyncio one (`pymq.aio`, `--api aio`).

Run alone:  python bench/bench_sdk.py --url vm://default [--api aio] [--count 20000] [--size 128] [--json -]
Compare:    python bench/bench_sdk.py --compare [--rounds 3] [--quick]   starts a pymq-server for stomp://, then
            runs the blocking and the asyncio loops over stomp:// and vm://, non-persistent and persistent, each
            in a fresh process, and prints msg/s with the aio/blocking ratio (the blocking SDK is the baseline).
            --baseline DIR also runs each loop with another build's SDK first on the path (DIR holds its
            ``pymq`` package, e.g. ``git archive <commit> pymq | tar -x -C DIR`` plus the compiled modules), in
            the same rounds, and prints this build's rate over that one's.
bench_brokers.py runs it as a subprocess against the pymq broker it started, and sets it beside the bench's
own load client against the same broker (the baseline of the same run).

Each body carries a sequence number; the receive loop checks every one arrived once (loss or duplicate makes
the exit status 1). The loops are bounded by --count and by --seconds, whichever comes first.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


#: --broker-pid: the pymq-server whose CPU each loop costs (its process tree, /proc), or 0
BROKER_PID = 0


def _broker_cpu() -> float:
    if not BROKER_PID:
        return 0.0
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from peers import cpu_seconds

    return cpu_seconds(BROKER_PID)


def _broker_us(cpu_s: float, messages: int) -> float:
    return cpu_s * 1e6 / messages if BROKER_PID and messages else 0.0


def _body_of(message) -> bytes | None:
    # The message model is being written alongside this bench: accept the likely spellings.
    for attr in ("body", "text", "payload"):
        v = getattr(message, attr, None)
        if callable(v):
            v = v()
        if isinstance(v, str):
            return v.encode()
        if isinstance(v, (bytes, bytearray, memoryview)):
            return bytes(v)
    for meth in ("get_body", "get_text", "get_bytes"):
        f = getattr(message, meth, None)
        if f is not None:
            v = f()
            return v.encode() if isinstance(v, str) else bytes(v)
    return None


def run(url: str, count: int, size: int, seconds: float, queue: str, text: bool, persistent: bool) -> dict:
    import pymq  # the SDK under test

    pad = b"x" * max(0, size - 12)
    conn = pymq.connect(url)
    conn.start()
    try:
        session = conn.create_session()
        producer = session.create_producer(pymq.Queue(queue))
        # JMS's default is PERSISTENT, where each send outside a transaction waits for the broker's receipt
        # (durable write included): that is a different measurement from a pipelined non-persistent loop.
        producer.delivery_mode = pymq.PERSISTENT if persistent else pymq.NON_PERSISTENT
        # Send loop.
        cpu0, t0, bcpu0 = _cpu(), time.perf_counter(), _broker_cpu()
        deadline = t0 + seconds
        sent = 0
        while sent < count and time.perf_counter() < deadline:
            body = b"%012d" % sent + pad
            producer.send(session.create_text_message(body.decode()) if text else body)
            sent += 1
        send_s, send_cpu, send_bcpu = time.perf_counter() - t0, _cpu() - cpu0, _broker_cpu() - bcpu0
        # Receive loop: the messages are already queued, so this is the SDK's delivery path alone.
        consumer = session.create_consumer(pymq.Queue(queue))
        seen = bytearray(sent)
        received = dups = unreadable = 0
        cpu0, t0, bcpu0 = _cpu(), time.perf_counter(), _broker_cpu()
        deadline = t0 + seconds + 30
        while received < sent and time.perf_counter() < deadline:
            m = consumer.receive(timeout=5)
            if m is None:
                break
            received += 1
            b = _body_of(m)
            if b is None or not b[:12].isdigit():
                unreadable += 1
                continue
            seq = int(b[:12])
            if seq >= sent:
                unreadable += 1
            elif seen[seq]:
                dups += 1
            else:
                seen[seq] = 1
        recv_s, recv_cpu, recv_bcpu = time.perf_counter() - t0, _cpu() - cpu0, _broker_cpu() - bcpu0
        lost = sent - sum(seen) if not unreadable else sent - received
    finally:
        conn.close()
    return {
        "url": url.split("://")[0] + "://", "api": "blocking", "size": size, "text_messages": text,
        "persistent": persistent,
        "sent": sent, "send_rate": sent / send_s if send_s else 0.0, "send_cpu_pct": 100 * send_cpu / send_s,
        "received": received, "recv_rate": received / recv_s if recv_s else 0.0,
        "recv_cpu_pct": 100 * recv_cpu / recv_s if recv_s else 0.0,
        "lost": lost, "duplicated": dups, "unreadable": unreadable,
        # the broker's CPU per message during each loop (--broker-pid; 0 without): the receive loop's
        # includes the acknowledgements the SDK sends
        "broker_send_us": _broker_us(send_bcpu, sent), "broker_recv_us": _broker_us(recv_bcpu, received),
    }


async def _run_aio(url: str, count: int, size: int, seconds: float, queue: str, text: bool,
                   persistent: bool) -> dict:
    import pymq
    import pymq.aio  # the SDK under test

    pad = b"x" * max(0, size - 12)
    conn = await pymq.aio.connect(url)
    try:
        session = conn.create_session()
        producer = session.create_producer(pymq.Queue(queue))
        producer.delivery_mode = pymq.PERSISTENT if persistent else pymq.NON_PERSISTENT
        cpu0, t0, bcpu0 = _cpu(), time.perf_counter(), _broker_cpu()
        deadline = t0 + seconds
        sent = 0
        while sent < count and time.perf_counter() < deadline:
            body = b"%012d" % sent + pad
            await producer.send(session.create_text_message(body.decode()) if text else body)
            sent += 1
        send_s, send_cpu, send_bcpu = time.perf_counter() - t0, _cpu() - cpu0, _broker_cpu() - bcpu0
        consumer = await session.create_consumer(pymq.Queue(queue))
        seen = bytearray(sent)
        received = dups = unreadable = 0
        cpu0, t0, bcpu0 = _cpu(), time.perf_counter(), _broker_cpu()
        deadline = t0 + seconds + 30
        while received < sent and time.perf_counter() < deadline:
            m = await consumer.receive(timeout=5)
            if m is None:
                break
            received += 1
            b = _body_of(m)
            if b is None or not b[:12].isdigit():
                unreadable += 1
                continue
            seq = int(b[:12])
            if seq >= sent:
                unreadable += 1
            elif seen[seq]:
                dups += 1
            else:
                seen[seq] = 1
        recv_s, recv_cpu, recv_bcpu = time.perf_counter() - t0, _cpu() - cpu0, _broker_cpu() - bcpu0
        lost = sent - sum(seen) if not unreadable else sent - received
    finally:
        await conn.close()
    return {
        "url": url.split("://")[0] + "://", "api": "aio", "size": size, "text_messages": text,
        "persistent": persistent,
        "sent": sent, "send_rate": sent / send_s if send_s else 0.0, "send_cpu_pct": 100 * send_cpu / send_s,
        "received": received, "recv_rate": received / recv_s if recv_s else 0.0,
        "recv_cpu_pct": 100 * recv_cpu / recv_s if recv_s else 0.0,
        "lost": lost, "duplicated": dups, "unreadable": unreadable,
        # the broker's CPU per message during each loop (--broker-pid; 0 without): the receive loop's
        # includes the acknowledgements the SDK sends
        "broker_send_us": _broker_us(send_bcpu, sent), "broker_recv_us": _broker_us(recv_bcpu, received),
    }


def run_aio(url: str, count: int, size: int, seconds: float, queue: str, text: bool, persistent: bool) -> dict:
    """The same two loops as :func:`run`, through pymq.aio on one event loop (uvloop is not used: the
    SDK is measured on the standard loop applications get by default)."""
    import asyncio

    return asyncio.run(_run_aio(url, count, size, seconds, queue, text, persistent))


def compare(quick: bool, count: int, size: int, seconds: float, rounds: int = 1, baseline: str | None = None) -> int:
    """Blocking vs asyncio SDK over stomp:// and vm://, each run in a fresh process.  With ``rounds``
    the pair runs that many times, alternating which goes first, and the median row is shown (this
    machine is shared: back-to-back pairs and medians keep others' load off the ratio)."""
    import shutil
    import subprocess
    import tempfile

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from peers import PeerUnavailable, PymqBroker

    broker = PymqBroker(log=lambda *a: None)
    work = tempfile.mkdtemp(prefix="bench-sdk-")
    rows: list[dict] = []
    failed = False
    try:
        try:
            broker.start(work)
            urls = [f"stomp://127.0.0.1:{broker.stomp_port}", f"vm://bench-{os.getpid()}"]
        except PeerUnavailable as e:
            print(f"stomp:// not measured: {e}")
            broker = None
            urls = [f"vm://bench-{os.getpid()}"]
        builds = ["new", "base"] if baseline else ["new"]
        for persistent in (False, True):
            for url in urls:
                runs: dict[str, list[dict]] = {f"{api}{'' if b == 'new' else '@base'}": []
                                               for b in builds for api in ("blocking", "aio")}
                for rnd in range(rounds):
                    order = [(api, b) for api in ("blocking", "aio") for b in builds]
                    for api, build in (order if rnd % 2 == 0 else order[::-1]):
                        env = dict(os.environ)
                        if build == "base":
                            env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.abspath(baseline or ""),
                                                                              env.get("PYTHONPATH")]))
                        argv = [sys.executable, os.path.abspath(__file__), "--url", url, "--api", api,
                                "--count", str(count), "--size", str(size), "--seconds", str(seconds),
                                "--queue", f"bench.sdk.{api}.{os.getpid()}.{len(rows)}", "--json", "-"]
                        argv += ["--persistent"] if persistent else []
                        if url.startswith("stomp://") and broker is not None and broker.proc is not None:
                            argv += ["--broker-pid", str(broker.proc.pid)]
                        # cwd: the embedded broker makes a directory named after it there
                        p = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=work, env=env)
                        lines = p.stdout.strip().splitlines()
                        try:
                            r = json.loads(lines[-1])
                        except (IndexError, json.JSONDecodeError):
                            r = {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
                        r.setdefault("api", api)
                        if "error" in r or r.get("lost") or r.get("duplicated"):
                            failed = True
                        runs[f"{api}{'' if build == 'new' else '@base'}"].append(r)
                        rows.append(r)
                medians = {key: _median(rs) for key, rs in runs.items()}
                _print_pair(url, persistent, medians)
                if baseline:
                    _print_against_base(url, persistent, medians)
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def _median(runs: list[dict]) -> dict:
    """Per field, the median of the rounds' send and receive rates (a failed round wins: it shows)."""
    for r in runs:
        if "error" in r:
            return r
    out = dict(runs[0])
    for key in ("send_rate", "recv_rate", "broker_send_us", "broker_recv_us"):
        values = sorted(r.get(key, 0.0) for r in runs)
        out[key] = values[len(values) // 2]
    out["lost"] = max(r["lost"] for r in runs)
    out["duplicated"] = max(r["duplicated"] for r in runs)
    return out


def _print_pair(url: str, persistent: bool, pair: dict) -> None:
    scheme = url.split("://")[0] + "://"
    mode = "persistent" if persistent else "non-persistent"
    b, a = pair.get("blocking", {}), pair.get("aio", {})
    for api, r in (("blocking", b), ("aio", a)):
        if "error" in r:
            print(f"{scheme:9} {mode:14} {api:8}  not measured: {r['error']}")
        else:
            print(f"{scheme:9} {mode:14} {api:8}  send {r['send_rate']:9.0f} msg/s"
                  f"   receive {r['recv_rate']:9.0f} msg/s"
                  f"   lost {r['lost']} dup {r['duplicated']}"
                  + (f"   broker µs/msg: send loop {r['broker_send_us']:.1f}, receive loop {r['broker_recv_us']:.1f}"
                     if r.get("broker_recv_us") else ""))
    if "error" not in a and "error" not in b and b.get("send_rate") and b.get("recv_rate"):
        print(f"{scheme:9} {mode:14} {'aio/blk':8}  send {a['send_rate'] / b['send_rate']:9.2f}x        "
              f"receive {a['recv_rate'] / b['recv_rate']:9.2f}x")


def _print_against_base(url: str, persistent: bool, medians: dict) -> None:
    scheme = url.split("://")[0] + "://"
    mode = "persistent" if persistent else "non-persistent"
    for api in ("blocking", "aio"):
        new, base = medians.get(api, {}), medians.get(f"{api}@base", {})
        if "error" in base:
            print(f"{scheme:9} {mode:14} {api + '@base':14}  not measured: {base['error']}")
            continue
        if "error" in new or not base.get("send_rate") or not base.get("recv_rate"):
            continue
        print(f"{scheme:9} {mode:14} {api + '@base':14}  send {base['send_rate']:9.0f} msg/s   receive "
              f"{base['recv_rate']:9.0f} msg/s   new/base: send {new['send_rate'] / base['send_rate']:.2f}x  "
              f"receive {new['recv_rate'] / base['recv_rate']:.2f}x"
              + (f"   broker µs/msg of the receive loop {new['broker_recv_us']:.1f} / {base['broker_recv_us']:.1f}"
                 f" = {new['broker_recv_us'] / base['broker_recv_us']:.2f}x"
                 if new.get("broker_recv_us") and base.get("broker_recv_us") else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="vm://default")
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--queue", default=f"bench.sdk.{os.getpid()}")
    ap.add_argument("--text", action="store_true", help="send TextMessages (create_text_message) not bytes")
    ap.add_argument("--persistent", action="store_true",
                    help="PERSISTENT delivery (JMS default: every send waits for its receipt); else NON_PERSISTENT")
    ap.add_argument("--api", choices=("blocking", "aio"), default="blocking",
                    help="the blocking SDK (pymq) or the asyncio one (pymq.aio)")
    ap.add_argument("--compare", action="store_true",
                    help="blocking vs aio over stomp:// (a pymq-server started here) and vm://, both "
                         "persistence modes, with the aio/blocking ratio")
    ap.add_argument("--rounds", type=int, default=1, help="--compare: runs per pair, median shown")
    ap.add_argument("--baseline", help="--compare: a directory holding another build's pymq package, measured in "
                                       "the same rounds (this build's rate over its rate is printed)")
    ap.add_argument("--quick", action="store_true", help="2,000 messages, 3 s")
    ap.add_argument("--json", help="write the result as JSON to this file ('-' for stdout)")
    ap.add_argument("--broker-pid", type=int, default=0,
                    help="a pymq-server's pid: report its CPU per message during each loop (--compare sets it)")
    a = ap.parse_args(argv)
    global BROKER_PID
    BROKER_PID = a.broker_pid
    if a.quick:
        a.count, a.seconds = min(a.count, 2_000), 3.0
    if a.compare:
        return compare(a.quick, a.count, a.size, a.seconds, 1 if a.quick else a.rounds, a.baseline)
    try:
        r = (run_aio if a.api == "aio" else run)(a.url, a.count, a.size, a.seconds, a.queue, a.text,
                                                  a.persistent)
    except ImportError as e:
        r = {"url": a.url, "error": f"pymq SDK not importable: {e}"}
    except AttributeError as e:
        r = {"url": a.url, "error": f"pymq SDK API not there yet: {e}"}
    if a.json == "-":
        print(json.dumps(r))
    else:
        if "error" in r:
            print(f"sdk {a.url}: {r['error']}")
        else:
            print(f"sdk {r['api']:8} {r['url']:9} {'persistent' if r['persistent'] else 'non-persistent':14} "
                  f"send {r['send_rate']:9.0f} msg/s (cpu {r['send_cpu_pct']:.0f}%)   "
                  f"receive {r['recv_rate']:9.0f} msg/s (cpu {r['recv_cpu_pct']:.0f}%)   "
                  f"lost {r['lost']} dup {r['duplicated']}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(r, f, indent=2)
    if "error" in r:
        return 2
    return 1 if (r["lost"] or r["duplicated"]) else 0


if __name__ == "__main__":
    sys.exit(main())
