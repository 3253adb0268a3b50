"""A message written in an application's database transaction is routed like a SEND (spec/placement.md):
a grouped queue message goes to the node its group's hash names, whichever node claims it."""
from __future__ import annotations

import uuid

import sqlalchemy as sa
from pymq_server.storage.sql import drop_tables, send_in_transaction

import pymq
from pymq.protocol.scanner import encode_frame
from pymq.routing import GroupRouter
from tests.cluster.nodes import Node
from tests.cluster.test_cluster import _cluster_cfg, status
from tests.conftest import wait_for
from tests.storage.services import postgres_url, redis_url  # noqa: F401 - fixtures


def test_a_grouped_message_from_an_application_transaction_goes_to_its_groups_node(
        tmp_path, redis_url, postgres_url):  # noqa: F811
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    storage = {"devices": {"memory": {"kind": "memory"}, "file": {"kind": "file"},
                           "db": {"kind": "sql", "url": postgres_url, "table_prefix": prefix}},
               "persistent_device": "file"}
    cfg = _cluster_cfg(redis_url)
    ids = [f"a{uuid.uuid4().hex[:6]}", f"b{uuid.uuid4().hex[:6]}"]
    claimer, owner = ids
    nodes = {node_id: Node(node_id, str(tmp_path / node_id), cfg, {"storage": storage}).start() for node_id in ids}
    engine = sa.create_engine(postgres_url)
    conns = []
    try:
        for node in nodes.values():
            def joined(node: Node = node) -> bool:
                seen = status(node)
                return set(seen["members"]) == set(ids) and all(seen["links"].values())
            assert wait_for(joined, timeout=10), status(node)
        router = GroupRouter(sorted(ids))
        group = next(g for g in (f"customer-{i}" for i in range(1000)) if router.route(g) == owner)
        queue = f"orders-{uuid.uuid4().hex[:6]}"
        consumers = {}
        for node_id, node in nodes.items():
            conn = pymq.connect(node.url)
            conns.append(conn)
            consumers[node_id] = conn.create_session().create_consumer(pymq.Queue(queue))
        data = encode_frame("SEND", {"destination": "/queue/" + queue, "JMSXGroupID": group}, b"grouped", "1.2")
        with engine.begin() as db:        # addressed to the node that is not the group's
            send_in_transaction(db, "/queue/" + queue, data, persistent=True, broker_id=claimer, table_prefix=prefix)
        got = consumers[owner].receive(10)
        assert got is not None and got.text == "grouped"
        assert consumers[claimer].receive(0.5) is None
    finally:
        for conn in conns:
            conn.close()
        for node in nodes.values():
            node.stop()
        drop_tables(engine, prefix)
