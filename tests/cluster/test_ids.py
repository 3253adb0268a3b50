"""Ids that survive (issue 27 item 4) on a real two-node cluster: a message that crosses nodes keeps its
message id, its timestamp and every header a consumer on its first node would see (spec/cluster.md §3),
so a reply correlated by JMSMessageID finds its request wherever it was consumed, and a queue routing on
message ids routes by the id its consumers see (spec/routing.md §2.3).

On the landed main before this (6f908ed) the consumer on the other node got a new id (0 of 10 equal), the
forwarded copy carried `pymq-forwarded` and a `pymq-dedup-id` of the cluster's own, a hand-over made new
ids again, and the rows of a bulk SEND to a message-id queue all routed by one id nobody saw.
"""
from __future__ import annotations

import uuid

import pytest

import pymq
from pymq.routing import GroupRouter
from tests.cluster.nodes import start_cluster, status, wait_consumers_seen, wait_topic_seen
from tests.conftest import RawStomp, wait_for
from tests.storage.services import redis_url  # noqa: F401 - fixture

#: headers that belong to one delivery on one node, not to the message
PER_DELIVERY = {"subscription", "ack", "pymq-seq"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory, redis_url):  # noqa: F811
    nodes, _ = start_cluster(tmp_path_factory.mktemp("ids"), redis_url, n=2)
    yield nodes
    for node in nodes:
        node.stop()


def _raw(node) -> RawStomp:
    raw = RawStomp(node.port)
    assert raw.connect().command == "CONNECTED"
    return raw


def _subscribe(raw: RawStomp, destination: str, sub_id: str = "s") -> None:
    raw.send("SUBSCRIBE", {"id": sub_id, "destination": destination, "receipt": "sub"})
    frame = raw.read()
    assert frame.command == "RECEIPT", frame


def test_a_topic_message_forwarded_to_another_node_carries_what_a_local_subscriber_sees(pair):
    a, b = pair
    topic = f"ids.{uuid.uuid4().hex[:6]}"
    here, there, pub = _raw(a), _raw(b), _raw(a)
    try:
        _subscribe(here, "/topic/" + topic)
        _subscribe(there, "/topic/" + topic)
        wait_topic_seen(b, topic, by=[a])
        pub.send("SEND", {"destination": "/topic/" + topic, "receipt": "r1", "persistent": "true", "priority": "7",
                          "expires": "4102444800000", "correlation-id": "conv-1", "reply-to": "/queue/answers",
                          "type": "Quote", "JMSXGroupID": "g-1", "color": "red", "n": "7", "pymq-types": "n=i",
                          "pymq-dedup-id": "producer-1", "content-type": "text/plain"}, b"price 7")
        receipt = pub.read()
        assert receipt.command == "RECEIPT", receipt
        local, forwarded = here.read(), there.read()
        assert local.command == forwarded.command == "MESSAGE"
        assert forwarded.headers["message-id"] == local.headers["message-id"] == receipt.headers["message-id"]
        assert forwarded.headers["timestamp"] == local.headers["timestamp"]
        assert {k: v for k, v in forwarded.headers.items() if k not in PER_DELIVERY} == \
            {k: v for k, v in local.headers.items() if k not in PER_DELIVERY}
        assert forwarded.body == local.body == b"price 7"
    finally:
        for raw in (here, there, pub):
            raw.close()


def test_a_queue_message_consumed_on_another_node_has_the_id_its_producer_was_given(pair):
    a, b = pair
    queue = pymq.Queue(f"ids-{uuid.uuid4().hex[:6]}")
    with pymq.connect(b.url) as cons, pymq.connect(a.url) as prod:
        consumer = cons.create_session().create_consumer(queue)
        wait_consumers_seen(b, queue.name, by=[a])
        producer = prod.create_session().create_producer(queue)
        sent = [producer.send(f"m{i}").message_id for i in range(10)]      # persistent: each receipted
        assert all(sent)
        got = [consumer.receive(5) for _ in range(10)]
    assert [m.message_id for m in got] == sent                                 # 10 of 10 equal
    assert all(m.text == f"m{i}" for i, m in enumerate(got))


def test_replies_correlated_by_message_id_find_their_requests_across_nodes(pair):
    """The JMS request/reply pattern: the replier sets the reply's correlation id to the request's
    JMSMessageID, which the requester learnt from its producer (the receipt)."""
    a, b = pair
    tag = uuid.uuid4().hex[:6]
    service, answers = pymq.Queue(f"svc-{tag}"), pymq.Queue(f"answers-{tag}")
    with pymq.connect(a.url) as requester, pymq.connect(b.url) as replier:
        rs = replier.create_session()
        requests = rs.create_consumer(service)
        reply_producer = rs.create_producer(answers)
        qs = requester.create_session()
        replies = qs.create_consumer(answers)
        wait_consumers_seen(b, service.name, by=[a])
        wait_consumers_seen(a, answers.name, by=[b])
        producer = qs.create_producer(service)
        asked = {}
        for i in range(10):
            request = pymq.TextMessage(f"question {i}")
            request.reply_to = answers
            asked[producer.send(request).message_id] = f"question {i}"
        for _ in range(10):
            request = requests.receive(5)
            reply = pymq.TextMessage("answer to " + request.text)
            reply.correlation_id = request.message_id
            reply_producer.send(reply)
        matched = {}
        for _ in range(10):
            reply = replies.receive(5)
            matched[reply.correlation_id] = reply.text
    assert matched == {mid: "answer to " + text for mid, text in asked.items()}


def test_a_message_id_queue_routes_by_the_ids_its_consumers_see(pair):
    """Single SENDs and the rows of a bulk SEND: each message is consumed on the node its id's hash names,
    and that id is the one its producer was given."""
    pa = pytest.importorskip("pyarrow")
    from tests.arrow_rows import rows
    a, b = pair
    name = f"spread-{uuid.uuid4().hex[:6]}"
    with pymq.connect(a.url) as conn:
        conn.queue_manager().create(name, routing_key="message-id")
    assert wait_for(lambda: all(status(n)["routing_keys"].get(name) == "message-id" for n in pair), timeout=5)
    router = GroupRouter([n.node_id for n in pair])
    conns = [pymq.connect(n.url) for n in pair]
    try:
        consumers = {n.node_id: c.create_session().create_consumer(pymq.Queue(name), prefetch=1000)
                     for n, c in zip(pair, conns, strict=True)}
        producer = conns[0].create_session().create_producer(pymq.Queue(name))
        sent = {producer.send(f"m{i}").message_id for i in range(60)}
        session = conns[0].create_session()
        session.send_arrow("/queue/" + name, rows(60, start=1000))
        del pa

        got: dict[str, str] = {}
        for node_id, consumer in consumers.items():
            while (m := consumer.receive(1.5)) is not None:
                assert m.message_id not in got, m.message_id              # no id twice
                got[m.message_id] = node_id
        singles = {mid for mid in got if mid in sent}
        assert singles == sent                                             # every single SEND, by its own id
        assert len(got) == 120
        misrouted = [mid for mid, node in got.items() if router.route(mid) != node]
        assert misrouted == []
        bulk_nodes = {node for mid, node in got.items() if mid not in sent}
        assert bulk_nodes == {"n0", "n1"}                                  # the rows spread too
    finally:
        for c in conns:
            c.close()


def test_a_durable_subscription_that_follows_its_consumer_keeps_its_messages_ids(pair):
    a, b = pair
    topic = pymq.Topic(f"follow.{uuid.uuid4().hex[:6]}")
    owner = f"mover-{uuid.uuid4().hex[:6]}"
    with pymq.connect(b.url, client_id=owner) as conn:
        conn.create_session().create_durable_consumer(topic, "inbox").close()
    key = f"sub:{owner}:inbox"
    assert wait_for(lambda: status(a)["assignments"].get(key) == "n1", timeout=5)
    wait_topic_seen(b, topic.name, by=[a])
    with pymq.connect(a.url) as pub:
        producer = pub.create_session().create_producer(topic)
        sent = [producer.send(f"held on b {i}").message_id for i in range(4)]
    assert wait_for(lambda: status(b)["received_forwarded"] >= 4)
    with pymq.connect(a.url, client_id=owner) as conn:                   # it comes back through a
        consumer = conn.create_session().create_durable_consumer(topic, "inbox")
        got = [consumer.receive(15.0)]
        while (m := consumer.receive(1.0)) is not None:
            got.append(m)
    assert [m.text for m in got] == [f"held on b {i}" for i in range(4)]
    assert [m.message_id for m in got] == sent


def test_redistributed_messages_keep_their_ids(pair):
    a, b = pair
    queue = pymq.Queue(f"backlog-{uuid.uuid4().hex[:6]}")
    with pymq.connect(a.url) as pub:
        producer = pub.create_session().create_producer(queue)
        sent = [producer.send(f"m{i}").message_id for i in range(8)]      # nobody consumes yet: they wait on a
    with pymq.connect(b.url) as conn:
        consumer = conn.create_session().create_consumer(queue)
        got = [consumer.receive(10) for _ in range(8)]
    assert sorted(m.message_id for m in got) == sorted(sent)


def test_a_message_that_crosses_back_and_forth_is_never_taken_for_a_duplicate(pair):
    """Redistribution follows consumers: a message may cross from a to b, back to a and to b again. Each
    crossing is its own (the sender's key, not the message id, names it), so the receiver's duplicate
    window, which drops the resend of one crossing, never drops a later crossing of the same message."""
    a, b = pair
    queue = pymq.Queue(f"pingpong-{uuid.uuid4().hex[:6]}")
    with pymq.connect(a.url) as pub:
        producer = pub.create_session().create_producer(queue)
        sent = [producer.send(f"m{i}").message_id for i in range(5)]       # waiting on a: no consumer

    def take_and_return(node) -> list[str]:
        """Receive all five through ``node`` without acknowledging: back into its queue when the
        connection closes."""
        with pymq.connect(node.url) as conn:
            consumer = conn.create_session(pymq.CLIENT_ACKNOWLEDGE).create_consumer(queue)
            return [consumer.receive(10).message_id for _ in range(5)]
    assert sorted(take_and_return(b)) == sorted(sent)          # a -> b
    assert sorted(take_and_return(a)) == sorted(sent)          # b -> a
    with pymq.connect(b.url) as conn:                          # a -> b again
        consumer = conn.create_session().create_consumer(queue)
        got = [consumer.receive(10) for _ in range(5)]
        assert consumer.receive(0.5) is None
    assert sorted(m.message_id for m in got) == sorted(sent)
