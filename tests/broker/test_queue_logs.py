"""A separate log for each queue (seed 001; server/broker/queue_logs.py): its path in the queue's admin view,
what happened to that queue and nothing of another's, names any file system takes, bounded files."""
from __future__ import annotations

import os

import pymq
from pymq_server.broker.queue_logs import OPEN_FILES, QueueLogs, file_name

from tests.conftest import wait_for


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def test_each_queue_has_its_own_log_named_in_its_admin_view(broker_factory, tmp_path):
    b = broker_factory(data_dir=str(tmp_path / "d"))
    with pymq.connect(b.url) as conn:
        qm = conn.queue_manager()
        qm.create("orders", max_deliveries=1)
        qm.create("invoices")
        info = qm.call("queue-info", name="orders")
        path = info["log"]
        assert path == os.path.join(str(tmp_path / "d"), "queue-logs", "orders.log")
        s = conn.create_session()
        s.create_producer(pymq.Queue("orders")).send("poison")
        consumer = s.create_consumer(pymq.Queue("orders"))
        assert consumer.receive(5).text == "poison"
        consumer.close()
        qm.alter("orders", default_priority=7)
        qm.purge("orders")
    assert wait_for(lambda: "consumer detached" in _read(path))
    text = _read(path)
    for expected in ("declared by guest", "consumer attached: connection", "consumer detached",
                     "altered by guest: default_priority: 4 -> 7", "purged by guest"):
        assert expected in text, (expected, text)
    assert "invoices" not in text
    other = os.path.join(os.path.dirname(path), "invoices.log")
    assert "declared by guest" in _read(other) and "orders" not in _read(other)


def test_dead_letters_and_expiry_are_in_the_queues_log(broker_factory, tmp_path):
    b = broker_factory(data_dir=str(tmp_path / "d"))
    with pymq.connect(b.url) as conn:
        conn.queue_manager().create("jobs", max_deliveries=1)
        path = conn.queue_manager().call("queue-info", name="jobs")["log"]
        p = conn.create_session().create_producer(pymq.Queue("jobs"))
        p.send("short-lived", time_to_live=1)
        p.send("fails")
    raw_dead = []
    with pymq.connect(b.url) as conn:
        s = conn.create_session(transacted=True)
        c = s.create_consumer(pymq.Queue("jobs"))
        m = c.receive(5)
        assert m is not None and m.text == "fails"
        raw_dead.append(m.message_id)
        s.rollback()                                # its one delivery is spent: dead-lettered
    assert wait_for(lambda: os.path.exists(path) and "DLQ.jobs" in _read(path), timeout=10), _read(path)
    text = _read(path)
    assert f"message {raw_dead[0]} after 1 deliveries: to DLQ.jobs" in text
    assert "expired" in text


def test_file_names_and_bounds(tmp_path):
    assert file_name("orders") == "orders.log"
    assert file_name("$vh.shop.orders") == "%24vh.shop.orders.log"
    assert file_name("a/b") == "a%2Fb.log" and file_name("..") == "%2E..log"
    long = file_name("é" * 255)
    assert len(long.encode()) < 255 and long != file_name("é" * 254)
    logs = QueueLogs(str(tmp_path), max_bytes=4096)
    for i in range(200):
        logs.event("busy", "x" * 100)
    assert os.path.getsize(tmp_path / "busy.log") < 4096 + 200 and os.path.exists(tmp_path / "busy.log.1")
    for i in range(OPEN_FILES + 10):
        logs.event(f"q{i}", "one line")
    assert len(logs._open) <= OPEN_FILES
    logs.close()
    assert QueueLogs(None).path_for("x") is None
