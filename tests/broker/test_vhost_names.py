"""Names that could cross a vhost boundary (spec/stomp.md §1): a reply-to, a temporary destination's global
name, the dead-letter and expiry queues the broker makes from a queue's name, and the headers that name a
destination all stay inside the vhost they came from. Two vhosts with a queue of the same name: a reply in
vhost a never reaches vhost b's queue, nor the default vhost's."""
from __future__ import annotations

import json

import pytest
import stomp

from tests.conftest import RawStomp
from tests.stomp_py_client import Collector

VHOSTS = {"a": ["*"], "b": ["*"]}


def _raw(b, vhost: str | None) -> RawStomp:
    c = RawStomp(b.port)
    assert c.connect(**({} if vhost is None else {"host": vhost})).command == "CONNECTED"
    return c


def _depths(b, *names: str) -> list:
    return b.call(lambda: [b.broker.queues[n].depth if n in b.broker.queues else None for n in names])


def _stomp_py(b, vhost: str) -> tuple[stomp.Connection12, Collector]:
    c = stomp.Connection12([("127.0.0.1", b.port)], heartbeats=(0, 0), vhost=vhost)
    listener = Collector()
    c.set_listener("collector", listener)
    c.connect("guest", "guest", wait=True)
    return c, listener


def test_an_admin_answer_goes_to_the_reply_to_of_the_askers_vhost(broker_factory):
    b = broker_factory(vhosts=VHOSTS)
    for vhost in ("/b", None):          # vhost b and the default have a 'replies' queue too
        c = _raw(b, vhost)
        c.send("SEND", {"destination": "/queue/replies", "receipt": "r"}, b"theirs")
        assert c.read().command == "RECEIPT"
    asker = _raw(b, "/a")               # guest is an administrator on a test broker
    asker.send("SEND", {"destination": "/pymq/admin", "pymq-admin-op": "status", "reply-to": "/queue/replies",
                        "correlation-id": "q1", "receipt": "asked"}, b"{}")
    assert asker.read().command == "RECEIPT"
    assert _depths(b, "$vh.a.replies", "$vh.b.replies", "replies") == [1, 1, 1]
    asker.send("SUBSCRIBE", {"destination": "/queue/replies", "id": "1"})
    answer = asker.read()
    assert answer.headers["destination"] == "/queue/replies" and answer.headers["correlation-id"] == "q1"
    assert json.loads(answer.body)["ok"] is True


def test_a_reply_to_naming_another_vhosts_queue_is_refused(broker_factory):
    b = broker_factory(vhosts=VHOSTS)
    asker = _raw(b, None)
    asker.send("SEND", {"destination": "/pymq/admin", "pymq-admin-op": "status",
                        "reply-to": "/queue/$vh.b.replies", "receipt": "asked"}, b"{}")
    frame = asker.read()
    assert frame.command == "ERROR" and frame.headers["pymq-code"] == "invalid-destination", frame
    assert _depths(b, "$vh.b.replies") == [None]


def test_a_temporary_queues_global_name_is_reached_only_from_its_vhost(broker_factory):
    b = broker_factory(vhosts=VHOSTS)
    # a requester in vhost b (stomp.py) asks with its own temporary queue as reply-to
    requester, heard = _stomp_py(b, "/b")
    requester.subscribe("/temp-queue/reply", id="r", headers={"receipt": "sub"})
    assert heard.receipts.get(timeout=5) == "sub"
    requester.send("/queue/work", "ask", headers={"reply-to": "/temp-queue/reply"})
    responder = _raw(b, "/b")
    responder.send("SUBSCRIBE", {"destination": "/queue/work", "id": "w"})
    global_name = responder.read().headers["reply-to"]
    assert global_name.startswith("/temp-queue/tmp."), global_name
    # from vhost a (and from the default vhost) that name is unknown, and nothing reaches the requester
    for vhost in ("/a", None):
        other = _raw(b, vhost)
        other.send("SEND", {"destination": global_name, "receipt": "x"}, b"from elsewhere")
        frame = other.read()
        assert frame.command == "ERROR" and frame.headers["pymq-code"] == "unknown-destination", frame
    # from its own vhost the reply arrives
    responder.send("SEND", {"destination": global_name, "receipt": "y"}, b"the reply")
    assert responder.read().command == "RECEIPT"
    frame = heard.next()
    assert frame.body == "the reply"
    assert heard.none(0.3)
    requester.disconnect()


def test_dead_letters_and_expired_messages_stay_in_their_vhost(broker_factory):
    b = broker_factory(vhosts=VHOSTS, queue_defaults={"max_deliveries": 1}, expiry_queue="expired")
    c = _raw(b, "/a")
    c.send("SEND", {"destination": "/queue/work", "receipt": "r"}, b"fails")
    assert c.read().command == "RECEIPT"
    c.send("SEND", {"destination": "/queue/work", "expires": "1", "receipt": "r2"}, b"expires")
    assert c.read().command == "RECEIPT"
    c.send("SUBSCRIBE", {"destination": "/queue/work", "id": "w", "ack": "client-individual"})
    frame = c.read()
    assert frame.body == b"fails"
    c.send("NACK", {"id": frame.headers["ack"], "receipt": "n"})
    assert c.read().command == "RECEIPT"
    dead = _raw(b, "/a")
    dead.send("SUBSCRIBE", {"destination": "/queue/DLQ.work", "id": "d", "ack": "client-individual"})
    frame = dead.read()
    assert frame.body == b"fails" and frame.headers["destination"] == "/queue/DLQ.work"
    assert frame.headers["pymq-original-destination"] == "/queue/work"       # as vhost a names it
    queues = b.call(lambda: set(b.broker.queues))
    assert "$vh.a.DLQ.work" in queues and not any(n.startswith("DLQ.") for n in queues)
    assert "$vh.a.expired" in queues and "expired" not in queues
    # an administrator's retry sends it back to vhost a's queue (the header read inside the DLQ's vhost)
    dead.close()                                  # unacknowledged: back in the dead-letter queue
    admin = _raw(b, None)
    admin.send("SEND", {"destination": "/pymq/admin", "pymq-admin-op": "retry-dead-letters",
                        "reply-to": "/queue/answers", "receipt": "asked"},
               json.dumps({"name": "$vh.a.DLQ.work"}).encode())
    assert admin.read().command == "RECEIPT"
    admin.send("SUBSCRIBE", {"destination": "/queue/answers", "id": "1"})
    answer = json.loads(admin.read().body)
    assert answer["ok"] is True and answer["result"]["moved"] == 1, answer
    assert _depths(b, "$vh.a.work", "work") == [1, None]
    # the default vhost cannot read vhost a's dead letters by the name they had before
    spy = _raw(b, None)
    spy.send("SUBSCRIBE", {"destination": "/queue/DLQ.$vh.a.work", "id": "s"})
    with pytest.raises(TimeoutError):
        spy.read(0.5)


def test_a_durable_subscriptions_dead_letters_stay_in_its_vhost(broker_factory):
    b = broker_factory(vhosts=VHOSTS, queue_defaults={"max_deliveries": 1})
    c = RawStomp(b.port)
    assert c.connect(host="/a", **{"client-id": "app"}).command == "CONNECTED"
    c.send("SUBSCRIBE", {"destination": "/topic/news", "id": "d", "durable-subscription-name": "feed",
                         "ack": "client-individual", "receipt": "s"})
    assert c.read().command == "RECEIPT"
    publisher = _raw(b, "/a")
    publisher.send("SEND", {"destination": "/topic/news", "receipt": "p"}, b"dies")
    assert publisher.read().command == "RECEIPT"
    frame = c.read()
    c.send("NACK", {"id": frame.headers["ack"], "receipt": "n"})
    assert c.read().command == "RECEIPT"
    reader = _raw(b, "/a")
    reader.send("SUBSCRIBE", {"destination": "/queue/DLQ.sub.app.feed", "id": "r"})
    dead = reader.read()
    assert dead.body == b"dies" and dead.headers["pymq-original-destination"] == "/topic/news"
    queues = b.call(lambda: set(b.broker.queues))
    assert "$vh.a.DLQ.sub.app.feed" in queues and not any(n.startswith("DLQ.") for n in queues)
