"""A cluster at internet scale, simulated in one process with the real routing, filter and assignment code.

    python bench/bench_cluster_sim.py                 # 1M recipients; 64 and 256 nodes (see bench/README.md)
    python bench/bench_cluster_sim.py --quick         # CI smoke run: 50k recipients, 16 and 64 nodes
    python bench/bench_cluster_sim.py --recipients 200000 --nodes 32 --models zipf --json /tmp/sim.json

What is real and what is modelled (spec/cluster.md §7 lists the model's limits):

real       the code a node runs: assignment of recipients to nodes (pymq.routing.assignment: `hash` and
           `similar`, streaming then joins and leaves), each node's subscription filter with regeneration
           (pymq.routing.interest.InterestFilter, compiled bloom core), the forwarding decision over the
           peers' digests with popular topics (pymq.routing.forwarding.PeerFilters: classify, targets), the
           rendezvous hash that homes each source on a node (pymq.routing.GroupRouter), and the forwarded
           frame's headers and encoding (pymq_server.broker.forwarded.forward_headers, the STOMP encoder).
modelled   no sockets, no storage, no time: a message is "forwarded" to the nodes PeerFilters names and
           "stored" on the nodes with a subscriber of its source; bytes are counts x the encoded frame size.

Workload. S sources ranked by popularity; recipients follow sources drawn from a Zipf distribution over
the ranks (exponent --zipf). Two models:
  zipf         every follow is drawn from the global distribution (no structure: similar recipients are
               only those who share popular sources);
  communities  the top --celebrities sources are global; the others belong to --communities interest
               groups (round-robin by rank); a recipient belongs to one group and draws each follow from its
               group's sources (Zipf by rank within the group) with probability --locality, else globally.
Each recipient follows 1 + Poisson(--follows - 1) distinct sources (at most 64). Messages: --messages,
each from a source drawn from the same global Zipf (popular sources also post most), published on the
node rendezvous(source) names (where its producer connects).

Reported per model, node count and policy: forwarded messages and bytes against broadcast and against
the exact receivers; false-positive forwards; filter memory per node (counters) and the digests each node
keeps of its peers; the same with filters sized once at --filter-capacity (no regeneration: the landed
behaviour); nodes storing each message; the share of the nodes that store the most popular sources'
messages; recipients, subscriptions and stored messages moved when a node leaves and when one joins.
Exit status 1 only if a subscriber would miss a message (a false negative: never expected).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402  (workload generation only; the decisions are pymq's own code)

from pymq.protocol.scanner import encode_frame  # noqa: E402
from pymq.routing import GroupRouter  # noqa: E402
from pymq.routing import bloom  # noqa: E402
from pymq.routing.assignment import HashPolicy, Placement, SimilarPolicy, place_all, shed  # noqa: E402
from pymq.routing.forwarding import PeerFilters  # noqa: E402
from pymq.routing.interest import InterestFilter  # noqa: E402
from pymq_server.broker.forwarded import forward_headers  # noqa: E402

TOP = (1, 10, 100)          # "popular sources": the top 1, 10, 100 by rank


# -- workload -------------------------------------------------------------------------------------------
def zipf_cdf(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.power(np.arange(1, n + 1, dtype=np.float64), s)
    c = np.cumsum(w)
    return c / c[-1]


def draw(cdf: np.ndarray, size, rng) -> np.ndarray:
    return np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), len(cdf) - 1)


def build_workload(args, model: str, seed: int) -> SimpleNamespace:
    rng = np.random.default_rng(seed)
    S, R = args.sources, args.recipients
    global_cdf = zipf_cdf(S, args.zipf)
    counts = np.minimum(1 + rng.poisson(max(0.0, args.follows - 1), R), 64)
    total = int(counts.sum())
    follows = draw(global_cdf, total, rng)
    if model == "communities":
        G, C = args.celebrities, args.communities
        per = (S - G) // C                         # sources per community (rank G + k*C + c)
        local_cdf = zipf_cdf(per, args.zipf)
        community = rng.integers(0, C, R)
        owner = np.repeat(community, counts)
        local = rng.random(total) < args.locality
        k = draw(local_cdf, int(local.sum()), rng)
        follows[local] = G + k * C + owner[local]
    names = [f"src{i}" for i in range(S)]
    recipients = []
    pos = 0
    for i, n in enumerate(counts.tolist()):
        row = follows[pos:pos + n]
        pos += n
        recipients.append((f"r{i}", tuple(sorted({names[j] for j in row.tolist()}))))
    messages = draw(global_cdf, args.messages, rng)
    published = np.bincount(messages, minlength=S)
    return SimpleNamespace(model=model, names=names, recipients=recipients, messages=messages.tolist(),
                           published={names[i]: int(c) for i, c in enumerate(published.tolist()) if c},
                           subscriptions=sum(len(t) for _, t in recipients))


def frame_bytes(body_size: int) -> int:
    """Bytes of one forwarded message on a link: the real forward headers and STOMP 1.2 encoding."""
    message = SimpleNamespace(headers={"persistent": "true", "priority": "4", "timestamp": "1700000000000",
                                       "content-type": "text/plain", "pymq-seq": "123456"},
                              destination="/topic/src12345", message_id="ID:node-017-1700000000123456",
                              key=1700000000123456, deliver_at=0)     # key: the forward id (3b19a58)
    headers = forward_headers(message, "node-017")
    headers["receipt"] = "f123"
    return len(encode_frame("SEND", headers, b"x" * body_size, "1.2"))


# -- one simulated cluster ------------------------------------------------------------------------------
def simulate(w: SimpleNamespace, n_nodes: int, policy_name: str, args, frame_size: int) -> dict:
    nodes = [f"node-{i:03d}" for i in range(n_nodes)]
    timings = {}
    t0 = time.perf_counter()
    placement = Placement(nodes)
    policy = HashPolicy() if policy_name == "hash" else SimilarPolicy(slack=args.slack,
                                                                       expected=len(w.recipients))
    place_all(placement, policy, w.recipients)
    timings["assign_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    by_node = placement.topics_by_node()
    filters = {n: InterestFilter.of(by_node[n], args.filter_capacity, args.filter_fpr) for n in nodes}
    fixed = None
    if args.compare_fixed:                     # the landed behaviour: sized once, never regenerated
        fixed = {}
        for n in nodes:
            f = InterestFilter(args.filter_capacity, args.filter_fpr)
            for t in by_node[n]:
                f.add(t)
            fixed[n] = f
    timings["filters_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    view = PeerFilters()
    for n in nodes:
        view.update(n, filters[n].digest())
    fixed_view = None
    if fixed is not None:
        fixed_view = PeerFilters()
        for n in nodes:
            fixed_view.update(n, fixed[n].digest())
    home = GroupRouter(nodes)
    names = w.names
    seen_topics: set[str] = set()
    head = args.celebrities                      # ranks below this are "popular", the rest the long tail
    by_class = {"popular": [0, 0, 0, 0], "long_tail": [0, 0, 0, 0]}   # messages, forwarded, exact, stored
    forwarded = exact = fp = popular_extra = fixed_forwarded = fixed_fp = missed = popular_msgs = stored = 0
    for src in w.messages:
        topic = names[src]
        origin = home.route(topic)
        if topic not in seen_topics:          # a node classifies a topic when it first sees it (node.py)
            seen_topics.add(topic)
            view.classify(topic, args.popular_fraction)
            if fixed_view is not None:
                fixed_view.classify(topic, args.popular_fraction)
        holders = placement.holders.get(topic, {})
        stored += len(holders)
        cls = by_class["popular" if src < head else "long_tail"]
        receivers = len(holders) - (1 if origin in holders else 0)
        exact += receivers
        targets = view.targets(topic)
        sent = len(targets) - (1 if origin in targets else 0)
        forwarded += sent
        wrong = sum(1 for n in targets if n != origin and n not in holders)
        if topic in view.popular:              # sent to every peer without probing (seed 004)
            popular_msgs += 1
            popular_extra += wrong
        else:
            fp += wrong
        if sent - wrong != receivers:
            missed += receivers - (sent - wrong)
        cls[0] += 1
        cls[1] += sent
        cls[2] += receivers
        cls[3] += len(holders)
        if fixed_view is not None:
            ft = fixed_view.targets(topic)
            fsent = len(ft) - (1 if origin in ft else 0)
            fixed_forwarded += fsent
            fixed_fp += sum(1 for n in ft if n != origin and n not in holders)
    timings["forwarding_s"] = time.perf_counter() - t0

    M = len(w.messages)
    broadcast = M * (n_nodes - 1)
    counters = [filters[n].memory_bytes() for n in nodes]
    digests = [8 + (filters[n].filter.m + 7) // 8 for n in nodes]
    topics_per_node = [len(by_node[n]) for n in nodes]
    out = {
        "nodes": n_nodes, "policy": policy_name,
        "recipients_per_node": {"min": min(placement.load.values()), "max": max(placement.load.values())},
        "topics_per_node": {"mean": sum(topics_per_node) / n_nodes, "max": max(topics_per_node)},
        "messages": M, "broadcast_forwards": broadcast,
        "forwarded": forwarded, "forwarded_vs_broadcast": forwarded / broadcast,
        "exact_forwards": exact, "false_positive_forwards": fp,
        "false_positive_share": fp / forwarded if forwarded else 0.0,
        "popular_broadcast_extra_forwards": popular_extra,
        "by_source_class": {name: {"messages": c[0],
                                   "forwarded_vs_broadcast": c[1] / (c[0] * (n_nodes - 1)) if c[0] else 0.0,
                                   "exact_vs_broadcast": c[2] / (c[0] * (n_nodes - 1)) if c[0] else 0.0,
                                   "stored_copies_per_message": c[3] / c[0] if c[0] else 0.0}
                            for name, c in by_class.items()},
        "popular_messages": popular_msgs,
        "forwarded_bytes": forwarded * frame_size, "broadcast_bytes": broadcast * frame_size,
        "missed": missed,
        "stored_copies_per_message": stored / M,
        "filter_counters_bytes_per_node": {"mean": sum(counters) / n_nodes, "max": max(counters)},
        "digest_bytes_per_node": {"mean": sum(digests) / n_nodes, "max": max(digests)},
        "peer_digests_bytes_per_node": sum(digests) - min(digests),
        "filter_regenerations": sum(filters[n].epoch for n in nodes),
        "measured_fpr": {"mean": sum(filters[n].measured_fpr() for n in nodes) / n_nodes,
                         "max": max(filters[n].measured_fpr() for n in nodes)},
    }
    if fixed_view is not None:
        out["fixed_filters"] = {"forwarded": fixed_forwarded, "forwarded_vs_broadcast": fixed_forwarded / broadcast,
                                "false_positive_forwards": fixed_fp,
                                "measured_fpr_mean": sum(fixed[n].measured_fpr() for n in nodes) / n_nodes}
    popular = {}
    per_node = (1.0 + args.slack) * len(w.recipients) / n_nodes     # the most recipients a node may hold
    for k in TOP:
        tops = [names[i] for i in range(k)]
        share = [placement.stored_on(t) / n_nodes for t in tops]
        subscribers = [len_holders(placement, t) for t in tops]
        # the fewest nodes that can hold a source's subscribers at all (each holds at most per_node)
        least = [min(n_nodes, max(1, math.ceil(n / per_node))) / n_nodes for n in subscribers]
        popular[f"top{k}"] = {"share_of_nodes_storing": sum(share) / k, "subscribers": sum(subscribers),
                              "least_possible_share": sum(least) / k}
    out["popular_sources"] = popular

    # -- membership changes: a node leaves, then one joins ------------------------------------------------
    t0 = time.perf_counter()
    pending = w.published                     # messages stored per subscription = messages of its source

    def cost(moves_or_recipients, topics_of) -> tuple[int, int]:
        subs = msgs = 0
        for r in moves_or_recipients:
            ts = topics_of[r]
            subs += len(ts)
            msgs += sum(pending.get(t, 0) for t in ts)
        return subs, msgs

    leaver = max(nodes, key=lambda n: (placement.load[n], n))
    topics_of = dict(w.recipients)
    orphans = placement.remove_node(leaver)
    place_all(placement, policy, [(r, topics_of[r]) for r in orphans])
    subs, msgs = cost(orphans, topics_of)
    out["leave"] = {"recipients_moved": len(orphans), "share": len(orphans) / len(w.recipients),
                    "subscriptions_moved": subs, "messages_moved": msgs}
    placement.add_node(leaver + "-new")
    if isinstance(policy, SimilarPolicy):
        policy.expected = len(w.recipients)
    moves = shed(placement, policy)
    subs, msgs = cost([r for r, _, _ in moves], topics_of)
    out["join"] = {"recipients_moved": len(moves), "share": len(moves) / len(w.recipients),
                   "subscriptions_moved": subs, "messages_moved": msgs,
                   "to_newcomer": sum(1 for _, _, t in moves if t == leaver + "-new")}
    timings["membership_s"] = time.perf_counter() - t0
    out["timings"] = {k: round(v, 2) for k, v in timings.items()}
    return out


def len_holders(placement: Placement, topic: str) -> int:
    return sum(placement.holders.get(topic, {}).values())


# -- report ---------------------------------------------------------------------------------------------
def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def print_row(r: dict) -> None:
    f = r.get("fixed_filters")
    fixed = "" if f is None else f"; filters sized once: {f['forwarded_vs_broadcast'] * 100:.1f}% of broadcast"
    print(f"  {r['policy']:8s} fwd {r['forwarded_vs_broadcast']*100:6.2f}% of broadcast"
          f" ({r['forwarded']:,} vs {r['broadcast_forwards']:,}; exact {r['exact_forwards']:,};"
          f" bloom FP {r['false_positive_forwards']:,} = {r['false_positive_share']*100:.2f}%;"
          f" popular-topic broadcast extra {r['popular_broadcast_extra_forwards']:,}){fixed}")
    print(f"           recipients/node {r['recipients_per_node']['min']:,}-{r['recipients_per_node']['max']:,};"
          f" stored/msg {r['stored_copies_per_message']:.1f} nodes;"
          f" top1 on {r['popular_sources']['top1']['share_of_nodes_storing']*100:.0f}% of nodes,"
          f" top10 {r['popular_sources']['top10']['share_of_nodes_storing']*100:.0f}%,"
          f" top100 {r['popular_sources']['top100']['share_of_nodes_storing']*100:.0f}%"
          f" (least possible {r['popular_sources']['top1']['least_possible_share']*100:.0f}/"
          f"{r['popular_sources']['top10']['least_possible_share']*100:.0f}/"
          f"{r['popular_sources']['top100']['least_possible_share']*100:.0f}%);"
          f" long tail fwd {r['by_source_class']['long_tail']['forwarded_vs_broadcast']*100:.1f}% of broadcast"
          f" (exact {r['by_source_class']['long_tail']['exact_vs_broadcast']*100:.1f}%);"
          f" filter {r['filter_counters_bytes_per_node']['mean']/1024:.0f} KiB counters/node,"
          f" peers' digests {r['peer_digests_bytes_per_node']/1024/1024:.1f} MiB/node")
    print(f"           leave: {r['leave']['recipients_moved']:,} recipients ({r['leave']['share']*100:.2f}%),"
          f" {r['leave']['messages_moved']:,} msgs; join: {r['join']['recipients_moved']:,}"
          f" ({r['join']['share']*100:.2f}%), {r['join']['messages_moved']:,} msgs;"
          f" times {r['timings']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 50k recipients, 16 and 64 nodes")
    ap.add_argument("--recipients", type=int, default=1_000_000)
    ap.add_argument("--sources", type=int, default=200_000)
    ap.add_argument("--follows", type=float, default=8.0, help="mean sources a recipient follows")
    ap.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of source popularity")
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--nodes", default="64,256")
    ap.add_argument("--models", default="zipf,communities")
    ap.add_argument("--policies", default="hash,similar")
    ap.add_argument("--communities", type=int, default=2_000)
    ap.add_argument("--celebrities", type=int, default=1_000)
    ap.add_argument("--locality", type=float, default=0.8)
    ap.add_argument("--slack", type=float, default=0.1)
    ap.add_argument("--filter-capacity", type=int, default=10_000)
    ap.add_argument("--filter-fpr", type=float, default=0.01)
    ap.add_argument("--popular-fraction", type=float, default=0.75)
    ap.add_argument("--body", type=int, default=256, help="message body bytes (for forwarded bytes)")
    ap.add_argument("--no-compare-fixed", dest="compare_fixed", action="store_false",
                    help="skip the filters sized once (the landed behaviour)")
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.quick:
        args.recipients, args.sources, args.messages, args.nodes = 50_000, 20_000, 20_000, "16,64"
        args.communities, args.celebrities = 200, 100
    if bloom.implementation.__name__.endswith("_py"):
        print("note: the compiled bloom core is not in use (PYMQ_NO_EXTENSIONS or not built): slow")
    frame_size = frame_bytes(args.body)
    started = time.perf_counter()
    results = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "bloom": bloom.implementation.__name__},
               "args": vars(args), "frame_bytes": frame_size, "runs": []}
    print(f"{args.recipients:,} recipients, {args.sources:,} sources (Zipf {args.zipf}), ~{args.follows} follows each, "
          f"{args.messages:,} messages, forwarded frame {frame_size} B ({args.body} B body)")
    failed = False
    for model in args.models.split(","):
        t0 = time.perf_counter()
        w = build_workload(args, model, args.seed)
        print(f"\nmodel {model}: {w.subscriptions:,} subscriptions, workload built in "
              f"{time.perf_counter() - t0:.1f} s")
        for n in [int(x) for x in args.nodes.split(",")]:
            print(f" {n} nodes")
            for policy in args.policies.split(","):
                r = simulate(w, n, policy, args, frame_size)
                r["model"] = model
                results["runs"].append(r)
                print_row(r)
                failed |= r["missed"] != 0
                gc.collect()
        del w
        gc.collect()
    results["wall_s"] = round(time.perf_counter() - started, 1)
    results["peak_rss_mb"] = round(rss_mb())
    print(f"\nwall {results['wall_s']} s, peak RSS {results['peak_rss_mb']} MB")
    if failed:
        print("FAILED: a subscriber would have missed a message (a bloom false negative)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
