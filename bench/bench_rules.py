"""Storage-rule selection cost per message with 1000 rules: compiled evaluator against the Python twin.

    python bench/bench_rules.py            # ~30 s
    python bench/bench_rules.py --quick    # a few seconds (CI smoke run)

1000 generated rules over five devices (SIZE ranges, TYPE, HEADER(..).contains/.isPresent,
DESTINATION / DESTINATION_NAME LIKE, PRIORITY, PERSISTENT, CLIENT_ID), fixed device scores, and a
rotating set of message contexts.  Measures ``RuleEvaluator.select`` per message for the first-match
strategy (stops at the first matching rule of the sorted list), for a message no rule matches
(first-match then evaluates all 1000), and for the average strategy (always evaluates all 1000);
reports the number of sorts, which must stay at one: scores do not change here.
"""
from __future__ import annotations

import argparse
import random
import time

from pymq.selector import IMPLEMENTATIONS, rule_context
from pymq_server.storage.selection import RuleBook, RuleEvaluator, SelectionRule, StaticHealth

DEVICES = {"memory": 0, "file": -10, "db1": -20, "db2": -5, "grid": -30}


def make_rules(n: int, seed: int = 7) -> list[SelectionRule]:
    rnd = random.Random(seed)
    atoms = [
        lambda: f"SIZE > {rnd.randint(1, 5000)}",
        lambda: f"SIZE < {rnd.randint(1, 5000)}",
        lambda: f"SIZE BETWEEN {rnd.randint(0, 100)} AND {rnd.randint(100, 9000)}",
        lambda: f"TYPE == {rnd.choice(['TEXT', 'BYTES', 'MAP'])}",
        lambda: f"TYPE IN ({', '.join(rnd.sample(['TEXT', 'BYTES', 'MAP', 'OBJECT'], 2))})",
        lambda: f"HEADER('locator').contains('{rnd.choice(['fast', 'slow', 'db', 'x'])}{rnd.randint(0, 20)}')",
        lambda: f"HEADER('h{rnd.randint(0, 30)}').isPresent()",
        lambda: f"DESTINATION == {rnd.choice(['QUEUE', 'TOPIC'])}",
        lambda: f"DESTINATION_NAME LIKE '/queue/orders.{rnd.randint(0, 50)}%'",
        lambda: f"PRIORITY >= {rnd.randint(0, 9)}",
        lambda: "PERSISTENT" if rnd.random() < 0.5 else "NOT PERSISTENT",
        lambda: f"CLIENT_ID = 'app-{rnd.randint(0, 40)}'",
    ]
    rules = []
    for i in range(n):
        k = rnd.choice([2, 3, 3, 4])
        parts = [rnd.choice(atoms)() for _ in range(k)]
        glue = " OR " if rnd.random() < 0.1 else " AND "
        rules.append(SelectionRule(f"R{i:04d}", rnd.choice(list(DEVICES)), rnd.randint(1, 100), glue.join(parts)))
    return rules


def make_contexts(n: int, seed: int = 11) -> list[dict]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        headers = {f"h{rnd.randint(0, 60)}": "1" for _ in range(rnd.randint(0, 4))}
        if rnd.random() < 0.5:
            headers["locator"] = f"{rnd.choice(['fast', 'slow'])} db{rnd.randint(0, 20)}"
        kind = rnd.choice(["queue", "topic"])
        out.append(rule_context(size_bytes=rnd.randint(100, 12_000_000), body_type=rnd.choice(["TEXT", "BYTES", "MAP"]),
                                headers=headers, destination=f"/{kind}/orders.{rnd.randint(0, 99)}",
                                client_id=f"app-{rnd.randint(0, 80)}", priority=rnd.randint(0, 9),
                                persistent=rnd.random() < 0.7, producer="bench"))
    return out


def per_message(evaluator: RuleEvaluator, contexts: list[dict], seconds: float) -> float:
    """Seconds per select() call (best of 3 rounds)."""
    select = evaluator.select
    best = float("inf")
    for _ in range(3):
        n = 0
        start = time.perf_counter()
        while True:
            for ctx in contexts:
                select(ctx)
            n += len(contexts)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / 3:
                break
        best = min(best, elapsed / n)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short smoke run")
    ap.add_argument("--rules", type=int, default=1000)
    args = ap.parse_args()
    seconds = 0.6 if args.quick else 5.0
    book = RuleBook(make_rules(args.rules))
    contexts = make_contexts(200)
    health = StaticHealth(DEVICES)
    impls = [(name, mod) for name, mod in (("python", IMPLEMENTATIONS["py"]), ("compiled", IMPLEMENTATIONS["c"]))
             if mod is not None]
    print(f"{args.rules} rules, {len(contexts)} message contexts")
    print(f"{'strategy':12}  {'python µs/msg':>14}  {'compiled µs/msg':>16}  {'ratio':>6}  sorts")
    depth = None
    # a message no rule matches: first-match must evaluate all of them
    nothing = [{key: None for key in rule_context(size_bytes=0)} | {"headers": {}}]
    scenarios = (("first-match", contexts), ("first-match", nothing), ("average", contexts))
    for strategy, workload in scenarios:
        results = {}
        sorts = []
        for name, mod in impls:
            ev = RuleEvaluator(book, health, strategy=strategy, default_device="memory", implementation=mod)
            if workload is contexts and strategy == "first-match" and depth is None:
                ranked = [r.id for r in ev.ranking()]
                hits = [ranked.index(d.rule_id) + 1 for d in map(ev.select, contexts) if d.rule_id]
                depth = sum(hits) / max(1, len(hits))
            assert workload is contexts or ev.select(workload[0]).fallback == "default"
            results[name] = per_message(ev, workload, seconds)
            sorts.append(ev.sorts)
        label = strategy if workload is contexts else "no match"
        py_us = results["python"] * 1e6
        if "compiled" in results:
            c_us = results["compiled"] * 1e6
            print(f"{label:12}  {py_us:14.1f}  {c_us:16.1f}  {py_us / c_us:5.1f}x  {sorts}")
        else:
            print(f"{label:12}  {py_us:14.1f}  {'-':>16}  {'-':>6}  {sorts}")
    print(f"first-match evaluates {depth:.0f} rules per message on average before the first match")


if __name__ == "__main__":
    main()
