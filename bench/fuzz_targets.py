"""Coverage-guided (atheris / libFuzzer) targets for the compiled scanner, the selector front end and the
broker's reader of bulk SEND bodies.

    python bench/fuzz_targets.py scanner -max_total_time=60 -print_final_stats=1 [corpus_dir]
    python bench/fuzz_targets.py selector -max_total_time=60 -print_final_stats=1 [corpus_dir]
    python bench/fuzz_targets.py bulk -max_total_time=60 -print_final_stats=1 [corpus_dir]
    python bench/fuzz_targets.py definitions -max_total_time=60 -print_final_stats=1 [corpus_dir]
    python bench/fuzz_targets.py filter -max_total_time=60 -print_final_stats=1 [corpus_dir]
    python bench/fuzz_targets.py handover -max_total_time=60 -print_final_stats=1 [corpus_dir]
    python bench/fuzz_targets.py send -max_total_time=60 -print_final_stats=1 [corpus_dir]

``send`` feeds a SEND frame's header lines (as the broker's scanner reads them, STOMP 1.2) to both twins of
``parse_send`` (server/broker/_send_py.py, _ext/send.pyx): the same SendRequest field by field and type by type,
or the same exception naming the same header (tests/hostile/send_headers.py states the property).

``handover`` feeds a HANDOVER envelope's payload (spec/cores.md §2.1, §2.4: a moved connection's state and the
bytes read behind it) to the adopting worker: ``unpack_state`` must refuse it with ValueError or accept exactly
the fields ``hand_over`` writes, and the adoption must give a connection in the state CONNECTED or one closed
with an ERROR, never a traceback (tests/hostile/handover_states.py states the property).

``filter`` feeds a cluster peer's filter announcement (spec/routing.md §3.4-3.5: the digest bytes and the
``pymq-filter-patterns`` list) to ``TopicInterest.announced``: it must apply it or refuse with a
ClusterError, and the peer it describes must then want a topic exactly when its digest's bits or its
listed patterns say so, or be match-all; nothing else may be raised.

``bulk`` feeds the bytes to ``bulk_rows.read_bulk`` (an Arrow IPC stream, spec/spark.md §7): it must
refuse with a MessageFormatError or give a batch that pyarrow's own full validation accepts and that the
broker then uses all the way (rows completed, made into messages, a segment's views, an Arrow answer)
without any other exception; a crash of the process (pyarrow reading a buffer it should not) is found
as such.  Seeds are valid bodies of every bulk column type, plain and ZSTD-compressed.

Run by ``python -m bench.fuzz`` (which sets the time and collects the figures).  Each target is
*differential*: the same input goes to the compiled module and to its pure-Python twin, and any
difference in outcome — frames, buffered bytes, error class and message; selector position, expected
text and three-valued result — is a crash, as is any exception outside the error tree or a crash of the
process itself.  Coverage: atheris instruments the Python twins and the parser (``instrument_imports``),
so the mutation is guided by the reference implementation's branches; the compiled modules are not
instrumented (that needs clang's ``-fsanitize=fuzzer-no-link``, and this machine has only gcc), they are
exercised on every input the twin's coverage finds interesting.
"""
from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from pymq import errors
    from pymq.protocol import _scanner_py
    from pymq.selector import IMPLEMENTATIONS, SelectorLimits, compile_selector
    from pymq.selector import _lexer, _parser  # noqa: F401  (instrumented for coverage)

    from pymq_server.broker import bulk_rows, bulk_stream  # noqa: F401  (instrumented for coverage)
    from pymq_server.admin import definitions
    from pymq_server.cluster import topics as cluster_topics  # noqa: F401  (instrumented for coverage)
    from pymq_server.cores import handover  # noqa: F401  (instrumented for coverage)
    from pymq_server.broker import _send_py  # noqa: F401  (instrumented for coverage)

from pymq.protocol import _scanner_c
from pymq_server.broker import _send_c
from pymq_server.broker import segments
from pymq_server.broker.message import BrokerMessage

LIMITS = SelectorLimits(max_length=4096, max_terms=512)
VALUES = [{}, {"x": 3, "p": "aab%_", "b": True, "s": "red", "n": None},
          {"x": 2 ** 63 - 1, "p": "", "b": False, "s": 1.5, "y": float("nan")}]


def _scan(module, data: bytes, cut: int, limit: int, version: str):
    scanner = module.FrameScanner(max_frame_size=limit, version=version)
    frames = []
    try:
        frames += scanner.feed(data[:cut])
        frames += scanner.feed(data[cut:])
        while True:
            more = scanner.feed(b"")
            if not more:
                break
            frames += more
        return ("ok", [tuple(f) for f in frames], scanner.buffered)
    except errors.ProtocolError as exc:
        return ("error", type(exc).__name__, str(exc), [tuple(f) for f in frames])


def scanner_target(data: bytes) -> None:
    if len(data) < 3:
        return
    cut = data[0] * 4
    limit = (64, 300, 4096, 1 << 20, (1 << 63) - 1)[data[1] % 5]
    version = ("1.0", "1.1", "1.2")[data[2] % 3]
    body = data[3:]
    c = _scan(_scanner_c, body, cut, limit, version)
    py = _scan(_scanner_py, body, cut, limit, version)
    if c != py:
        raise AssertionError(f"scanner twins disagree on {body!r} (cut {cut}, limit {limit}, {version}):\n"
                             f"  c:  {c!r}\n  py: {py!r}")


def _selector(module, text: str):
    try:
        s = compile_selector(text, evaluator=module, limits=LIMITS)
    except errors.InvalidSelector as exc:
        return ("invalid", exc.position, exc.expected)
    return ("ok",) + tuple(s.evaluate(v) for v in VALUES)


def selector_target(data: bytes) -> None:
    text = atheris.FuzzedDataProvider(data).ConsumeUnicodeNoSurrogates(len(data))
    results = {name: _selector(module, text) for name, module in IMPLEMENTATIONS.items() if module is not None}
    if len(set(map(repr, results.values()))) != 1:
        raise AssertionError(f"selector twins disagree on {text!r}: {results!r}")


def bulk_target(data: bytes) -> None:
    try:
        batch = bulk_rows.read_bulk(data, max_bytes=8 * 1024 * 1024)
    except errors.MessageFormatError:
        return
    batch.validate(full=True)                       # an independent judge of what was accepted
    rows = bulk_rows.complete_bulk(batch, first_seq=1, first_key=1, node_id="n", now=5, persistent=True,
                                   priority=4, ttl=0)
    segments.materialize(rows, "/queue/q", range(1, rows.num_rows + 1), BrokerMessage)
    segment = segments.Segment(rows)
    segment.body_ends()
    segment.body_sizes()
    segment.first_expiry()
    segments.ipc_pieces(segments.LOG_SCHEMA, [rows]).join()


_DEFINITIONS: list = []


def _definitions_admin():
    """One in-process broker core (tests/broker/core_harness.py) the target checks documents against."""
    if not _DEFINITIONS:
        import pathlib
        import tempfile
        from types import SimpleNamespace
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
        from tests.broker.core_harness import Core
        core = Core(pathlib.Path(tempfile.mkdtemp(prefix="pymq-fuzz-defs-")), memory_only=True)
        _DEFINITIONS.append(SimpleNamespace(broker=core.broker, server=SimpleNamespace(store=core.store)))
    return _DEFINITIONS[0]


def definitions_target(data: bytes) -> None:
    """A definitions document (server/admin/definitions.py, spec/admin.md): its check must answer with an
    error of the tree (ConfigError, DestinationExists) or a plan, whatever the JSON; nothing is applied."""
    import json
    text = atheris.FuzzedDataProvider(data).ConsumeUnicodeNoSurrogates(len(data))
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return
    try:
        definitions.check(_definitions_admin(), doc)
    except errors.PymqError:
        pass


def filter_target(data: bytes) -> None:
    """A peer's filter announcement: (digest bytes, patterns header) from the input, checked by the property
    of tests/hostile/filter_announcements.py."""
    fdp = atheris.FuzzedDataProvider(data)
    body = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    raw = fdp.ConsumeUnicodeNoSurrogates(fdp.remaining_bytes()) if fdp.ConsumeBool() else None
    _filter_check()(body, raw)


def _filter_check():
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from tests.hostile.filter_announcements import check_announcement
    return check_announcement


def send_target(data: bytes) -> None:
    """A SEND's header block, parsed by both twins of parse_send (tests/hostile/send_headers.py)."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from tests.hostile.send_headers import check_block
    check_block(_send_c, data)


def handover_target(data: bytes) -> None:
    """A HANDOVER payload, adopted by one in-process worker core (tests/hostile/handover_states.py)."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from tests.hostile.handover_states import check_state
    check_state(data)


TARGETS = {"scanner": scanner_target, "selector": selector_target, "bulk": bulk_target,
           "definitions": definitions_target, "filter": filter_target, "handover": handover_target,
           "send": send_target}


def _bulk_seeds() -> list[bytes]:
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from tests.hostile.bulk_bodies import seed_bodies
    return seed_bodies()

def _handover_seed(state: bytes, unread: bytes) -> bytes:
    return len(state).to_bytes(4, "big") + state + unread


SEEDS = {
    "send": [b"destination:/queue/q\ncontent-type:text/plain\npersistent:true\npriority:7\ncolour:red",
             b"destination:/q\nAMQ_SCHEDULED_DELAY:5\n_AMQ_DUPL_ID:d\npymq-forwarded:b\nexpires:9223372036854775807",
             b"destination:/q\npriority:+5\npersistent:TRUE\nreceipt:r\ntransaction:t\nmessage-id:forged"],
    "scanner": [b"\x05\x02\x02SEND\ndestination:/q\ncontent-length:3\n\nabc\x00",
                b"\x00\x04\x02CONNECT\ncontent-length:9223372036854775807\n\nabc",
                b"\x01\x03\x01SUBSCRIBE\nid:1\ndestination:/q\nk:a\\cb\n\n\x00\n\n"],
    "selector": [b"color = 'red' AND weight > 2500", b"p LIKE '%a_b%' ESCAPE '!'", b"x + 1 * 2 BETWEEN 1 AND 9",
                 b"NOT (a IN ('x', 'y') OR b IS NULL)", b"x = 9223372036854775807"],
    "definitions": [b'{"pymq_definitions": 1, "queues": [{"name": "q", "settings": {"max_depth": 5}, "acl": '
                    b'{"owner": null, "grants": {"*": ["consume"]}}}], "permissions": [{"destination": '
                    b'"/topic/a.*", "grants": {"role:r": ["produce"]}}], "durable_subscriptions": [{"topic": "a.#", '
                    b'"owner": "o", "name": "n", "selector": "x > 1"}], "users": [{"name": "u", "roles": ["r"], '
                    b'"password_hash": "scrypt$16384$8$1$c2FsdA$ZA"}], "vhosts": {}}'],
    "handover": [_handover_seed(b'{"user": "guest", "roles": ["admin"], "subject": null, "version": "1.2", '
                                b'"client_id": "c", "vhost": "shop", "to_client": 250, "to_server": 0, "from": "w0c1"}',
                                b"SEND\ndestination:/queue/h.0\nreceipt:r\n\nx\x00"
                                b"SUBSCRIBE\nid:1\ndestination:/queue/h.0\n\n\x00"),
                 _handover_seed(b'{"user": "u", "version": "1.0"}', b"")],
    "filter": [b"\x08\x01\x01\x07\x01\x00\x00\x00\x08\xff" + b'["stocks.*","a.#"]',
               b"\x08\x01\x01\x07\x00\x00\x00\x00\x08\x00" + b'["*.x"]', b"\x00" + b"[[[[[["],
}


def main() -> None:
    name = sys.argv[1]
    argv = [sys.argv[0]] + sys.argv[2:]
    corpus = [a for a in argv[1:] if not a.startswith("-")]
    if name == "bulk":
        SEEDS["bulk"] = _bulk_seeds()
    for directory in corpus:
        import os
        os.makedirs(directory, exist_ok=True)
        for i, seed in enumerate(SEEDS[name]):
            path = os.path.join(directory, f"seed-{i}")
            if not os.path.exists(path):
                with open(path, "wb") as fh:
                    fh.write(seed)
    atheris.Setup(argv, TARGETS[name])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
