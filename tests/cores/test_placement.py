"""Where a workload's destinations and connections end up in a 2-worker broker (spec/cores.md §2, §2.4).

bench_brokers' rows in small: a topic with four subscribers and a producer connected to either worker (row c)
and four queues with a producer and a consumer each (row m). After the workload every connection is a
connection of its destination's owner (its id ``w<owner>c<n>``, its subscription held there): nothing is
relayed per message. The four numbered queues are two per worker, whatever the hash of their names would say.
"""
from __future__ import annotations

import json
import time

import pytest

from pymq.routing import GroupRouter
from tests.conftest import RawStomp
from tests.cores.conftest import Cluster, spec_owner, start_broker, stop_broker
from tests.cores.test_forwarding import _receipt


def _connections(cluster: Cluster) -> list[dict]:
    """Every worker's connections (the admin listing, joined), but the one asking."""
    asker = cluster.connect(0, **{"client-id": "asker"})
    asker.send("SUBSCRIBE", {"destination": "/temp-queue/answers", "id": "a", "receipt": "a"})
    _receipt(asker, "a")
    asker.send("SEND", {"destination": "/pymq/admin", "pymq-admin-op": "connections",
                        "reply-to": "/temp-queue/answers"}, b"{}")
    answer = asker.read()
    assert answer.command == "MESSAGE", answer
    asker.send("DISCONNECT", {"receipt": "bye"})        # its client id is free for the next listing
    _receipt(asker, "bye")
    result = json.loads(answer.body)
    assert result["ok"], result
    return [row for row in result["result"] if row["client_id"] != "asker"]


def _messages(c: RawStomp, count: int) -> list[bytes]:
    bodies = []
    deadline = time.monotonic() + 10
    while len(bodies) < count:
        f = c.read(max(0.1, deadline - time.monotonic()))
        assert f.command == "MESSAGE", f
        bodies.append(f.body)
    return bodies


def test_a_topic_row_runs_in_its_owner_with_no_relay(broker):
    topic = "/topic/placement.c"
    owner = spec_owner(topic)
    subscribers = []
    for i in range(4):
        s = broker.connect(i % 2)           # two accepted by each worker
        s.send("SUBSCRIBE", {"destination": topic, "id": f"s{i}", "receipt": f"s{i}"})
        _receipt(s, f"s{i}")
        subscribers.append(s)
    producer = broker.connect(1 - owner)    # accepted by the worker that does not own the topic
    for n in range(20):
        producer.send("SEND", {"destination": topic, **({"receipt": "p"} if n == 19 else {})}, b"m%d" % n)
    _receipt(producer, "p")
    for s in subscribers:
        assert _messages(s, 20) == [b"m%d" % n for n in range(20)]
    rows = _connections(broker)
    # all five are the owner's own connections: handed over there (or accepted there), none spans workers
    assert len(rows) == 5 and all(row["id"].startswith(f"w{owner}c") for row in rows), rows
    assert sorted(row["subscriptions"] for row in rows) == [0, 1, 1, 1, 1], rows
    assert all(row["sent"] >= 20 for row in rows if row["subscriptions"]), rows     # written by the owner


def _four_streams(cluster: Cluster, queues: list[str]) -> list[int]:
    """Row m in small: a producer and a consumer per queue, accepted by either worker; the worker each
    connection ends at, sorted."""
    pairs = []
    for i, q in enumerate(queues):
        consumer = cluster.connect(i % 2)
        consumer.send("SUBSCRIBE", {"destination": q, "id": "s", "receipt": "s"})
        _receipt(consumer, "s")
        producer = cluster.connect((i + 1) % 2)
        for n in range(10):
            producer.send("SEND", {"destination": q, **({"receipt": "p"} if n == 9 else {})}, b"%d.%d" % (i, n))
        _receipt(producer, "p")
        pairs.append((consumer, i))
    for consumer, i in pairs:
        assert _messages(consumer, 10) == [b"%d.%d" % (i, n) for n in range(10)]
    rows = _connections(cluster)
    assert len(rows) == 8, rows
    return sorted(int(row["id"][1:row["id"].index("c")]) for row in rows)


@pytest.mark.parametrize("placement", ["numbered", "hash"])
def test_four_numbered_queues_are_two_per_worker_and_each_stream_runs_in_its_owner(tmp_path, placement):
    """A new data directory places a numbered family round-robin; one whose cores.json predates the rule
    (no `placement`) keeps the hash alone: its messages stay where they were written."""
    router = GroupRouter(["w0", "w1"])
    # a stem whose four names the hash alone puts on one worker: the numbered rule must split them 2:2
    stem = next(f"/queue/placement.s{j}" for j in range(1000)
                if len({router.route(f"/queue/placement.s{j}.{i}") for i in range(4)}) == 1)
    queues = [f"{stem}.{i}" for i in range(4)]
    data = tmp_path / "data"
    if placement == "hash":
        data.mkdir()
        (data / "cores.json").write_text(json.dumps({"workers": 2}))
        everything = int(router.route(queues[0])[1:])
        expected = [everything] * 8
    else:
        assert sorted(spec_owner(q) for q in queues) == [0, 0, 1, 1]
        expected = [0, 0, 0, 0, 1, 1, 1, 1]
    cluster = start_broker(str(data))
    try:
        # CONNECTED says which rule the data directory keeps, from either worker: a client that computes
        # owners (the JVM Spark reader's Planner.owner) follows it
        said: dict[str, str] = {}
        for _ in range(200):
            c = RawStomp(cluster.port)
            frame = c.connect()
            c.sock.close()
            said[frame.headers["pymq-worker"]] = frame.headers["pymq-placement"]
            if len(said) == 2:
                break
        assert said == {"0": placement, "1": placement}
        assert _four_streams(cluster, queues) == expected       # numbered: two streams a worker, nothing spans
    finally:
        stop_broker(cluster)
