"""Delivery state survives restarts (issue 11 item 5; spec/storage.md frame DELIVERED, section 8).

On the landed main (792990a) delivered-but-unacknowledged messages came back after a restart without
``redelivered`` and with their delivery count reset, so a poison message got a fresh ``max_deliveries``
budget after every restart.  Now each delivery of a persistent message to a consumer that must
acknowledge it is recorded by the file device and logged with its next log write — the next receipt's
barrier on a busy broker, at most 10 ms later on an idle one (handed to the OS, no fsync) — and kept in
its checkpoints.
"""
from __future__ import annotations

import shutil

import yaml

from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice
from tests.conftest import RawStomp, wait_for

from .disks import BrokerProcess


def _device(path) -> FileDevice:
    device = FileDevice("file", path, 4096, fsync=False)
    device.open()
    return device


def _msg(key, persistent=True):
    return StoredMessage(key, "/queue/a", key, persistent, b"m%d" % key)


def test_the_file_device_keeps_delivery_counts_in_its_log_and_checkpoints(tmp_path):
    store = tmp_path / "s"
    device = _device(store)
    device.write(_msg(1), ["/queue/a", "sub:x"])
    device.write(_msg(2), ["/queue/a"])
    device.write(_msg(3, persistent=False), ["/queue/a"])
    device.record_delivery(1, "/queue/a", 1)
    device.record_delivery(1, "/queue/a", 2)
    device.record_delivery(1, "sub:x", 1)
    device.record_delivery(2, "/queue/a", 4)
    device.record_delivery(3, "/queue/a", 1)             # non-persistent: nothing survives anyway
    device.record_delivery(2, "/queue/other", 1)         # no such reference: ignored
    device.flush()
    image = tmp_path / "crash"                            # a crash: only the log has them
    shutil.copytree(store, image, ignore=shutil.ignore_patterns("LOCK"))
    crashed = _device(image)
    assert crashed.deliveries(1) == {"/queue/a": 2, "sub:x": 1}
    assert crashed.deliveries(2) == {"/queue/a": 4}
    crashed.remove(1, "sub:x")                            # a reference gone takes its count with it
    assert crashed.deliveries(1) == {"/queue/a": 2}
    crashed.close()                                       # a checkpoint now holds them (section 8)
    reopened = _device(image)
    assert reopened.status().extra["recovery"]["frames_replayed"] == 0
    assert reopened.deliveries(1) == {"/queue/a": 2} and reopened.deliveries(2) == {"/queue/a": 4}
    reopened.remove(2, "/queue/a")
    reopened.close()
    again = _device(image)
    assert again.deliveries(2) == {} and again.deliveries(1) == {"/queue/a": 2}
    again.close()
    device.close()


def _config(tmp_path, max_deliveries: int) -> str:
    path = tmp_path / "broker.yaml"
    path.write_text(yaml.safe_dump({"queues": {"poison": {"max_deliveries": max_deliveries}}}))
    return str(path)


def _receive_without_ack(port: int, destination: str, timeout: float = 10.0):
    client = RawStomp(port)
    assert client.connect().command == "CONNECTED"
    client.send("SUBSCRIBE", {"destination": destination, "id": "s", "ack": "client-individual"})
    try:
        frame = client.read(timeout)
    except TimeoutError:
        frame = None
    return client, frame


def _broker_writes_on(port: int) -> None:
    """Some other work that writes the log (a persistent SEND's receipt): what a busy broker does."""
    other = RawStomp(port)
    other.connect()
    other.send("SEND", {"destination": "/queue/elsewhere", "receipt": "w"}, b"w")
    assert other.read(10).command == "RECEIPT"
    other.close()


def test_a_poison_message_keeps_its_delivery_count_across_kill_9(tmp_path):
    data = tmp_path / "data"
    config = _config(tmp_path, max_deliveries=3)
    bp = BrokerProcess(data, config=config)
    producer = RawStomp(bp.port)
    producer.connect()
    producer.send("SEND", {"destination": "/queue/poison", "receipt": "r"}, b"poison")
    assert producer.read(10).command == "RECEIPT"
    producer.close()
    seen = []
    try:
        for delivery in (1, 2, 3):
            client, frame = _receive_without_ack(bp.port, "/queue/poison")
            assert frame is not None and frame.command == "MESSAGE", (delivery, frame)
            seen.append((frame.headers.get("redelivered"), frame.headers.get("JMSXDeliveryCount")))
            _broker_writes_on(bp.port)
            bp.kill()                                      # kill -9 while the message is out
            client.close()
            bp = BrokerProcess(data, config=config)
        # landed main: [(None, None), (None, None), (None, None)] and a fourth delivery, forever
        assert seen == [(None, None), ("true", "2"), ("true", "3")]
        client, frame = _receive_without_ack(bp.port, "/queue/poison", timeout=1.5)
        assert frame is None, "the message got a fresh budget after the restart"
        client.close()
        client, frame = _receive_without_ack(bp.port, "/queue/DLQ.poison")
        assert frame is not None and frame.body == b"poison"
        assert frame.headers["JMSXDeliveryCount"] == "3"
        assert "before a restart" in frame.headers["pymq-dead-letter-reason"]
        client.close()
        assert bp.terminate() == 0
    finally:
        if bp.proc.poll() is None:
            bp.kill()


def test_delivery_counts_survive_a_clean_restart_too(tmp_path):
    data = tmp_path / "data"
    config = _config(tmp_path, max_deliveries=10)
    bp = BrokerProcess(data, config=config)
    producer = RawStomp(bp.port)
    producer.connect()
    producer.send("SEND", {"destination": "/queue/poison", "receipt": "r"}, b"m")
    assert producer.read(10).command == "RECEIPT"
    producer.close()
    client, frame = _receive_without_ack(bp.port, "/queue/poison")
    client.send("NACK", {"id": frame.headers["ack"]})     # back to the queue: the count stays
    frame = client.read(10)
    assert frame.headers["JMSXDeliveryCount"] == "2"
    client.close()
    assert bp.terminate() == 0                             # SIGTERM: the checkpoint carries the count
    bp = BrokerProcess(data, config=config)
    try:
        client, frame = _receive_without_ack(bp.port, "/queue/poison")
        assert frame.headers["redelivered"] == "true" and frame.headers["JMSXDeliveryCount"] == "3"
        client.send("ACK", {"id": frame.headers["ack"], "receipt": "a"})
        assert client.read(10).command == "RECEIPT"
        client.close()
        assert bp.terminate() == 0
    finally:
        if bp.proc.poll() is None:
            bp.kill()


def test_an_idle_broker_logs_the_delivery_count_on_its_own(broker_factory, tmp_path):
    """No other write follows the delivery: the store's timer hands the record to the OS (the copy of
    the directory is what a kill -9 leaves behind)."""
    broker = broker_factory()
    producer = RawStomp(broker.port)
    producer.connect()
    producer.send("SEND", {"destination": "/queue/idle", "receipt": "r"}, b"m")
    assert producer.read(10).command == "RECEIPT"
    device = broker.server.store.devices["file"]
    written = device.status().extra["log_bytes"]
    client, frame = _receive_without_ack(broker.port, "/queue/idle")
    assert frame.command == "MESSAGE"
    assert wait_for(lambda: device.status().extra["log_bytes"] > written, timeout=10)
    image = tmp_path / "crash"
    shutil.copytree(device.directory, image, ignore=shutil.ignore_patterns("LOCK"))
    recovered = _device(image)
    try:
        (message, _), = recovered.recover()
        assert recovered.deliveries(message.key) == {"/queue/idle": 1}
    finally:
        recovered.close()
        client.close()
        producer.close()
