"""What a queue message costs the cluster node that keeps it (bench/cluster_opcodes.py --queue): the routing
rule (routes.py) is reached from the driver with no frame of the state's in between, the queue's own routing
key setting is read without an Enum call, and the local-consumer question stops at the first one."""
from __future__ import annotations


from pymq_server.broker.requests import SubscribeRequest

from tests.broker.core_harness import FakeClient
from tests.calls import python_calls
from tests.cluster.test_outboxes import n  # noqa: F401  (the fixture: a broker core and its node n0)


def _calls(fn) -> tuple[object, list[str]]:
    return python_calls(fn, lambda code: code.co_name)


def test_a_queue_message_with_local_consumers_is_kept_here_by_the_shortest_path(n):  # noqa: F811
    n.store.beat("n0", "n1")
    n.read()
    assert not n.node.state.membership.alone
    clients = [FakeClient(name=f"c{i}") for i in range(3)]
    for i, client in enumerate(clients):
        consumer = n.core.broker.subscribe(client, SubscribeRequest("/queue/q", f"s{i}"))
        consumer.queue.add_consumer(consumer)                 # (a session attaches it: session.py)
    queue = n.core.queue("q")
    assert len(queue.consumers) == 3
    peer, calls = _calls(lambda: n.node.route_queue(queue, {}, "ID:n0-1"))
    assert peer is None
    assert calls == ["<lambda>", "route_queue", "route", "key_for", "routing_key_of", "<lambda>",
                     "has_local_consumer", "_client"]
    # a keyed message asks no consumer; alone, nothing past the driver's first test
    peer, calls = _calls(lambda: n.node.route_queue(queue, {"JMSXGroupID": "g"}, "ID:n0-2"))
    assert "has_local_consumer" not in calls and peer in (None, "n1")
    n.clock.advance(400)
    n.store.beat("n0")
    n.read()
    assert n.node.state.membership.alone
    peer, calls = _calls(lambda: n.node.route_queue(queue, {"JMSXGroupID": "g"}, "ID:n0-3"))
    assert peer is None and calls == ["<lambda>", "route_queue"]
