"""Three brokers on loopback, membership in a real Redis (spec/cluster.md): group routing across nodes,
filter exchange and forwarding counts, queue draining across nodes, join, clean leave with hand-over,
and a killed node."""
from __future__ import annotations

import time
import uuid

import pytest

import pymq
from pymq.routing import GroupRouter
from tests.cluster.nodes import (
    Node,
    cluster_cfg,
    start_cluster,
    status,
    wait_consumers_seen,
    wait_heartbeats,
    wait_topic_seen,
)
from tests.conftest import wait_for
from tests.storage.services import postgres_url, redis_url  # noqa: F401 - fixtures


def _cluster_cfg(store_url, **over):
    return cluster_cfg(store_url, **over)


@pytest.fixture(scope="module")
def trio(tmp_path_factory, redis_url):  # noqa: F811
    nodes, _ = start_cluster(tmp_path_factory.mktemp("trio"), redis_url)
    yield nodes
    for node in nodes:
        node.stop()


def test_groups_are_consumed_in_order_on_the_node_their_hash_names(trio):
    queue = pymq.Queue(f"orders-{uuid.uuid4().hex[:6]}")
    conns = [pymq.connect(n.url) for n in trio]
    try:
        consumers = {n.node_id: c.create_session().create_consumer(queue, prefetch=5000)
                     for n, c in zip(trio, conns, strict=True)}
        for node in trio:                        # consumer maps reach the peers
            wait_consumers_seen(node, queue.name, [n for n in trio if n is not node])
        producer = conns[0].create_session().create_producer(queue)
        groups = [f"customer-{i}" for i in range(40)]
        for seq in range(5):
            for g in groups:
                m = pymq.TextMessage(f"{g}:{seq}")
                m.group_id = g
                producer.send(m, delivery_mode=pymq.NON_PERSISTENT)
        router = GroupRouter([n.node_id for n in trio])
        got: dict[str, list[str]] = {}
        where: dict[str, str] = {}
        for node_id, consumer in consumers.items():
            while (m := consumer.receive(1.5)) is not None:
                got.setdefault(m.group_id, []).append(m.text)
                assert where.setdefault(m.group_id, node_id) == node_id
        assert sorted(got) == sorted(groups)
        for g in groups:
            assert got[g] == [f"{g}:{s}" for s in range(5)]          # in order
            assert where[g] == router.route(g)                        # on the node the hash names
    finally:
        for c in conns:
            c.close()


def test_topic_filters_forward_only_where_someone_listens(trio):
    a, b, c = trio
    wanted, unwanted = f"prices.{uuid.uuid4().hex[:6]}", f"noise.{uuid.uuid4().hex[:6]}"
    before = {n.node_id: status(n) for n in trio}
    with pymq.connect(b.url) as listener, pymq.connect(a.url) as pub:
        sub = listener.create_session().create_consumer(pymq.Topic(wanted))
        wait_topic_seen(b, wanted, [a])                              # b's digest reaches a
        p = pub.create_session().create_producer(pymq.Topic(wanted))
        q = pub.create_session().create_producer(pymq.Topic(unwanted))
        for i in range(20):
            p.send(f"tick {i}")
            q.send(f"nobody {i}")
        assert [sub.receive(5).text for _ in range(20)] == [f"tick {i}" for i in range(20)]
    after = {n.node_id: status(n) for n in trio}
    # a forwarded the 20 wanted messages (to b only), never the unwanted ones
    assert after["n0"]["forwarded_topic_messages"] - before["n0"]["forwarded_topic_messages"] == 20
    assert after["n1"]["received_forwarded"] - before["n1"]["received_forwarded"] == 20
    assert after["n2"]["received_forwarded"] - before["n2"]["received_forwarded"] == 0
    # when the last subscriber leaves, the topic leaves b's filter
    assert wait_for(lambda: wanted not in status(b)["filter_topics"])


def test_a_wildcard_subscriber_gets_what_other_nodes_publish(trio):
    """A pattern subscription on b (spec/routing.md §3.5, §5): b's filter holds the pattern and its digest
    becomes match-all, so a forwards every topic message to b, which matches the pattern itself."""
    a, b, _ = trio
    base = f"w{uuid.uuid4().hex[:6]}"
    with pymq.connect(b.url) as listener, pymq.connect(a.url) as pub:
        sub = listener.create_session().create_consumer(pymq.Topic(f"{base}.*"))
        assert wait_for(lambda: f"{base}.*" in status(b)["filter_patterns"])
        s = pub.create_session()
        probe = s.create_producer(pymq.Topic(f"{base}.probe"))
        deadline = time.monotonic() + 10
        got = None
        while got is None and time.monotonic() < deadline:     # until b's digest has reached a
            probe.send("probe")
            got = sub.receive(0.1)
        assert got is not None and got.destination.name == f"{base}.probe"
        for i in range(10):
            s.create_producer(pymq.Topic(f"{base}.k{i}")).send(f"tick {i}")
            s.create_producer(pymq.Topic(f"{base}.k{i}.deep")).send("not one word")
        texts = []
        while len(texts) < 10:
            m = sub.receive(5)
            assert m is not None
            if m.text != "probe":
                texts.append((m.text, m.destination.name))
        assert texts == [(f"tick {i}", f"{base}.k{i}") for i in range(10)]
        assert sub.receive(0.3) is None
    assert wait_for(lambda: f"{base}.*" not in status(b)["filter_patterns"])


def test_vhosts_stay_apart_across_nodes(tmp_path, redis_url):  # noqa: F811
    """A vhost's topic and queue messages cross nodes under the vhost's own names (spec/stomp.md §1): a
    subscriber of shop on one node gets shop's messages published on another, not the default vhost's."""
    from tests.cluster.nodes import Node, wait_topic_seen
    cfg = _cluster_cfg(redis_url)
    extra = {"vhosts": {"shop": ["*"]}}
    a, b = (Node(f"n{i}", str(tmp_path / f"n{i}"), cfg, extra).start() for i in range(2))
    try:
        assert wait_for(lambda: all(len(status(n)["members"]) == 2 and all(status(n)["links"].values())
                                    for n in (a, b)), timeout=10)
        with pymq.connect(b.url + "/shop") as shop_b, pymq.connect(b.url) as default_b:
            shop_sub = shop_b.create_session().create_consumer(pymq.Topic("news"))
            default_sub = default_b.create_session().create_consumer(pymq.Topic("news"))
            wait_topic_seen(b, "$vh.shop.news", [a])
            wait_topic_seen(b, "news", [a])
            with pymq.connect(a.url + "/shop") as shop_a, pymq.connect(a.url) as default_a:
                shop_a.create_session().create_producer(pymq.Topic("news")).send("shop news")
                default_a.create_session().create_producer(pymq.Topic("news")).send("default news")
                shop_a.create_session().create_producer(pymq.Queue("orders")).send("shop order")
            m = shop_sub.receive(5)
            assert (m.text, m.destination.name) == ("shop news", "news")
            assert default_sub.receive(5).text == "default news"
            assert shop_sub.receive(0.3) is None and default_sub.receive(0.1) is None
            order = shop_b.create_session().create_consumer(pymq.Queue("orders")).receive(5)
            assert order is not None and order.text == "shop order"
            assert default_b.create_session().create_consumer(pymq.Queue("orders")).receive(0.3) is None
    finally:
        a.stop()
        b.stop()


def test_idle_links_stay_up(trio):
    """A link judges its peer's silence by the heart-beat interval the peer's broker negotiated (10 s by
    default), not by this cluster's membership period: idle links used to be closed and reopened every
    second."""
    def drops():
        return sum("is down" in line or "closing" in line for n in trio for line in list(n.log))
    before = drops()
    wait_heartbeats(trio, 12)                             # > 4 periods of 200 ms each, with no traffic
    assert drops() == before
    assert all(all(status(n)["links"].values()) for n in trio)


def test_consumers_on_any_node_drain_a_queue_produced_elsewhere(trio):
    a, b, c = trio
    queue = pymq.Queue(f"backlog-{uuid.uuid4().hex[:6]}")
    with pymq.connect(a.url) as pub:
        p = pub.create_session().create_producer(queue)
        for i in range(30):
            p.send(f"m{i}")                        # nobody consumes anywhere: they wait on a
    with pymq.connect(c.url) as conn:
        consumer = conn.create_session().create_consumer(queue)
        got = sorted(consumer.receive(5).text for _ in range(30))   # redistributed from a to c
    assert got == sorted(f"m{i}" for i in range(30))
    assert status(a)["redistributed"] >= 30


def test_join_moves_only_the_newcomers_share_of_groups(tmp_path, redis_url):  # noqa: F811
    nodes, cfg = start_cluster(tmp_path, redis_url, n=3)
    try:
        newcomer = Node("n3", str(tmp_path / "n3"), cfg).start()
        nodes.append(newcomer)
        ids = {"n0", "n1", "n2", "n3"}
        assert wait_for(lambda: all(set(status(n)["members"]) == ids for n in nodes), timeout=10)
        groups = [f"g{i}" for i in range(300)]
        before = GroupRouter(["n0", "n1", "n2"])
        after = GroupRouter(sorted(ids))
        moved = [g for g in groups if before.route(g) != after.route(g)]
        assert all(after.route(g) == "n3" for g in moved)           # only to the newcomer
        assert 0.1 < len(moved) / len(groups) < 0.4                    # about 1/4
        queue = pymq.Queue(f"joined-{uuid.uuid4().hex[:6]}")
        conn = pymq.connect(newcomer.url)
        consumer = conn.create_session().create_consumer(queue, prefetch=1000)
        wait_consumers_seen(newcomer, queue.name, [nodes[0]])
        with pymq.connect(nodes[0].url) as pub:
            p = pub.create_session().create_producer(queue)
            for g in groups[:50]:
                m = pymq.TextMessage(g)
                m.group_id = g
                p.send(m, delivery_mode=pymq.NON_PERSISTENT)
        received = set()
        while (m := consumer.receive(1.0)) is not None:
            received.add(m.text)
        conn.close()
        assert received == {g for g in groups[:50] if after.route(g) == "n3"}
    finally:
        for node in nodes:
            node.stop()


def test_clean_leave_hands_over_durable_subscriptions(tmp_path, redis_url):  # noqa: F811
    nodes, cfg = start_cluster(tmp_path, redis_url, n=3)
    a, b, c = nodes
    topic = pymq.Topic(f"audit.{uuid.uuid4().hex[:6]}")
    try:
        with pymq.connect(b.url, client_id="auditor") as conn:
            conn.create_session().create_durable_consumer(topic, "trail").close()
        assert wait_for(lambda: status(a)["assignments"].get("sub:auditor:trail") == "n1", timeout=5)
        wait_topic_seen(b, topic.name, [a])
        with pymq.connect(a.url) as pub:
            p = pub.create_session().create_producer(topic)
            for i in range(5):
                p.send(f"before leave {i}")
        assert wait_for(lambda: status(b)["received_forwarded"] >= 5)
        b.stop()                                              # SIGTERM: hand-over, then exit
        remaining = [a, c]
        assert wait_for(lambda: all(set(status(n)["members"]) == {"n0", "n2"} for n in remaining), timeout=10)
        host = status(a)["assignments"].get("sub:auditor:trail")
        assert host in ("n0", "n2")
        with pymq.connect(a.url) as pub:
            pub.create_session().create_producer(topic).send("after leave")
        successor = a if host == "n0" else c
        with pymq.connect(successor.url, client_id="auditor") as conn:
            consumer = conn.create_session().create_durable_consumer(topic, "trail")
            got = []
            while (m := consumer.receive(2.0)) is not None:
                got.append(m.text)
        assert got == [f"before leave {i}" for i in range(5)] + ["after leave"]
    finally:
        for node in nodes:
            node.stop()


def test_killed_node_is_detected_and_nothing_accepted_for_it_is_lost(tmp_path, redis_url):  # noqa: F811
    nodes, cfg = start_cluster(tmp_path, redis_url, n=3)
    a, b, c = nodes
    queue = pymq.Queue(f"grouped-{uuid.uuid4().hex[:6]}")
    try:
        c.kill()                                             # no goodbye: its peers must notice
        groups = [f"k{i}" for i in range(60)]
        router3 = GroupRouter(["n0", "n1", "n2"])
        for_c = [g for g in groups if router3.route(g) == "n2"]
        assert for_c
        ids = {}
        with pymq.connect(a.url) as pub:
            p = pub.create_session().create_producer(queue)
            for g in groups:                                 # accepted by a while c is dead, not yet noticed
                m = pymq.TextMessage(g)
                m.group_id = g
                ids[g] = p.send(m).message_id                # persistent: receipted by a
        assert wait_for(lambda: set(status(a)["members"]) == {"n0", "n1"}, timeout=10)
        assert wait_for(lambda: status(a)["outboxes"].get("n2", 0) == 0, timeout=10)
        router2 = GroupRouter(["n0", "n1"])
        got: list[tuple[str, str, str]] = []
        for node in (a, b):
            with pymq.connect(node.url) as conn:
                consumer = conn.create_session().create_consumer(queue)
                while (m := consumer.receive(1.5)) is not None:
                    got.append((m.text, m.message_id, node.node_id))
        # exactly once: every message acknowledged to its producer arrives, none twice, under its own id
        assert sorted(text for text, _, _ in got) == sorted(groups)
        assert all(mid == ids[text] for text, mid, _ in got)
        assert all(node == router2.route(text) for text, _, node in got)   # c's groups re-routed to their new node
        assert 0 < status(a)["rerouted"] <= len(for_c)          # (c may be noticed dead before the last sends)
    finally:
        for node in nodes:
            node.stop()
            node.kill()


def test_wrong_cluster_secret_is_refused(tmp_path, redis_url):  # noqa: F811
    nodes, cfg = start_cluster(tmp_path, redis_url, n=2)
    intruder = Node("evil", str(tmp_path / "evil"), dict(cfg, secret="wrong")).start()
    try:
        assert wait_for(lambda: any("access refused for cluster node" in line or "ERROR" in line
                                    for line in list(intruder.log)), timeout=10), "".join(intruder.log)
        assert status(nodes[0])["links"].get("evil") is not True
        from tests.conftest import RawStomp
        raw = RawStomp(nodes[0].port)
        frame = raw.connect(login="cluster:evil", passcode="guess")
        assert frame.command == "ERROR" and frame.headers["pymq-code"] == "authentication-failed"
    finally:
        intruder.kill()
        for node in nodes:
            node.stop()


def test_postgresql_as_the_cluster_store(tmp_path, postgres_url):  # noqa: F811
    """The registry also lives in PostgreSQL (the SQL device's server), not only Redis."""
    cfg = _cluster_cfg(postgres_url)
    nodes = [Node(f"p{i}", str(tmp_path / f"p{i}"), cfg).start() for i in range(2)]
    try:
        assert wait_for(lambda: all(set(status(n)["members"]) == {"p0", "p1"} and all(status(n)["links"].values())
                                    for n in nodes), timeout=10)
        queue = pymq.Queue(f"pg-{uuid.uuid4().hex[:6]}")
        with pymq.connect(nodes[1].url) as cons, pymq.connect(nodes[0].url) as prod:
            consumer = cons.create_session().create_consumer(queue)
            wait_consumers_seen(nodes[1], queue.name, [nodes[0]])
            prod.create_session().create_producer(queue).send("via postgres membership")
            assert consumer.receive(5).text == "via postgres membership"
    finally:
        for node in nodes:
            node.stop()


def test_durable_subscription_follows_its_consumer_to_another_node(tmp_path, redis_url):  # noqa: F811
    nodes, cfg = start_cluster(tmp_path, redis_url, n=3)
    a, b, c = nodes
    topic = pymq.Topic(f"moves.{uuid.uuid4().hex[:6]}")
    try:
        with pymq.connect(b.url, client_id="mover") as conn:
            conn.create_session().create_durable_consumer(topic, "inbox").close()
        wait_topic_seen(b, topic.name, [a])
        with pymq.connect(a.url) as pub:
            p = pub.create_session().create_producer(topic)
            for i in range(4):
                p.send(f"held on b {i}")
        assert wait_for(lambda: status(b)["received_forwarded"] >= 4)
        # the same client comes back through another node: its messages follow it there
        with pymq.connect(c.url, client_id="mover") as conn:
            consumer = conn.create_session().create_durable_consumer(topic, "inbox")
            first = consumer.receive(15.0)        # the move crosses the store and two links: be patient
            got = [first.text] if first is not None else []
            while (m := consumer.receive(2.0)) is not None:
                got.append(m.text)
        assert got == [f"held on b {i}" for i in range(4)]
        assert wait_for(lambda: status(a)["assignments"].get("sub:mover:inbox") == "n2")
        assert "sub:mover:inbox" not in [k for k, v in status(b)["assignments"].items() if v == "n1"]
        # b dropped its copy: new messages reach the subscriber once, through c
        with pymq.connect(a.url) as pub:
            pub.create_session().create_producer(topic).send("after the move")
        with pymq.connect(c.url, client_id="mover") as conn:
            consumer = conn.create_session().create_durable_consumer(topic, "inbox")
            assert consumer.receive(3).text == "after the move"
            assert consumer.receive(1.0) is None
        # nothing is left behind on b: no subscription there, so the topic left its filter
        assert wait_for(lambda: topic.name not in status(b)["filter_topics"])
    finally:
        for node in nodes:
            node.stop()
