"""Seed 004 on real 3-node clusters: idle durable subscriptions are placed by the assignment policy (hash:
the rendezvous of their owner; similar: owners with overlapping topics consolidated on one node) and moved
with their pending messages, never while a consumer is attached (spec/cluster.md §6)."""
from __future__ import annotations

import uuid

import pymq
from pymq.routing import GroupRouter
from tests.cluster.nodes import start_cluster, status
from tests.conftest import wait_for
from tests.storage.services import redis_url  # noqa: F401 - fixture


def _subscribe(node, owner: str, topic, keep: bool = False):
    conn = pymq.connect(node.url, client_id=owner)
    consumer = conn.create_session().create_durable_consumer(topic, "inbox")
    if keep:
        return conn, consumer
    consumer.close()
    conn.close()
    return None, None


def _drain(node, owner: str, topic) -> list[str]:
    with pymq.connect(node.url, client_id=owner) as conn:
        consumer = conn.create_session().create_durable_consumer(topic, "inbox")
        got = []
        m = consumer.receive(10.0)
        while m is not None:
            got.append(m.text)
            m = consumer.receive(1.0)
        return got


def test_idle_subscriptions_go_where_the_hash_policy_says_with_their_messages(tmp_path, redis_url):  # noqa: F811
    nodes, _ = start_cluster(tmp_path, redis_url, assignment="hash", rebalance_interval_ms=300)
    a, b, c = nodes
    by_id = {n.node_id: n for n in nodes}
    router = GroupRouter(sorted(by_id))
    tag = uuid.uuid4().hex[:6]
    owners = [f"o{i}-{tag}" for i in range(6)]
    busy = next(f"busy{i}-{tag}" for i in range(100) if router.route(f"busy{i}-{tag}") != "n0")
    topics = {o: pymq.Topic(f"feed.{o}") for o in owners + [busy]}
    held = None
    try:
        held, _ = _subscribe(a, busy, topics[busy], keep=True)       # its consumer stays attached on n0
        # each subscription is created busy (a consumer attached: never moved) and stays busy until its
        # messages are in it: a move under way while another node publishes is at-least-once and may
        # reorder (spec/cluster.md §6), which is not what this test is about
        attached = []
        for o in owners:
            conn = pymq.connect(a.url, client_id=o)            # all created through n0
            conn.create_session(pymq.CLIENT_ACKNOWLEDGE).create_durable_consumer(topics[o], "inbox")
            attached.append(conn)
        before = status(a)["received_forwarded"]
        with pymq.connect(b.url) as pub:
            session = pub.create_session()
            for o in owners:
                producer = session.create_producer(topics[o])
                for i in range(3):
                    producer.send(f"{o}:{i}")
        assert wait_for(lambda: status(a)["received_forwarded"] >= before + 3 * len(owners))
        for conn in attached:
            conn.close()                                      # idle now, with what they were sent unacknowledged

        def placed():
            assignments = status(a)["assignments"]
            return all(assignments.get(f"sub:{o}:inbox") == router.route(o) for o in owners)
        assert wait_for(placed, timeout=15), status(a)["assignments"]
        assert status(a)["assignments"][f"sub:{busy}:inbox"] == "n0"      # never moved while consumed
        assert status(a)["moves_refused"] + status(a)["moves_ordered"] >= 1
        for o in owners:                                                   # every message followed
            assert _drain(by_id[router.route(o)], o, topics[o]) == [f"{o}:{i}" for i in range(3)]
        held.close()
        held = None
        assert wait_for(lambda: status(a)["assignments"].get(f"sub:{busy}:inbox") == router.route(busy),
                        timeout=15)                                       # idle now: it moves too
    finally:
        if held is not None:
            held.close()
        for node in nodes:
            node.stop()


def test_similar_consolidates_subscribers_of_the_same_topic_on_one_node(tmp_path, redis_url):  # noqa: F811
    """Three subscribers of one topic and three of another, created one of each per node: the similar
    policy (default slack: at most ceil(1.1 x 6 / 3) = 3 per node) puts each topic's subscribers together,
    so each topic message is forwarded to and stored on one node instead of three."""
    nodes, _ = start_cluster(tmp_path, redis_url, assignment="similar")
    by_id = {n.node_id: n for n in nodes}
    tag = uuid.uuid4().hex[:6]
    sports, news = pymq.Topic(f"sports.{tag}"), pymq.Topic(f"news.{tag}")
    fans = {f"s{i}-{tag}": sports for i in range(3)} | {f"w{i}-{tag}": news for i in range(3)}
    try:
        for i, node in enumerate(nodes):
            _subscribe(node, f"s{i}-{tag}", sports)
            _subscribe(node, f"w{i}-{tag}", news)
        with pymq.connect(nodes[0].url) as pub:
            session = pub.create_session()
            for topic in (sports, news):
                producer = session.create_producer(topic)
                for i in range(2):
                    producer.send(f"{topic.name}:{i}")

        def hosts(topic):
            assignments = status(nodes[0])["assignments"]
            return {assignments.get(f"sub:{o}:inbox") for o, t in fans.items() if t is topic}
        assert wait_for(lambda: len(hosts(sports)) == 1 and len(hosts(news)) == 1, timeout=30), \
            status(nodes[0])["assignments"]
        (sports_host,), (news_host,) = hosts(sports), hosts(news)
        assert sports_host != news_host
        # one copy travels: a sports message published on the news node reaches only the sports node
        before = {n.node_id: status(n)["received_forwarded"] for n in nodes}
        with pymq.connect(by_id[news_host].url) as pub:
            pub.create_session().create_producer(sports).send("goal")
        for o, topic in fans.items():
            host = sports_host if topic is sports else news_host
            expected = [f"{topic.name}:0", f"{topic.name}:1"] + (["goal"] if topic is sports else [])
            assert _drain(by_id[host], o, topic) == expected
        after = {n.node_id: status(n)["received_forwarded"] for n in nodes}
        assert after[sports_host] - before[sports_host] == 1
        assert all(after[n] == before[n] for n in after if n not in (sports_host, news_host))
    finally:
        for node in nodes:
            node.stop()
