"""Seed 004 on real 3-node clusters: peers hold messages for a dead node's durable subscribers until it
returns or its subscriptions are adopted elsewhere (spec/cluster.md §5, §6), and the admin operations that
list and purge held outboxes."""
from __future__ import annotations

import uuid

import pytest

import pymq
from pymq.errors import IllegalStateError
from tests.cluster.nodes import start_cluster, status
from tests.conftest import wait_for
from tests.storage.services import redis_url  # noqa: F401 - fixture


def _durable(node, client_id: str, topic, name: str = "inbox"):
    conn = pymq.connect(node.url, client_id=client_id)
    return conn, conn.create_session().create_durable_consumer(topic, name)


def _drain(consumer, first_wait: float = 10.0) -> list[str]:
    got = []
    m = consumer.receive(first_wait)
    while m is not None:
        got.append(m.text)
        m = consumer.receive(1.5)
    return got


def _sync_subscription(node, topic, text: str) -> None:
    """A persistent send through the subscriber's node: once receipted, the subscription's catalog
    record is on disk too (creating a durable subscription alone does not sync the catalog)."""
    with pymq.connect(node.url) as pub:
        pub.create_session().create_producer(topic).send(text)


def _kill_and_wait(victim, survivors):
    victim.kill()
    assert wait_for(lambda: all(victim.node_id not in status(n)["members"] for n in survivors), timeout=10)


def test_messages_for_a_dead_nodes_durable_subscriber_are_held_until_it_returns(tmp_path, redis_url):  # noqa: F811
    nodes, _ = start_cluster(tmp_path, redis_url)
    a, b, c = nodes
    topic = pymq.Topic(f"alerts.{uuid.uuid4().hex[:6]}")
    try:
        conn, consumer = _durable(c, "watcher", topic)
        consumer.close()
        conn.close()
        assert wait_for(lambda: status(a)["assignments"].get("sub:watcher:inbox") == "n2")
        _sync_subscription(c, topic, "stored on c")
        _kill_and_wait(c, [a, b])
        with pymq.connect(a.url) as pub:
            p = pub.create_session().create_producer(topic)
            for i in range(5):
                p.send(f"while dead {i}")                 # persistent, receipted by a
        c.start()                                         # same node id and data: it recovers its subscription
        assert wait_for(lambda: all(status(n)["links"].get("n2") for n in (a, b)), timeout=15)
        conn, consumer = _durable(c, "watcher", topic)
        try:
            assert _drain(consumer) == ["stored on c"] + [f"while dead {i}" for i in range(5)]
            # and its recovered subscription is in its filter again: later messages reach it too
            with pymq.connect(b.url) as pub:
                pub.create_session().create_producer(topic).send("after return")
            assert _drain(consumer, 5.0) == ["after return"]
        finally:
            conn.close()
        assert wait_for(lambda: status(a)["outboxes"].get("n2") == 0)
    finally:
        for node in nodes:
            node.stop()
            node.kill()


def test_a_dead_nodes_subscription_adopted_elsewhere_gets_what_every_peer_held(tmp_path, redis_url):  # noqa: F811
    nodes, _ = start_cluster(tmp_path, redis_url)
    a, b, c = nodes
    topic = pymq.Topic(f"orders.{uuid.uuid4().hex[:6]}")
    try:
        conn, consumer = _durable(c, "billing", topic)
        consumer.close()
        conn.close()
        assert wait_for(lambda: status(b)["assignments"].get("sub:billing:inbox") == "n2")
        _sync_subscription(c, topic, "stored on c")
        _kill_and_wait(c, [a, b])
        for node, n in ((a, 3), (b, 2)):                  # both peers hold what they accepted
            with pymq.connect(node.url) as pub:
                p = pub.create_session().create_producer(topic)
                for i in range(n):
                    p.send(f"{node.node_id}-{i}")
        # the subscriber comes back through b while c is still dead: b adopts the subscription
        conn, consumer = _durable(b, "billing", topic)
        try:
            got = _drain(consumer)
            assert sorted(got) == ["n0-0", "n0-1", "n0-2", "n1-0", "n1-1"]
            assert [m for m in got if m.startswith("n0")] == ["n0-0", "n0-1", "n0-2"]     # in order per origin
        finally:
            conn.close()
        assert status(a)["held_transferred"] >= 3
        assert wait_for(lambda: status(a)["outboxes"].get("n2", 0) == 0)   # nothing else of c's wanted it
        # c returns: the map names b, so c sends what it had stored for the subscription to b and drops its
        # copy; nothing arrives twice
        c.start()
        assert wait_for(lambda: all(status(n)["links"].get("n2") for n in (a, b)), timeout=15)
        assert wait_for(lambda: topic.name not in status(c)["filter_topics"], timeout=10)
        with pymq.connect(a.url) as pub:
            pub.create_session().create_producer(topic).send("later")
        conn, consumer = _durable(b, "billing", topic)
        try:
            assert sorted(_drain(consumer, 5.0)) == ["later", "stored on c"]
        finally:
            conn.close()
        assert status(a)["assignments"]["sub:billing:inbox"] == "n1"
    finally:
        for node in nodes:
            node.stop()
            node.kill()


def test_list_and_purge_held_outboxes(tmp_path, redis_url):  # noqa: F811
    nodes, _ = start_cluster(tmp_path, redis_url, held_max_messages=3)
    a, b, c = nodes
    topic = pymq.Topic(f"audit.{uuid.uuid4().hex[:6]}")
    try:
        conn, consumer = _durable(c, "auditor", topic)
        consumer.close()
        conn.close()
        assert wait_for(lambda: status(a)["assignments"].get("sub:auditor:inbox") == "n2")
        _kill_and_wait(c, [a, b])
        with pymq.connect(a.url) as pub:
            p = pub.create_session().create_producer(topic)
            for i in range(5):
                p.send(f"m{i}")
        with pymq.connect(a.url) as admin:
            qm = admin.queue_manager()
            outboxes = {o["node"]: o for o in qm.call("list-outboxes")}
            assert outboxes["n1"]["alive"] and not outboxes["n1"]["held"]
            assert outboxes["n2"]["held"] and outboxes["n2"]["state"] == "dead"
            assert outboxes["n2"]["subscriptions"] == ["sub:auditor:inbox"]
            assert outboxes["n2"]["topics"] == ["/topic/" + topic.name]
            assert outboxes["n2"]["messages"] == 3                  # the cap: the rest were refused, counted
            assert status(a)["held_refused"] == 2
            with pytest.raises(IllegalStateError):
                qm.call("purge-outbox", node="n1")                  # alive: its outbox drains to it
            with pytest.raises(IllegalStateError):
                qm.call("purge-outbox", node="n0")                  # no outbox to itself
            assert qm.call("purge-outbox", node="n2", forget=True) == \
                {"node": "n2", "purged_messages": 3, "forgotten": True}
            assert {o["node"]: o for o in qm.call("list-outboxes")}["n2"]["messages"] == 0
        # forgotten: its record is gone from the store, so neither peer holds for it any more
        assert wait_for(lambda: all("n2" not in status(n)["dead"] for n in (a, b)), timeout=5)
        held_before = status(b)["held"]
        with pymq.connect(b.url) as pub:
            pub.create_session().create_producer(topic).send("nobody holds this")   # routed before its receipt
        assert status(b)["held"] == held_before
        assert status(b)["outboxes"].get("n2", 0) == 0
    finally:
        for node in nodes:
            node.stop()
            node.kill()
