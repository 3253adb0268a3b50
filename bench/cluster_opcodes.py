"""The Python bytecodes a cluster node executes per forwarded topic message, per function: the cost of a forward
on the node that sends it and on the node that receives it, a figure the machine's load does not move.

    eval "$(.ci/services.sh)"                                   # Redis: the cluster's membership
    python bench/cluster_opcodes.py [--baseline /tmp/old] [--delivered | --filtered | --queue | --fanout N] [--top 40]

Two real nodes (tests/cluster/nodes.py) in broadcast mode (``topic_filtering: false``: every topic message
goes to every peer, as in bench_cluster's broadcast part); one producer on n0 sends N non-persistent 128 B
messages to one topic (``--queue``: to a queue whose consumer is on n0, bench_cluster's ungrouped load,
where nothing is forwarded). Without ``--delivered`` nobody subscribes: n1 receives every message forwarded and
discards it (a filter's false positive); with it, a subscriber on n1 receives each. ``--filtered``: filters on
(``topic_filtering: true``, bench_cluster's filtered part) and a subscriber on n1, so that every message is
forwarded because n1's filter has the topic, and delivered there (warm-up messages are sent until n1 has one:
the filter reached n0 before the count starts); against ``--delivered`` (the same in broadcast mode) it adds
the filter's look-up. ``--fanout N``: filters on, N subscriptions to the topic on one connection to n0 and
none on n1 (the local fan-out that is most of bench_cluster's filters part: hundreds of subscriptions per
connection); the figure is per message, N deliveries. Each node process counts
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
        queue: bool = False, filtered: bool = False, fanout: int = 0) -> list[dict[str, int]]:
    """One 2-node cluster of ``tree``: the bytecodes per function of each node over ``messages`` forwards
    (``queue``: messages to a queue with a consumer on n0, which stay there: nothing forwarded; ``filtered``:
    filters on, a subscriber on n1)."""
    import pymq

    site = os.path.join(tmp, "site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as fh:
        fh.write(SITECUSTOMIZE)
    env = bench_cluster.tree_env(tree, os.path.join(tmp, label))
    env["PYTHONPATH"] = site + os.pathsep + env["PYTHONPATH"]
    # beats far apart: a traced node runs ~10x slower, and a link closed as silent would re-send its outbox
    cluster = bench_cluster.Cluster(tmp, label, redis, 2, env=env, topic_filtering=filtered or bool(fanout),
                                    heartbeat_ms=3000, dead_after_ms=60000)
    cluster.start()
    try:
        reader = consumer = None
        destination = pymq.Queue("bench.local") if queue else pymq.Topic("bench.forwarded")
        fans: list = []
        if fanout:
            reader = pymq.connect(f"stomp://127.0.0.1:{cluster.ports[0]}")
            fan_session = reader.create_session()
            fans = [fan_session.create_consumer(destination) for _ in range(fanout)]
        elif delivered or queue or filtered:
            reader = pymq.connect(f"stomp://127.0.0.1:{cluster.ports[0 if queue else 1]}")
            consumer = reader.create_session().create_consumer(destination)
        with pymq.connect(f"stomp://127.0.0.1:{cluster.ports[0]}") as conn:
            producer = conn.create_session().create_producer(destination)
            warm = 0
            if filtered:                # until n1's filter with the topic reached n0: its subscriber gets one
                assert consumer is not None
                deadline = time.monotonic() + 30
                while True:
                    producer.send(b"w", delivery_mode=pymq.NON_PERSISTENT)
                    warm += 1
                    if consumer.receive(0.2) is not None:
                        break
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{label}: n1's filter never reached n0")
                while consumer.receive(0.2) is not None:
                    pass
            before = cluster.status(1)
            for node in cluster.nodes:
                assert node.proc is not None
                os.kill(node.proc.pid, signal.SIGUSR1)          # our own child, by its handle's pid
            for _ in range(messages):
                producer.send(b"x" * 128, delivery_mode=pymq.NON_PERSISTENT)
            # the producer's connection stays open until everything arrived: a traced node reads slowly, and a
            # DISCONNECT unconfirmed within the SDK's 10 s closes the socket with SENDs still unread
            got = 0
            if fans and reader is not None:
                for fan in fans:            # (each subscriber's messages wait in its own buffer)
                    while got < messages * fanout and fan.receive(60) is not None:
                        got += 1
                        if got % messages == 0:
                            break
                reader.close()
            elif consumer is not None and reader is not None:
                while got < messages and consumer.receive(60) is not None:
                    got += 1
                reader.close()
            deadline = time.monotonic() + 120
            forwards = not queue and not fanout
            while forwards and cluster.status(1)["received_forwarded"] - before["received_forwarded"] < messages \
                    and time.monotonic() < deadline:
                time.sleep(0.1)
        figures = cluster.status(1)
        figures = {k: figures[k] - before[k] for k in ("received_forwarded", "discarded_false_positive")}
    finally:
        cluster.stop()
    want = messages if delivered or filtered else 0
    if queue or fanout:
        if got != messages * max(fanout, 1) or figures["received_forwarded"]:
            raise SystemExit(f"{label}: {got} of {messages} received, {figures['received_forwarded']} forwarded")
    elif figures["received_forwarded"] < messages or ((delivered or filtered) and got != messages) or \
            figures["discarded_false_positive"] != messages - want:
        raise SystemExit(f"{label}: received {figures['received_forwarded']}, discarded "
                         f"{figures['discarded_false_positive']}, delivered {got} of {messages}")
    if not queue and not fanout and figures["received_forwarded"] > messages:
        # a link that dropped under the tracer's slowness re-sends what it had in flight: duplicates, dropped
        print(f"{label}: {figures['received_forwarded'] - messages} forwards received twice (link re-sends)",
              file=sys.stderr)
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
    ap.add_argument("--filtered", action="store_true",
                    help="filters on and a subscriber on n1 (bench_cluster's filtered mode: forwards a filter passes)")
    ap.add_argument("--queue", action="store_true",
                    help="a queue with its consumer on n0 instead (bench_cluster's ungrouped load: nothing forwarded)")
    ap.add_argument("--fanout", type=int, default=0,
                    help="filters on, N subscriptions on one connection to n0, none on n1 (local fan-out)")
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
            runs = [run(tree, n, tmp, f"{name}{n}", redis, a.delivered, a.queue, a.filtered, a.fanout)
                    for n in (small, large)]
            figures[name] = [per_message(runs[0][i], runs[1][i], large - small) for i in range(2)]
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(figures, fh, indent=1, sort_keys=True)
    receiver = "n1: receives (" + ("delivers" if a.delivered or a.filtered else "discards") + ")"
    roles = (("n0: sends and receives (the producer's and consumer's node)", "n1: the other node")
             if a.queue or a.fanout
             else ("n0: forwards (the producer's node" + (", through n1's filter)" if a.filtered else ")"),
                   receiver))
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
