"""Pattern subscriptions across the cluster (spec/routing.md §3.5): forwarded copies nobody wanted, with
the earlier scheme (a node holding a pattern announces a match-all digest) against the current one (it lists
its patterns with the digest and the sender matches them with the compiled matcher), in the same run.

Runs the code a node runs — each node's ``TopicInterest`` (server/cluster/topics.py: the regenerating
bloom filter, the announcement with its pattern list, the peers' digests and patterns, popular topics) —
over N simulated nodes in one process, with no network: "forwarded" means the sender's ``targets`` named
the peer. Topics are ``<market>.<sector>.<symbol>`` words; each node subscribes to some topics exactly and,
on a fraction of the nodes, to a few patterns of the shapes users write (``m.s.*``, ``m.#``, ``m.*.sym``,
``*.s.sym``); messages are published on Zipf-ranked topics from random nodes. A copy is *unwanted* when the
receiving node has no subscription whose topic or pattern the message matches; *missed* (wanted, not
forwarded) must be 0 for both schemes. ``us/msg`` is the sender's decision (``targets``) per message, the
one cost the pattern list adds (a shared machine makes it noisy: compare within a run).

    python bench/bench_cluster_patterns.py [--nodes 16] [--messages 50000] [--pattern-nodes 0.5] [--seed 1]
"""
from __future__ import annotations

import argparse
import bisect
import itertools
import random
import time

from pymq.routing.topics import PatternIndex
from pymq_server.cluster.topics import TopicInterest


def zipf_cdf(n: int, s: float) -> list[float]:
    weights = list(itertools.accumulate(1.0 / (r ** s) for r in range(1, n + 1)))
    return [w / weights[-1] for w in weights]


def workload(args: argparse.Namespace) -> tuple[list[str], list[tuple[set[str], list[str]]]]:
    rng = random.Random(args.seed)
    markets = [f"m{i}" for i in range(args.markets)]
    sectors = [f"s{i}" for i in range(args.sectors)]
    symbols = [f"y{i}" for i in range(args.symbols)]
    topics = [f"{m}.{s}.{y}" for m in markets for s in sectors for y in symbols]
    rng.shuffle(topics)                                # Zipf rank independent of the name
    nodes = []
    for _ in range(args.nodes):
        exact = set(rng.sample(topics, args.exact))
        patterns: list[str] = []
        if rng.random() < args.pattern_nodes:
            for _ in range(args.patterns):
                m, s, y = rng.choice(markets), rng.choice(sectors), rng.choice(symbols)
                patterns.append(rng.choice([f"{m}.{s}.*", f"{m}.#", f"{m}.*.{y}", f"*.{s}.{y}"]))
        nodes.append((exact, patterns))
    return topics, nodes


def run(topics: list[str], nodes: list[tuple[set[str], list[str]]], messages: int, zipf_s: float, seed: int,
        list_patterns: bool) -> dict:
    names = [f"n{i:03d}" for i in range(len(nodes))]
    interests = []
    for name, (exact, patterns) in zip(names, nodes, strict=True):
        interest = TopicInterest(name, 1, capacity=1000, fpr=0.01, popular_fraction=0.75)
        interest.announce_patterns = list_patterns
        for topic in exact:
            interest.changed(topic, True)
        for pattern in set(patterns):
            interest.changed(pattern, True, pattern=True)
        interest.renew()
        interests.append(interest)
    announcements = [interest.announcement() for interest in interests]
    for me, interest in enumerate(interests):          # every node holds every peer's latest announcement
        for peer, (headers, body) in enumerate(announcements):
            if peer != me:
                interest.peer_joined(names[peer])
                interest.announced(names[peer], headers, body)
    wanted_by = []                                      # what each node really wants: its topics and patterns
    for exact, patterns in nodes:
        index = PatternIndex()
        for pattern in patterns:
            index.add(pattern)
        wanted_by.append((exact, index))
    live = set(names)
    rng = random.Random(seed + 1)
    cdf = zipf_cdf(len(topics), zipf_s)
    forwarded = unwanted = missed = wanted_total = 0
    elapsed = 0.0
    for _ in range(messages):
        topic = topics[min(bisect.bisect_left(cdf, rng.random()), len(topics) - 1)]
        sender = rng.randrange(len(nodes))
        start = time.perf_counter()
        chosen = interests[sender].targets(topic, live)
        elapsed += time.perf_counter() - start
        targets = set(chosen)
        for peer, (exact, index) in enumerate(wanted_by):
            if peer == sender:
                continue
            wants = topic in exact or bool(index.match(topic))
            wanted_total += wants
            sent = names[peer] in targets
            forwarded += sent
            unwanted += sent and not wants
            missed += wants and not sent
    return {"forwarded": forwarded, "unwanted": unwanted, "missed": missed, "wanted": wanted_total,
            "seconds": elapsed}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--markets", type=int, default=8)
    ap.add_argument("--sectors", type=int, default=10)
    ap.add_argument("--symbols", type=int, default=50)
    ap.add_argument("--exact", type=int, default=100, help="exact topic subscriptions per node")
    ap.add_argument("--patterns", type=int, default=3, help="patterns per node that holds any")
    ap.add_argument("--pattern-nodes", type=float, default=0.5, help="fraction of nodes holding patterns")
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--zipf", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    topics, nodes = workload(args)
    holders = sum(1 for _, p in nodes if p)
    print(f"{args.nodes} nodes, {len(topics):,} topics, {args.exact} exact subscriptions per node, "
          f"{holders} nodes with {args.patterns} patterns each, {args.messages:,} messages (Zipf s={args.zipf})")
    old = run(topics, nodes, args.messages, args.zipf, args.seed, list_patterns=False)
    new = run(topics, nodes, args.messages, args.zipf, args.seed, list_patterns=True)
    print(f"{'scheme':<34}{'forwarded':>12}{'unwanted':>12}{'unwanted %':>12}{'missed':>8}{'us/msg':>8}")
    for label, r in (("match-all digest (before)", old), ("patterns announced (now)", new)):
        share = 100.0 * r["unwanted"] / r["forwarded"] if r["forwarded"] else 0.0
        print(f"{label:<34}{r['forwarded']:>12,}{r['unwanted']:>12,}{share:>11.1f}%{r['missed']:>8}"
              f"{1e6 * r['seconds'] / args.messages:>8.1f}")
    if old["unwanted"]:
        print(f"unwanted copies now / before: {new['unwanted'] / old['unwanted']:.3f}; forwarded copies now / "
              f"before: {new['forwarded'] / old['forwarded']:.3f} (copies wanted: {new['wanted']:,})")
    if old["missed"] or new["missed"]:
        raise SystemExit("a wanted copy was not forwarded: a bug")


if __name__ == "__main__":
    main()
