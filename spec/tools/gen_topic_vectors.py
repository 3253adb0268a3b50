"""Generate spec/vectors/topic_patterns.json (spec/routing.md §5) from hand-picked cases.

The expected answers come from an oracle written here, independently of pymq/routing: a recursive matcher
over word lists, and, for ``covers``, every topic of up to ``len(general) + len(specific) + 2`` words over
the patterns' literal words and one word neither names. Regenerate only on a deliberate change:

    python spec/tools/gen_topic_vectors.py > spec/vectors/topic_patterns.json
"""
from __future__ import annotations

import itertools
import json
import sys
from functools import lru_cache


def normalize(pattern: str) -> str:
    out: list[str] = []
    for word in pattern.split("."):
        word = "#" if word == ">" else word
        if word == "#" and out and out[-1] == "#":
            continue
        out.append(word)
    return ".".join(out)


@lru_cache(maxsize=None)
def _match(p: tuple[str, ...], t: tuple[str, ...]) -> bool:
    if not p:
        return not t
    if p[0] == "#":
        return _match(p[1:], t) or (bool(t) and _match(p, t[1:]))
    if not t:
        return False
    return (p[0] == "*" or p[0] == t[0]) and _match(p[1:], t[1:])


def match(pattern: str, topic: str) -> bool:
    return _match(tuple(normalize(pattern).split(".")), tuple(topic.split(".")))


def covers(general: str, specific: str) -> bool:
    g, s = normalize(general).split("."), normalize(specific).split(".")
    words = sorted({w for w in g + s if w not in ("*", "#")}) + ["\x00fresh"]
    for n in range(1, len(g) + len(s) + 3):
        for topic in itertools.product(words, repeat=n):
            if _match(tuple(s), topic) and not _match(tuple(g), topic):
                return False
    return True


def is_pattern(name: str) -> bool:
    return any(w in ("*", "#", ">") for w in name.split("."))


PATTERNS = ["stocks.*", "stocks.#", "stocks.>", "#", ">", "*", "*.*", "*.ibm", "stocks.*.ibm", "stocks.#.ibm",
            "a.#.b.#.c", "#.#", "#.*", "*.#", "a.*.#", "a*b.*", "a.b", "", ".", "a..b", "a.*.*.b", "#.z",
            "a.#.#.b", "x.>.y", "stocks.nyse.*", "ünï.*", "*.*.*"]
TOPICS = ["stocks", "stocks.ibm", "stocks.nyse.ibm", "stocks.nyse", "stocks.nasdaq.msft.ibm", "ibm", "a.b",
          "a.x.b", "a.b.c", "a.b.x.c", "a.x.b.y.c", "a.c", "a*b.x", "axb.x", "", ".", "a..b", "a.x.y.b", "z",
          "q.z", "x.y", "x.q.y", "ünï.code", "a.b.b.b", "stocks.ibm.ibm"]

COVERS = [
    ("stocks.*", "stocks.ibm"), ("stocks.*", "stocks.*"), ("stocks.*", "stocks.#"), ("stocks.*", "#"),
    ("#", "stocks.*"), ("#", "#"), (">", "stocks.#"), ("stocks.#", "stocks.*"), ("stocks.#", "stocks.*.*"),
    ("stocks.#", "stocks"), ("stocks.*", "stocks"), ("*.#", "#"), ("#", "*.#"), ("#.*", "*.#"), ("*", "#"),
    ("#", "*"), ("*.*", "#"), ("*.*", "*.#"), ("a.#.b", "a.b"), ("a.#.b", "a.*.b"), ("a.*.b", "a.#.b"),
    ("a.#.b", "a.#.x.b"), ("a.#.x.b", "a.#.b"), ("stocks.>", "stocks.nyse.>"), ("stocks.nyse.>", "stocks.>"),
    ("*.ibm", "stocks.ibm"), ("*.ibm", "stocks.*"), ("stocks.ibm", "stocks.ibm"), ("stocks.ibm", "stocks.*"),
    ("a.*", "a.b"), ("a.b", "a.*"), ("#.b", "a.#.b"), ("a.#", "a.#.b"), ("#.#", "#"), ("*.#.*", "a.b"),
    ("*.#.*", "a"), ("a*b.*", "a*b.x"), ("a*b.*", "axb.x"),
]

NAMES = ["stocks", "stocks.*", "stocks.>", "stocks.#", "a*b", "a#b", "a>b", "*", "#", ">", "a.*b", "a.b*",
         "**", "##", ">>", "a.>.b", "", "."]


def main() -> None:
    doc = {
        "about": "Topic patterns (spec/routing.md section 5): '.' separates words, '*' is one word, '#' zero or "
                 "more words, ActiveMQ's '>' is '#'; a wildcard is a whole word. Every implementation that "
                 "matches topics runs these (the broker's compiled PatternIndex and its pure twin).",
        "normalize": [{"pattern": p, "normal": normalize(p)} for p in PATTERNS],
        "is_pattern": [{"name": n, "pattern": is_pattern(n)} for n in NAMES],
        "matches": [{"pattern": p, "topic": t, "match": match(p, t)} for p in PATTERNS for t in TOPICS],
        "index": {"patterns": PATTERNS,
                  "cases": [{"topic": t, "matches": sorted({normalize(p) for p in PATTERNS if match(p, t)})}
                            for t in TOPICS]},
        "covers": [{"general": g, "specific": s, "covers": covers(g, s)} for g, s in COVERS],
    }
    sys.stdout.write(compact(doc) + "\n")


def compact(doc: dict) -> str:
    """One case per line (as spec/vectors/selector.json), so a change reads as a diff of cases."""
    one = lambda v: json.dumps(v, ensure_ascii=False)  # noqa: E731
    lines = ["{"]
    for i, (key, value) in enumerate(doc.items()):
        end = "," if i < len(doc) - 1 else ""
        if isinstance(value, list):
            lines.append(f"  {one(key)}: [")
            lines += [f"    {one(v)}" + ("," if j < len(value) - 1 else "") for j, v in enumerate(value)]
            lines.append("  ]" + end)
        elif isinstance(value, dict):
            lines.append(f"  {one(key)}: {{")
            items = list(value.items())
            for j, (k, v) in enumerate(items):
                tail = "," if j < len(items) - 1 else ""
                if isinstance(v, list) and v and isinstance(v[0], dict):
                    lines.append(f"    {one(k)}: [")
                    lines += [f"      {one(x)}" + ("," if n < len(v) - 1 else "") for n, x in enumerate(v)]
                    lines.append("    ]" + tail)
                else:
                    lines.append(f"    {one(k)}: {one(v)}" + tail)
            lines.append("  }" + end)
        else:
            lines.append(f"  {one(key)}: {one(value)}" + end)
    lines.append("}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
