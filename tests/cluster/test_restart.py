"""A cluster node that restarts with its data: what it recovered before joining counts in the cluster.

Issue 9: recovery ran before the cluster node was attached, so a restarted node's durable subscriptions
were missing from its bloom filter and messages published on other nodes never reached them (on the
landed main 792990a the topic is absent from the restarted node's filter and the message is lost).
"""
from __future__ import annotations

import uuid

import pymq
from tests.cluster.nodes import start_cluster, status
from tests.conftest import wait_for
from tests.storage.services import redis_url  # noqa: F401 - fixture


def _drain(consumer, first_wait: float = 10.0) -> list[str]:
    got = []
    m = consumer.receive(first_wait)
    while m is not None:
        got.append(m.text)
        m = consumer.receive(1.5)
    return got


def test_a_restarted_nodes_durable_subscription_is_in_its_filter_and_gets_peers_messages(
        tmp_path, redis_url):  # noqa: F811
    nodes, _ = start_cluster(tmp_path, redis_url, n=2)
    a, b = nodes
    topic = pymq.Topic(f"news.{uuid.uuid4().hex[:6]}")
    try:
        with pymq.connect(b.url, client_id="reader") as conn:
            conn.create_session().create_durable_consumer(topic, "inbox").close()
        with pymq.connect(b.url) as pub:            # persistent and receipted: the catalog is on disk too
            pub.create_session().create_producer(topic).send("before")
        b.kill()                                     # no clean leave: the subscription stays b's
        assert wait_for(lambda: "n1" not in status(a)["members"], timeout=10)
        b.start()                                    # same node id and data: it recovers the subscription
        assert wait_for(lambda: status(a)["links"].get("n1") and status(b)["links"].get("n0"), timeout=15)
        # nobody is connected to the subscription: only recovery can have put its topic in b's filter
        assert wait_for(lambda: topic.name in status(b)["filter_topics"], timeout=10), status(b)
        serial = status(b)["filter"]["serial"]
        assert wait_for(lambda: (status(a)["peer_filters"].get("n1") or {}).get("serial") == serial,
                        timeout=10), status(a)["peer_filters"]
        with pymq.connect(a.url) as pub:
            pub.create_session().create_producer(topic).send("published on a after the restart")
        conn = pymq.connect(b.url, client_id="reader")
        try:
            consumer = conn.create_session().create_durable_consumer(topic, "inbox")
            assert _drain(consumer) == ["before", "published on a after the restart"]
        finally:
            conn.close()
    finally:
        for node in nodes:
            node.stop()
            node.kill()
