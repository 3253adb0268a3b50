"""Producer and consumer on different workers reach each other, in order, with receipts and acks
that go to the destination's owner (spec/cores.md §3)."""
from __future__ import annotations

import pytest

from tests.cores.conftest import owned_by


def _drain_messages(c, n, timeout=10.0):
    got = []
    for _ in range(n):
        f = c.read(timeout)
        assert f.command == "MESSAGE", f
        got.append(f)
    return got


@pytest.mark.parametrize("owner", [0, 1])
@pytest.mark.parametrize("producer_home,consumer_home", [(0, 1), (1, 0), (0, 0), (1, 1)])
def test_send_and_receive_whatever_the_homes(broker, owner, producer_home, consumer_home):
    dest = owned_by(owner)[0]
    consumer = broker.connect(consumer_home)
    consumer.send("SUBSCRIBE", {"destination": dest, "id": "s1", "ack": "client-individual", "receipt": "sub"})
    r = consumer.read()
    assert r.command == "RECEIPT" and r.headers["receipt-id"] == "sub", r
    producer = broker.connect(producer_home)
    for i in range(50):
        producer.send("SEND", {"destination": dest, "seq": str(i)}, f"m{i}".encode())
    producer.send("SEND", {"destination": dest, "seq": "50", "receipt": "r50"}, b"m50")
    r = producer.read()
    assert r.command == "RECEIPT" and r.headers["receipt-id"] == "r50" and r.headers["message-id"], r
    msgs = _drain_messages(consumer, 51)
    assert [m.headers["seq"] for m in msgs] == [str(i) for i in range(51)]     # order per destination
    assert all(m.headers["message-id"].startswith(f"ID:pymq.w{owner}-") for m in msgs)
    for m in msgs:
        consumer.send("ACK", {"id": m.headers["ack"]})
    consumer.send("DISCONNECT", {"receipt": "bye"})
    r = consumer.read()
    assert r.command == "RECEIPT" and r.headers["receipt-id"] == "bye", r


def _receipt(c, rid, timeout=10.0):
    f = c.read(timeout)
    assert f.command == "RECEIPT" and f.headers["receipt-id"] == rid, f
    return f


def test_ack_at_a_remote_owner_completes_and_unacked_come_back(broker):
    dest = owned_by(1)[0]
    local = owned_by(0)[0]
    producer = broker.connect(0)
    # both connections span workers: each holds a subscription at its home (worker 0) first, so neither is
    # handed over to worker 1 (spec/cores.md §2.4): their frames and the MESSAGEs are forwarded
    producer.send("SUBSCRIBE", {"destination": local, "id": "held", "receipt": "held"})
    _receipt(producer, "held")
    for i in range(10):
        producer.send("SEND", {"destination": dest, "seq": str(i)}, b"x")
    producer.send("SEND", {"destination": dest, "seq": "end", "receipt": "p"}, b"x")
    _receipt(producer, "p")
    consumer = broker.connect(0)          # home 0, owner 1: the ACKs cross
    consumer.send("SUBSCRIBE", {"destination": local, "id": "held", "receipt": "held"})
    _receipt(consumer, "held")
    consumer.send("SUBSCRIBE", {"destination": dest, "id": "s", "ack": "client-individual"})
    msgs = _drain_messages(consumer, 11)
    assert all(m.headers["ack"].startswith("w1.") for m in msgs)   # the token names the owner
    for m in msgs[:6]:
        consumer.send("ACK", {"id": m.headers["ack"]})
    consumer.send("NACK", {"id": msgs[6].headers["ack"], "receipt": "acked"})
    _receipt(consumer, "acked")
    consumer.send("DISCONNECT", {"receipt": "bye"})
    for _ in range(20):                   # the NACKed one may be redelivered here first: never acked
        f = consumer.read()
        if f.command == "RECEIPT":
            assert f.headers["receipt-id"] == "bye"
            break
        assert f.command == "MESSAGE" and f.headers["seq"] == "6", f
    again = broker.connect(1)
    again.send("SUBSCRIBE", {"destination": dest, "id": "s", "ack": "auto"})
    back = _drain_messages(again, 5)
    assert [m.headers["seq"] for m in back] == ["6", "7", "8", "9", "end"]
    with pytest.raises(TimeoutError):
        again.read(0.5)


def test_an_unknown_ack_token_at_a_remote_owner_is_the_same_error(broker):
    c = broker.connect(0)
    c.send("ACK", {"id": "w1.999", "receipt": "a"})
    f = c.read()
    assert f.command == "ERROR" and f.headers.get("receipt-id") == "a", f
    assert "unknown or already acknowledged" in f.headers["message"]


def test_a_receipt_covers_frames_sent_to_other_owners_before_it(broker):
    """SEND to w1's queue (no receipt), then SEND to w0's queue with a receipt: the RECEIPT comes after
    both owners have the data; a consumer of w1's queue connected afterwards finds it at once."""
    far, near = owned_by(1)[0], owned_by(0)[0]
    p = broker.connect(0)
    for i in range(200):
        p.send("SEND", {"destination": far, "persistent": "true", "seq": str(i)}, b"far")
    p.send("SEND", {"destination": near, "persistent": "true", "receipt": "both"}, b"near")
    _receipt(p, "both")
    c = broker.connect(1)
    c.send("SUBSCRIBE", {"destination": far, "id": "s"})
    got = _drain_messages(c, 200)
    assert [m.headers["seq"] for m in got] == [str(i) for i in range(200)]


def test_subscription_ids_are_one_namespace_across_owners(broker):
    c = broker.connect(0)
    c.send("SUBSCRIBE", {"destination": owned_by(1)[0], "id": "same"})
    c.send("SUBSCRIBE", {"destination": owned_by(0)[0], "id": "same", "receipt": "r"})
    f = c.read()
    assert f.command == "ERROR" and "already in use" in f.headers["message"], f


def test_reply_to_a_temporary_queue_crosses_workers(broker):
    requester = broker.connect(0)
    service_queue = owned_by(1)[0]
    requester.send("SUBSCRIBE", {"destination": "/temp-queue/replies", "id": "r"})
    requester.send("SEND", {"destination": service_queue, "reply-to": "/temp-queue/replies", "receipt": "q"},
                   b"ping")
    _receipt(requester, "q")
    service = broker.connect(1)
    service.send("SUBSCRIBE", {"destination": service_queue, "id": "s"})
    req = service.read()
    assert req.command == "MESSAGE", req
    reply_to = req.headers["reply-to"]
    assert reply_to.startswith("/temp-queue/tmp.w0"), reply_to     # global name naming its home
    service.send("SEND", {"destination": reply_to, "receipt": "a"}, b"pong")
    _receipt(service, "a")
    ans = requester.read()
    assert ans.command == "MESSAGE" and ans.body == b"pong", ans


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_older_versions_acknowledge_by_message_id_at_the_owner(broker, version):
    dest = owned_by(1, prefix="/queue/old.")[0]
    p = broker.connect(1, version=version)
    for i in range(3):
        p.send("SEND", {"destination": dest, "seq": str(i)}, b"x")
    p.send("SEND", {"destination": dest, "seq": "3", "receipt": "p"}, b"x")
    _receipt(p, "p")
    c = broker.connect(0, version=version)
    sub = {"destination": dest, "ack": "client"}
    if version == "1.1":
        sub["id"] = "s"
    c.send("SUBSCRIBE", sub)
    msgs = _drain_messages(c, 4)
    ack = {"message-id": msgs[1].headers["message-id"], "receipt": "a"}      # client mode: 0 and 1
    if version == "1.1":
        ack["subscription"] = "s"
    c.send("ACK", ack)
    _receipt(c, "a")
    c.send("DISCONNECT", {"receipt": "bye"})
    _receipt(c, "bye")
    again = broker.connect(0, version=version)
    again.send("SUBSCRIBE", {"destination": dest, "id": "s2"})
    assert [m.headers["seq"] for m in _drain_messages(again, 2)] == ["2", "3"]
    with pytest.raises(TimeoutError):
        again.read(0.5)


def test_browsing_a_queue_of_another_worker(broker):
    dest = owned_by(1, prefix="/queue/browse.")[0]
    p = broker.connect(1)
    for i in range(3):
        p.send("SEND", {"destination": dest, "seq": str(i)}, b"x")
    p.send("SEND", {"destination": dest, "seq": "3", "receipt": "p"}, b"x")
    _receipt(p, "p")
    c = broker.connect(0)
    c.send("SUBSCRIBE", {"destination": dest, "id": "b", "browser": "true"})
    frames = [c.read() for _ in range(5)]
    assert [f.headers.get("seq") for f in frames[:4]] == ["0", "1", "2", "3"]
    assert all(f.headers.get("browser") == "true" for f in frames[:4])
    assert frames[4].headers.get("browser") == "end", frames[4]
    c.send("UNSUBSCRIBE", {"id": "b", "receipt": "u"})
    _receipt(c, "u")
    c.send("SUBSCRIBE", {"destination": dest, "id": "s"})       # browsing took nothing
    assert len(_drain_messages(c, 4)) == 4
