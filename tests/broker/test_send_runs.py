"""A session's SENDs of one read form a run: the first is planned (Placement.plan), each later one with the same
plan inputs follows it (Placement.follow: the rules that read the message applied to it, the rest of the plan
re-used). A run must give exactly what the same SENDs give one read at a time: message ids, order, headers,
receipts, errors (and nothing after the SEND that failed), queue statistics, memory and flow control's pauses.

These drive real sessions (server/net/tcp.py's protocol over a recording transport) of two brokers built alike:
one gets every frame in one read, the other one frame a read, and their transcripts are compared."""
from __future__ import annotations

import ast
import asyncio
import inspect
import textwrap
from typing import Any

from hypothesis import HealthCheck, given, settings, strategies as st

from pymq.protocol.scanner import encode_frame
from pymq_server.broker.placement import Placement

from tests.fake_transport import RecordingTransport

QUEUES = {
    "plain": {},
    "small": {"max_depth": 3, "overflow": "reject"},
    "oldest": {"max_depth": 2, "overflow": "drop-oldest"},
    "blocked": {"max_depth": 2, "overflow": "block"},
    "latest": {"last_value_key": "k", "max_depth": 4, "overflow": "reject"},
    "typed": {"schema": {"n": {"type": "int"}}, "default_priority": 7, "default_expiration_ms": 0},
}
DESTINATIONS = [f"/queue/{name}" for name in QUEUES] + ["/topic/news"]


_VARYING = ("timestamp", "pymq-reclaim-token")     # the clock's, and a random nonce of CONNECTED


def _numbered(name: str, value: str, origin: int) -> str:
    """Keys and sequence numbers as offsets from the broker's first (a memory store's start at its clock)."""
    if name == "pymq-seq":
        return str(int(value) - origin)
    if name == "message-id":                     # (read back unescaped by a RECEIPT, escaped by a MESSAGE)
        prefix = value[:value.index("n1-") + 3]
        return f"{prefix}+{int(value[len(prefix):]) - origin}"
    return value


def _transcript(frames: list, origin: int) -> list[tuple[str, tuple, bytes]]:
    """What a connection was written, without the headers that read the clock or a random source."""
    return [(f.command, tuple(sorted((k, _numbered(k, v, origin)) for k, v in f.headers.items()
                                     if k not in _VARYING)), f.body)
            for f in frames]


async def _broker_run(tmp_path: Any, sends: list[bytes], one_read: bool, max_memory: int) -> dict:
    from pymq_server.app import BrokerServer
    from pymq_server.config import BrokerConfig
    from pymq_server.net.tcp import StompServerProtocol

    limit = {"max_memory": max_memory} if max_memory else {}
    config = BrokerConfig.from_dict(dict(host="127.0.0.1", port=0, data_dir=str(tmp_path), sync_policy="never",
                                         node_id="n1", dedup_window_ms=60_000, queues=QUEUES, **limit,
                                         storage={"devices": {"memory": {"kind": "memory"}}}))
    server = BrokerServer(config)
    await server.start_core()
    loop = asyncio.get_running_loop()
    plans: list[str] = []
    broker = server.broker
    placement = broker.router.placement
    real_plan, real_follow = placement.plan, placement.follow
    placement.plan = lambda *a, **k: plans.append("plan") or real_plan(*a, **k)            # type: ignore[method-assign]
    placement.follow = lambda *a, **k: plans.append("follow") or real_follow(*a, **k)      # type: ignore[method-assign]
    links = []
    for i in range(2):
        proto = StompServerProtocol(broker, loop)
        transport = RecordingTransport()
        proto.connection_made(transport)   # type: ignore[arg-type]
        proto.data_received(encode_frame("CONNECT", {"accept-version": "1.2", "host": "/", "login": "guest",
                                                     "passcode": "guest"}, b"", "1.2"))
        links.append((proto, transport))
    consumer, producer = links[0][0], links[1][0]
    deadline = loop.time() + 10
    while not all(p.session.user is not None and p.session.version == "1.2" for p, _ in links):
        assert loop.time() < deadline, "not connected"
        await asyncio.sleep(0.005)
    # one consumer takes two messages of each destination and holds them (never acknowledges): the rest wait
    consumer.data_received(b"".join(encode_frame("SUBSCRIBE", {"destination": d, "id": f"s{i}",
                                                               "ack": "client-individual", "prefetch-count": "2"},
                                                 b"", "1.2") for i, d in enumerate(DESTINATIONS)))
    if one_read:
        producer.data_received(b"".join(sends))
    else:
        for frame in sends:
            producer.data_received(frame)
            await asyncio.sleep(0)         # the next read in a later turn of the loop
    for _ in range(3):
        await asyncio.sleep(0)
    queues = {name: (q.stats.added, q.depth, q.stats.peak_depth) for name, q in broker.destinations.queues.items()}
    flow = broker.flow
    origin = placement.seqs._origin
    out = {"consumer": _transcript(links[0][1].frames(), origin),
           "producer": _transcript(links[1][1].frames(), origin),
           "queues": queues, "memory": (flow.held_messages, flow.entries, flow.held_bytes, flow.high),
           "paused": sorted(producer.session._pauses), "closed": producer.session.closed, "plans": plans}
    for proto, _ in links:
        proto.connection_lost(None)
    await server.stop()
    return out


def _compare(tmp_path: Any, sends: list[bytes], max_memory: int = 0) -> tuple[dict, dict]:
    run = asyncio.run(_broker_run(tmp_path / "run", sends, True, max_memory))
    single = asyncio.run(_broker_run(tmp_path / "single", sends, False, max_memory))
    for key in ("consumer", "producer", "queues", "memory", "paused", "closed"):
        assert run[key] == single[key], key
    return run, single


def _send(destination: str, i: int, **headers: str) -> bytes:
    return encode_frame("SEND", {"destination": destination, "i": str(i), **headers}, b"body-%d" % i, "1.2")


# -- the run is taken, and gives what one SEND a read gives ----------------------------------------------------

def test_a_run_is_planned_once_and_gives_what_single_sends_give(tmp_path):
    sends = [_send("/queue/plain", i, receipt=f"r{i}") for i in range(6)]
    run, single = _compare(tmp_path, sends)
    assert run["plans"] == ["plan"] + ["follow"] * 5        # one plan for the run
    assert single["plans"] == ["plan"] * 6                  # one a read
    receipts = [dict(h) for c, h, _ in run["producer"] if c == "RECEIPT"]
    assert [r["receipt-id"] for r in receipts] == [f"r{i}" for i in range(6)]
    assert [r["message-id"] for r in receipts] == [f"ID\\cn1-+{k}" for k in range(6)]    # ids in order
    assert run["queues"]["plain"] == (6, 6, 6)              # added, depth (2 of them out), peak


def test_each_destination_and_each_other_frame_keeps_its_own_plan(tmp_path):
    sends = [_send("/queue/plain", 0), _send("/queue/plain", 1), _send("/topic/news", 2), _send("/topic/news", 3),
             _send("/queue/plain", 4), encode_frame("BEGIN", {"transaction": "t"}, b"", "1.2"),
             _send("/queue/plain", 5, transaction="t"), encode_frame("COMMIT", {"transaction": "t"}, b"", "1.2"),
             _send("/queue/plain", 6), _send("/queue/plain", 7)]
    run, _ = _compare(tmp_path, sends)
    # topics are planned each time (a topic's subscriptions read the message); a COMMIT's SEND starts no run
    assert run["plans"] == ["plan", "follow", "plan", "plan", "plan", "plan", "plan", "follow"]


def test_a_full_queue_refuses_mid_run_with_the_same_error_and_nothing_after_it(tmp_path):
    sends = [_send("/queue/small", i, receipt=f"r{i}") for i in range(6)]
    run, _ = _compare(tmp_path, sends)
    # the consumer holds 2 of them, 1 waits (the depth counts both): the 4th is refused; nothing follows the ERROR
    commands = [c for c, _, _ in run["producer"]]
    assert commands[1:] == ["RECEIPT"] * 3 + ["ERROR"]
    error = dict(run["producer"][-1][1])
    assert error["receipt-id"] == "r3" and run["closed"] and run["queues"]["small"] == (3, 3, 3)
    assert run["plans"] == ["plan", "follow", "follow", "follow"]


def test_a_schema_violation_mid_run_is_the_sends_own_error(tmp_path):
    sends = [_send("/queue/typed", 0, n="1"), _send("/queue/typed", 1, n="2"), _send("/queue/typed", 2, n="x"),
             _send("/queue/typed", 3, n="4")]
    run, _ = _compare(tmp_path, sends)
    assert [c for c, _, _ in run["producer"]][-1] == "ERROR"
    assert run["queues"]["typed"][0] == 2
    priorities = [dict(h)["priority"] for c, h, _ in run["consumer"] if c == "MESSAGE"]
    assert priorities == ["7", "7"]                          # the queue's default, on the followers too


def test_duplicates_last_values_drop_oldest_and_block_follow_the_same_rules(tmp_path):
    sends = ([_send("/queue/plain", i, **{"pymq-dedup-id": f"d{i % 3}", "receipt": f"p{i}"}) for i in range(6)]
             + [_send("/queue/latest", i, k=f"v{i % 2}") for i in range(6)]
             + [_send("/queue/oldest", i) for i in range(6)]
             + [_send("/queue/blocked", i) for i in range(6)])
    run, _ = _compare(tmp_path, sends)
    receipts = [dict(h) for c, h, _ in run["producer"] if c == "RECEIPT"]
    assert ["message-id" in r for r in receipts] == [True] * 3 + [False] * 3     # the last three are duplicates
    assert run["queues"]["plain"][0] == 3 and run["queues"]["latest"] == (6, 4, 4)    # two replaced
    assert run["queues"]["oldest"] == (6, 3, 3)             # 2 out, the newest waits: the others dropped
    # the producer pauses once the 2nd fills "blocked": the rest of the read waits
    assert run["paused"] == ["queue-full:/queue/blocked"] and run["queues"]["blocked"] == (2, 2, 2)


def test_memory_pauses_a_run_at_the_same_message(tmp_path):
    sends = [_send("/queue/plain", i) for i in range(40)]
    run, _ = _compare(tmp_path, sends, max_memory=8 * 1024)
    assert run["paused"] == ["memory"] and run["memory"][3] is True
    assert 2 < run["queues"]["plain"][0] < 40


_header = st.fixed_dictionaries({}, optional={
    "persistent": st.sampled_from(["true", "false"]), "priority": st.sampled_from(["0", "4", "9"]),
    "expires": st.sampled_from(["0", "4102444800000"]), "pymq-dedup-id": st.sampled_from(["a", "b", "c"]),
    "receipt": st.sampled_from(["r"]), "k": st.sampled_from(["v0", "v1"]), "n": st.sampled_from(["1", "x"]),
    "JMSXGroupID": st.sampled_from(["g1", "g2"]), "reply-to": st.sampled_from(["/queue/plain"])})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(DESTINATIONS), _header), min_size=1, max_size=14),
       st.sampled_from([0, 6 * 1024]))
def test_property_one_read_gives_what_one_send_a_read_gives(tmp_path_factory, sends, max_memory):
    frames = [_send(d, i, **h) for i, (d, h) in enumerate(sends)]
    _compare(tmp_path_factory.mktemp("p"), frames, max_memory)


# -- plan's inputs are enumerated: a new one cannot be forgotten by follow ---------------------------------------

_NAMED = ("self", "source", "target", "queue", "cfg")


def _reads(function: Any) -> set[str]:
    """The parameters of ``function`` and every ``<name>.<attribute>`` it reads for the names above."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    found = {a.arg for a in fn.args.args if a.arg != "self"}
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in _NAMED:
            found.add(f"{node.value.id}.{node.attr}")
    return found


def test_every_input_plan_reads_is_classified_for_runs():
    assert _reads(Placement.plan) == set(Placement.PLAN_INPUTS), (
        "Placement.plan reads something PLAN_INPUTS does not list (or no longer reads something it lists): "
        "decide whether a run's later SENDs may re-use it (same_inputs, reusable) or follow must apply it")


def test_a_plan_is_kept_for_a_run_only_for_a_queue_that_no_cluster_routes():
    from types import SimpleNamespace

    from pymq_server.broker.topic import Topic

    queue = SimpleNamespace(destination="/queue/q")
    plan = SimpleNamespace(queues=[queue], outboxes=[])
    standalone = SimpleNamespace(cluster=SimpleNamespace(active=False))
    clustered = SimpleNamespace(cluster=SimpleNamespace(active=True))
    assert Placement.reusable(standalone, plan, queue)                                  # type: ignore[arg-type]
    # a clustered queue's next message may go to a peer (its group, its properties): planned each time
    assert not Placement.reusable(clustered, plan, queue)                               # type: ignore[arg-type]
    # routed to a peer's outbox, or a topic (its subscriptions read the message): planned each time
    assert not Placement.reusable(standalone, SimpleNamespace(queues=[object()], outboxes=[]), queue)  # type: ignore[arg-type]
    topic = Topic.__new__(Topic)
    assert not Placement.reusable(standalone, SimpleNamespace(queues=[topic], outboxes=[]), topic)  # type: ignore[arg-type]
