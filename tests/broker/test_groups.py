"""Message groups inside one queue: one consumer per group, in order; hand-over flagged; no group limit."""
from __future__ import annotations

import uuid

import pymq
from tests.conftest import RawStomp


def _drain(client, timeout=0.5):
    out = []
    while True:
        try:
            out.append(client.read(timeout))
        except TimeoutError:
            return out


def test_each_group_sticks_to_one_consumer_in_order(broker):
    name = f"/queue/g-{uuid.uuid4().hex[:6]}"
    consumers = []
    for i in range(3):
        c = RawStomp(broker.port)
        c.connect()
        c.send("SUBSCRIBE", {"destination": name, "id": "s", "ack": "client-individual",
                             "prefetch-count": "1000", "receipt": "r"})
        assert c.read().command == "RECEIPT"
        consumers.append(c)
    p = RawStomp(broker.port)
    p.connect()
    groups = [f"g{i}" for i in range(30)]
    for n in range(10):
        for g in groups:
            p.send("SEND", {"destination": name, "JMSXGroupID": g, "JMSXGroupSeq": str(n + 1)},
                   f"{g}:{n}".encode())
    owner, seen = {}, {g: [] for g in groups}
    firsts = {}
    for idx, c in enumerate(consumers):
        for f in _drain(c):
            g = f.headers["JMSXGroupID"]
            assert owner.setdefault(g, idx) == idx, f"group {g} went to two consumers"
            seen[g].append(int(f.headers["JMSXGroupSeq"]))
            if f.headers.get("JMSXGroupFirstForConsumer") == "true":
                firsts[g] = firsts.get(g, 0) + 1
    assert all(seq == list(range(1, 11)) for seq in seen.values())
    assert firsts == {g: 1 for g in groups}          # only the first message of each group is flagged
    assert len(set(owner.values())) == 3             # the groups are spread over the consumers


def test_group_moves_when_its_consumer_closes(broker):
    name = f"g-{uuid.uuid4().hex[:6]}"
    with pymq.connect(broker.url) as conn:
        s1 = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        c1 = s1.create_consumer(pymq.Queue(name), prefetch=1)
        p = conn.create_session().create_producer(pymq.Queue(name))
        for n in range(4):
            m = pymq.TextMessage(str(n))
            m.group_id = "order-7"
            p.send(m)
        first = c1.receive(5)
        assert first.text == "0" and first.properties.get("JMSXGroupFirstForConsumer") == "true"
        first.acknowledge()
        second = c1.receive(5)
        assert second.text == "1" and "JMSXGroupFirstForConsumer" not in second.properties
        c1.close()                                   # "1" was not acknowledged: it comes back
        s2 = conn.create_session()
        c2 = s2.create_consumer(pymq.Queue(name))
        moved = [c2.receive(5) for _ in range(3)]
        assert [m.text for m in moved] == ["1", "2", "3"]
        assert moved[0].properties.get("JMSXGroupFirstForConsumer") == "true" and moved[0].redelivered


def test_many_groups_keep_order(broker):
    """Far more groups than ActiveMQ's 1024 default: ordering holds for every one."""
    name = f"/queue/many-{uuid.uuid4().hex[:6]}"
    a, b, p = RawStomp(broker.port), RawStomp(broker.port), RawStomp(broker.port)
    for c in (a, b, p):
        c.connect()
    for c in (a, b):
        c.send("SUBSCRIBE", {"destination": name, "id": "s", "ack": "auto", "receipt": "r"})
        assert c.read().command == "RECEIPT"
    n_groups = 3000
    for rnd in range(2):
        for g in range(n_groups):
            p.send("SEND", {"destination": name, "JMSXGroupID": f"G{g}", "persistent": "false"},
                   f"{g}:{rnd}".encode())
    p.send("SEND", {"destination": name, "receipt": "done", "persistent": "false", "JMSXGroupID": "end"}, b"x")
    got = {}
    owners = {}
    for idx, c in enumerate((a, b)):
        for f in _drain(c, 1.0):
            g = f.headers["JMSXGroupID"]
            assert owners.setdefault(g, idx) == idx
            got.setdefault(g, []).append(f.body)
    assert all(got[f"G{g}"] == [f"{g}:0".encode(), f"{g}:1".encode()] for g in range(n_groups))
