"""Generate spec/vectors/worker_owners.json: which worker owns a destination (spec/cores.md §2).

The oracle is written here from the spec's words, not imported from server/cores: the rendezvous hash of
spec/routing.md §2.2 over the worker ids ``w0 .. w<W-1>`` (murmur3 from the pure-Python reference, scores
compared here, ties to the first id in UTF-8 order) for an ordinary name, and for a *numbered* name
``<stem>.<n>`` (n: 1-18 ASCII digits) the stem's winner plus n, modulo W: the ``numbered`` placement; each case
also under the ``hash`` placement (a data directory written before the numbered rule, CONNECTED's
``pymq-placement:hash``), where every name is hashed whole. Only ordinary destination names
are listed (what a client such as the JVM Spark reader computes); the home's own names (``/pymq/``, a
connection's temporaries) and dead-letter queues are spec/cores.md §2's and tested in tests/cores.
Regenerate only on a deliberate change:

    python spec/tools/gen_worker_vectors.py > spec/vectors/worker_owners.json
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from pymq.routing import _bloom_py as ref  # noqa: E402


def rendezvous(key: str, workers: int) -> int:
    ids = sorted((f"w{k}" for k in range(workers)), key=lambda w: w.encode("utf-8"))
    scores = [ref.murmur3_32(key, ref.murmur3_32(w, 0)) for w in ids]
    best = max(range(len(ids)), key=lambda i: (scores[i], -i))
    return int(ids[best][1:])


def owner(name: str, workers: int, placement: str) -> int:
    stem, dot, number = name.rpartition(".")
    if placement == "numbered" and dot and 1 <= len(number) <= 18 and all(ch in "0123456789" for ch in number):
        return (rendezvous(stem, workers) + int(number)) % workers
    return rendezvous(name, workers)


NAMES = [
    # numbered families: W consecutive members on W different workers
    *[f"/queue/orders.{n}" for n in range(8)],
    *[f"/topic/prices.eu.{n}" for n in range(5)],
    *[f"/queue/bench.1764356400123.m.{n}" for n in range(4)],
    "/queue/orders.007", "/queue/orders.123456789012345678",
    # hashed whole: no number, not only ASCII digits, too long, empty, a sign
    "/queue/orders", "/topic/prices.eu", "/queue/orders.1a", "/queue/orders.-1", "/queue/orders.",
    "/queue/orders.1234567890123456789", "/queue/orders.\u0662", "/queue/orders.\u00b2", "/queue/orders 1",
    "/queue/7", "/queue/a.b-3", "/queue/\u00e9t\u00e9.3",
]


def main() -> None:
    cases = [{"placement": placement, "workers": w, "destination": name, "owner": owner(name, w, placement)}
             for placement in ("numbered", "hash") for w in (2, 3, 5, 16) for name in NAMES]
    json.dump({"spec": "spec/cores.md section 2",
               "description": "owner(d) for W workers under the data directory's placement (CONNECTED's "
                              "pymq-placement): numbered: a name <stem>.<n> (n 1-18 ASCII digits) -> "
                              "(rendezvous(stem) + n) mod W, any other name -> rendezvous(d); hash (a data directory "
                              "written before the numbered rule): every name -> rendezvous(d); rendezvous = "
                              "spec/routing.md 2.2 over the candidates w0..w<W-1>, the winner's number",
               "cases": cases}, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
