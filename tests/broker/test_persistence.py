"""Persistent messages survive a broker restart; non-persistent ones do not; numbering never goes back."""
from __future__ import annotations

import pytest

import pymq
from tests.conftest import RawStomp


def _drain(client: RawStomp, timeout=0.5):
    out = []
    while True:
        try:
            out.append(client.read(timeout))
        except TimeoutError:
            return out


def test_restart_keeps_persistent_messages_only(broker_factory, tmp_path):
    data = str(tmp_path / "d")
    b1 = broker_factory(data_dir=data)
    p = RawStomp(b1.port)
    p.connect()
    for i in range(5):
        p.send("SEND", {"destination": "/queue/keep", "receipt": f"r{i}"}, f"p{i}".encode())
        p.send("SEND", {"destination": "/queue/keep", "persistent": "false"}, f"n{i}".encode())
    for _ in range(5):
        assert p.read().command == "RECEIPT"
    c = RawStomp(b1.port)
    c.connect()
    c.send("SUBSCRIBE", {"destination": "/queue/keep", "id": "1", "ack": "client-individual",
                         "prefetch-count": "2"})
    first = c.read()
    assert first.body == b"p0"
    c.send("ACK", {"id": first.headers["ack"], "receipt": "a"})
    while c.read().command != "RECEIPT":
        pass
    seqs_before = {int(first.headers["pymq-seq"])}
    b1.stop()
    b2 = broker_factory(data_dir=data)
    c2 = RawStomp(b2.port)
    c2.connect()
    c2.send("SUBSCRIBE", {"destination": "/queue/keep", "id": "1"})
    frames = _drain(c2)
    assert [f.body for f in frames] == [b"p1", b"p2", b"p3", b"p4"]
    # new messages continue the numbering past everything handed out before the restart
    c2.send("SEND", {"destination": "/queue/keep", "receipt": "x"}, b"after")
    newer = [f for f in _drain(c2) if f.command == "MESSAGE"]
    assert newer and int(newer[0].headers["pymq-seq"]) > max(
        int(f.headers["pymq-seq"]) for f in frames) > max(seqs_before)


def test_durable_subscription_and_its_messages_survive_restart(broker_factory, tmp_path):
    data = str(tmp_path / "d")
    b1 = broker_factory(data_dir=data)
    with pymq.connect(b1.url, client_id="keeper") as conn:
        s = conn.create_session()
        s.create_durable_consumer(pymq.Topic("events"), "audit").close()
    with pymq.connect(b1.url) as conn:
        p = conn.create_session().create_producer(pymq.Topic("events"))
        for i in range(3):
            p.send(f"e{i}")
        p.send("volatile", delivery_mode=pymq.NON_PERSISTENT)
    b1.stop()
    b2 = broker_factory(data_dir=data)
    with pymq.connect(b2.url, client_id="keeper") as conn:
        c = conn.create_session().create_durable_consumer(pymq.Topic("events"), "audit")
        got = []
        while (m := c.receive(0.5)) is not None:
            got.append(m.text)
    assert got == ["e0", "e1", "e2"]


def test_memory_only_broker_keeps_sequence_monotonic_across_restart(broker_factory, tmp_path):
    storage = {"devices": {"memory": {"kind": "memory"}}, "persistent_device": "memory"}
    b1 = broker_factory(data_dir=str(tmp_path / "m"), storage=storage)
    with pymq.connect(b1.url) as conn:
        s = conn.create_session()
        s.create_producer(pymq.Queue("m")).send("x")
        first = s.create_consumer(pymq.Queue("m")).receive(5).sequence
    b1.stop()
    b2 = broker_factory(data_dir=str(tmp_path / "m"), storage=storage)
    with pymq.connect(b2.url) as conn:
        s = conn.create_session()
        s.create_producer(pymq.Queue("m")).send("y")
        second = s.create_consumer(pymq.Queue("m")).receive(5).sequence
    assert second > first
