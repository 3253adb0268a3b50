"""Regenerate spec/vectors/{murmur3,group_routing,bloom}.json from the reference twin.

Run by hand after a deliberate change to spec/routing.md: ``python spec/tools/gen_routing_vectors.py``.
The tests never regenerate; they load the JSON.  The murmur3 values marked ``published`` are copied from
public sources (SMHasher, the widely cited test list for MurmurHash3_x86_32) and are checked here against
the twin before anything is written, so a broken twin cannot rewrite them; if the independent ``mmh3``
package is importable every murmur3 vector is cross-checked with it as well.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from pymq.errors import ClusterError  # noqa: E402
from pymq.routing import _bloom_py as ref  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "vectors")

# (input bytes, seed, expected) published for MurmurHash3_x86_32.
PUBLISHED = [
    (b"", 0, 0x00000000), (b"", 1, 0x514E28B7), (b"", 0xFFFFFFFF, 0x81F16F39),
    (b"\x00\x00\x00\x00", 0, 0x2362F9DE), (b"\x00\x00\x00", 0, 0x85F0B427), (b"\x00\x00", 0, 0x30F4C306),
    (b"\x00", 0, 0x514E28B7), (b"\xff\xff\xff\xff", 0, 0x76293B50),
    (b"\x21\x43\x65\x87", 0, 0xF55B516B), (b"\x21\x43\x65\x87", 0x5082EDEE, 0x2362F9DE),
    (b"\x21\x43\x65", 0, 0x7E4A8634), (b"\x21\x43", 0, 0xA0F7B07A), (b"\x21", 0, 0x72661CF4),
    (b"aaaa", 0x9747B28C, 0x5A97808A), (b"aaa", 0x9747B28C, 0x283E0130), (b"aa", 0x9747B28C, 0x5D211726),
    (b"a", 0x9747B28C, 0x7FA09EA6), (b"abcd", 0x9747B28C, 0xF0478627), (b"abc", 0x9747B28C, 0xC84A62DD),
    (b"ab", 0x9747B28C, 0x74875592), (b"Hello, world!", 0x9747B28C, 0x24884CBA),
    ("ππππππππ".encode(), 0x9747B28C, 0xD58063C1), (b"a" * 256, 0x9747B28C, 0x37405BDC),
    (b"abc", 0, 0xB3DD93FA), (b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 0, 0xEE925B90),
    (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
]
SMHASHER_VERIFICATION = 0xB0F57EE3


def smhasher_verification(h) -> int:
    """SMHasher's VerificationTest: hash key[0..i) (key[j] = j) with seed 256 - i for i in 0..255,
    concatenate the 256 results as little-endian uint32, hash that with seed 0."""
    key = bytes(range(256))
    out = b"".join(h(key[:i], 256 - i).to_bytes(4, "little") for i in range(256))
    return h(out, 0)


def _text(raw: bytes):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def murmur3_vectors() -> dict:
    try:
        import mmh3  # type: ignore
    except ImportError:
        mmh3 = None
    vectors = []

    def add(raw: bytes, seed: int, source: str, expected: int | None = None, note: str = "") -> None:
        got = ref.murmur3_32(raw, seed)
        if expected is not None and got != expected:
            raise SystemExit(f"twin disagrees with published value for {raw!r} seed {seed:#x}")
        if mmh3 is not None and mmh3.hash(raw, seed, signed=False) != got:
            raise SystemExit(f"twin disagrees with mmh3 for {raw!r} seed {seed:#x}")
        v = {"input_hex": raw.hex(), "seed": seed, "hash": got, "hash_hex": f"{got:08x}", "source": source}
        text = _text(raw)
        if text is not None and text.isprintable():
            v["input_text"] = text
        if note:
            v["note"] = note
        vectors.append(v)

    for raw, seed, expected in PUBLISHED:
        add(raw, seed, "published", expected)
    alphabet = b"abcdefghij"
    for n in range(0, 11):
        add(alphabet[:n], 0, "pymq", note=f"{n // 4} block(s), {n % 4}-byte tail")
    for text in ["é", "Ω", "日本語", "😀", "Grüße, Jürgen", "ordre-été-🍓", "группа-42", "\u0000nul"]:
        add(text.encode("utf-8"), 0, "pymq", note="UTF-8 of the text")
    for seed in (1, 42, 0x7FFFFFFF, 0x80000000, 0xDEADBEEF, 0xFFFFFFFF, ref.HASH_SEED_2):
        add(b"orders.eu", seed, "pymq", note="non-zero seed")
    add(bytes(i % 251 for i in range(1000)), 0, "pymq", note="1000 bytes, byte i = i mod 251")
    ver = smhasher_verification(ref.murmur3_32)
    if ver != SMHASHER_VERIFICATION:
        raise SystemExit("twin fails the SMHasher verification value")
    return {
        "algorithm": "MurmurHash3_x86_32",
        "spec": "spec/routing.md section 1",
        "description": "hash = murmur3_x86_32(bytes.fromhex(input_hex), seed); unsigned 32-bit. "
                       "source 'published' = values from SMHasher and the public MurmurHash3 test list.",
        "vectors": vectors,
        "verification": {
            "procedure": "key = bytes 0,1,...,255; for i in 0..255: r_i = murmur3(key[0:i], seed=256-i) as "
                         "4 bytes little-endian; result = murmur3(r_0 || ... || r_255, seed=0)",
            "expected": SMHASHER_VERIFICATION,
            "expected_hex": f"{SMHASHER_VERIFICATION:08x}",
        },
    }


def _sorted(dests):
    return sorted(set(dests), key=lambda d: d.encode("utf-8"))


def group_case(name: str, key: str, dests: list[str]) -> dict:
    order = _sorted(dests)
    gh = ref.group_hash(key)
    seeds = [ref.group_hash(d) for d in order]
    scores = [ref.murmur3_32(key, s) for s in seeds]
    best = max(range(len(order)), key=lambda i: (scores[i], -i))
    ranking = sorted(range(len(order)), key=lambda i: (-scores[i], i))
    return {
        "name": name, "key": key, "key_hex": key.encode("utf-8").hex(), "destinations": dests,
        "sorted": order, "destination_hashes": seeds, "group_hash": gh, "modulo_index": gh % len(order),
        "modulo": order[gh % len(order)], "rendezvous_scores": scores, "rendezvous": order[best],
        "rendezvous_ranking": [order[i] for i in ranking],
    }


# The header each routing key reads (spec/routing.md section 2.3), written out here rather than imported so
# that the vectors state the rule independently of the code they check.
_KEY_HEADER = {"group": "JMSXGroupID", "correlation-id": "correlation-id", "message-id": "message-id"}


def key_case(name: str, routing_key: str, headers: dict, dests: list[str]) -> dict:
    """Which id a message routes on under a destination's routing_key, then where it goes."""
    if "JMSXGroupID" in headers:                       # a grouped message keeps its group's node
        source = "group"
    elif routing_key != "group" and _KEY_HEADER[routing_key] in headers:
        source = routing_key
    else:
        source = None
    case = {"name": name, "routing_key": routing_key, "headers": headers, "key_source": source,
            "key": None, "destinations": dests, "modulo": None, "rendezvous": None}
    if source is not None:
        key = headers[_KEY_HEADER[source]]
        routed = group_case(name, key, dests)
        case.update(key=key, modulo=routed["modulo"], rendezvous=routed["rendezvous"])
    return case


def key_vectors() -> list[dict]:
    nodes = ["node-b", "node-c", "node-a"]
    ids = {"message-id": "ID:node-a-1700000000000001", "correlation-id": "req-42"}
    cases = []
    for setting in ("group", "correlation-id", "message-id"):
        cases.append(key_case(f"{setting}: grouped message routes on its group", setting,
                              {"JMSXGroupID": "customer-7", **ids}, nodes))
        cases.append(key_case(f"{setting}: ungrouped message with both ids", setting, dict(ids), nodes))
        cases.append(key_case(f"{setting}: message with no correlation id", setting,
                              {"message-id": ids["message-id"]}, nodes))
    cases.append(key_case("correlation-id: an empty correlation id is a key", "correlation-id",
                          {"correlation-id": "", "message-id": "ID:n-1"}, nodes))
    cases.append(key_case("correlation-id: an empty group id is still a group", "correlation-id",
                          {"JMSXGroupID": "", "correlation-id": "req-1"}, nodes))
    for i, cid in enumerate(["conversation/Grüße", "😀", "req-" + "9" * 60]):
        cases.append(key_case(f"correlation-id: non-ASCII and long keys ({i})", "correlation-id",
                              {"correlation-id": cid}, [f"node-{j}" for j in range(5)]))
    for i in range(4):
        mid = f"ID:node-b-{1700000000000000 + i}"
        cases.append(key_case(f"message-id: consecutive ids spread ({i})", "message-id",
                              {"message-id": mid}, nodes))
    return cases


def group_vectors() -> dict:
    three = ["node-c", "node-a", "node-b"]
    five = [f"node-{i}" for i in (4, 2, 5, 1, 3)]
    queues = [f"/queue/orders.{i}" for i in range(10)]
    cases = [group_case("single destination", "g-1", ["only"])]
    for key in ["order-1", "order-2", "order-3", "customer:7781", "", "ID:host-4711-1:1:1:1"]:
        cases.append(group_case(f"three nodes, key {key!r}", key, three))
    for key in ["session-9", "Grüße", "😀-group", "x" * 100]:
        cases.append(group_case(f"five nodes, key {key!r}", key, five))
    for key in ["a", "b", "c", "batch/2024-05-01"]:
        cases.append(group_case(f"ten queues, key {key!r}", key, queues))
    # UTF-16 order would put U+1F600 (D83D DE00) before U+FF61; UTF-8 byte order puts it after.
    cases.append(group_case("UTF-8 byte order, not UTF-16 order", "g", ["q-\U0001F600", "q-\uff61", "q-A"]))
    cases.append(group_case("duplicates are one destination", "order-1", ["n2", "n1", "n2", "n1", "n3"]))
    a, b = "node-70603", "node-53119"
    if ref.group_hash(a) != ref.group_hash(b):
        raise SystemExit("tie pair no longer collides")
    tie = group_case("equal destination hashes tie on every key: first in byte order wins", "any-group", [a, b])
    if tie["rendezvous"] != b:
        raise SystemExit("tie-break broken")
    cases.append(tie)
    return {
        "spec": "spec/routing.md section 2",
        "description": "sorted = distinct destinations ascending by UTF-8 bytes; modulo = sorted[group_hash mod N]; "
                       "rendezvous = argmax over sorted of murmur3(utf8(key), seed=murmur3(utf8(dest), 0)), "
                       "first in sorted order on equal scores; ranking = descending score, then sorted order.",
        "cases": cases,
        "errors": [{"destinations": [], "error": "no-destination"}],
        "key_description": "key_cases: a destination's routing_key (group | correlation-id | message-id) and a "
                           "message's headers give key_source and key: JMSXGroupID when present (whatever the "
                           "setting), else the setting's header (correlation-id or message-id) when present, "
                           "even empty; key_source null means unkeyed (not hash-routed). modulo and rendezvous "
                           "route key over destinations as in cases[].",
        "key_cases": key_vectors(),
        "key_errors": [{"routing_key": "JMSXGroupID", "error": "unknown-routing-key"},
                       {"routing_key": "", "error": "unknown-routing-key"},
                       {"routing_key": "Message-ID", "error": "unknown-routing-key"}],
    }


def filter_case(name: str, m: int, k: int, ops: list[dict], probes: list[str]) -> dict:
    f = ref.SubscriptionFilter(m, k)
    for op in ops:
        times = op.get("times", 1)
        results = []
        for _ in range(times):
            if op["op"] == "add":
                f.add(op["topic"])
            elif op["op"] == "remove":
                results.append(f.remove(op["topic"]))
            elif op["op"] == "add_pattern":
                f.add_pattern(op["topic"])
            elif op["op"] == "remove_pattern":
                results.append(f.remove_pattern(op["topic"]))
        if results:
            if len(set(results)) != 1:
                raise SystemExit(f"{name}: repeated op gave mixed results")
            op["result"] = results[0]
    topics = sorted({op["topic"] for op in ops if op["op"] in ("add", "remove")} | set(probes))
    return {
        "name": name, "m": m, "k": k, "operations": ops, "count": f.count, "match_all": f.match_all,
        "counters_hex": f.counters().hex(), "bits_hex": f.to_bits().hex(), "digest_hex": f.digest().to_bytes().hex(),
        "serialized_hex": f.to_bytes().hex(),
        "probes": [{"topic": t, "might_contain": f.might_contain(t)} for t in topics],
    }


def bloom_vectors() -> dict:
    index_cases = []
    for topic, m, k in [("orders", 64, 3), ("orders", 1000, 7), ("prices.eu.fx", 95856, 7), ("", 100, 4),
                        ("日本語/トピック", 4096, 10), ("a", 7, 8), ("weather/london", 13, 5), ("x" * 64, 1 << 30, 32)]:
        h1, h2 = ref.hash_pair(topic)
        index_cases.append({"topic": topic, "topic_hex": topic.encode().hex(), "h1": h1, "h2": h2, "m": m, "k": k,
                            "indexes": ref.bloom_indexes(topic, m, k)})
    # a topic whose indexes are all set by "a" but one index of which it needs twice: remove refuses.
    m7 = ref.SubscriptionFilter(7, 8)
    m7.add("a")
    refused = next(f"t{i}" for i in range(10000)
                   if m7.might_contain(f"t{i}") and not m7.copy().remove(f"t{i}"))
    filters = [
        filter_case("empty", 64, 3, [], ["orders"]),
        filter_case("three topics", 64, 3, [{"op": "add", "topic": t} for t in ("orders", "prices", "news")],
                    ["alerts", "trades"]),
        filter_case("add then remove leaves zeros", 64, 3,
                    [{"op": "add", "topic": "orders"}, {"op": "add", "topic": "prices"},
                     {"op": "remove", "topic": "orders"}, {"op": "remove", "topic": "never-added"}],
                    ["orders"]),
        filter_case("m not a multiple of 8 (padding bits stay zero)", 13, 5,
                    [{"op": "add", "topic": t} for t in ("weather/london", "weather/paris")], ["weather/rome"]),
        filter_case("duplicate indexes need their multiplicity to be removed", 7, 8,
                    [{"op": "add", "topic": "a"}, {"op": "remove", "topic": refused},
                     {"op": "remove", "topic": "a"}], []),
        filter_case("saturated counters are never decremented", 16, 3,
                    [{"op": "add", "topic": "hot", "times": 300}, {"op": "remove", "topic": "hot", "times": 300},
                     {"op": "add", "topic": "cold"}, {"op": "remove", "topic": "cold"}], ["hot", "cold"]),
        filter_case("wildcard subscription makes the filter match-all", 64, 3,
                    [{"op": "add", "topic": "orders"}, {"op": "add_pattern", "topic": "prices.>"},
                     {"op": "add_pattern", "topic": "news.*", "times": 2},
                     {"op": "remove_pattern", "topic": "news.*"}, {"op": "remove_pattern", "topic": "never"}],
                    ["anything"]),
        filter_case("sized for 100 topics at 1%", *ref.optimal_parameters(100, 0.01),
                    [{"op": "add", "topic": f"topic-{i}"} for i in range(100)],
                    [f"topic-{i}" for i in range(95, 105)]),
    ]
    sizing = []
    for n, p in [(1, 0.5), (100, 0.01), (1000, 0.01), (10000, 0.01), (10000, 0.001), (1000000, 0.0001)]:
        m, k = ref.optimal_parameters(n, p)
        sizing.append({"expected_items": n, "fpr": p, "m": m, "k": k})
    good = ref.SubscriptionFilter(13, 5)
    good.add("x")
    dg = good.digest().to_bytes()
    bad_digests = [
        {"hex": dg[:5].hex(), "reason": "truncated-header"},
        {"hex": (bytes([2]) + dg[1:]).hex(), "reason": "unsupported-format"},
        {"hex": (dg[:1] + bytes([2]) + dg[2:]).hex(), "reason": "unsupported-hash-version"},
        {"hex": (dg[:3] + bytes([0x02]) + dg[4:]).hex(), "reason": "unknown-flags"},
        {"hex": (dg[:2] + bytes([0]) + dg[3:]).hex(), "reason": "bad-parameters"},
        {"hex": (dg[:2] + bytes([33]) + dg[3:]).hex(), "reason": "bad-parameters"},
        {"hex": dg[:-1].hex(), "reason": "bits-length"},
        {"hex": (dg + b"\x00").hex(), "reason": "bits-length"},
        {"hex": (dg[:-1] + bytes([dg[-1] | 0x20])).hex(), "reason": "padding-bits-set"},
    ]
    fs = good.to_bytes()
    bad_filters = [
        {"hex": fs[:10].hex(), "reason": "truncated-header"},
        {"hex": (b"XMQC" + fs[4:]).hex(), "reason": "bad-magic"},
        {"hex": (fs[:4] + bytes([2]) + fs[5:]).hex(), "reason": "unsupported-format"},
        {"hex": (fs[:5] + bytes([9]) + fs[6:]).hex(), "reason": "unsupported-hash-version"},
        {"hex": (fs[:7] + bytes([4]) + fs[8:]).hex(), "reason": "unsupported-counter-width"},
        {"hex": (fs[:6] + bytes([0]) + fs[7:]).hex(), "reason": "bad-parameters"},
        {"hex": fs[:-1].hex(), "reason": "counters-length"},
        {"hex": (fs[:20] + (1).to_bytes(4, "big") + b"\x00\x01").hex(), "reason": "truncated-pattern"},
        {"hex": (fs[:20] + (1).to_bytes(4, "big") + bytes([0, 0, 0, 0, 0, 1]) + b"p" + fs[24:]).hex(),
         "reason": "bad-pattern"},
        {"hex": (fs[:20] + (1).to_bytes(4, "big") + bytes([0, 0, 0, 1, 0, 1]) + b"\xff" + fs[24:]).hex(),
         "reason": "bad-pattern"},
    ]
    for case in bad_digests:
        try:
            ref.BloomDigest.from_bytes(bytes.fromhex(case["hex"]))
        except ClusterError as exc:
            if exc.reason != case["reason"]:
                raise SystemExit(f"bad digest vector gives {exc.reason}, not {case['reason']}")
        else:
            raise SystemExit(f"bad digest vector accepted: {case}")
    for case in bad_filters:
        try:
            ref.SubscriptionFilter.from_bytes(bytes.fromhex(case["hex"]))
        except ClusterError as exc:
            if exc.reason != case["reason"]:
                raise SystemExit(f"bad filter vector gives {exc.reason}, not {case['reason']}")
        else:
            raise SystemExit(f"bad filter vector accepted: {case}")
    return {
        "spec": "spec/routing.md section 3",
        "hash_version": ref.HASH_VERSION, "seed_1": 0, "seed_2": ref.HASH_SEED_2, "counter_bits": 8,
        "counter_max": ref.COUNTER_MAX,
        "description": "h1 = murmur3(utf8(topic), 0), h2 = murmur3(utf8(topic), seed_2), "
                       "index_i = (h1 + i*h2) mod m for i in 0..k-1. Operations with 'times' repeat; "
                       "'result' is what every repetition of remove/remove_pattern returns.",
        "index_cases": index_cases, "filter_cases": filters, "sizing": sizing,
        "bad_digests": bad_digests, "bad_filters": bad_filters,
    }


def main() -> None:
    for name, data in [("murmur3.json", murmur3_vectors()), ("group_routing.json", group_vectors()),
                       ("bloom.json", bloom_vectors())]:
        path = os.path.join(OUT, name)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, ensure_ascii=False)
            fh.write("\n")
        print("wrote", os.path.relpath(path))


if __name__ == "__main__":
    main()
