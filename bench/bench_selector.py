"""Selector evaluations per second: the compiled evaluator against its pure-Python twin, same run.

    python bench/bench_selector.py            # ~20 s
    python bench/bench_selector.py --quick    # a few seconds (CI smoke run)

Each selector is compiled once (as the broker does per subscription) and evaluated over a rotating set
of property mappings that mix matches, misses and NULLs.  Prints evaluations/s for each twin and the
ratio compiled/python.
"""
from __future__ import annotations

import argparse
import time

from pymq.selector import IMPLEMENTATIONS, compile_selector

SELECTORS = {
    "simple": "color = 'red'",
    "complex": ("(JMSType = 'car' AND color IN ('blue', 'red', 'green') AND weight BETWEEN 1000 AND 5000)"
                " OR (make LIKE 'Vol%' AND price * 1.2 - discount > 20000 AND NOT (region = 'EU'))"
                " OR (JMSPriority >= 7 AND model LIKE '%_X_%' ESCAPE '!' AND JMSCorrelationID IS NOT NULL)"),
}

MESSAGES = [
    {"JMSType": "car", "color": "blue", "weight": 2500, "make": "Volvo", "price": 30000, "discount": 500,
     "region": "US", "JMSPriority": 4},
    {"JMSType": "truck", "color": "red", "weight": 9000, "make": "Volvo", "price": 90000, "discount": 0,
     "region": "EU", "JMSPriority": 9, "model": "FH_X_16", "JMSCorrelationID": "c-1"},
    {"JMSType": "car", "color": "black", "weight": 1200, "make": "Fiat", "price": 15000.0, "JMSPriority": 7,
     "model": "Panda"},
    {"color": "red"},
    {},
]


def rate(selector, seconds: float) -> float:
    """Evaluations per second over ``seconds`` (best of 3 rounds, to dodge a noisy neighbour)."""
    matches = selector.matches
    messages = MESSAGES * 200
    best = 0.0
    for _ in range(3):
        n = 0
        start = time.perf_counter()
        deadline = start + seconds / 3
        while True:
            for m in messages:
                matches(m)
            n += len(messages)
            now = time.perf_counter()
            if now >= deadline:
                break
        best = max(best, n / (now - start))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short smoke run")
    args = ap.parse_args()
    seconds = 0.6 if args.quick else 4.0
    py, c = IMPLEMENTATIONS["py"], IMPLEMENTATIONS["c"]
    if c is None:
        print("compiled evaluator not available (PYMQ_NO_EXTENSIONS=1 or not built): python twin only")
    print(f"{'selector':8}  {'python/s':>12}  {'compiled/s':>12}  {'ratio':>6}")
    for name, text in SELECTORS.items():
        py_rate = rate(compile_selector(text, evaluator=py), seconds)
        if c is None:
            print(f"{name:8}  {py_rate:12,.0f}  {'-':>12}  {'-':>6}")
            continue
        c_rate = rate(compile_selector(text, evaluator=c), seconds)
        print(f"{name:8}  {py_rate:12,.0f}  {c_rate:12,.0f}  {c_rate / py_rate:5.1f}x")


if __name__ == "__main__":
    main()
