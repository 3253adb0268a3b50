"""Seed 000 device selection under pressure (issue 11 item 4; spec/storage_rules.md §6.4).

On the landed main (792990a): a file device bounded to 1 MiB at 94 % stayed "available" (the full
threshold is a fixed 98 %) and refused every 100 KB write, closing the producer's connection each time;
nothing fell over to the next device the rules rank; refusals were not device errors and the admin
placement counted them; a rule sending persistent messages to memory got their receipts and lost them
on kill -9; and one unreachable device (Redis down) kept the broker from starting.
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
import yaml

import pymq
from tests.conftest import RawStomp, wait_for

from .disks import BrokerProcess
from .services import TcpProxy, redis_url  # noqa: F401  (fixture)


def storage_config(tmp_path, *, file_bytes: int | None = None, period: float = 0.05, rules=(),
                   default: str = "db", extra_devices=None) -> dict:
    file = {"kind": "file", "page_size": 4096}
    if file_bytes is not None:
        file["max_bytes"] = file_bytes
    devices = {"memory": {"kind": "memory"}, "file": file,
               "db": {"kind": "sql", "url": f"sqlite:///{tmp_path / 'db.sqlite3'}"}}
    devices.update(extra_devices or {})
    return {"devices": devices, "persistent_device": "db",
            "selection": {"strategy": "first-match", "default_device": default,
                          "monitor": {"period": period}, "rules": list(rules)}}


def send_all(port: int, count: int, size: int, destination: str = "/queue/p", start: int = 0) -> list:
    """Persistent SENDs with a receipt each on one connection: every answer, in order."""
    client = RawStomp(port)
    assert client.connect().command == "CONNECTED"
    answers = []
    try:
        for i in range(start, start + count):
            client.send("SEND", {"destination": destination, "receipt": str(i)},
                        f"{i:06d}".encode() + b"x" * (size - 6))
            frame = client.read(15)
            answers.append(frame.command)
            if frame.command != "RECEIPT":
                break
        return answers
    finally:
        client.close()


def number(message) -> int:
    raw = message.text.encode() if isinstance(message, pymq.TextMessage) else message.data
    return int(raw[:6])


def placed(broker) -> dict:
    return {(p["device"], p["rule"]): p["messages"]
            for p in broker.call(lambda: broker.server.store.placements())}


def file_status(broker):
    return broker.call(lambda: broker.server.store.devices["file"].status())


def test_a_device_too_full_for_a_message_is_skipped_for_it_and_still_takes_smaller_ones(
        broker_factory, tmp_path):
    rules = [{"id": "to-file", "device": "file", "weight": 90, "condition": ""},
             {"id": "to-db", "device": "db", "weight": 50, "condition": ""}]
    broker = broker_factory(storage=storage_config(tmp_path, file_bytes=1 << 20, rules=rules))
    # fill the file device with small messages until a 100 KB one no longer fits (about 94 %)
    sent = 0
    while (file_status(broker).bytes_free or 0) >= 110_000:
        assert send_all(broker.port, 10, 8_000, start=sent) == ["RECEIPT"] * 10
        sent += 10
        assert sent < 2000
    monitor = broker.server.store.selection.monitor
    checked = broker.call(lambda: monitor.refreshes)
    assert wait_for(lambda: broker.call(lambda: monitor.refreshes) >= checked + 2)     # a monitor check or two
    status = file_status(broker)
    used = 1 - status.bytes_free / status.capacity
    assert 0.85 < used < 0.98, used
    before = placed(broker)
    # 100 KB messages: one connection, every one receipted (landed main: ERROR, connection closed)
    assert send_all(broker.port, 20, 100_000, start=10_000) == ["RECEIPT"] * 20
    after = placed(broker)
    assert after[("db", "to-db")] - before.get(("db", "to-db"), 0) == 20
    assert after[("file", "to-file")] == before[("file", "to-file")]
    # smaller messages still go to the file device
    assert send_all(broker.port, 5, 1_000, start=20_000) == ["RECEIPT"] * 5
    assert placed(broker)[("file", "to-file")] == before[("file", "to-file")] + 5
    with pymq.connect(broker.url) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue("p"))
        got = [consumer.receive(10) for _ in range(sent + 25)]
        assert all(m is not None for m in got)
        assert consumer.receive(0.3) is None


def test_a_refused_write_falls_over_to_the_next_device_and_counts_as_an_error(broker_factory, tmp_path):
    """The monitor's estimate lags (a 10 KB message takes four 4 KiB pages), so the device itself
    refuses: the message goes to the next device the rules rank, on the same connection."""
    rules = [{"id": "to-file", "device": "file", "weight": 90, "condition": ""},
             {"id": "to-db", "device": "db", "weight": 50, "condition": ""}]
    broker = broker_factory(storage=storage_config(tmp_path, file_bytes=256 << 10, period=3600,
                                                   rules=rules))
    answers = send_all(broker.port, 40, 10_000)
    assert answers == ["RECEIPT"] * 40, answers              # landed main: ERROR at the first refusal
    status = file_status(broker)
    refusals = status.extra["refusals"]
    assert refusals >= 1 and status.errors >= refusals
    counts = placed(broker)
    # the placement counts only what each device stored
    assert counts[("file", "to-file")] == status.messages
    assert counts[("db", "to-db")] == 40 - status.messages
    # the refusals lower the device's score (or make it failing) at the next check
    layer = broker.server.store.selection
    before = broker.call(lambda: layer.health()["file"])
    broker.call(lambda: layer.monitor.refresh(time.monotonic() + 1, force=True))
    after = broker.call(lambda: layer.health()["file"])
    assert after.score < before.score or not after.available, (before, after)
    with pymq.connect(broker.url) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue("p"))
        got = sorted(number(consumer.receive(10)) for _ in range(40))
        assert got == list(range(40))


def test_nothing_can_take_it_is_an_error_naming_every_refusal(broker_factory, tmp_path):
    rules = [{"id": "to-file", "device": "file", "weight": 90, "condition": ""}]
    config = storage_config(tmp_path, file_bytes=64 << 10, period=3600, rules=rules, default="file")
    config["persistent_device"] = "memory"       # the catalog elsewhere: only the file device is durable
    del config["devices"]["db"]
    broker = broker_factory(storage=config)
    answers = send_all(broker.port, 50, 10_000)
    assert answers[-1] == "ERROR" and set(answers[:-1]) == {"RECEIPT"}
    client = RawStomp(broker.port)
    client.connect()
    client.send("SEND", {"destination": "/queue/p", "receipt": "x"}, b"y" * 10_000)
    frame = client.read(10)
    assert frame.command == "ERROR" and frame.headers["pymq-code"] == "storage"
    assert "file: file device 'file' is full" in frame.headers["message"]
    assert "memory: not durable" in frame.headers["message"]
    client.close()


# -- durability --------------------------------------------------------------------------------------

def _durability_config(tmp_path, downgrade: bool) -> str:
    rule = {"id": "fast", "device": "memory", "weight": 90, "condition": "DESTINATION_NAME LIKE '/queue/%'"}
    if downgrade:
        rule["downgrade_durability"] = True
    path = tmp_path / "broker.yaml"
    path.write_text(yaml.safe_dump({"storage": {
        "devices": {"memory": {"kind": "memory"}, "file": {"kind": "file"}},
        "persistent_device": "file",
        "selection": {"default_device": "file", "rules": [rule]}}}))
    return str(path)


def _drain(port: int, destination: str) -> list[str]:
    with pymq.connect(f"stomp://127.0.0.1:{port}", timeout=10) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue(destination.rsplit("/", 1)[1]))
        got = []
        while (m := consumer.receive(1.0)) is not None:
            got.append(m.text)
        return got


def _receipted_then_killed(tmp_path, config: str) -> BrokerProcess:
    data = tmp_path / "data"
    bp = BrokerProcess(data, config=config)
    client = RawStomp(bp.port)
    client.connect()
    for i in range(5):
        client.send("SEND", {"destination": "/queue/precious", "receipt": str(i)}, f"m{i}".encode())
        assert client.read(10).command == "RECEIPT"
    client.close()
    bp.kill()                                                 # kill -9 after every receipt
    return BrokerProcess(data, config=config)


def test_a_rule_cannot_send_a_persistent_message_to_memory_without_saying_so(tmp_path):
    bp = _receipted_then_killed(tmp_path, _durability_config(tmp_path, downgrade=False))
    try:
        assert _drain(bp.port, "/queue/precious") == [f"m{i}" for i in range(5)]   # landed main: []
        assert bp.terminate() == 0
    finally:
        if bp.proc.poll() is None:
            bp.kill()


def test_a_rule_that_downgrades_durability_explicitly_loses_them_on_a_crash_as_documented(tmp_path):
    bp = _receipted_then_killed(tmp_path, _durability_config(tmp_path, downgrade=True))
    try:
        assert _drain(bp.port, "/queue/precious") == []
        assert bp.terminate() == 0
    finally:
        if bp.proc.poll() is None:
            bp.kill()


# -- an unreachable device at start-up ----------------------------------------------------------------

def test_a_broker_starts_with_a_device_that_cannot_be_reached(broker_factory, tmp_path):
    rules = [{"id": "to-grid", "device": "grid", "weight": 90, "condition": ""}]
    dead = {"grid": {"kind": "grid", "url": "redis://127.0.0.1:1/0", "socket_timeout_s": 0.5, "retries": 0}}
    broker = broker_factory(storage=storage_config(tmp_path, rules=rules, extra_devices=dead))
    assert send_all(broker.port, 5, 1_000) == ["RECEIPT"] * 5     # fall back to the default device
    assert placed(broker) == {("db", "default"): 5}
    with pymq.connect(broker.url) as conn:
        storage = conn.queue_manager().call("storage")
        grid = next(d for d in storage["devices"] if d["name"] == "grid")
        assert grid["online"] is False
        assert storage["rules"]["devices"]["grid"]["available"] is False


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{port}"))


def test_a_device_unreachable_at_start_up_is_opened_when_it_comes_back(broker_factory, tmp_path, redis_url):
    host, port = urlsplit(redis_url).hostname, urlsplit(redis_url).port or 6379
    proxy = TcpProxy(host, port)
    namespace = f"t{uuid.uuid4().hex[:12]}"
    grid = {"grid": {"kind": "grid", "url": _with_port(redis_url, proxy.port), "namespace": namespace,
                     "socket_timeout_s": 1.0, "retries": 0}}
    rules = [{"id": "to-grid", "device": "grid", "weight": 90, "condition": "DESTINATION_NAME = '/queue/g'"}]
    try:
        first = broker_factory(data_dir=str(tmp_path / "data"),
                               storage=storage_config(tmp_path, rules=rules, extra_devices=grid))
        assert send_all(first.port, 3, 500, destination="/queue/g") == ["RECEIPT"] * 3
        assert placed(first) == {("grid", "to-grid"): 3}
        first.stop()
        proxy.cut()                                              # Redis goes away
        broker = broker_factory(data_dir=str(tmp_path / "data"),
                                storage=storage_config(tmp_path, rules=rules, extra_devices=grid))
        assert "grid" in broker.server.store.unopened
        assert send_all(broker.port, 2, 500, destination="/queue/g", start=100) == ["RECEIPT"] * 2
        assert placed(broker) == {("db", "default"): 2}          # fell over to the default device
        proxy.restore()
        assert wait_for(lambda: "grid" not in broker.server.store.unopened, timeout=30)
        assert wait_for(lambda: broker.call(lambda: broker.server.store.selection.health()["grid"].available),
                        timeout=10)
        assert send_all(broker.port, 1, 500, destination="/queue/g", start=200) == ["RECEIPT"]
        assert placed(broker)[("grid", "to-grid")] == 1
        # the messages the grid held before are recovered into the running broker
        with pymq.connect(broker.url) as conn:
            consumer = conn.create_session().create_consumer(pymq.Queue("g"))
            got = sorted(number(consumer.receive(10)) for _ in range(6))
            assert got == [0, 1, 2, 100, 101, 200]
    finally:
        proxy.close()
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(f"{namespace}:*"))
        if keys:
            client.delete(*keys)
        client.close()
