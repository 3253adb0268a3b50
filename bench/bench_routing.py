"""Benchmark the routing primitives: compiled vs twin, group moves on membership change, bloom accuracy,
and the seed-004 forwarding workload.  Run by hand: ``python bench/bench_routing.py [--quick]``.

Sections (each prints its figures and, where there is one, the ratio against the baseline measured in the
same run):
1. bloom lookups per second, compiled vs twin;
2. group routes per second, modulo and rendezvous over 3/10/50 destinations, compiled hash vs twin;
3. fraction of groups that move when one of N = 3, 5, 10 nodes leaves or one joins, both strategies;
4. false-positive rate measured vs configured, for a few sizes;
5. seed 004: 10,000 topics with Zipf popularity, subscribers over 4 nodes; inter-node messages and bytes
   with filters (and with popular topics broadcast) vs plain broadcast, and the measured false-positive rate.
No timing is asserted anywhere; the tests assert behaviour (tests/routing).
"""
from __future__ import annotations

import argparse
import bisect
import itertools
import random
import sys
import time

from pymq.routing import GroupRouter, RoutingStrategy
from pymq.routing.bloom import IMPLEMENTATIONS


def rate(fn, items, min_time: float) -> float:
    """Operations per second of ``fn`` over ``items``, repeating until ``min_time`` has passed."""
    done, start = 0, time.perf_counter()
    while True:
        for item in items:
            fn(item)
        done += len(items)
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return done / elapsed


def fmt_rate(r: float) -> str:
    return f"{r / 1e6:8.2f} M/s" if r >= 1e6 else f"{r / 1e3:8.1f} k/s"


def impls():
    if "c" not in IMPLEMENTATIONS:
        print("  (compiled module not available: twin only, no ratio)")
    return [(name, IMPLEMENTATIONS[name]) for name in ("c", "py") if name in IMPLEMENTATIONS]


# -- 1 ------------------------------------------------------------------------------------------------

def bench_bloom(quick: bool) -> None:
    print("\n1. Bloom filter lookups (10,000 topics at 1 %, half the probes present)")
    t = 0.2 if quick else 1.0
    topics = [f"orders.region-{i % 37}.customer-{i}" for i in range(10_000)]
    probes = topics[:2000] + [f"absent.topic-{i}" for i in range(2000)]
    results = {}
    for name, impl in impls():
        f = impl.SubscriptionFilter.for_capacity(len(topics), 0.01)
        for topic in topics:
            f.add(topic)
        d = f.digest()
        results[name] = (rate(f.might_contain, probes, t), rate(d.might_contain, probes, t),
                         rate(lambda x, f=f: (f.add(x), f.remove(x)), probes[:2000], t) * 2)
        r = results[name]
        print(f"  {name:>2}: filter {fmt_rate(r[0])}   digest {fmt_rate(r[1])}   add+remove {fmt_rate(r[2])} ops")
    if len(results) == 2:
        c, py = results["c"], results["py"]
        print(f"  ratio c/py: filter {c[0] / py[0]:.1f}x   digest {c[1] / py[1]:.1f}x   "
              f"add+remove {c[2] / py[2]:.1f}x")


# -- 2 ------------------------------------------------------------------------------------------------

def bench_group_routing(quick: bool) -> None:
    print("\n2. Group routing (routes per second)")
    t = 0.15 if quick else 0.8
    keys = [f"group-{i}" for i in range(2000)]
    print(f"  {'strategy':<11}{'N':>4}" + "".join(f"{name:>14}" for name, _ in impls()) + "   ratio c/py")
    for strategy in RoutingStrategy:
        for n in (3, 10, 50):
            nodes = [f"node-{i}" for i in range(n)]
            rates = {name: rate(GroupRouter(nodes, strategy, implementation=impl).route, keys, t)
                     for name, impl in impls()}
            ratio = f"{rates['c'] / rates['py']:10.1f}x" if len(rates) == 2 else ""
            print(f"  {strategy.value:<11}{n:>4}" + "".join(f"{fmt_rate(r):>14}" for r in rates.values()) + ratio)


# -- 3 ------------------------------------------------------------------------------------------------

def bench_moves(quick: bool) -> None:
    n_groups = 20_000 if quick else 100_000
    print(f"\n3. Groups moved on membership change ({n_groups:,} groups; leave = mean over every node leaving)")
    keys = [f"group-{i}" for i in range(n_groups)]
    print(f"  {'N':>3}  {'event':<6}{'modulo':>9}{'rendezvous':>12}{'ideal':>8}")
    for n in (3, 5, 10):
        nodes = [f"node-{i}" for i in range(n)]
        row = {}
        for strategy in RoutingStrategy:
            before = [GroupRouter(nodes, strategy).route(k) for k in keys]
            joined = GroupRouter(nodes + ["node-new"], strategy)
            row[("join", strategy)] = sum(joined.route(k) != b for k, b in zip(keys, before, strict=True)) / n_groups
            left = []
            for leaver in nodes:
                router = GroupRouter([x for x in nodes if x != leaver], strategy)
                left.append(sum(router.route(k) != b for k, b in zip(keys, before, strict=True)) / n_groups)
            row[("leave", strategy)] = sum(left) / len(left)
        for event, ideal in (("join", 1 / (n + 1)), ("leave", 1 / n)):
            print(f"  {n:>3}  {event:<6}{row[(event, RoutingStrategy.MODULO)]:>9.1%}"
                  f"{row[(event, RoutingStrategy.RENDEZVOUS)]:>12.1%}{ideal:>8.1%}")


# -- 4 ------------------------------------------------------------------------------------------------

def bench_fpr(quick: bool) -> None:
    n_probes = 20_000 if quick else 200_000
    print(f"\n4. False-positive rate, measured ({n_probes:,} absent probes) vs configured, filter filled to n")
    impl = IMPLEMENTATIONS.get("c", IMPLEMENTATIONS["py"])
    sizes = [(1_000, 0.01), (10_000, 0.01), (10_000, 0.001)] + ([] if quick else [(100_000, 0.01), (100_000, 0.05)])
    print(f"  {'n':>8}{'configured':>12}{'m':>10}{'k':>4}{'digest B':>10}{'measured':>10}{'fill':>7}")
    for n, p in sizes:
        f = impl.SubscriptionFilter.for_capacity(n, p)
        for i in range(n):
            f.add(f"present/{i}")
        fp = sum(f.might_contain(f"absent/{i}") for i in range(n_probes))
        print(f"  {n:>8,}{p:>12.2%}{f.m:>10,}{f.k:>4}{len(f.digest().to_bytes()):>10,}{fp / n_probes:>10.3%}"
              f"{f.fill_ratio():>7.2f}")


# -- 5 ------------------------------------------------------------------------------------------------

def bench_seed004(quick: bool, zipf_s: float, payload: int, subscribers: int | None) -> None:
    n_topics, n_nodes = 10_000, 4
    n_subscribers = subscribers or (10_000 if quick else 40_000)
    subs_each = 3
    n_messages = 20_000 if quick else 200_000
    configured = 0.01
    rng = random.Random(4)
    print(f"\n5. Seed-004 workload: {n_topics:,} topics, Zipf s={zipf_s}, {n_subscribers:,} subscribers x "
          f"{subs_each} topics over {n_nodes} nodes, {n_messages:,} messages of {payload} B")
    impl = IMPLEMENTATIONS.get("c", IMPLEMENTATIONS["py"])
    topics = [f"feed/{i:05d}" for i in range(n_topics)]
    rng.shuffle(topics)  # rank (popularity) is unrelated to the name
    weights = [1.0 / (r + 1) ** zipf_s for r in range(n_topics)]
    cum = list(itertools.accumulate(weights))
    total = cum[-1]

    def zipf_topic() -> str:
        return topics[bisect.bisect_left(cum, rng.random() * total)]

    nodes = [f"node-{i}" for i in range(n_nodes)]
    wanted: dict[str, set[str]] = {n: set() for n in nodes}
    subscribers_of: dict[str, int] = {}
    for _ in range(n_subscribers):
        node = nodes[rng.randrange(n_nodes)]
        for _ in range(subs_each):
            t = zipf_topic()
            wanted[node].add(t)
            subscribers_of[t] = subscribers_of.get(t, 0) + 1
    # Two sizings: for the whole topic space (what a node that cannot predict its load would do), and for
    # the node's own distinct topics (tight: the measured FP rate should then sit near the configured one).
    configs = {
        f"filters ({n_topics:,} @ {configured:.0%})":
            lambda n: impl.SubscriptionFilter.for_capacity(n_topics, configured),
        f"filters (own @ {configured:.0%})":
            lambda n: impl.SubscriptionFilter.for_capacity(len(wanted[n]), configured),
    }
    filters: dict[str, dict] = {}
    for cname, make in configs.items():
        filters[cname] = {}
        for n in nodes:
            f = make(n)
            for t in wanted[n]:
                f.add(t)
            filters[cname][n] = f
    digests = {c: {n: f.digest() for n, f in fs.items()} for c, fs in filters.items()}
    # popular: the top 1 % of topics by subscriber count (the cluster would learn this from its peers)
    popular = set(sorted(subscribers_of, key=subscribers_of.get, reverse=True)[: n_topics // 100])

    counts = {"broadcast": 0, "exact": 0}
    counts.update({c: 0 for c in configs})
    counts.update({c + " + popular": 0 for c in configs})
    false_fw = dict.fromkeys(configs, 0)
    negatives = probes = probes_popular = 0
    elapsed = 0.0
    for _ in range(n_messages):
        topic = zipf_topic()
        origin = nodes[rng.randrange(n_nodes)]
        peers = [n for n in nodes if n != origin]
        counts["broadcast"] += len(peers)
        truth = [n for n in peers if topic in wanted[n]]
        counts["exact"] += len(truth)
        negatives += len(peers) - len(truth)
        is_popular = topic in popular
        probes += len(peers)
        probes_popular += 0 if is_popular else len(peers)
        for cname, ds in digests.items():
            t0 = time.perf_counter()
            h1, h2 = impl.hash_pair(topic)
            matched = [n for n in peers if ds[n].might_contain_pair(h1, h2)]
            elapsed += time.perf_counter() - t0
            if not set(truth) <= set(matched):
                raise SystemExit(f"false negative on {topic}: the filter lost a subscriber")
            counts[cname] += len(matched)
            counts[cname + " + popular"] += len(peers) if is_popular else len(matched)
            false_fw[cname] += len(matched) - len(truth)
    print(f"  distinct topics per node: {[len(wanted[n]) for n in nodes]}")
    exchange = {}
    for cname, ds in digests.items():
        sizes = [len(d.to_bytes()) for d in ds.values()]
        exchange[cname] = sum(sizes) * (n_nodes - 1)  # every node sends its digest to every peer once
        f0 = filters[cname][nodes[0]]
        print(f"  {cname}: m={f0.m:,} k={f0.k}, digests {sizes} B, exchange {exchange[cname]:,} B once")
    base = counts["broadcast"]
    print(f"  {'forwarding':<34}{'messages':>11}{'bytes':>14}{'vs broadcast':>14}")
    for name, msgs in counts.items():
        b = msgs * payload + next((x for c, x in exchange.items() if name.startswith(c)), 0)
        print(f"  {name:<34}{msgs:>11,}{b:>14,}{msgs / base:>13.1%}")
    for cname in configs:
        absent = [f"never/{i}" for i in range(20_000 if quick else 100_000)]
        direct = sum(f.might_contain(t) for f in filters[cname].values() for t in absent) / (len(absent) * n_nodes)
        print(f"  {cname}: false forwards {false_fw[cname]:,} of {negatives:,} (message, peer) pairs without a "
              f"subscriber = {false_fw[cname] / max(1, negatives):.3%}; on never-subscribed topics "
              f"{direct:.3%}; configured {configured:.2%}")
    print(f"  bloom probes {probes:,}; with the top 1 % broadcast {probes_popular:,} "
          f"({1 - probes_popular / probes:.1%} fewer); forwarding decision (hash once + probe 3 digests) "
          f"{n_messages * len(configs) / elapsed:,.0f}/s with {impl.__name__.rsplit('.', 1)[1]}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short smoke run (a few seconds)")
    ap.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of topic popularity (default 1.0)")
    ap.add_argument("--subscribers", type=int, default=None,
                    help="subscribers in the seed-004 workload (default 10,000 quick / 40,000 full)")
    ap.add_argument("--payload", type=int, default=1024, help="bytes per forwarded message (default 1024)")
    args = ap.parse_args(argv)
    print(f"pymq routing benchmark ({'quick' if args.quick else 'full'}); implementations: {sorted(IMPLEMENTATIONS)}; "
          f"python {sys.version.split()[0]}")
    bench_bloom(args.quick)
    bench_group_routing(args.quick)
    bench_moves(args.quick)
    bench_fpr(args.quick)
    bench_seed004(args.quick, args.zipf, args.payload, args.subscribers)


if __name__ == "__main__":
    main()
