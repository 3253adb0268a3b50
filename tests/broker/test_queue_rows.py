"""Issue 15 item 1, end to end over STOMP: exclusive consumers, last-value queues, temporary topics, altering
a queue, auto-deleted destinations and the scheduling headers consumed at delivery — from stomp.py (a client
nobody here wrote), from the blocking SDK and from pymq.aio."""
from __future__ import annotations

import asyncio

import pytest
import stomp

import pymq
import pymq.aio
from pymq.errors import AccessDenied, ConfigError, UnknownDestination
from tests.conftest import RawStomp, wait_for
from tests.stomp_py_client import connections


@pytest.fixture
def stomppy(broker):
    yield from connections(stomp.Connection12, broker.port)


def _consumers(broker, name: str) -> int:
    return broker.call(lambda: len(q.consumers) if (q := broker.broker.queues.get(name)) is not None else 0)


def _send(broker, destination: str, bodies, **headers) -> None:
    with pymq.connect(broker.url) as conn:
        session = conn.create_session()
        producer = session.create_producer(destination)
        for body in bodies:
            producer.send(session.create_text_message(body, properties=dict(headers) or None))


# -- exclusive consumers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["activemq.exclusive", "exclusive"])
def test_exclusive_consumer_takes_everything_and_hands_over_in_subscription_order(broker, stomppy, spelling):
    first, got1 = stomppy()
    second, got2 = stomppy()
    third, got3 = stomppy()
    first.subscribe("/queue/excl", id="a", ack="client-individual", headers={spelling: "true"})
    second.subscribe("/queue/excl", id="b", ack="client-individual", headers={spelling: "true"})
    third.subscribe("/queue/excl", id="c", ack="client-individual", headers={spelling: "true"})
    assert wait_for(lambda: _consumers(broker, "excl") == 3)
    _send(broker, "/queue/excl", [f"m{i}" for i in range(11)])
    frames = [got1.next() for _ in range(11)]
    assert [f.body for f in frames] == [f"m{i}" for i in range(11)]
    assert got2.drain() == [] and got3.drain() == []       # not 6/5: one consumer has them all
    for f in frames[:5]:
        first.ack(f.headers["ack"])
    first.disconnect()                                     # m5..m10 unacked: back, to the next in order
    taken = [got2.next() for _ in range(6)]
    assert [f.body for f in taken] == [f"m{i}" for i in range(5, 11)]
    assert taken[0].headers.get("JMSXGroupFirstForConsumer") == "true"      # flagged like a group hand-over
    assert all("JMSXGroupFirstForConsumer" not in f.headers for f in taken[1:])
    assert got3.drain() == []


def test_exclusive_consumer_wins_over_plain_ones_and_queue_setting_makes_all_exclusive(broker, stomppy):
    plain, got_plain = stomppy()
    excl, got_excl = stomppy()
    plain.subscribe("/queue/mixed", id="p", ack="auto")
    excl.subscribe("/queue/mixed", id="e", ack="auto", headers={"activemq.exclusive": "true"})
    assert wait_for(lambda: _consumers(broker, "mixed") == 2)
    _send(broker, "/queue/mixed", ["x", "y", "z"])
    assert [got_excl.next().body for _ in range(3)] == ["x", "y", "z"]
    assert got_plain.drain() == []
    # Artemis: exclusivity is the queue's setting; every consumer is then exclusive
    with pymq.connect(broker.url) as conn:
        conn.queue_manager().create("artemis.excl", exclusive=True)
    a, got_a = stomppy()
    b, got_b = stomppy()
    a.subscribe("/queue/artemis.excl", id="a", ack="auto")
    b.subscribe("/queue/artemis.excl", id="b", ack="auto")
    assert wait_for(lambda: _consumers(broker, "artemis.excl") == 2)
    _send(broker, "/queue/artemis.excl", [str(i) for i in range(6)])
    assert [got_a.next().body for _ in range(6)] == [str(i) for i in range(6)]
    assert got_b.drain() == []


def test_exclusive_consumer_from_both_sdks(broker):
    with pymq.connect(broker.url) as c1, pymq.connect(broker.url) as c2:
        s1, s2 = c1.create_session(), c2.create_session()
        k1 = s1.create_consumer(pymq.Queue("sdk.excl"), exclusive=True)
        k2 = s2.create_consumer(pymq.Queue("sdk.excl"), exclusive=True)
        _send(broker, "/queue/sdk.excl", ["1", "2", "3"])
        assert [k1.receive(5).text for _ in range(3)] == ["1", "2", "3"]
        assert k2.receive(0.3) is None
        k1.close()
        _send(broker, "/queue/sdk.excl", ["4"])
        m = k2.receive(5)
        assert m.text == "4" and m.get_property("JMSXGroupFirstForConsumer") in ("true", True)

    async def run() -> list:
        async with pymq.aio.connect(broker.url) as c1, pymq.aio.connect(broker.url) as c2:
            k1 = await c1.create_session().create_consumer(pymq.Queue("aio.excl"), exclusive=True)
            k2 = await c2.create_session().create_consumer(pymq.Queue("aio.excl"), exclusive=True)
            producer = c1.create_session().create_producer(pymq.Queue("aio.excl"))
            for body in ("a", "b"):
                await producer.send(body)
            got = [(await k1.receive(5)).text for _ in range(2)]
            assert await k2.receive(0.3) is None
            return got
    assert asyncio.run(run()) == ["a", "b"]


# -- last-value queues -----------------------------------------------------------------------------------

def test_last_value_queue_keeps_the_latest_message_per_key(broker, stomppy):
    with pymq.connect(broker.url) as conn:
        conn.queue_manager().create("prices", last_value_key="_AMQ_LVQ_NAME")
    sender, _ = stomppy()
    for key, price in (("EUR", "1.01"), ("USD", "1.00"), ("EUR", "1.02"), ("EUR", "1.03"), ("USD", "0.99")):
        sender.send("/queue/prices", price, headers={"_AMQ_LVQ_NAME": key})
    sender.send("/queue/prices", "no key")               # without the property: waits like any message
    assert wait_for(lambda: broker.call(lambda: broker.broker.queues["prices"].depth) == 3)
    info = broker.call(lambda: broker.broker.queues["prices"].stats.replaced)
    assert info == 3
    reader, got = stomppy()
    reader.subscribe("/queue/prices", id="r", ack="auto")
    bodies = sorted(f.body for f in (got.next() for _ in range(3)))
    assert bodies == ["0.99", "1.03", "no key"]


def test_last_value_queue_delivered_unacked_is_not_replaced_but_gives_way_when_it_comes_back(broker):
    with pymq.connect(broker.url) as conn:
        conn.queue_manager().create("lvq.unacked", last_value_key="sym")
        session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(pymq.Queue("lvq.unacked"), prefetch=1)
        _send(broker, "/queue/lvq.unacked", ["v1"], sym="A")
        first = consumer.receive(5)
        assert first.text == "v1"
        _send(broker, "/queue/lvq.unacked", ["v2"], sym="A")    # v1 is delivered: both exist for now
        assert wait_for(lambda: broker.call(lambda: broker.broker.queues["lvq.unacked"].depth) == 2)
        session.recover()                  # v1 comes back while v2 waits: v1 gives way (replaced)
        again = consumer.receive(5)
        assert again.text == "v2"
        again.acknowledge()
        assert consumer.receive(0.3) is None
    assert broker.call(lambda: broker.broker.queues["lvq.unacked"].depth) == 0


def test_last_value_queue_across_a_restart(broker_factory, tmp_path):
    data = str(tmp_path / "lvq")
    first = broker_factory(data_dir=data)
    with pymq.connect(first.url) as conn:
        conn.queue_manager().create("lvq.durable", last_value_key="k")
    for v in ("1", "2", "3"):
        _send(first, "/queue/lvq.durable", [v], k="x")
    first.stop()
    second = broker_factory(data_dir=data)
    with pymq.connect(second.url) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue("lvq.durable"))
        assert consumer.receive(5).text == "3"
        assert consumer.receive(0.3) is None
        # still a last-value queue after the restart
        _send(second, "/queue/lvq.durable", ["4", "5"], k="y")


# -- temporary topics --------------------------------------------------------------------------------------

def test_temp_topic_request_reply_between_stomppy_and_the_sdk(broker, stomppy):
    requester, got = stomppy()
    requester.subscribe("/temp-topic/answers", id="t", ack="auto")
    with pymq.connect(broker.url) as conn:
        session = conn.create_session()
        service = session.create_consumer(pymq.Queue("svc"))
        requester.send("/queue/svc", "question", headers={"reply-to": "/temp-topic/answers"})
        request = service.receive(5)
        assert isinstance(request.reply_to, pymq.TemporaryTopic)
        assert request.reply_to.name.startswith("tmp.")          # rewritten to the global name
        session.create_producer(request.reply_to).send("answer")
    assert got.next().body == "answer"
    # another connection may publish to it but not subscribe
    other = RawStomp(broker.port)
    other.connect()
    other.send("SUBSCRIBE", {"destination": request.reply_to.stomp_name, "id": "x", "receipt": "r"})
    error = other.read()
    assert error.command == "ERROR" and error.headers["pymq-code"] == "access-denied"
    other.close()
    topic_name = request.reply_to.name
    assert broker.call(lambda: topic_name in broker.broker.destinations.temp_topics)
    requester.disconnect()
    # gone with its connection: sending to it now is refused
    assert wait_for(lambda: broker.call(lambda: topic_name not in broker.broker.destinations.temp_topics))
    late = RawStomp(broker.port)
    late.connect()
    late.send("SEND", {"destination": request.reply_to.stomp_name, "receipt": "s"}, b"late")
    error = late.read()
    assert error.command == "ERROR" and error.headers["pymq-code"] == "unknown-destination"
    late.close()


def test_temp_topic_from_both_sdks(broker):
    with pymq.connect(broker.url) as conn:
        session = conn.create_session()
        temp = session.create_temporary_topic()
        assert isinstance(temp, pymq.TemporaryTopic) and temp.stomp_name.startswith("/temp-topic/")
        one = session.create_consumer(temp)
        two = session.create_consumer(temp)                  # a topic: every subscriber gets each message
        session.create_producer(temp).send("hello")
        assert one.receive(5).text == "hello" and two.receive(5).text == "hello"
    raw = RawStomp(broker.port)                              # no durable subscriptions to temporary topics
    raw.connect()
    raw.send("SUBSCRIBE", {"destination": "/temp-topic/mine", "id": "d", "durable-subscription-name": "d"})
    error = raw.read()
    assert error.command == "ERROR" and error.headers["pymq-code"] == "invalid-destination"
    raw.close()

    async def run() -> str:
        async with pymq.aio.connect(broker.url) as conn:
            session = conn.create_session()
            temp = session.create_temporary_topic()
            consumer = await session.create_consumer(temp)
            await session.create_producer(temp).send("hi")
            return (await consumer.receive(5)).text
    assert asyncio.run(run()) == "hi"
    assert wait_for(lambda: broker.call(lambda: not broker.broker.destinations.temp_topics))


# -- altering a queue ------------------------------------------------------------------------------------

def test_alter_queue_from_the_sdk_applies_and_persists(broker_factory, tmp_path):
    data = str(tmp_path / "alter")
    b = broker_factory(data_dir=data)
    with pymq.connect(b.url) as conn:
        qm = conn.queue_manager()
        qm.create("alt", max_deliveries=5, default_priority=2, max_depth=10, overflow="reject")
        _send(b, "/queue/alt", ["waiting"])
        result = qm.alter("alt", max_deliveries=1, default_priority=7, max_depth=2, redelivery_delay_ms=5,
                          schema={"n": "int"}, delivery_timeout_ms=60000, dead_retention_ms=1000,
                          default_expiration_ms=3600000)
        assert "max_deliveries: 5 -> 1" in result["changes"]
        config = result["queue"]["config"]
        assert (config["max_deliveries"], config["default_priority"], config["max_depth"],
                config["overflow"]) == (1, 7, 2, "reject")       # what was not named kept its value
        # waiting messages keep the priority they were given; new ones get the new default
        _send(b, "/queue/alt", ["new"], n="1")
        prios = b.call(lambda: sorted(e.message.priority for e in b.broker.queues["alt"].ready))
        assert prios == [2, 7]
        # the new schema and depth apply to the next SEND
        with pytest.raises(pymq.PymqError):
            _send(b, "/queue/alt", ["no n"])
        assert qm.alter("alt", max_deliveries=1)["changes"] == []      # the same again: no change
        with pytest.raises(ConfigError):
            qm.alter("alt", max_delivries=3)
        with pytest.raises(UnknownDestination):
            qm.alter("no.such.queue", max_deliveries=3)
        assert qm.info("alt")["config"]["max_deliveries"] == 1
    b.stop()
    again = broker_factory(data_dir=data)
    with pymq.connect(again.url) as conn:
        config = conn.queue_manager().info("alt")["config"]
        assert (config["max_deliveries"], config["default_priority"], config["schema"]) == (1, 7, {"n": "int"})


def test_alter_raising_max_depth_releases_a_blocked_producer_and_max_deliveries_applies_to_waiting(broker):
    with pymq.connect(broker.url) as conn:
        qm = conn.queue_manager()
        qm.create("alt.dlq", max_deliveries=10)
        _send(broker, "/queue/alt.dlq", ["m"])
        qm.alter("alt.dlq", max_deliveries=1)
        session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(pymq.Queue("alt.dlq"))
        assert consumer.receive(5).text == "m"
        session.recover()                                 # one failed delivery is now the maximum
        consumer.close()
        assert wait_for(lambda: "DLQ.alt.dlq" in broker.call(lambda: set(broker.broker.queues)))
        assert broker.call(lambda: broker.broker.queues["DLQ.alt.dlq"].depth) == 1
        qm.create("alt.block", max_depth=1, overflow="block")
        raw = RawStomp(broker.port)
        raw.connect()
        raw.send("SEND", {"destination": "/queue/alt.block"}, b"1")
        raw.send("SEND", {"destination": "/queue/alt.block"}, b"2")
        raw.send("SEND", {"destination": "/queue/alt.block", "receipt": "r3"}, b"3")
        assert wait_for(lambda: broker.call(lambda: broker.broker.queues["alt.block"].depth) == 1)
        with pytest.raises(TimeoutError):
            raw.read(0.3)                                 # the producer is paused: no receipt yet
        qm.alter("alt.block", max_depth=100)
        assert raw.read().headers.get("receipt-id") == "r3"
        assert broker.call(lambda: broker.broker.queues["alt.block"].depth) == 3
        raw.close()


def test_alter_is_refused_to_others_and_changes_nothing(broker_factory, tmp_path):
    users = tmp_path / "users.yaml"
    from pymq_server.broker.auth import hash_password
    import yaml
    users.write_text(yaml.safe_dump({"users": {
        "owner": {"password": hash_password("pw1"), "roles": []},
        "other": {"password": hash_password("pw2"), "roles": []},
        "root": {"password": hash_password("pw3"), "roles": ["admin"]}}}))
    b = broker_factory(users_file=str(users))
    with pymq.connect(b.url, username="owner", password="pw1") as conn:
        conn.queue_manager().create("owned", max_deliveries=4)
    with pymq.connect(b.url, username="other", password="pw2") as conn:
        with pytest.raises(AccessDenied):
            conn.queue_manager().alter("owned", max_deliveries=1)
    with pymq.connect(b.url, username="root", password="pw3") as conn:
        assert conn.queue_manager().info("owned")["config"]["max_deliveries"] == 4
        conn.queue_manager().alter("owned", max_deliveries=6)      # an administrator may
    with pymq.connect(b.url, username="owner", password="pw1") as conn:
        assert conn.queue_manager().alter("owned", max_deliveries=3)["queue"]["config"]["max_deliveries"] == 3


def test_alter_from_the_asyncio_sdk(broker):
    async def run() -> dict:
        async with pymq.aio.connect(broker.url) as conn:
            qm = conn.queue_manager()
            await qm.create("aio.alt", max_deliveries=3)
            return await qm.alter_queue("aio.alt", max_deliveries=8, last_value_key="k")
    result = asyncio.run(run())
    assert result["queue"]["config"]["max_deliveries"] == 8 and result["queue"]["config"]["last_value_key"] == "k"


# -- auto-delete ---------------------------------------------------------------------------------------

def test_ten_thousand_auto_created_queues_are_reclaimed_after_close_but_declared_ones_stay(broker_factory):
    b = broker_factory(auto_delete_idle_ms=1, max_subscriptions_per_connection=10_001)
    with pymq.connect(b.url) as conn:
        conn.queue_manager().create("auto.declared")
    raw = RawStomp(b.port)
    raw.connect()
    frames = b"".join(raw.encode("SUBSCRIBE", {"destination": f"/queue/auto.{i}", "id": str(i)})
                      for i in range(10_000))
    raw.send_raw(frames + raw.encode("SUBSCRIBE", {"destination": "/topic/auto.t", "id": "t"}))
    raw.send("SEND", {"destination": "/queue/auto.keep"}, b"waiting")      # not empty: stays
    raw.send("DISCONNECT", {"receipt": "bye"})
    answer = raw.read(30)
    assert answer.headers.get("receipt-id") == "bye", answer
    raw.close()
    assert b.call(lambda: len(b.broker.queues)) >= 10_000
    assert wait_for(lambda: b.call(lambda: sum(1 for n in b.broker.queues if n.startswith("auto."))) == 2,
                    timeout=60)
    assert b.call(lambda: "auto.t" not in b.broker.topics)
    assert b.call(lambda: sorted(n for n in b.broker.queues if n.startswith("auto."))) == \
        ["auto.declared", "auto.keep"]


def test_auto_delete_waits_for_idle_and_empty_and_off_keeps_everything(broker_factory):
    b = broker_factory(auto_delete_idle_ms=0)
    _send(b, "/queue/kept", ["x"])
    with pymq.connect(b.url) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue("kept"))
        assert consumer.receive(5).text == "x"
    b.call(b.broker.housekeeping)
    assert b.call(lambda: "kept" in b.broker.queues)
    # a topic with a subscriber stays; once the subscriber has gone it is reclaimed
    t = broker_factory(auto_delete_idle_ms=1)
    with pymq.connect(t.url) as conn:
        consumer = conn.create_session().create_consumer(pymq.Topic("auto.topic"))
        t.call(t.broker.housekeeping)
        assert t.call(lambda: "auto.topic" in t.broker.topics)
    assert wait_for(lambda: t.call(lambda: "auto.topic" not in t.broker.topics), timeout=30)


# -- scheduling headers are consumed at delivery ----------------------------------------------------------

def test_scheduled_delay_is_not_on_the_delivered_message_so_forwarding_does_not_delay_again(broker, stomppy):
    sender, _ = stomppy()
    sender.send("/queue/sched.in", "later", headers={"AMQ_SCHEDULED_DELAY": "50"})
    sender.send("/queue/sched.in", "at", headers={"AMQ_SCHEDULED_TIME": "1"})
    reader, got = stomppy()
    reader.subscribe("/queue/sched.in", id="s", ack="auto")
    frames = [got.next() for _ in range(2)]
    for frame in frames:
        assert not {"AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_TIME"} & set(frame.headers)
    with pymq.connect(broker.url) as conn:
        session = conn.create_session()
        producer = session.create_producer(pymq.Queue("sched.out"))
        consumer = session.create_consumer(pymq.Queue("sched.in2"))
        session.create_producer(pymq.Queue("sched.in2")).send("delayed", delivery_delay=50)
        message = consumer.receive(5)
        assert message.get_property("AMQ_SCHEDULED_DELAY") is None
        producer.send(message)                              # forwarded as it came
        assert broker.call(lambda: broker.broker.queues["sched.out"].scheduled) == 0


def test_last_value_replacement_is_not_refused_by_a_full_queue_and_hostile_alters_change_nothing(broker):
    with pymq.connect(broker.url) as conn:
        qm = conn.queue_manager()
        qm.create("lvq.full", last_value_key="k", max_depth=2, overflow="reject")
        _send(broker, "/queue/lvq.full", ["a1"], k="a")
        _send(broker, "/queue/lvq.full", ["b1"], k="b")
        _send(broker, "/queue/lvq.full", ["a2"], k="a")        # full, but it replaces a1: taken
        with pytest.raises(pymq.PymqError) as refused:
            _send(broker, "/queue/lvq.full", ["c1"], k="c")    # a new key in a full queue: refused
        assert refused.value.code == "queue-full"
        assert broker.call(lambda: sorted(e.message.body for e in broker.broker.queues["lvq.full"].ready)) == \
            [b"a2", b"b1"]
        before = qm.info("lvq.full")["config"]
        for hostile in ({"max_depth": 10 ** 30}, {"max_deliveries": -1}, {"overflow": "explode"},
                        {"default_priority": 10}, {"schema": {"n": {"type": "complex"}}}, {"no_such": 1},
                        {"last_value_key": ""}, {"exclusive": "maybe"}):
            with pytest.raises(ConfigError):
                qm.alter("lvq.full", **hostile)
        with pytest.raises(ConfigError):
            qm.call("alter-queue", name="lvq.full", config=[1, 2])
        assert qm.info("lvq.full")["config"] == before
        # the key changed: waiting messages are indexed by the new key, only the newest per value stays
        _send(broker, "/queue/lvq.rekey", ["x1", "x2", "y1"], sym="same")
        qm.create("lvq.rekey")
        result = qm.alter("lvq.rekey", last_value_key="sym")
        assert result["queue"]["metrics"]["depth"] == 1 and result["queue"]["metrics"]["replaced"] == 2
        assert broker.call(lambda: [e.message.body for e in broker.broker.queues["lvq.rekey"].ready]) == [b"y1"]


def test_alter_cannot_point_dead_letters_into_another_users_queue(broker_factory, tmp_path):
    users = tmp_path / "users.yaml"
    from pymq_server.broker.auth import hash_password
    import yaml
    users.write_text(yaml.safe_dump({"users": {
        "alice": {"password": hash_password("pw1"), "roles": []},
        "bob": {"password": hash_password("pw2"), "roles": []}}}))
    b = broker_factory(users_file=str(users))
    with pymq.connect(b.url, username="bob", password="pw2") as conn:
        conn.queue_manager().create("X.mine")                 # bob's queue
    with pymq.connect(b.url, username="alice", password="pw1") as conn:
        qm = conn.queue_manager()
        qm.create("mine", max_deliveries=1)
        with pytest.raises(pymq.PymqError) as refused:      # its dead letters would land in bob's queue
            qm.alter("mine", dead_letter_prefix="X.")
        assert refused.value.code == "destination-exists"
        assert qm.info("mine")["config"]["dead_letter_prefix"] == "DLQ."
        assert qm.alter("mine", dead_letter_prefix="ALICE.")["changes"] == ["dead_letter_prefix: 'DLQ.' -> 'ALICE.'"]
