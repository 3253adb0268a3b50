"""The Python bytecodes a cluster node executes per forwarded topic message, per function: the cost of a forward
on the node that sends it and on the node that receives it, a figure the machine's load does not move.

    eval "$(.ci/services.sh)"                                   # Redis: the cluster's membership
    python bench/cluster_opcodes.py [--baseline /tmp/old] [--delivered] [--top 40]

Two real nodes (tests/cluster/nodes.py) in broadcast mode (``topic_filtering: false``: every topic message
goes to every peer, as in bench_cluster's broadcast part); one producer on n0 sends N non-persistent 128 B
messages to one topic (``--queue``: to a queue whose consumer is on n0, bench_cluster's ungrouped load,
where nothing is forwarded). Without ``--delivered`` nobody subscribes: n1 receives every message forwarded and
discards it (a filter's false positive); with it, a subscriber on n1 receives each. Each node process counts
the bytecodes of every function (``sys.settrace`` with opcode events, from a SIGUSR1 sent once the cluster has
formed, written at exit); a run at 1,000 and one at 3,000 messages, the difference over 2,000 is one more
message. Compiled code (the Cython twins) is not counted, the same in both trees; the heartbeat's functions
run per second, not per message, and stay near 0. ``--baseline TREE`` runs another checkout's broker the same
way (its own compiled modules: see bench_cluster.py's ``tree_env``) and prints old, new and the difference.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_cluster  # noqa: E402

#: started in each node process (its sitecustomize): counts per function from SIGUSR1 on, dumped at exit
SITECUSTOMIZE = '''
import atexit, collections, json, os, signal, sys
_counts = collections.Counter()

def _tracer(frame, event, arg):
    frame.f_trace_opcodes = True
    frame.f_trace_lines = False
    code = frame.f_code
    key = os.path.basename(code.co_filename) + ":" + code.co_name

    def local(frame, event, arg):
        if event == "opcode":
            _counts[key] += 1
        return local
    return local

signal.signal(signal.SIGUSR1, lambda signum, frame: sys.settrace(_tracer))

def _dump():
    sys.settrace(None)
    with open(os.path.join(os.getcwd(), "opcodes.json"), "w") as fh:
        json.dump(_counts, fh)
atexit.register(_dump)
'''


def run(tree: str, messages: int, tmp: str, label: str, redis: str, delivered: bool,
        queue: bool = False) -> list[dict[str, int]]:
    """One 2-node cluster of ``tree``: the bytecodes per function of each node over ``messages`` forwards
    (``queue``: messages to a queue with a consumer on n0, which stay there: nothing forwarded)."""
    import pymq

    site = os.path.join(tmp, "site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as fh:
        fh.write(SITECUSTOMIZE)
    env = bench_cluster.tree_env(tree, os.path.join(tmp, label))
    env["PYTHONPATH"] = site + os.pathsep + env["PYTHONPATH"]
    cluster = bench_cluster.Cluster(tmp, label, redis, 2, env=env, topic_filtering=False)
    cluster.start()
    try:
        reader = consumer = None
        destination = pymq.Queue("bench.local") if queue else pymq.Topic("bench.forwarded")
        if delivered or queue:
            reader = pymq.connect(f"stomp://127.0.0.1:{cluster.ports[0 if queue else 1]}")
            consumer = reader.create_session().create_consumer(destination)
        for node in cluster.nodes:
            assert node.proc is not None
            os.kill(node.proc.pid, signal.SIGUSR1)          # our own child, by its handle's pid
        with pymq.connect(f"stomp://127.0.0.1:{cluster.ports[0]}") as conn:
            producer = conn.create_session().create_producer(destination)
            for _ in range(messages):
                producer.send(b"x" * 128, delivery_mode=pymq.NON_PERSISTENT)
        got = 0
        if consumer is not None and reader is not None:
            while got < messages and consumer.receive(10) is not None:
                got += 1
            reader.close()
        deadline = time.monotonic() + 60
        while not queue and cluster.status(1)["received_forwarded"] < messages and time.monotonic() < deadline:
            time.sleep(0.1)
        figures = cluster.status(1)
    finally:
        cluster.stop()
    want = messages if delivered else 0
    if queue:
        if got != messages or figures["received_forwarded"]:
            raise SystemExit(f"{label}: {got} of {messages} received, {figures['received_forwarded']} forwarded")
    elif figures["received_forwarded"] != messages or (delivered and got != messages) or \
            figures["discarded_false_positive"] != messages - want:
        raise SystemExit(f"{label}: received {figures['received_forwarded']}, discarded "
                         f"{figures['discarded_false_positive']}, delivered {got} of {messages}")
    out = []
    for node in cluster.nodes:
        with open(os.path.join(node.data_dir, "opcodes.json")) as fh:
            out.append(json.load(fh))
    return out


def per_message(small: dict[str, int], large: dict[str, int], extra: int) -> dict[str, float]:
    return {k: (large.get(k, 0) - small.get(k, 0)) / extra for k in set(small) | set(large)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="another checkout whose broker is counted the same way (old)")
    ap.add_argument("--delivered", action="store_true", help="a subscriber on n1 (else every forward is discarded)")
    ap.add_argument("--queue", action="store_true",
                    help="a queue with its consumer on n0 instead (bench_cluster's ungrouped load: nothing forwarded)")
    ap.add_argument("--messages", type=int, nargs=2, default=[1000, 3000])
    ap.add_argument("--top", type=int, default=40, help="functions shown per node, by the largest figure")
    ap.add_argument("--json", help="write the per-message figures here")
    a = ap.parse_args()
    redis = os.environ.get("PYMQ_TEST_REDIS_URL")
    if not redis:
        raise SystemExit("needs Redis: eval \"$(.ci/services.sh)\"")
    trees = [("new", os.path.dirname(HERE))]
    if a.baseline:
        bench_cluster.baseline_extensions(os.path.abspath(a.baseline))
        trees.append(("old", os.path.abspath(a.baseline)))
    small, large = a.messages
    figures: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, tree in trees:
            runs = [run(tree, n, tmp, f"{name}{n}", redis, a.delivered, a.queue) for n in (small, large)]
            figures[name] = [per_message(runs[0][i], runs[1][i], large - small) for i in range(2)]
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(figures, fh, indent=1, sort_keys=True)
    receiver = "n1: receives (" + ("delivers" if a.delivered else "discards") + ")"
    roles = (("n0: sends and receives (the producer's and consumer's node)", "n1: the other node") if a.queue
             else ("n0: forwards (the producer's node)", receiver))
    for i, role in enumerate(roles):
        new = figures["new"][i]
        old = figures["old"][i] if "old" in figures else {}
        print(f"== {role}: bytecodes per message, new {sum(new.values()):,.0f}"
              + (f", old {sum(old.values()):,.0f}" if old else ""))
        keys = sorted(set(new) | set(old), key=lambda k: -max(abs(new.get(k, 0)), abs(old.get(k, 0))))
        for k in keys[:a.top]:
            n, o = new.get(k, 0.0), old.get(k, 0.0)
            print(f"{n:8.1f}" + (f" {o:8.1f} {n - o:+8.1f}" if old else "") + f"  {k}")


if __name__ == "__main__":
    main()
