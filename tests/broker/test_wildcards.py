"""Wildcard subscriptions on topics (spec/routing.md §5): ``*`` one word, ``#`` (and ActiveMQ's ``>``) zero or
more words; durable, shared and selective subscriptions to patterns; a pattern is never published to; a
grant on a pattern covers what it matches and nothing wider, and a refused pattern subscription creates
nothing. Every "nothing else arrived" is shown by a last message that every subscription matches."""
from __future__ import annotations

import pymq
import pytest
from pymq.errors import AccessDenied, DestinationError
from pymq_server.broker.auth import save_user

from tests.conftest import RawStomp, wait_for


def _subscribe(c: RawStomp, destination: str, sub_id: str, **headers) -> None:
    c.send("SUBSCRIBE", {"destination": destination, "id": sub_id, "receipt": f"s-{sub_id}", **headers})
    frame = c.read()
    assert frame.command == "RECEIPT", frame


def _publish(c: RawStomp, destination: str, body: str, **headers) -> None:
    c.send("SEND", {"destination": destination, "receipt": "p-" + body, **headers}, body.encode())
    frame = c.read()
    assert frame.command == "RECEIPT", frame


def _until(c: RawStomp, last: str) -> list[tuple[str, str, str]]:
    """(subscription, destination, body) of every MESSAGE up to and including the one whose body is ``last``."""
    out = []
    while True:
        f = c.read()
        assert f.command == "MESSAGE", f
        out.append((f.headers["subscription"], f.headers["destination"], f.body.decode()))
        if f.body.decode() == last:
            return out


def test_star_hash_and_activemq_gt(raw):
    c, p = raw(), raw()
    _subscribe(c, "/topic/stocks.*", "star")
    _subscribe(c, "/topic/stocks.#", "hash")
    _subscribe(c, "/topic/stocks.>", "gt")
    _subscribe(c, "/topic/#", "all")
    for topic in ("stocks.ibm", "stocks.nyse.ibm", "stocks", "bonds.x", "stocksx.ibm"):
        _publish(p, "/topic/" + topic, topic)
    got = _until(c, "stocksx.ibm")
    by_sub: dict[str, list[str]] = {}
    for sub, destination, body in got:
        assert destination == "/topic/" + body        # the topic it was published to, not the pattern
        by_sub.setdefault(sub, []).append(body)
    assert by_sub["star"] == ["stocks.ibm"]
    assert by_sub["hash"] == ["stocks.ibm", "stocks.nyse.ibm", "stocks"]
    assert by_sub["gt"] == by_sub["hash"]
    assert by_sub["all"] == ["stocks.ibm", "stocks.nyse.ibm", "stocks", "bonds.x", "stocksx.ibm"]
    assert len(got) == 1 + 3 + 3 + 5                  # each subscription has each message once


def test_pattern_and_plain_subscriptions_each_get_one_copy(raw, broker):
    c, p = raw(), raw()
    _subscribe(c, "/topic/a.b", "plain")
    _subscribe(c, "/topic/a.*", "star")
    _subscribe(c, "/topic/a.#", "hash")
    _publish(p, "/topic/a.b", "one")
    assert sorted(s for s, _, _ in _until(c, "one") + _until(c, "one") + _until(c, "one")) == \
        ["hash", "plain", "star"]
    c.send("UNSUBSCRIBE", {"id": "star", "receipt": "u1"})
    assert c.read().command == "RECEIPT"
    _publish(p, "/topic/a.b", "two")
    assert sorted(s for s, _, _ in _until(c, "two") + _until(c, "two")) == ["hash", "plain"]
    c.send("UNSUBSCRIBE", {"id": "hash", "receipt": "u2"})
    assert c.read().command == "RECEIPT"
    # the index holds a pattern only while its topic has subscriptions
    assert wait_for(lambda: broker.call(lambda: sorted(broker.broker.destinations.patterns.topics)) == [])


def test_publishing_to_a_pattern_is_refused_and_creates_nothing(raw, broker):
    for destination in ("/topic/stocks.*", "/topic/#", "/topic/a.>.b"):
        c = raw()
        c.send("SEND", {"destination": destination, "receipt": "r"}, b"x")
        frame = c.read()
        assert frame.command == "ERROR" and frame.headers["pymq-code"] == "invalid-destination", frame
        assert "pattern" in frame.headers["message"]
    topics = broker.call(lambda: sorted(broker.broker.topics))
    assert not any(t in topics for t in ("stocks.*", "#", "a.#.b", "a.>.b"))
    # inside a word the characters are plain: a topic may be called 'a*b'
    c, p = raw(), raw()
    _subscribe(c, "/topic/a*b", "1")
    _publish(p, "/topic/a*b", "plain")
    assert _until(c, "plain") == [("1", "/topic/a*b", "plain")]


def test_selector_with_a_pattern_on_plain_stomp_headers(raw):
    c, p = raw(), raw()
    _subscribe(c, "/topic/prices.*", "1", selector="price > 100 AND venue = 'nyse'")
    _publish(p, "/topic/prices.ibm", "cheap", price="99", venue="nyse")
    _publish(p, "/topic/prices.ibm", "dear", price="150", venue="nyse")
    _publish(p, "/topic/prices.msft", "elsewhere", price="150", venue="lse")
    _publish(p, "/topic/prices.x.y", "deep", price="150", venue="nyse")
    _publish(p, "/topic/prices.aapl", "last", price="101", venue="nyse")
    assert [b for _, _, b in _until(c, "last")] == ["dear", "last"]


def test_durable_pattern_subscription_keeps_messages_across_restart(broker_factory, tmp_path):
    data = str(tmp_path / "data")
    b = broker_factory(data_dir=data)
    with pymq.connect(b.url, client_id="app1") as conn:
        conn.create_session().create_durable_consumer(pymq.Topic("orders.>"), "all-orders").close()
    with pymq.connect(b.url) as conn:
        producer = conn.create_session().create_producer(pymq.Topic("orders.eu"))
        producer.send("eu")
        conn.create_session().create_producer(pymq.Topic("orders.us.east")).send(
            "us-east")
        conn.create_session().create_producer(pymq.Topic("invoices.eu")).send(
            "invoice")
    b.stop()
    b2 = broker_factory(data_dir=data)
    with pymq.connect(b2.url) as conn:
        conn.create_session().create_producer(pymq.Topic("orders")).send("bare")
    with pymq.connect(b2.url, client_id="app1") as conn:
        consumer = conn.create_session().create_durable_consumer(pymq.Topic("orders.#"), "all-orders")
        got = [consumer.receive(5) for _ in range(3)]
        # in publishing order across topics, before and after the restart (TopicPatterns.clock)
        assert [(m.text, m.destination.name) for m in got] == \
            [("eu", "orders.eu"), ("us-east", "orders.us.east"), ("bare", "orders")]
        seqs = [m.sequence for m in got]
        assert seqs == sorted(seqs)
        assert consumer.receive(0.3) is None
        consumer.close()
        conn.create_session().unsubscribe("all-orders")
    assert b2.call(lambda: sorted(b2.broker.destinations.patterns.topics)) == []


def test_shared_pattern_subscription_splits_the_messages(broker):
    with pymq.connect(broker.url) as conn:
        s1, s2 = conn.create_session(), conn.create_session()
        c1 = s1.create_shared_consumer(pymq.Topic("jobs.*"), "workers", prefetch=1)
        c2 = s2.create_shared_consumer(pymq.Topic("jobs.*"), "workers", prefetch=1)
        producer = conn.create_session()
        for i in range(10):
            producer.create_producer(pymq.Topic(f"jobs.k{i}")).send(f"j{i}")
        got: list[str] = []
        while len(got) < 10:
            for consumer in (c1, c2):
                m = consumer.receive(0.2)
                if m is not None:
                    got.append(m.text)
        assert sorted(got) == sorted(f"j{i}" for i in range(10))


# -- grants on patterns ---------------------------------------------------------------------------

@pytest.fixture
def secured(broker_factory, tmp_path):
    users = str(tmp_path / "users.yaml")
    save_user(users, "root", "rootpw", ["admin"])
    save_user(users, "alice", "alicepw", [])
    save_user(users, "bob", "bobpw", [])
    b = broker_factory(users_file=users, default_permissions={"role:admin": ["produce", "consume", "browse"]})
    with pymq.connect(b.url, username="root", password="rootpw") as root:
        root.queue_manager().grant("/topic/stocks.*", "user:alice", "consume")
        root.queue_manager().grant("/topic/stocks.>", "user:bob", "produce")
    return b


def _nothing_made(b, *names: str) -> None:
    topics = b.call(lambda: dict(b.broker.topics))
    for name in names:
        assert name not in topics or not topics[name].subscriptions, name
    assert b.call(lambda: list(b.broker.destinations.patterns.topics)) == []


def test_a_grant_on_a_pattern_covers_what_it_matches_and_nothing_wider(secured):
    b = secured
    for wider in ("stocks.#", "stocks.>", "#", "*.*", "stocks.*.*", "*.ibm"):
        with pymq.connect(b.url, username="alice", password="alicepw") as alice:   # an ERROR closes it
            with pytest.raises(AccessDenied, match="consume"):
                alice.create_session().create_consumer(pymq.Topic(wider))
    _nothing_made(b, "stocks.#", "#", "*.*", "stocks.*.*", "*.ibm")
    with pymq.connect(b.url, username="alice", password="alicepw", client_id="alice-app") as alice:
        with pytest.raises(AccessDenied):
            alice.create_session().create_durable_consumer(pymq.Topic("#"), "everything")
    _nothing_made(b, "#")
    assert b.call(lambda: list(b.broker.subscriptions.durable)) == []
    with pymq.connect(b.url, username="alice", password="alicepw") as alice:
        s = alice.create_session()
        star = s.create_consumer(pymq.Topic("stocks.*"))
        ibm = s.create_consumer(pymq.Topic("stocks.ibm"))
        with pymq.connect(b.url, username="bob", password="bobpw") as bob:
            bob.create_session().create_producer(pymq.Topic("stocks.ibm")).send("tick")
            bob.create_session().create_producer(pymq.Topic("stocks.nyse.ibm")).send("deep")
        with pymq.connect(b.url, username="bob", password="bobpw") as bob:
            with pytest.raises(AccessDenied, match="produce"):
                bob.create_session().create_producer(pymq.Topic("bonds.x")).send("no")
        assert star.receive(5).text == "tick" and ibm.receive(5).text == "tick"
        assert star.receive(0.2) is None           # stocks.nyse.ibm is not stocks.*
    with pymq.connect(b.url, username="alice", password="alicepw") as alice:
        with pytest.raises(AccessDenied, match="produce"):
            alice.create_session().create_producer(pymq.Topic("stocks.ibm")).send("alice may only read")
    with pymq.connect(b.url, username="bob", password="bobpw") as bob:
        with pytest.raises(AccessDenied, match="consume"):
            bob.create_session().create_consumer(pymq.Topic("stocks.ibm"))


def test_a_pattern_grant_survives_restart(broker_factory, tmp_path):
    users = str(tmp_path / "users.yaml")
    save_user(users, "root", "rootpw", ["admin"])
    save_user(users, "alice", "alicepw", [])
    settings = dict(users_file=users, data_dir=str(tmp_path / "d"),
                    default_permissions={"role:admin": ["produce", "consume"]})
    b = broker_factory(**settings)
    with pymq.connect(b.url, username="root", password="rootpw") as root:
        root.queue_manager().grant("/topic/metrics.#", "user:alice", "consume")
    b.stop()
    b2 = broker_factory(**settings)
    with pymq.connect(b2.url, username="alice", password="alicepw") as alice:
        alice.create_session().create_consumer(pymq.Topic("metrics.cpu.load"))
        alice.create_session().create_consumer(pymq.Topic("metrics.*"))
        with pytest.raises(AccessDenied):
            alice.create_session().create_consumer(pymq.Topic("*.cpu"))


def test_sdk_refuses_nothing_the_broker_accepts_and_reports_the_pattern_error(broker):
    with pymq.connect(broker.url) as conn:
        with pytest.raises(DestinationError, match="pattern"):
            conn.create_session().create_producer(pymq.Topic("stocks.*")).send("x")


def test_a_pattern_subscription_sees_many_topics_in_publishing_order(raw):
    """Each topic numbers its own messages (pymq-seq) and a subscription's queue is kept in number order: a
    pattern subscription reading topics with far-apart counters still gets them as they were published."""
    c, p = raw(), raw()
    for i in range(30):                       # 'busy' is far ahead of 'quiet'
        _publish(p, "/topic/m.busy", f"early-{i}")
    _subscribe(c, "/topic/m.*", "1")
    order = ["m.quiet", "m.busy", "m.quiet", "m.new", "m.busy"]
    for i, topic in enumerate(order):
        _publish(p, "/topic/" + topic, f"{i}")
    got = []
    while len(got) < len(order):
        f = c.read()
        got.append((f.headers["destination"], f.body.decode(), int(f.headers["pymq-seq"])))
    assert [(d, b) for d, b, _ in got] == [("/topic/" + t, str(i)) for i, t in enumerate(order)]
    assert [s for _, _, s in got] == sorted(s for _, _, s in got)
