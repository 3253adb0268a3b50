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
