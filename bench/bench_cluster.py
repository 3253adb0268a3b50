"""Cluster benchmarks of the cluster issue: topic filters against broadcast, and throughput on 1-3 nodes.

    eval "$(.ci/services.sh)"     # a private Redis for membership (exports PYMQ_TEST_REDIS_URL)
    python bench/bench_cluster.py [--quick] [--parts filters,throughput] [--redis URL] [--json out.json]
                                  [--baseline TREE]

Every node is a real `pymq-server` process (tests/cluster/nodes.py) in a cluster of its own name; the
membership lives in Redis.

filters     4 nodes, 10,000 topics with Zipf popularity (exponent 1): S subscriptions, each on a topic
            drawn from that distribution, spread round-robin over the nodes and over 4 STOMP connections
            per node; M messages, each on a topic drawn from the same distribution, published by one
            producer per node at a fixed pace. The same layout and stream run on a cluster with
            `topic_filtering: true` (bloom filters at the configured size: filter_capacity 10,000,
            filter_fpr 0.01), on one with `topic_filtering: false` (broadcast: every topic message to
            every peer) and, in the full run, on one whose filters are sized to the topics a node holds
            (filter_capacity = the largest node's distinct topics), where the false-positive rate is the
            design rate. Inter-node traffic is counted twice: by the nodes (admin `cluster` operation:
            forwarded, forwarded_topic_messages, received_forwarded, discarded_false_positive) and on the
            wire: each node advertises a small TCP proxy (run by this bench) in front of it, so every
            link to that node passes through it; the proxy splits the byte stream into frames and counts
            forwarded-message frames, control frames (filters, consumer maps), receipts and heart-beat
            bytes. Every subscription must get every message on its topic exactly once.
throughput  The same queue load (6 producers, 6 consumers, spread evenly over the nodes; 128 B,
            non-persistent, 1,000 in flight per producer) on clusters of 1, 2 and 3 nodes, started
            together and loaded one at a time; ungrouped, and grouped (60 JMSXGroupID values, so a
            message goes to the node its group hashes to). msg/s, the whole cluster's CPU per message,
            forwarded messages, and the ratio to 1 node.

--baseline TREE: every cluster also runs with the broker of another checkout (say `git worktree add --detach
/tmp/old <commit>`), its nodes started next to this tree's, loaded in turns, and each figure is shown for
both with the ratio new/old. The baseline runs with this tree's compiled modules when its _ext/ sources
are the same (copied in), else with its pure-Python twins (said in the output).

Exit status: 1 if a message was lost, duplicated or misrouted, or on a harness error; never because of
speed. Without Redis the bench says so and exits 0 (1 when CI is set). Never run by pytest.
"""
from __future__ import annotations

import argparse
import array
import asyncio
import bisect
import itertools
import json
import math
import multiprocessing as mp
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))      # the repo: tests.cluster.nodes starts the nodes

from loadclient import (Endpoint, FrameReader, LoadSpec, RunResult, _new_loop, _produce,  # noqa: E402
                        close_connection, encode_frame, open_connection, run_load, uvloop)
from peers import cpu_seconds, free_port, machine_busy_seconds  # noqa: E402
from tests.cluster.nodes import Node  # noqa: E402

SIZE = 128
TOPICS = 10_000
SECRET = "bench-cluster-secret"


def tree_env(tree: str, tmp: str) -> dict[str, str]:
    """The environment that makes a node process import pymq and pymq_server from checkout ``tree``
    (PYTHONPATH ahead of the editable install's finder; the node's working directory is its data dir)."""
    shim = os.path.join(tmp, "baseline-path")
    os.makedirs(shim, exist_ok=True)
    for name, where in (("pymq", "pymq"), ("pymq_server", "server")):
        link = os.path.join(shim, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(tree, where), link)
    return {**os.environ, "PYTHONPATH": shim}


def baseline_extensions(tree: str) -> str:
    """Give ``tree`` this tree's compiled modules when both build them from the same _ext/ sources; says
    which the baseline runs with."""
    here = os.path.dirname(HERE)

    def sources(root: str) -> dict[str, bytes]:
        ext = os.path.join(root, "_ext")
        out = {}
        for f in sorted(os.listdir(ext)):
            if f.endswith(".pyx"):
                with open(os.path.join(ext, f), "rb") as fh:
                    out[f] = fh.read()
        return out
    if sources(here) != sources(tree):
        built = [f for top in ("pymq", "server") for _, _, files in os.walk(os.path.join(tree, top))
                 for f in files if f.endswith(".so") and "_c." in f]
        if built:
            return f"its own compiled modules ({len(built)} built there: its _ext/*.pyx differ from this tree's)"
        return "its pure-Python twins (its _ext/*.pyx differ from this tree's, and it has none built)"
    copied = 0
    for top, target in (("pymq", "pymq"), ("server", "server")):
        for dirpath, _, files in os.walk(os.path.join(here, top)):
            for f in files:
                if f.endswith(".so") and "_c." in f:
                    inside = os.path.relpath(os.path.join(dirpath, f), os.path.join(here, top))
                    dest = os.path.join(tree, target, inside)
                    if not os.path.exists(dest) and os.path.isdir(os.path.dirname(dest)):
                        subprocess.run(["cp", os.path.join(dirpath, f), dest], check=True)
                        copied += 1
    return f"the same compiled modules as this tree ({copied} copied in)"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def admin(port: int, op: str, **args):
    """One admin operation over the SDK, on a short connection of its own (no SDK thread across a fork)."""
    import pymq

    with pymq.connect(f"stomp://127.0.0.1:{port}") as conn:
        return conn.queue_manager().call(op, timeout=60, **args)


# ------------------------------------------------------------------------------------------- clusters
class Cluster:
    """n real nodes with their own cluster name; started, checked formed, stopped (by pid)."""

    def __init__(self, tmp: str, label: str, redis: str, n: int, *, advertise: list[int] | None = None,
                 env: dict[str, str] | None = None, tree: str = "new", **settings) -> None:
        self.label = label
        self.tree = tree                 # "new" (this checkout) or "old" (--baseline)
        self.name = f"bench-{os.getpid()}-{int(time.time() * 1000) % 10**8}-{label}"
        self.ports = [free_port() for _ in range(n)]
        cfg = {"store": redis, "secret": SECRET, "name": self.name,
               # generous on a busy 2-core machine: a late beat must not look like a death
               "heartbeat_ms": 1000, "dead_after_ms": 15000, **settings}
        self.nodes = []
        for i in range(n):
            node_cfg = dict(cfg)
            if advertise:
                node_cfg["advertise"] = f"127.0.0.1:{advertise[i]}"
            self.nodes.append(Node(f"n{i}", os.path.join(tmp, label, f"n{i}"), node_cfg,
                                   {"log_level": "WARNING"}, env=env))

    def start(self, timeout: float = 60) -> Cluster:
        for node, port in zip(self.nodes, self.ports, strict=True):
            node.start(port)
        ids = {n.node_id for n in self.nodes}
        deadline = time.monotonic() + timeout
        while True:
            st = [self.status(i) for i in range(len(self.nodes))]
            if all(set(s["members"]) == ids and len(s["links"]) == len(ids) - 1 and all(s["links"].values())
                   for s in st):
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster {self.label} did not form within {timeout:.0f} s: "
                                   f"{[(s['members'], s['links']) for s in st]}")
            time.sleep(0.2)

    def status(self, i: int) -> dict:
        return admin(self.ports[i], "cluster")

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint("127.0.0.1", p) for p in self.ports]

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(n.proc.pid) for n in self.nodes if n.proc is not None)

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)      # our own child, by its handle
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                node.proc.wait(30)
            except subprocess.TimeoutExpired:
                node.kill()


# ---------------------------------------------------------------------------------------------- proxy
# Counters per node, in one shared array (the proxy process writes, the bench reads).
(BYTES_TO, BYTES_FROM, FWD_FRAMES, FWD_BYTES, CTL_FRAMES, CTL_BYTES, RCPT_FRAMES, RCPT_BYTES,
 OTHER_FRAMES, LINKS) = range(10)
NCOUNT = 10


def _proxy_main(listen: list[int], targets: list[int], counters, ready) -> None:
    """One TCP proxy per node, in front of it: peers reach the node through it (its advertised address),
    so every inter-node byte passes here and is counted, split into frames with the load client's reader."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    loop = _new_loop()
    asyncio.set_event_loop(loop)

    async def pump(src, dst, node: int, inbound: bool) -> None:
        base = node * NCOUNT
        reader = FrameReader()
        try:
            while data := await src.read(1 << 16):
                dst.write(data)
                counters[base + (BYTES_TO if inbound else BYTES_FROM)] += len(data)
                reader.feed(data)
                for command, headers, _ in reader.frames():
                    size = reader.last_size
                    if inbound and command == b"SEND" and b"pymq-forwarded" in headers:
                        counters[base + FWD_FRAMES] += 1
                        counters[base + FWD_BYTES] += size
                    elif (inbound and command == b"SEND"
                          and headers.get(b"destination", b"").startswith(b"/pymq/cluster/")):
                        counters[base + CTL_FRAMES] += 1
                        counters[base + CTL_BYTES] += size
                    elif not inbound and command == b"RECEIPT":
                        counters[base + RCPT_FRAMES] += 1
                        counters[base + RCPT_BYTES] += size
                    else:
                        counters[base + OTHER_FRAMES] += 1
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    async def serve(node: int):
        async def handle(reader, writer):
            counters[node * NCOUNT + LINKS] += 1
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", targets[node])
            except OSError:
                writer.close()
                return
            await asyncio.gather(pump(reader, up_writer, node, True), pump(up_reader, writer, node, False))

        return await asyncio.start_server(handle, "127.0.0.1", listen[node])

    async def main():
        servers = [await serve(i) for i in range(len(listen))]
        ready.set()
        await asyncio.Event().wait()       # until the bench kills this process
        for s in servers:
            s.close()

    loop.run_until_complete(main())


class Proxies:
    def __init__(self, n: int) -> None:
        self.ctx = mp.get_context("fork")
        self.listen = [free_port() for _ in range(n)]
        self.targets: list[int] = []
        self.counters = self.ctx.Array("q", n * NCOUNT, lock=False)
        self.proc = None

    def start(self, targets: list[int]) -> None:
        ready = self.ctx.Event()
        self.proc = self.ctx.Process(target=_proxy_main, args=(self.listen, targets, self.counters, ready),
                                     daemon=True)
        self.proc.start()
        if not ready.wait(30):
            raise RuntimeError("the link proxies did not start")

    def snapshot(self) -> list[list[int]]:
        c = self.counters[:]
        return [c[i * NCOUNT:(i + 1) * NCOUNT] for i in range(len(self.listen))]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()                  # our own child, by its handle
            self.proc.join(5)


# ------------------------------------------------------------------------------------ filters workload
@dataclass
class Layout:
    """Who subscribes to what where, and what is published where: the same for every cluster mode."""

    nodes: int
    conns_per_node: int
    sub_topic: list        # subscription index -> topic rank
    sub_node: list
    sub_conn: list         # connection index within its node
    stream: list           # producer (= node) -> [topic rank of message seq]

    def topic_name(self, rank: int) -> str:
        return f"zipf.t{rank:05d}"

    @property
    def per_producer(self) -> int:
        return len(self.stream[0])

    def node_topics(self, node: int) -> set:
        return {t for t, n in zip(self.sub_topic, self.sub_node, strict=True) if n == node}


def make_layout(nodes: int, subscriptions: int, messages: int, zipf_s: float, seed: int = 4) -> Layout:
    rng = random.Random(seed)
    cum = list(itertools.accumulate(1.0 / (r ** zipf_s) for r in range(1, TOPICS + 1)))

    def draw(k: int) -> list:
        return [bisect.bisect_left(cum, rng.random() * cum[-1]) + 1 for _ in range(k)]

    sub_topic = draw(subscriptions)
    sub_node = [i % nodes for i in range(subscriptions)]
    conns = 4
    sub_conn = [(i // nodes) % conns for i in range(subscriptions)]
    per = messages // nodes
    return Layout(nodes, conns, sub_topic, sub_node, sub_conn, [draw(per) for _ in range(nodes)])


class _SubTally:
    """All the subscriptions of one connection: which message (producer, sequence) each one got."""

    def __init__(self, per_producer: int, counter, slot: int) -> None:
        self.per = per_producer
        self.got: dict[int, array.array] = {}
        self.received = 0
        self.bad = 0
        self.counter, self.slot = counter, slot

    def __call__(self, headers, body, now):
        try:
            sid = int(headers[b"subscription"][1:])
            g = int(body[0:4]) * self.per + int(body[4:16])
        except (KeyError, ValueError):
            self.bad += 1
            return
        got = self.got.get(sid)
        if got is None:
            got = self.got[sid] = array.array("q")
        got.append(g)
        self.received += 1

    def flush(self, conn) -> None:
        self.counter[self.slot] = self.received


async def _subscribers(plan: list, per_producer: int, shared, ready, done, hard_deadline: float) -> dict:
    """plan: [(endpoint, [(sid, destination), ...], expected deliveries)] for this process's connections.
    Sets `done` once everything expected arrived (or it gave up), and leaves only on `shared.release`:
    the subscriptions leaving change the filters, and that traffic is not the stream's."""
    conns, tallies = [], []
    for slot, (ep, subs, _) in enumerate(plan):
        tally = _SubTally(per_producer, shared.received, shared.slot0 + slot)
        conn = await open_connection(ep, on_message=tally)
        # Frames are handled in order: the receipt on the last SUBSCRIBE confirms them all.
        fut = conn.expect_receipt("subscribed")
        conn.write(b"".join(encode_frame("SUBSCRIBE", {"id": f"s{sid}", "destination": dest, "ack": "auto",
                                                       **({"receipt": "subscribed"} if i == len(subs) - 1 else {})})
                            for i, (sid, dest) in enumerate(subs)))
        await asyncio.wait_for(fut, 120)
        conns.append(conn)
        tallies.append(tally)
    ready.set()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, shared.go.wait, 600)
    t0 = time.monotonic()
    expected = sum(e for _, _, e in plan)
    last, last_n, gave_up = time.monotonic(), -1, ""
    while True:
        await asyncio.sleep(0.05)
        n = sum(t.received for t in tallies)
        now = time.monotonic()
        if n != last_n:
            last, last_n = now, n
        if n >= expected and shared.producers_done.is_set():
            break
        if shared.producers_done.is_set() and now - last > 30:
            gave_up = "no delivery for 30 s after the producers finished"
            break
        if now - t0 > hard_deadline:
            gave_up = f"hard deadline of {hard_deadline:.0f} s"
            break
    await asyncio.sleep(0.3)      # a late duplicate would still be counted
    done.set()
    await loop.run_in_executor(None, shared.release.wait, 600)
    for conn in conns:
        conn.on_message = None
        await close_connection(conn, timeout=10)
    got: dict[int, bytes] = {}
    for t in tallies:
        for sid, arr in t.got.items():
            got[sid] = got.get(sid, b"") + arr.tobytes()
    return {"got": got, "received": sum(t.received for t in tallies), "bad": sum(t.bad for t in tallies),
            "gave_up": gave_up, "errors": [c.error for c in conns if c.error]}


async def _publishers(eps: list[Endpoint], specs: list[LoadSpec], shared) -> dict:
    await asyncio.get_running_loop().run_in_executor(None, shared.go.wait, 600)
    result: dict = {}
    fake = SimpleNamespace(sent=[0] * len(eps), received=[0])     # paced by rate: no window
    start = time.monotonic_ns()
    await asyncio.gather(*(_produce(ep, spec, pid, start, result, fake) for pid, (ep, spec) in
                           enumerate(zip(eps, specs, strict=True))))
    return result


def _child(target, args, out_q, kind: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    try:
        out_q.put((kind, loop.run_until_complete(target(*args)), None))
    except BaseException as e:  # noqa: BLE001 - a child reports any error to the parent (a harness error)
        out_q.put((kind, None, f"{type(e).__name__}: {e}"))


@dataclass
class FilterRun:
    mode: str                    # filtered | broadcast | sized
    filter_capacity: int = 0
    filter_fpr: float = 0.0
    published: int = 0
    deliveries_expected: int = 0
    deliveries: int = 0
    lost: int = 0
    duplicated: int = 0
    misrouted: int = 0
    malformed: int = 0
    forwarded_messages: int = 0       # topic messages forwarded to at least one peer (sum over nodes)
    forwarded_frames: int = 0         # copies sent to peers, confirmed (sum of `forwarded`)
    received_forwarded: int = 0
    discarded_false_positive: int = 0
    wire_fwd_frames: int = 0
    wire_fwd_bytes: int = 0
    wire_ctl_frames: int = 0
    wire_ctl_bytes: int = 0
    wire_receipt_bytes: int = 0
    wire_bytes_total: int = 0         # both directions, heart-beats included
    setup_ctl_frames: int = 0         # control frames while the subscriptions were made (filter digests)
    setup_ctl_bytes: int = 0
    negatives: int = 0                # (message, peer) pairs where the peer has no subscription on the topic
    positives: int = 0                # ... where it has one
    popular_topics: int = 0
    fp_over_received: float = 0.0
    fp_over_negatives: float = 0.0
    expected_fpr: float = 0.0         # (1 - e^(-kn/m))^k for the largest node's topic count
    predicted_fp: int = 0             # false positives of the same filters built here (pymq.routing)
    universe_fpr: float = 0.0         # those filters' false-positive rate over all 10,000 topics
    elapsed_s: float = 0.0
    cluster_cpu_s: float = 0.0
    per_node: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    tree: str = "new"                 # new (this checkout) | old (--baseline)

    @property
    def failed(self) -> bool:
        return bool(self.lost or self.duplicated or self.misrouted or self.malformed or self.errors)


def expected_fpr(topics: int, capacity: int, fpr: float) -> float:
    from pymq.routing._bloom_py import optimal_parameters

    m, k = optimal_parameters(capacity, fpr)
    return (1 - math.exp(-k * topics / m)) ** k


def predict_false_positives(layout: Layout, sent: dict, capacity: int, fpr: float) -> tuple[int, float]:
    """Build each node's filter as the node does (pymq.routing.SubscriptionFilter, the specified hash) and
    count the forwards it would let through to a peer without a subscriber: the broker's
    discarded_false_positive should be exactly this. Also the filters' rate over the whole topic universe."""
    from pymq.routing import SubscriptionFilter

    n = layout.nodes
    topics = [layout.node_topics(i) for i in range(n)]
    filters = []
    for mine in topics:
        f = SubscriptionFilter.for_capacity(capacity, fpr)
        for t in mine:
            f.add(layout.topic_name(t))
        filters.append(f)
    predicted = 0
    for origin, stream in enumerate(layout.stream):
        for t in stream[: sent.get(origin, 0)]:
            name = layout.topic_name(t)
            predicted += sum(1 for peer in range(n) if peer != origin and t not in topics[peer]
                             and filters[peer].might_contain(name))
    hits = negatives = 0
    for mine, f in zip(topics, filters, strict=True):
        for t in range(1, TOPICS + 1):
            if t not in mine:
                negatives += 1
                hits += f.might_contain(layout.topic_name(t))
    return predicted, hits / negatives if negatives else 0.0


def run_filters(tmp: str, redis: str, layout: Layout, mode: str, rate: float, settings: dict,
                tree: str = "new", env: dict[str, str] | None = None) -> FilterRun:
    res = FilterRun(mode, settings.get("filter_capacity", 10_000), settings.get("filter_fpr", 0.01), tree=tree)
    n = layout.nodes
    proxies = Proxies(n)
    cluster = Cluster(tmp, f"filters-{mode}-{tree}", redis, n, advertise=proxies.listen, env=env, tree=tree,
                      **settings)
    ctx = mp.get_context("fork")
    out_q = ctx.Queue()
    procs: list = []
    try:
        proxies.start(cluster.ports)
        cluster.start()
        # -- subscriptions: 4 connections per node, two subscriber processes
        per_conn: dict[tuple, list] = {}
        subscriptions = zip(layout.sub_topic, layout.sub_node, layout.sub_conn, strict=True)
        for sid, (topic, node, conn) in enumerate(subscriptions):
            per_conn.setdefault((node, conn), []).append((sid, "/topic/" + layout.topic_name(topic)))
        msgs_on: dict[int, int] = {}
        for producer in layout.stream:
            for t in producer:
                msgs_on[t] = msgs_on.get(t, 0) + 1
        eps = cluster.endpoints()
        plan = [(eps[node], subs, sum(msgs_on.get(layout.sub_topic[sid], 0) for sid, _ in subs))
                for (node, _), subs in sorted(per_conn.items())]
        res.deliveries_expected = sum(e for _, _, e in plan)
        shared = SimpleNamespace(go=ctx.Event(), producers_done=ctx.Event(), release=ctx.Event(),
                                 received=ctx.Array("q", len(plan), lock=False), slot0=0)
        halves = [plan[: len(plan) // 2], plan[len(plan) // 2:]]
        readies, dones = [], []
        hard = 120 + layout.per_producer * n / rate * 2
        setup0 = proxies.snapshot()
        for i, part in enumerate(halves):
            ready, done = ctx.Event(), ctx.Event()
            readies.append(ready)
            dones.append(done)
            sh = SimpleNamespace(**{**vars(shared), "slot0": 0 if i == 0 else len(halves[0])})
            p = ctx.Process(target=_child, args=(_subscribers, (part, layout.per_producer, sh, ready, done, hard),
                                                 out_q, f"subscribers{i}"), daemon=True)
            procs.append(p)
            p.start()
        for ev in readies:
            if not ev.wait(300):
                raise RuntimeError("the subscribers did not subscribe within 300 s")
        # Every node's filter holds its topics, and the digests have gone out: control traffic settles.
        want = [len(layout.node_topics(i)) for i in range(n)]
        deadline = time.monotonic() + 60
        while [len(cluster.status(i)["filter_topics"]) for i in range(n)] != want:
            if time.monotonic() > deadline:
                raise RuntimeError("the nodes' filters did not reach their subscriptions within 60 s")
            time.sleep(0.2)
        stable, last = 0, None
        while stable < 5:
            ctl = [c[CTL_FRAMES] for c in proxies.snapshot()]
            stable = stable + 1 if ctl == last else 0
            last = ctl
            time.sleep(0.1)
        before = [cluster.status(i) for i in range(n)]
        wire0 = proxies.snapshot()
        res.setup_ctl_frames = sum(b[CTL_FRAMES] - a[CTL_FRAMES] for a, b in zip(setup0, wire0, strict=True))
        res.setup_ctl_bytes = sum(b[CTL_BYTES] - a[CTL_BYTES] for a, b in zip(setup0, wire0, strict=True))
        cpu0 = cluster.cpu_seconds()
        # -- the stream: one producer per node, paced
        specs = [LoadSpec(destination="/topic/zipf.unused", size=SIZE, count=layout.per_producer, duration=3600,
                          rate=rate / n, max_in_flight=0, idle_timeout=60.0,
                          rotate_send_headers=[{"destination": "/topic/" + layout.topic_name(t)} for t in stream])
                 for stream in layout.stream]
        p = ctx.Process(target=_child, args=(_publishers, (eps, specs, shared), out_q, "publishers"), daemon=True)
        procs.append(p)
        p.start()
        t0 = time.monotonic()
        shared.go.set()
        reports: dict = {}
        kind, payload, err = out_q.get(timeout=hard + 120)
        if err:
            raise RuntimeError(f"{kind}: {err}")
        reports[kind] = payload
        shared.producers_done.set()
        for ev in dones:
            if not ev.wait(hard + 60):
                raise RuntimeError("the subscribers neither finished nor gave up")
        res.elapsed_s = time.monotonic() - t0
        deadline = time.monotonic() + 60
        while any(any(cluster.status(i)["outboxes"].values()) for i in range(n)):
            if time.monotonic() > deadline:
                res.errors.append("outboxes not empty 60 s after the stream")
                break
            time.sleep(0.2)
        res.cluster_cpu_s = cluster.cpu_seconds() - cpu0
        after = [cluster.status(i) for i in range(n)]
        wire1 = proxies.snapshot()
        shared.release.set()
        while len(reports) < 3:
            kind, payload, err = out_q.get(timeout=120)
            if err:
                raise RuntimeError(f"{kind}: {err}")
            reports[kind] = payload
        pubs = reports["publishers"]
        sent = {pid: r["sent"] for pid, r in pubs.items()}
        res.published = sum(sent.values())
        if res.published != layout.per_producer * n:
            res.errors.append(f"published {res.published} of {layout.per_producer * n} (deadline?)")
        _check_deliveries(res, layout, [reports["subscribers0"], reports["subscribers1"]])
        # -- inter-node figures
        for i in range(n):
            d = {k: after[i][k] - before[i][k] for k in ("forwarded", "forwarded_topic_messages",
                                                          "received_forwarded", "discarded_false_positive")}
            w = [b - a for a, b in zip(wire0[i], wire1[i], strict=True)]
            d.update(node=f"n{i}", subscriptions=sum(1 for x in layout.sub_node if x == i),
                     topics=want[i], popular=len(after[i]["popular"]), wire_fwd_frames_in=w[FWD_FRAMES],
                     wire_fwd_bytes_in=w[FWD_BYTES], wire_ctl_bytes_in=w[CTL_BYTES],
                     wire_bytes_in=w[BYTES_TO], wire_bytes_out=w[BYTES_FROM])
            res.per_node.append(d)
            res.forwarded_messages += d["forwarded_topic_messages"]
            res.forwarded_frames += d["forwarded"]
            res.received_forwarded += d["received_forwarded"]
            res.discarded_false_positive += d["discarded_false_positive"]
            res.wire_fwd_frames += w[FWD_FRAMES]
            res.wire_fwd_bytes += w[FWD_BYTES]
            res.wire_ctl_frames += w[CTL_FRAMES]
            res.wire_ctl_bytes += w[CTL_BYTES]
            res.wire_receipt_bytes += w[RCPT_BYTES]
            res.wire_bytes_total += w[BYTES_TO] + w[BYTES_FROM]
            res.popular_topics = max(res.popular_topics, d["popular"])
        # (message, peer) pairs: does the peer have a subscription on the message's topic?
        node_topics = [layout.node_topics(i) for i in range(n)]
        for origin, stream in enumerate(layout.stream):
            for t in stream[: sent.get(origin, 0)]:
                for peer in range(n):
                    if peer != origin:
                        if t in node_topics[peer]:
                            res.positives += 1
                        else:
                            res.negatives += 1
        if res.received_forwarded:
            res.fp_over_received = res.discarded_false_positive / res.received_forwarded
        if res.negatives:
            res.fp_over_negatives = res.discarded_false_positive / res.negatives
        if settings.get("topic_filtering", True):
            res.expected_fpr = expected_fpr(max(want), res.filter_capacity, res.filter_fpr)
            res.predicted_fp, res.universe_fpr = predict_false_positives(layout, sent, res.filter_capacity,
                                                                         res.filter_fpr)
        log(f"  {mode:9}: {res.published:,} published, {res.deliveries:,}/{res.deliveries_expected:,} deliveries, "
            f"{res.received_forwarded:,} forwarded copies received ({res.wire_fwd_bytes:,} B of forwarded frames), "
            f"{res.discarded_false_positive:,} discarded" + _faults(res))
    # node start, SDK, a child's error, queue.Empty: any of them is a harness error, reported with the run
    except Exception as e:  # noqa: BLE001 - recorded in the run's errors; the other runs go on
        res.errors.append(f"{type(e).__name__}: {e}")
    finally:
        for p in procs:            # our own children, by their handles
            if p.is_alive():
                p.kill()
            p.join(5)
        cluster.stop()
        proxies.stop()
    return res


def _faults(res) -> str:
    return ((f"  LOST {res.lost}" if res.lost else "") + (f"  DUP {res.duplicated}" if res.duplicated else "")
            + (f"  MISROUTED {res.misrouted}" if res.misrouted else "")
            + (f"  ERRORS {res.errors}" if res.errors else ""))


def _check_deliveries(res: FilterRun, layout: Layout, reports: list) -> None:
    """Every subscription must have every message on its topic, once, and nothing else."""
    per = layout.per_producer
    on_topic: dict[int, list] = {}
    for pid, stream in enumerate(layout.stream):
        for seq, t in enumerate(stream):
            on_topic.setdefault(t, []).append(pid * per + seq)
    got: dict[int, array.array] = {}
    for r in reports:
        res.deliveries += r["received"]
        res.malformed += r["bad"]
        if r["gave_up"]:
            res.errors.append(f"subscribers stopped waiting: {r['gave_up']}")
        res.errors += [f"subscriber connection: {e}" for e in r["errors"]]
        for sid, raw in r["got"].items():
            a = array.array("q")
            a.frombytes(raw)
            got.setdefault(sid, array.array("q")).extend(a)
    for sid, topic in enumerate(layout.sub_topic):
        want = set(on_topic.get(topic, ()))
        have = got.get(sid, array.array("q"))
        uniq = set(have)
        res.duplicated += len(have) - len(uniq)
        res.lost += len(want - uniq)
        res.misrouted += len(uniq - want)
    res.misrouted += sum(len(v) for sid, v in got.items() if sid < 0 or sid >= len(layout.sub_topic))


def print_filters(runs: list[FilterRun], layout: Layout, rate: float) -> dict:
    subs_topics = [len(layout.node_topics(i)) for i in range(layout.nodes)]
    print(f"\nfilters: {layout.nodes} nodes, {TOPICS:,} topics with Zipf popularity; {len(layout.sub_topic):,} "
          f"subscriptions ({len(set(layout.sub_topic)):,} distinct topics; per node {subs_topics}) over "
          f"{layout.conns_per_node} connections per node; {layout.per_producer * layout.nodes:,} messages of "
          f"{SIZE} B published by one producer per node at {rate:,.0f} msg/s in all")
    hdr = (f"{'mode':10} {'capacity':>8} {'fwd msgs':>9} {'fwd copies':>10} {'recv fwd':>9} {'discarded':>9} "
           f"{'wire fwd B':>11} {'wire ctl B':>10} {'wire all B':>11} {'setup ctl B':>11} {'FP/recv':>8} "
           f"{'FP/neg':>9} {'model FPR':>9} "
           f"{'cpu s':>6} {'deliveries':>10} {'lost':>5} {'dup':>4} {'misrt':>5}")
    print(hdr)
    print("-" * len(hdr))
    trees = sorted({r.tree for r in runs}, reverse=True)          # new, old
    for r in runs:
        cap = f"{r.filter_capacity:,}" if r.mode != "broadcast" else "-"
        label = r.mode if len(trees) == 1 else f"{r.mode}/{r.tree}"
        print(f"{label:10} {cap:>8} {r.forwarded_messages:9,} {r.forwarded_frames:10,} {r.received_forwarded:9,} "
              f"{r.discarded_false_positive:9,} {r.wire_fwd_bytes:11,} {r.wire_ctl_bytes:10,} "
              f"{r.wire_bytes_total:11,} {r.setup_ctl_bytes:11,} "
              f"{r.fp_over_received:8.4f} {r.fp_over_negatives:9.2e} {r.expected_fpr:9.2e} {r.cluster_cpu_s:6.1f} "
              f"{r.deliveries:10,} {r.lost:5} {r.duplicated:4} {r.misrouted:5}"
              + (f"  ERROR {'; '.join(r.errors)[:200]}" if r.errors else ""))
    out: dict = {}
    if len(trees) > 1:
        new = {r.mode: r for r in runs if r.tree == "new" and not r.failed}
        old = {r.mode: r for r in runs if r.tree == "old" and not r.failed}
        for mode in sorted(set(new) & set(old)):
            a, b = new[mode], old[mode]
            out[f"{mode} new/old"] = {"cluster_cpu": a.cluster_cpu_s / b.cluster_cpu_s if b.cluster_cpu_s else 0,
                                      "all_link_bytes": a.wire_bytes_total / b.wire_bytes_total
                                      if b.wire_bytes_total else 0,
                                      "received_forwarded": a.received_forwarded / b.received_forwarded
                                      if b.received_forwarded else 0}
            print(f"  {mode} new/old: cluster CPU {a.cluster_cpu_s:.1f} / {b.cluster_cpu_s:.1f} s = "
                  f"{out[f'{mode} new/old']['cluster_cpu']:.2f}, all link bytes "
                  f"{out[f'{mode} new/old']['all_link_bytes']:.3f}, forwarded copies received "
                  f"{out[f'{mode} new/old']['received_forwarded']:.3f}")
    runs = [r for r in runs if r.tree == "new"]
    by = {r.mode: r for r in runs if not r.failed}
    base = by.get("broadcast")
    for mode in ("filtered", "sized"):
        r = by.get(mode)
        if r is None or base is None or not base.received_forwarded or not base.wire_fwd_bytes:
            continue
        out[mode] = {"messages": r.received_forwarded / base.received_forwarded,
                     "forwarded_bytes": r.wire_fwd_bytes / base.wire_fwd_bytes,
                     "all_link_bytes": r.wire_bytes_total / base.wire_bytes_total if base.wire_bytes_total else 0,
                     "cluster_cpu": r.cluster_cpu_s / base.cluster_cpu_s if base.cluster_cpu_s else 0}
        print(f"  {mode} / broadcast: inter-node messages {out[mode]['messages']:.3f}, forwarded-frame bytes "
              f"{out[mode]['forwarded_bytes']:.3f}, all link bytes {out[mode]['all_link_bytes']:.3f}, "
              f"cluster CPU {out[mode]['cluster_cpu']:.2f}")
    for r in runs:
        if r.mode == "broadcast" or r.failed:
            continue
        print(f"  {r.mode}: false positives {r.discarded_false_positive:,} of {r.received_forwarded:,} forwarded "
              f"copies received ({r.fp_over_received:.2%}); of the {r.negatives:,} (message, peer) pairs where "
              f"the peer had no subscriber {r.fp_over_negatives:.3%} were sent anyway (the same filters built "
              f"here predict {r.predicted_fp:,} such copies); configured filter_fpr {r.filter_fpr:.2%} at "
              f"filter_capacity {r.filter_capacity:,}; over all {TOPICS:,} topics these filters answer 'maybe' "
              f"for {r.universe_fpr:.3%} of the topics a node does not hold (model for {max(subs_topics):,} topics: "
              f"{r.expected_fpr:.3%}); topics broadcast as popular (max per node): {r.popular_topics}")
    for r in runs:
        if r.setup_ctl_frames and not r.failed:
            print(f"  {r.mode}: control frames while subscribing (filter digests, consumer maps): "
                  f"{r.setup_ctl_frames:,} frames, {r.setup_ctl_bytes:,} B "
                  f"({r.setup_ctl_bytes / r.setup_ctl_frames:,.0f} B each)")
    if base is not None:
        print(f"  broadcast: {base.negatives:,} of {base.negatives + base.positives:,} forwarded copies went to a "
              f"peer without a subscriber ({base.discarded_false_positive:,} discarded there); wire bytes per "
              f"forwarded frame {base.wire_fwd_bytes / max(1, base.wire_fwd_frames):.0f}")
    return out


# ---------------------------------------------------------------------------------- throughput workload
@dataclass
class ThroughputRow:
    nodes: int
    variant: str               # ungrouped | grouped
    result: RunResult
    tree: str = "new"          # new (this checkout) | old (--baseline)
    round: int = 0
    cluster_us_per_msg: float = 0.0
    forwarded: int = 0
    other_cpu_pct: float = 0.0

    @property
    def failed(self) -> bool:
        r = self.result
        return bool(r.lost or r.duplicated or r.malformed or r.errors)


GROUPS = 60


def run_throughput(cluster: Cluster, variant: str, quick: bool, tag: str) -> ThroughputRow:
    n = len(cluster.nodes)
    spec = LoadSpec(destination=f"/queue/bench.cluster.{tag}.{n}.{variant}", producers=6, consumers=6, size=SIZE,
                    count=5_000 if quick else 40_000, duration=3.0 if quick else 15.0,
                    rotate_send_headers=([{"JMSXGroupID": f"g{i}"} for i in range(GROUPS)]
                                         if variant == "grouped" else []))
    st0 = [cluster.status(i)["forwarded"] for i in range(n)]
    at = []

    def sample():
        return cluster.cpu_seconds(), machine_busy_seconds(), time.monotonic()

    r = run_load(cluster.endpoints(), spec, on_started=lambda: at.append(sample()))
    time.sleep(0.3)
    cpu1, busy1, t1 = sample()
    cpu0, busy0, t0 = at[0] if at else (cpu1, busy1, t1)
    row = ThroughputRow(n, variant, r, cluster.tree)
    row.cluster_us_per_msg = (cpu1 - cpu0) * 1e6 / r.received if r.received else 0.0
    others = busy1 - busy0 - (cpu1 - cpu0) - r.producer_cpu_s - r.consumer_cpu_s
    row.other_cpu_pct = 100 * max(0.0, others) / (t1 - t0) if t1 > t0 else 0.0
    row.forwarded = sum(cluster.status(i)["forwarded"] for i in range(n)) - sum(st0)
    log(f"  {cluster.tree} {n} node{'s' if n > 1 else ' '} {variant:9} {r.rate:10,.0f} msg/s"
        f"  cluster {row.cluster_us_per_msg:6.1f} µs/msg"
        f"  forwarded {row.forwarded:,}  client cpu {r.producer_cpu_pct:.0f}%/{r.consumer_cpu_pct:.0f}%"
        f"  others {row.other_cpu_pct:.0f}%" + (f"  LOST {r.lost}" if r.lost else "")
        + (f"  DUP {r.duplicated}" if r.duplicated else "") + (f"  ERRORS {r.errors}" if r.errors else ""))
    return row


def median_rows(rows: list[ThroughputRow]) -> list[ThroughputRow]:
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r.variant, r.nodes, r.tree), []).append(r)
    out = []
    for key in sorted(groups, key=lambda k: (k[0] != "ungrouped", k[1], k[2] != "new")):
        g = groups[key]
        failed = [r for r in g if r.failed]
        if failed:
            out.append(failed[0])
            continue
        g.sort(key=lambda r: r.result.rate)
        out.append(g[(len(g) - 1) // 2])
    return out


def print_throughput(rows: list[ThroughputRow], rounds: int) -> dict:
    shown = median_rows(rows)
    print(f"\nthroughput: one queue, 6 producers + 6 consumers spread evenly over the nodes, {SIZE} B "
          f"non-persistent, ack:auto, 1,000 in flight per producer; grouped = {GROUPS} JMSXGroupID values"
          + (f"; median of {rounds} rounds" if rounds > 1 else ""))
    hdr = (f"{'variant':10} {'tree':>4} {'nodes':>5} {'msg/s':>9} {'vs 1 node':>9} {'cluster µs/msg':>14} "
           f"{'forwarded':>9} {'p50 ms':>7} {'p99 ms':>7} {'prod cpu':>8} {'cons cpu':>8} {'others':>6} "
           f"{'sent':>7} {'recv':>7} {'lost':>5} {'dup':>4}")
    print(hdr)
    print("-" * len(hdr))
    ratios: dict = {}
    base = {(r.variant, r.tree): r for r in shown if r.nodes == 1 and not r.failed}
    for row in shown:
        r = row.result
        b = base.get((row.variant, row.tree))
        ratio = r.rate / b.result.rate if b is not None and b.result.rate and not row.failed else 0.0
        if ratio and b is not None:
            cpu_per_msg = row.cluster_us_per_msg / b.cluster_us_per_msg if b.cluster_us_per_msg else 0.0
            ratios.setdefault(row.variant if row.tree == "new" else f"{row.variant}/old", {})[row.nodes] = \
                {"throughput": ratio, "cpu_per_msg": cpu_per_msg}
        print(f"{row.variant:10} {row.tree:>4} {row.nodes:5} {r.rate:9,.0f} {ratio:9.2f} "
              f"{row.cluster_us_per_msg:14.1f} {row.forwarded:9,} {r.lat_p50_us / 1000:7.2f} "
              f"{r.lat_p99_us / 1000:7.2f} {r.producer_cpu_pct:7.0f}% "
              f"{r.consumer_cpu_pct:7.0f}% {row.other_cpu_pct:5.0f}% {r.sent:7} {r.received:7} {r.lost:5} "
              f"{r.duplicated:4}" + (f"  ERROR {'; '.join(r.errors)[:160]}" if r.errors else ""))
    old = {(r.variant, r.nodes): r for r in shown if r.tree == "old" and not r.failed}
    for row in shown:
        b = old.get((row.variant, row.nodes))
        if row.tree != "new" or row.failed or b is None or not b.result.rate:
            continue
        rate = row.result.rate / b.result.rate
        cpu = row.cluster_us_per_msg / b.cluster_us_per_msg if b.cluster_us_per_msg else 0.0
        ratios.setdefault("new/old", {}).setdefault(row.variant, {})[row.nodes] = {"throughput": rate,
                                                                                    "cpu_per_msg": cpu}
        print(f"  new/old {row.variant:9} {row.nodes} node{'s' if row.nodes > 1 else ' '}: msg/s {rate:.2f}, "
              f"cluster µs/msg {cpu:.2f}")
    return ratios


# ----------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="cluster: topic filters vs broadcast; throughput on 1, 2, 3 nodes")
    ap.add_argument("--quick", action="store_true", help="a short smoke run (CI)")
    ap.add_argument("--parts", default="filters,throughput")
    ap.add_argument("--redis", default=os.environ.get("PYMQ_TEST_REDIS_URL") or os.environ.get("PYMQ_REDIS_URL"),
                    help="membership store (default: $PYMQ_TEST_REDIS_URL, set by eval \"$(.ci/services.sh)\")")
    ap.add_argument("--subscriptions", type=int, help="filters: subscriptions (default 2,000; --quick 400)")
    ap.add_argument("--messages", type=int, help="filters: messages published (default 8,000; --quick 1,200)")
    ap.add_argument("--rate", type=float, help="filters: msg/s published over all nodes (default 800; --quick 600)")
    ap.add_argument("--zipf", type=float, default=1.0, help="filters: Zipf exponent of topic popularity")
    ap.add_argument("--rounds", type=int, default=1, help="throughput: repeat and show the median")
    ap.add_argument("--json", help="write all figures to this file")
    ap.add_argument("--baseline", help="another checkout whose broker runs every cluster too (old vs new)")
    a = ap.parse_args(argv)
    parts = {s.strip() for s in a.parts.split(",") if s.strip()}
    if parts - {"filters", "throughput"}:
        ap.error("--parts takes filters,throughput")
    if not a.redis:
        msg = 'not measured: no Redis for the cluster membership; run eval "$(.ci/services.sh)" or pass --redis'
        print(msg)
        return 1 if os.environ.get("CI") else 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # finally blocks still stop the nodes
    doc: dict = {"quick": a.quick, "cores": os.cpu_count(), "python": platform.python_version(),
                 "loop": "uvloop" if uvloop else "asyncio", "load_at_start": os.getloadavg()[0]}
    failed: list[str] = []
    filter_runs: list[FilterRun] = []
    tp_rows: list[ThroughputRow] = []
    subs = a.subscriptions or (400 if a.quick else 2_000)
    msgs = a.messages or (1_200 if a.quick else 8_000)
    rate = a.rate or (600.0 if a.quick else 800.0)
    layout = make_layout(4, subs, msgs, a.zipf)
    with tempfile.TemporaryDirectory(prefix="pymq-bench-cluster-") as tmp:
        trees: list[tuple[str, dict[str, str] | None]] = [("new", None)]
        if a.baseline:
            baseline = os.path.abspath(a.baseline)
            doc["baseline"] = {"tree": baseline, "extensions": baseline_extensions(baseline)}
            trees.append(("old", tree_env(baseline, tmp)))
            log(f"baseline {baseline}: runs with {doc['baseline']['extensions']}")
        if "filters" in parts:
            modes = [("filtered", {"topic_filtering": True}), ("broadcast", {"topic_filtering": False})]
            if not a.quick:
                sized = max(len(layout.node_topics(i)) for i in range(layout.nodes))
                modes.append(("sized", {"topic_filtering": True, "filter_capacity": sized, "filter_fpr": 0.01}))
            for mode, settings in modes:
                for tree, env in trees:
                    filter_runs.append(run_filters(tmp, a.redis, layout, mode, rate, settings, tree, env))
        if "throughput" in parts:
            clusters: list[Cluster] = []
            try:
                # All three clusters up at once (idle nodes cost little), then each load on each in turn,
                # so other work on this shared machine falls on all node counts alike.
                for n in (1, 2, 3):
                    for tree, env in trees:
                        clusters.append(Cluster(tmp, f"tp{n}-{tree}", a.redis, n, env=env, tree=tree).start())
                k = len(clusters)
                for rnd in range(a.rounds):
                    for variant in ("ungrouped", "grouped"):
                        order = clusters[rnd % k:] + clusters[: rnd % k]
                        for c in order:
                            time.sleep(0.3)
                            row = run_throughput(c, variant, a.quick, f"{os.getpid()}r{rnd}")
                            row.round = rnd
                            tp_rows.append(row)
            except Exception as e:  # noqa: BLE001 - a cluster that does not form: reported as a harness error
                failed.append(f"throughput: {type(e).__name__}: {e}")
            finally:
                for c in clusters:
                    c.stop()
    print(f"\ncluster bench ({'quick' if a.quick else 'full'}), {os.cpu_count()} cores, python "
          f"{platform.python_version()}, {'uvloop' if uvloop else 'asyncio'} load client, load average at start "
          f"{doc['load_at_start']:.1f}")
    if filter_runs:
        doc["filter_ratios"] = print_filters(filter_runs, layout, rate)
        doc["filters"] = [asdict(r) for r in filter_runs]
        failed += [f"filters {r.mode}/{r.tree}: lost {r.lost}, duplicated {r.duplicated}, misrouted {r.misrouted}, "
                   f"malformed {r.malformed}, errors {r.errors}" for r in filter_runs if r.failed]
    if tp_rows:
        doc["throughput_ratios"] = print_throughput(tp_rows, a.rounds)
        doc["throughput"] = [{**r.result.as_dict(), "nodes": r.nodes, "variant": r.variant, "round": r.round,
                              "tree": r.tree,
                              "cluster_us_per_msg": r.cluster_us_per_msg, "forwarded": r.forwarded,
                              "other_cpu_pct": r.other_cpu_pct} for r in tp_rows]
        failed += [f"throughput {r.tree} {r.nodes} nodes {r.variant}: lost {r.result.lost}, duplicated "
                   f"{r.result.duplicated}, errors {r.result.errors}" for r in tp_rows if r.failed]
    for f in failed:
        print(f"\nFAILED {f}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(doc, fh, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
