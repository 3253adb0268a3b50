"""Seed 003 on a real 3-node cluster: a queue's routing key (group | correlation-id | message-id) picks the
node of every message, whichever node accepted it and whichever node the queue was declared through
(spec/routing.md §2.3, spec/cluster.md §4)."""
from __future__ import annotations

import uuid

import pytest

import pymq
from pymq.errors import ConfigError
from pymq.routing import GroupRouter
from tests.cluster.nodes import Node, cluster_cfg, start_cluster, status, wait_consumers_seen
from tests.conftest import wait_for
from tests.storage.services import redis_url  # noqa: F401 - fixture


@pytest.fixture(scope="module")
def trio(tmp_path_factory, redis_url):  # noqa: F811
    nodes, _ = start_cluster(tmp_path_factory.mktemp("rk"), redis_url)
    yield nodes
    for node in nodes:
        node.stop()


def test_correlation_id_routing_declared_through_one_node_holds_on_every_node(trio):
    a, b, c = trio
    queue = pymq.Queue(f"conversations-{uuid.uuid4().hex[:6]}")
    with pymq.connect(a.url) as conn:
        conn.queue_manager().create(queue.name, routing_key="correlation-id")
    # the setting reaches every node through the cluster store
    assert wait_for(lambda: all(status(n)["routing_keys"].get(queue.name) == "correlation-id" for n in trio),
                    timeout=5)
    conns = [pymq.connect(n.url) for n in trio]
    try:
        consumers = {n.node_id: cn.create_session().create_consumer(queue, prefetch=1000)
                     for n, cn in zip(trio, conns, strict=True)}
        for node in trio:                                 # consumer maps reach the peers
            wait_consumers_seen(node, queue.name, [n for n in trio if n is not node])
        cids = [f"req-{i}" for i in range(12)]
        producer = conns[1].create_session().create_producer(queue)    # sent through b, declared on a
        for seq in range(3):
            for cid in cids:
                m = pymq.TextMessage(f"{cid}:{seq}")
                m.correlation_id = cid
                producer.send(m, delivery_mode=pymq.NON_PERSISTENT)
        for i in range(6):
            producer.send(f"plain {i}", delivery_mode=pymq.NON_PERSISTENT)   # no correlation id: unkeyed
        where: dict[str, set] = {}
        plain: dict[str, str] = {}
        for node_id, consumer in consumers.items():
            while (m := consumer.receive(1.5)) is not None:
                if m.correlation_id is None:
                    plain[m.text] = node_id
                else:
                    where.setdefault(m.correlation_id, set()).add(node_id)
        router = GroupRouter([n.node_id for n in trio])
        assert sorted(where) == sorted(cids)
        for cid in cids:
            assert where[cid] == {router.route(cid)}, cid        # one node per conversation: the hash's
        assert len({router.route(cid) for cid in cids}) > 1       # and the conversations spread
        # an unkeyed message stays where it was sent while that node has a consumer (spec/cluster.md §4)
        assert plain == {f"plain {i}": "n1" for i in range(6)}
    finally:
        for cn in conns:
            cn.close()


def test_message_id_routing_spreads_messages_by_their_assigned_id(tmp_path, redis_url):  # noqa: F811
    """A queue declared in every node's configuration with routing_key: message-id."""
    name = f"spread-{uuid.uuid4().hex[:6]}"
    cfg = cluster_cfg(redis_url)
    extra = {"queues": {name: {"routing_key": "message-id"}}}
    nodes = [Node(f"n{i}", str(tmp_path / f"n{i}"), cfg, extra).start() for i in range(3)]
    try:
        assert wait_for(lambda: all(len(status(n)["links"]) == 2 and all(status(n)["links"].values())
                                    for n in nodes), timeout=10)
        assert status(nodes[0])["routing_keys"][name] == "message-id"
        queue = pymq.Queue(name)
        conns = [pymq.connect(n.url) for n in nodes]
        try:
            consumers = {n.node_id: cn.create_session().create_consumer(queue, prefetch=1000)
                         for n, cn in zip(nodes, conns, strict=True)}
            for node in nodes:
                wait_consumers_seen(node, queue.name, [n for n in nodes if n is not node])
            producer = conns[0].create_session().create_producer(queue)
            for i in range(45):
                m = pymq.TextMessage(f"m{i}")
                m.group_id = "g-fixed" if i % 15 == 0 else None     # grouped ones keep their group's node
                producer.send(m, delivery_mode=pymq.NON_PERSISTENT)
            router = GroupRouter([n.node_id for n in nodes])
            got = {}
            for node_id, consumer in consumers.items():
                while (m := consumer.receive(1.5)) is not None:
                    got[m.text] = node_id
                    if m.group_id is None:
                        assert router.route(m.message_id) == node_id, (m.text, m.message_id)   # the id it has
                    else:
                        assert node_id == router.route("g-fixed")
            assert sorted(got) == sorted(f"m{i}" for i in range(45))
            assert set(got.values()) == {"n0", "n1", "n2"}      # spread over the nodes, not kept local
        finally:
            for cn in conns:
                cn.close()
    finally:
        for node in nodes:
            node.stop()


def test_an_unknown_routing_key_is_refused_and_creates_nothing(trio):
    a = trio[0]
    name = f"bad-{uuid.uuid4().hex[:6]}"
    with pymq.connect(a.url) as conn:
        qm = conn.queue_manager()
        with pytest.raises(ConfigError) as info:
            qm.create(name, routing_key="JMSXGroupID")
        assert "routing_key: expected 'group', 'correlation-id' or 'message-id'" in str(info.value)
        assert name not in [q["name"] for q in qm.list()]
    assert name not in status(a)["routing_keys"]
