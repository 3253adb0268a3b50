"""Seed 004 on a real 3-node cluster: a node's subscription filter is regenerated at a larger size when
its measured false-positive rate misses the target, and re-announced with a new epoch, so topic
filtering does not silently turn into broadcast (spec/routing.md §3.8, spec/cluster.md §2)."""
from __future__ import annotations

import uuid

import pymq
from tests.cluster.nodes import start_cluster, status
from tests.conftest import RawStomp, wait_for
from tests.storage.services import redis_url  # noqa: F401 - fixture

TOPICS = 3_000


def test_an_overfull_filter_is_regenerated_and_reannounced(tmp_path, redis_url):  # noqa: F811
    # sized for 200 topics at 1 %; 3,000 subscribed topics fill a filter of that size completely
    nodes, _ = start_cluster(tmp_path, redis_url, filter_capacity=200, filter_fpr=0.01)
    a, b, c = nodes
    prefix = uuid.uuid4().hex[:6]
    raw = RawStomp(b.port)
    try:
        assert raw.connect().command == "CONNECTED"
        raw.send_raw(b"".join(raw.encode("SUBSCRIBE", {"id": str(i), "destination": f"/topic/{prefix}.s{i}"})
                              for i in range(TOPICS)))
        assert wait_for(lambda: len(status(b)["filter_topics"]) == TOPICS, timeout=20)

        def announced() -> bool:                                  # a holds b's latest announcement
            mine, theirs = status(b), status(a)
            if "filter" not in mine:
                return True                                       # (a build without versioned announcements)
            return theirs["peer_filters"]["n1"]["serial"] == mine["filter"]["serial"]
        assert wait_for(announced, timeout=10)
        before = status(b)["received_forwarded"]
        with pymq.connect(a.url) as pub:
            session = pub.create_session()
            for i in range(300):                                 # topics nobody subscribed to
                session.create_producer(pymq.Topic(f"{prefix}.unwanted{i}")).send(
                    "x", delivery_mode=pymq.NON_PERSISTENT)
            wanted = session.create_producer(pymq.Topic(f"{prefix}.s7"))
            wanted.send("for b", delivery_mode=pymq.NON_PERSISTENT)
        assert wait_for(lambda: status(b)["received_forwarded"] > before, timeout=5)
        # every message a forwarded to b has been receipted by b (one leaves the outbox on b's receipt, which
        # b sends after taking it in), so b's count is final
        assert wait_for(lambda: status(a)["outboxes"].get("n1", 0) == 0, timeout=10), status(a)["outboxes"]
        false_positives = status(b)["received_forwarded"] - before - 1
        assert false_positives <= 15                             # ~0.5 % of 300; the one-size filter: ~300
        mine = status(b)["filter"]
        assert mine["topics"] == TOPICS and mine["epoch"] >= 1 and mine["capacity"] >= TOPICS
        assert mine["measured_fpr"] <= 0.02                     # the target, within the tolerance of 2
        # a's view of b: the digest of the newest epoch, the same size as b's filter
        seen = status(a)["peer_filters"]["n1"]
        assert seen["epoch"] == mine["epoch"] and (seen["m"], seen["k"]) == (mine["m"], mine["k"])
        assert not seen["match_all"]
    finally:
        raw.sock.close()
        for node in nodes:
            node.stop()


def test_a_node_with_a_pattern_subscription_gets_the_topics_it_matches_only(tmp_path, redis_url):  # noqa: F811
    """spec/routing.md §3.5: n1 subscribes to stocks.*; n0 reads the pattern from n1's announcement and
    forwards stocks.a there, not bonds.a nor stocks.a.b (before, n1's digest was match-all and got all)."""
    nodes, _ = start_cluster(tmp_path, redis_url, n=2)
    a, b = nodes
    prefix = uuid.uuid4().hex[:6]
    raw = RawStomp(b.port)
    try:
        assert raw.connect().command == "CONNECTED"
        raw.send("SUBSCRIBE", {"id": "p", "destination": f"/topic/{prefix}.stocks.*", "receipt": "r"})
        assert raw.read(10).command == "RECEIPT"
        serial = status(b)["filter"]["serial"]
        assert wait_for(lambda: (status(a)["peer_filters"]["n1"]["serial"] or 0) >= serial, timeout=10)
        seen = status(a)["peer_filters"]["n1"]
        assert seen["patterns"] == [f"{prefix}.stocks.*"] and not seen["match_all"]
        before = status(b)["received_forwarded"]
        with pymq.connect(a.url) as pub:
            session = pub.create_session()
            for name in ("bonds.a", "stocks.a.b", "stocks", "stocks.a"):
                session.create_producer(pymq.Topic(f"{prefix}.{name}")).send(name, delivery_mode=pymq.NON_PERSISTENT)
        frame = raw.read(10)
        assert frame.command == "MESSAGE" and frame.body == b"stocks.a"
        assert wait_for(lambda: status(a)["outboxes"].get("n1", 0) == 0, timeout=10)
        assert status(b)["received_forwarded"] - before == 1          # nothing it did not want
        assert status(b)["discarded_false_positive"] == 0
    finally:
        raw.sock.close()
        for node in nodes:
            node.stop()
