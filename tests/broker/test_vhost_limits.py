"""Per-vhost limits (spec/stomp.md §1 "Limits"): a vhost's max_connections, max_queues and max_memory hold,
a refusal is a resource-limit ERROR naming the setting and leaves nothing behind, and another vhost and the
default '/' are unaffected."""
from __future__ import annotations

import pymq
import pytest
import stomp
from pymq.errors import ResourceLimit

from tests.conftest import RawStomp, wait_for
from tests.stomp_py_client import Collector

SHOP = {"principals": ["*"], "max_connections": 2, "max_queues": 2, "max_memory": 64 * 1024}
VHOSTS = {"shop": SHOP, "books": ["*"]}
BODY = b"x" * 16_000          # 16,768 bytes of message memory each: three fit in 64 KiB, a fourth does not


def _raw(b, vhost: str | None, **headers) -> tuple[RawStomp, object]:
    c = RawStomp(b.port)
    if vhost is not None:
        headers["host"] = vhost
    return c, c.connect(**headers)


def _send(c: RawStomp, destination: str, body: bytes = b"m", **headers):
    c.send("SEND", {"destination": destination, "receipt": "r", **headers}, body)
    return c.read()


def _refused(frame, limit: str) -> None:
    assert frame.command == "ERROR", frame
    assert frame.headers["pymq-code"] == "resource-limit", frame.headers
    assert frame.headers["pymq-field-limit"] == limit and frame.headers["pymq-field-vhost"] == "shop", frame.headers


def _queues(b) -> set[str]:
    return b.call(lambda: set(b.broker.queues))


def test_connections_per_vhost_hold_and_a_refused_connect_claims_nothing(broker_factory):
    b = broker_factory(vhosts=VHOSTS)
    held = [_raw(b, "/shop") for _ in range(2)]
    assert all(frame.command == "CONNECTED" for _, frame in held)
    sessions = b.call(lambda: len(b.broker.sessions))
    c, frame = _raw(b, "/shop", **{"client-id": "app"})
    _refused(frame, "max_connections")
    assert c.is_closed()
    assert wait_for(lambda: b.call(lambda: len(b.broker.sessions)) == sessions)      # its session went
    # another vhost and the default take connections as before
    assert _raw(b, "/books")[1].command == "CONNECTED" and _raw(b, None)[1].command == "CONNECTED"
    # the refused client id was not claimed: once a shop connection leaves, it connects with that id
    held[0][0].send("DISCONNECT", {"receipt": "bye"})
    assert held[0][0].read().command == "RECEIPT"
    held[0][0].close()
    kept: list = []      # (a RawStomp dropped is a socket closed: the broker would count one less)
    assert wait_for(lambda: kept.append(_raw(b, "/shop", **{"client-id": "app"})) or
                    kept[-1][1].command == "CONNECTED", timeout=5)
    # an outside client is refused the same way
    third = stomp.Connection12([("127.0.0.1", b.port)], heartbeats=(0, 0), vhost="/shop")
    third.set_listener("c", Collector())
    with pytest.raises(stomp.exception.ConnectFailedException):
        third.connect("guest", "guest", wait=True)


def test_queues_per_vhost_hold_and_a_refusal_makes_no_queue(broker_factory):
    b = broker_factory(vhosts=VHOSTS)
    c = _raw(b, "/shop")[0]
    assert _send(c, "/queue/a").command == "RECEIPT"
    assert _send(c, "/queue/b").command == "RECEIPT"
    before = _queues(b)
    _refused(_send(c, "/queue/c"), "max_queues")             # a SEND that would make a third
    c = _raw(b, "/shop")[0]
    c.send("SUBSCRIBE", {"destination": "/queue/d", "id": "1", "receipt": "s"})
    _refused(c.read(), "max_queues")                           # a SUBSCRIBE that would
    c = _raw(b, "/shop")[0]
    c.send("BEGIN", {"transaction": "t"})
    c.send("SEND", {"destination": "/queue/e", "transaction": "t"}, b"in t")
    c.send("COMMIT", {"transaction": "t", "receipt": "c"})
    _refused(c.read(), "max_queues")                           # a COMMIT that would
    with pymq.connect(b.url) as admin:                         # guest is an administrator on a test broker
        with pytest.raises(ResourceLimit, match="max_queues"):
            admin.queue_manager().create("$vh.shop.f")
    assert _queues(b) == before
    assert b.call(lambda: (b.broker.queues["$vh.shop.a"].depth, b.broker.queues["$vh.shop.b"].depth)) == (1, 1)
    # the existing ones still take messages; other vhosts make as many as they like
    c = _raw(b, "/shop")[0]
    assert _send(c, "/queue/a").command == "RECEIPT"
    books, default = _raw(b, "/books")[0], _raw(b, None)[0]
    for name in ("a", "b", "c", "d"):
        assert _send(books, "/queue/" + name).command == "RECEIPT"
        assert _send(default, "/queue/" + name).command == "RECEIPT"
    assert {"$vh.books.c", "$vh.books.d", "c", "d"} <= _queues(b)
    assert not {"$vh.shop.c", "$vh.shop.d", "$vh.shop.e", "$vh.shop.f"} & _queues(b)


def test_the_brokers_own_queues_are_made_at_the_limit_so_no_dead_letter_is_lost(broker_factory):
    b = broker_factory(vhosts=VHOSTS, queue_defaults={"max_deliveries": 1})
    c = _raw(b, "/shop")[0]
    assert _send(c, "/queue/a", b"dies").command == "RECEIPT"
    assert _send(c, "/queue/b").command == "RECEIPT"                # the vhost's 2 queues: at its max_queues
    c.send("SUBSCRIBE", {"destination": "/queue/a", "id": "1", "ack": "client-individual"})
    frame = c.read()
    c.send("NACK", {"id": frame.headers["ack"], "receipt": "n"})
    assert c.read().command == "RECEIPT"
    assert wait_for(lambda: "$vh.shop.DLQ.a" in _queues(b))
    assert b.call(lambda: b.broker.queues["$vh.shop.DLQ.a"].depth) == 1      # a third queue, by the broker


def test_memory_per_vhost_holds_a_refusal_places_nothing_and_consuming_makes_room(broker_factory):
    b = broker_factory(vhosts=VHOSTS)
    c = _raw(b, "/shop")[0]
    for _ in range(3):
        assert _send(c, "/queue/a", BODY).command == "RECEIPT"
    held = b.call(lambda: b.broker.flow.vhost_memory["shop"])
    assert held == 3 * (len(BODY) + 768)
    _refused(_send(c, "/queue/a", BODY), "max_memory")
    c = _raw(b, "/shop")[0]
    frame = _send(c, "/queue/b", BODY)                         # a queue the SEND would make: not made
    _refused(frame, "max_memory")
    assert "$vh.shop.b" not in _queues(b)
    assert b.call(lambda: (b.broker.queues["$vh.shop.a"].depth, b.broker.flow.vhost_memory["shop"])) == (3, held)
    # another vhost and the default are unaffected
    books, default = _raw(b, "/books")[0], _raw(b, None)[0]
    for _ in range(4):
        assert _send(books, "/queue/a", BODY).command == "RECEIPT"
        assert _send(default, "/queue/a", BODY).command == "RECEIPT"
    # consuming gives the room back, to the byte
    with pymq.connect(b.url, vhost="shop") as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue("a"))
        assert [len(consumer.receive(5).body) for _ in range(3)] == [len(BODY)] * 3
    assert wait_for(lambda: b.call(lambda: b.broker.flow.vhost_memory["shop"]) == 0)
    c = _raw(b, "/shop")[0]
    assert _send(c, "/queue/a", BODY).command == "RECEIPT"


def test_vhost_limits_are_checked_in_the_configuration():
    from pymq.errors import ConfigError
    from pymq_server.config import BrokerConfig
    for bad in ({"principals": ["*"], "max_queues": 0}, {"principals": ["bob"]}, {"max_memory": "lots"},
                {"principals": ["*"], "max_conections": 3}):
        with pytest.raises((ConfigError, ValueError)):
            BrokerConfig.from_dict({"vhosts": {"shop": bad}})
    with pytest.raises(ConfigError, match="workers > 1"):          # a worker would count only its own
        BrokerConfig.from_dict({"workers": 2, "vhosts": {"shop": {"principals": ["*"], "max_queues": 5}}})
    config = BrokerConfig.from_dict({"vhosts": {"shop": {"principals": ["*"], "max_memory": "1MiB"}, "b": ["*"]}})
    assert config.vhosts["shop"].max_memory == 1 << 20 and config.vhosts["b"].principals == ["*"]
