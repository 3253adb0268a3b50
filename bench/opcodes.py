"""The broker's Python bytecodes per message, per function: a cost figure neither the load nor timing moves.

    python bench/opcodes.py [--workload q-auto] [--json out.json] [--top 30]
    PYTHONPATH=<dir linking pymq, pymq_server> python bench/opcodes.py --json old.json   # another tree
    python bench/opcodes.py --compare old.json new.json                                  # per function
    python bench/opcodes.py --workers 2 --json w2.json     # the session of a 2-worker broker's owning worker

``--workload`` is any of bench_core's: q-auto (1->1 queue, auto-ack), q-client (client-individual, one ACK a
message), i1000 (q-client with a prefetch of 1,000: bench_brokers' i/in), q-cumulative, q-persist, topic4 (one
SEND to four auto-ack subscribers of a topic), d4 (4 producers and 4 auto-ack consumers on one queue:
bench_brokers' d/dn), m4 (4 queues, one producer and one consumer each: m/md;
with ``--workers 2`` each stream's sessions are those of its queue's owner).

Runs bench_core's workload (real sessions, no sockets) at 1,000 and 2,000 messages under ``sys.settrace``
with opcode events and counts the bytecodes each function executes; the difference over 1,000 is the cost of
one more message. Instruction counts under callgrind move by several thousand a message between runs of one
tree, because bench_core's wait for its deliveries polls the event loop a number of times that depends on
timing; the event loop's and the bench's own functions are counted apart here ("loop"), so the broker's
figure is the same run after run (±1 bytecode).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_core  # noqa: E402

#: files whose functions are the event loop's or the bench's, not the broker's
LOOP = frozenset({"base_events.py", "events.py", "selectors.py", "tasks.py", "bench_core.py", "selector_events.py",
                  "futures.py", "runners.py", "opcodes.py"})


def opcode_tracer(counts: collections.Counter[str]):  # type: ignore[no-untyped-def]
    """A ``sys.settrace`` function adding each executed bytecode to ``counts`` under ``file:function``."""
    def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        key = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"

        def local(frame, event, arg):  # type: ignore[no-untyped-def]
            if event == "opcode":
                counts[key] += 1
            return local
        return local
    return tracer


def count(workload: str, messages: int, workers: int = 1) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    tracer = opcode_tracer(counts)
    with tempfile.TemporaryDirectory() as tmp:
        sys.settrace(tracer)
        try:
            asyncio.run(bench_core.run_workload(workload, messages, tmp, workers))
        finally:
            sys.settrace(None)
    return counts


def split(per: dict[str, float]) -> tuple[float, float]:
    """(the broker's bytecodes per message, the loop's and the bench's)."""
    loop = sum(v for k, v in per.items() if k.split(":")[0] in LOOP)
    return sum(per.values()) - loop, loop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="q-auto")
    ap.add_argument("--workers", type=int, default=1,
                    help="> 1: the sessions of a multi-worker broker at the destination's owner (after a hand-over)")
    ap.add_argument("--json", help="write the per-function figures here")
    ap.add_argument("--top", type=int, default=0, help="print the N dearest functions")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="two --json files: per-function differences")
    a = ap.parse_args()
    if a.compare:
        old, new = (json.load(open(path)) for path in a.compare)
        rows = sorted(((new.get(k, 0) - old.get(k, 0), k) for k in set(old) | set(new)
                       if k.split(":")[0] not in LOOP), reverse=True)
        for delta, key in rows:
            if abs(delta) >= 1:
                print(f"{delta:+8.1f} {old.get(key, 0):8.1f} {new.get(key, 0):8.1f}  {key}")
        print(f"broker bytecodes per message: old {split(old)[0]:.0f}, new {split(new)[0]:.0f}")
        return
    small, large = count(a.workload, 1000, a.workers), count(a.workload, 2000, a.workers)
    per = {k: (large[k] - small[k]) / 1000 for k in set(small) | set(large)}
    broker, loop = split(per)
    print(f"{a.workload}: {broker:.0f} broker bytecodes per message (event loop and bench: {loop:+.0f})")
    for key, value in sorted(per.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"  {value:8.1f}  {key}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(per, fh, indent=0, sort_keys=True)


if __name__ == "__main__":
    main()
