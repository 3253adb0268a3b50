"""Queues that applications create and manage (seed 001): config, schema, overflow, timeouts, metrics."""
from __future__ import annotations

import time
import uuid

import pytest

import pymq
from pymq.errors import AccessDenied, DestinationExists, QueueFull, SchemaViolation, ConfigError
from tests.conftest import RawStomp, wait_for


def _q():
    return f"app-{uuid.uuid4().hex[:8]}"


def test_create_same_config_noop_different_config_error(broker):
    with pymq.connect(broker.url) as conn:
        qm = conn.queue_manager()
        name = _q()
        qm.create(name, max_deliveries=3, default_priority=6)
        qm.create(name, max_deliveries=3, default_priority=6)          # no-op
        with pytest.raises(DestinationExists) as info:
            qm.create(name, max_deliveries=5, default_priority=6)
        assert "max_deliveries: 3 != 5" in str(info.value)
        with pytest.raises(ConfigError, match="unknown queue"):
            qm.create(_q(), max_deliverys=3)
        with pytest.raises(ConfigError, match="overflow"):
            qm.create(_q(), max_depth=5, overflow="explode")
        info = qm.info(name)
        assert info["config"]["max_deliveries"] == 3 and info["declared"]
        assert any(q["name"] == name for q in qm.list())


def test_config_survives_restart(broker_factory, tmp_path):
    data = str(tmp_path / "d")
    b1 = broker_factory(data_dir=data)
    name = _q()
    with pymq.connect(b1.url) as conn:
        conn.queue_manager().create(name, max_deliveries=2, delivery_timeout_ms=5000)
    b1.stop()
    b2 = broker_factory(data_dir=data)
    with pymq.connect(b2.url) as conn:
        cfg = conn.queue_manager().info(name)["config"]
        assert cfg["max_deliveries"] == 2 and cfg["delivery_timeout_ms"] == 5000
        conn.queue_manager().create(name, max_deliveries=2, delivery_timeout_ms=5000)   # still a no-op


def test_per_queue_max_deliveries_and_dead_retention(broker):
    with pymq.connect(broker.url) as conn:
        name = _q()
        conn.queue_manager().create(name, max_deliveries=2, dead_retention_ms=1500)
        s = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        s.create_producer(pymq.Queue(name)).send("poison")
        c = s.create_consumer(pymq.Queue(name))
        for _ in range(2):
            assert c.receive(5).text == "poison"
            s.recover()
        dead_by = time.time() + 0.001            # it was dead-lettered before the last recover() returned
        assert c.receive(0.3) is None
        dlq = s.create_browser(pymq.Queue("DLQ." + name))
        assert [m.text for m in dlq] == ["poison"]
        assert wait_for(lambda: time.time() > dead_by + 1.5, timeout=10)     # its retention has passed
        broker.call(broker.broker.housekeeping)
        assert list(dlq) == []                       # purged after its retention


def test_dead_letter_off_drops(broker):
    with pymq.connect(broker.url) as conn:
        name = _q()
        conn.queue_manager().create(name, max_deliveries=1, dead_letter=False)
        s = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        s.create_producer(pymq.Queue(name)).send("x")
        c = s.create_consumer(pymq.Queue(name))
        assert c.receive(5) is not None
        s.recover()
        assert c.receive(0.3) is None
        assert conn.queue_manager().metrics(name)["failed"] == 1
        assert not any(q["name"] == "DLQ." + name for q in conn.queue_manager().list())


def test_queue_defaults_priority_and_expiration(broker):
    with pymq.connect(broker.url) as conn:
        name = _q()
        conn.queue_manager().create(name, default_priority=8, default_expiration_ms=200)
        s = conn.create_session()
        p = s.create_producer(pymq.Queue(name))
        p.send("defaulted")                                   # gets priority 8 and a 200 ms TTL
        p.send("explicit", priority=2, time_to_live=60_000)    # keeps what the producer set
        waiting = {m.text: m for m in s.create_browser(pymq.Queue(name))}
        assert waiting["defaulted"].priority == 8 and waiting["defaulted"].expiration > 0
        assert waiting["explicit"].priority == 2
        expires = waiting["defaulted"].expiration
        assert wait_for(lambda: time.time() * 1000 > expires, timeout=10)   # "defaulted" is past its time
        c = s.create_consumer(pymq.Queue(name))
        assert c.receive(5).text == "explicit"
        assert c.receive(0.3) is None                          # "defaulted" expired unseen


def test_delivery_timeout_returns_message(broker):
    with pymq.connect(broker.url) as conn:
        name = _q()
        conn.queue_manager().create(name, delivery_timeout_ms=200)
        s = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        s.create_producer(pymq.Queue(name)).send("slow job")
        c = s.create_consumer(pymq.Queue(name))
        first = c.receive(5)
        assert first.text == "slow job"
        received = time.monotonic()                   # the broker's clock: its deadline is before this + 0.2
        assert wait_for(lambda: time.monotonic() > received + 0.2, timeout=10)
        broker.call(broker.broker.housekeeping)      # the daemon's tick
        again = c.receive(5)                          # back to ready, redelivered
        assert again.text == "slow job" and again.redelivered and again.delivery_count == 2
        first.acknowledge()                           # a late ack of the lost delivery is harmless
        assert conn.queue_manager().metrics(name)["failed"] == 1


def test_overflow_reject(broker):
    with pymq.connect(broker.url) as conn:
        name = _q()
        conn.queue_manager().create(name, max_depth=2, overflow="reject")
        p = conn.create_session().create_producer(pymq.Queue(name))
        p.send("1")
        p.send("2")
        with pytest.raises(QueueFull, match="is full"):
            p.send("3")


def test_overflow_drop_oldest(broker):
    with pymq.connect(broker.url) as conn:
        name = _q()
        conn.queue_manager().create(name, max_depth=3, overflow="drop-oldest")
        s = conn.create_session()
        p = s.create_producer(pymq.Queue(name))
        for i in range(6):
            p.send(str(i))
        c = s.create_consumer(pymq.Queue(name))
        assert [c.receive(5).text for _ in range(3)] == ["3", "4", "5"]
        assert conn.queue_manager().metrics(name)["dropped"] == 3


def test_overflow_block_pauses_producer_until_drained(broker):
    name = _q()
    with pymq.connect(broker.url) as conn:
        conn.queue_manager().create(name, max_depth=5, overflow="block")
    p = RawStomp(broker.port)
    p.connect()
    for i in range(20):
        p.send("SEND", {"destination": f"/queue/{name}", "persistent": "false"}, str(i).encode())
    q = broker.broker.queues[name]
    assert wait_for(lambda: broker.call(lambda: q.depth) >= 5)
    # the producer's connection is paused (its frames stay unread in the socket)
    assert wait_for(lambda: broker.call(lambda: any(s._pauses for s in broker.broker.sessions.values())))
    assert broker.call(lambda: q.depth) <= 6
    c = RawStomp(broker.port)
    c.connect()
    c.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "1", "ack": "auto"})
    got = [c.read(5).body.decode() for _ in range(20)]
    assert got == [str(i) for i in range(20)]      # nothing lost, in order


def test_redelivery_delay_with_backoff(broker):
    with pymq.connect(broker.url) as conn:
        name = _q()
        conn.queue_manager().create(name, redelivery_delay_ms=150, redelivery_multiplier=2.0,
                                    max_deliveries=5)
        s = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        s.create_producer(pymq.Queue(name)).send("retry")
        c = s.create_consumer(pymq.Queue(name))
        assert c.receive(5) is not None
        s.recover()
        assert c.receive(0.05) is None             # not ready during the delay
        assert c.receive(2) is not None
        s.recover()
        assert c.receive(0.2) is None              # the second delay is longer (300 ms)
        assert c.receive(2) is not None


def test_schema(broker):
    with pymq.connect(broker.url) as conn:
        name = _q()
        conn.queue_manager().create(name, schema={"amount": {"type": "float", "required": True},
                                                  "region": "string", "rush": "bool"})
        s = conn.create_session()
        p = s.create_producer(pymq.Queue(name))
        p.send(pymq.TextMessage("ok", properties={"amount": 12.5, "region": "eu", "rush": True}))
        p.send(pymq.TextMessage("int fits float", properties={"amount": 3}))
    for props, text in ((({"region": "eu"}), "missing required property 'amount'"),
                        (({"amount": "lots"}), "property 'amount' must be float"),
                        (({"amount": 1.0, "rush": "maybe"}), "property 'rush' must be bool")):
        with pymq.connect(broker.url) as conn:
            with pytest.raises(SchemaViolation, match=text):
                conn.create_session().create_producer(pymq.Queue(name)).send(
                    pymq.TextMessage("bad", properties=props))
    # a foreign client's string values fit when they parse as the declared type
    raw = RawStomp(broker.port)
    raw.connect()
    raw.send("SEND", {"destination": f"/queue/{name}", "amount": "7.25", "receipt": "r"}, b"stomp")
    assert raw.read().command == "RECEIPT"
    with pymq.connect(broker.url) as conn:
        c = conn.create_session().create_consumer(pymq.Queue(name))
        assert [c.receive(5).text for _ in range(3)] == ["ok", "int fits float", "stomp"]


def test_nine_metrics(broker):
    with pymq.connect(broker.url) as conn:
        name = _q()
        qm = conn.queue_manager()
        qm.create(name, max_deliveries=5)
        s = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        p = s.create_producer(pymq.Queue(name))
        for i in range(4):
            p.send(str(i))
        p.send("short", time_to_live=1)
        time.sleep(0.1)     # the behaviour measured: the messages wait >= 100 ms (max_wait_s), "short" expires
        c = s.create_consumer(pymq.Queue(name), prefetch=1)
        m = c.receive(5)
        s.recover()                               # one failure
        for _ in range(4):
            m = c.receive(5)
            m.acknowledge()
        broker.call(broker.broker.housekeeping)
        metrics = qm.metrics(name)
    assert metrics["depth"] == 0
    assert metrics["peak_depth"] == 5
    assert metrics["added"] == 5
    assert metrics["removed"] == 4
    assert metrics["failed"] == 1
    assert metrics["expired"] == 1
    assert metrics["max_wait_s"] >= 0.1 and 0 < metrics["average_wait_s"] <= metrics["max_wait_s"]
    assert 0 < metrics["average_depth"] <= 5


def test_expiry_queue(broker_factory):
    broker = broker_factory(expiry_queue="Expired")
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        s.create_producer(pymq.Queue("perishable")).send("milk", time_to_live=50)
        sent = time.time() * 1000                 # it arrived before this: it expires before sent + 50
        assert wait_for(lambda: time.time() * 1000 > sent + 50, timeout=10)
        broker.call(broker.broker.housekeeping)
        m = s.create_consumer(pymq.Queue("Expired")).receive(5)
        assert m.text == "milk" and m.properties["pymq-original-destination"] == "/queue/perishable"


def test_purge_and_drop(broker):
    with pymq.connect(broker.url) as conn:
        name = _q()
        qm = conn.queue_manager()
        qm.create(name)
        s = conn.create_session()
        p = s.create_producer(pymq.Queue(name))
        for i in range(3):
            p.send(str(i))
        assert qm.purge(name) == 3
        p.send("again")
        c = s.create_consumer(pymq.Queue(name), prefetch=1)
        with pytest.raises(pymq.PymqError, match="consumer"):
            qm.drop(name)
        c.close()
        assert qm.drop(name) == 1
        assert not any(q["name"] == name for q in qm.list())
