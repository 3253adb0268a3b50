"""Ids that survive (issue 27 item 4) seen by stomp.py, a client nobody here wrote, on a real two-node
cluster: the message id a producer's RECEIPT names on node A is the message-id a consumer on node B reads,
for a queue and for a topic, and the reply it correlates by that id finds its request
(tests/cluster/test_ids.py shows the same with the project's own clients, header by header)."""
from __future__ import annotations

import queue
import uuid

import pytest
import stomp

from tests.cluster.nodes import start_cluster, wait_consumers_seen, wait_topic_seen
from tests.storage.services import redis_url  # noqa: F401 - fixture


class Heard(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.frames: queue.Queue = queue.Queue()
        self.receipts: dict[str, dict] = {}

    def on_message(self, frame) -> None:
        self.frames.put(frame)

    def on_receipt(self, frame) -> None:
        self.receipts[frame.headers["receipt-id"]] = dict(frame.headers)


def _connect(node) -> tuple[stomp.Connection12, Heard]:
    c = stomp.Connection12([("127.0.0.1", node.port)], heartbeats=(0, 0))
    heard = Heard()
    c.set_listener("heard", heard)
    c.connect("guest", "guest", wait=True)
    return c, heard


@pytest.fixture(scope="module")
def pair(tmp_path_factory, redis_url):  # noqa: F811
    nodes, _ = start_cluster(tmp_path_factory.mktemp("ids-stomp-py"), redis_url, n=2)
    yield nodes
    for node in nodes:
        node.stop()


def _receipted_ids(producer: stomp.Connection12, heard: Heard, destination: str, count: int) -> list[str]:
    from tests.conftest import wait_for
    for i in range(count):
        producer.send(destination, f"m{i}", headers={"receipt": f"r{i}", "persistent": "true"})
    assert wait_for(lambda: len(heard.receipts) >= count, timeout=10)
    return [heard.receipts[f"r{i}"]["message-id"] for i in range(count)]


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_the_id_in_the_producers_receipt_is_the_one_a_consumer_on_another_node_reads(pair, kind):
    a, b = pair
    name = f"ids-py-{uuid.uuid4().hex[:6]}"
    destination = f"/{kind}/{name}"
    consumer, arrived = _connect(b)
    producer, heard = _connect(a)
    try:
        consumer.subscribe(destination, id="1")
        if kind == "queue":
            wait_consumers_seen(b, name, by=[a])
        else:
            wait_topic_seen(b, name, by=[a])
        sent = _receipted_ids(producer, heard, destination, 10)
        got = [arrived.frames.get(timeout=10) for _ in range(10)]
        assert [f.headers["message-id"] for f in got] == sent                      # 10 of 10 equal
        assert [f.body for f in got] == [f"m{i}" for i in range(10)]
        # a reply correlated by that id, sent back from node B, is matched on node A
        replies = f"/queue/{name}.replies"
        producer.subscribe(replies, id="r")
        wait_consumers_seen(a, name + ".replies", by=[b])
        for frame in got:
            consumer.send(replies, "answer " + frame.body, headers={"correlation-id": frame.headers["message-id"]})
        answers = {}
        for _ in range(10):
            frame = heard.frames.get(timeout=10)
            answers[frame.headers["correlation-id"]] = frame.body
        assert answers == {mid: f"answer m{i}" for i, mid in enumerate(sent)}
    finally:
        for c in (consumer, producer):
            c.disconnect()
