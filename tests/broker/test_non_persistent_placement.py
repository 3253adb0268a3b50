"""A non-persistent message a storage rule sends to a database or the grid is held there, for real
(issue 24 item 6; spec/storage_rules.md §6.4).

On the landed main (ccb5094) such a message stayed in the heap, was counted as placed on the grid or SQL
device all the same, and was charged to the memory device: the grid's own status said it held nothing, the
memory device's figures (what the storage monitor scores it by) grew, and so the next placements went
elsewhere. The seed's own example hits it (W999: very large messages to the grid, whatever their mode).

Each device is a real server: Redis for the grid, PostgreSQL for SQL (SQLite when none is configured
locally is not enough to say "a database": the URL comes from ``.ci/services.sh``).
"""
from __future__ import annotations

import uuid

import pytest

from tests.conftest import RawStomp, wait_for
from tests.storage.services import postgres_url, redis_url  # noqa: F401  (fixtures)


def _storage(tmp_path, device: dict) -> dict:
    return {
        "devices": {"memory": {"kind": "memory"}, "file": {"kind": "file"}, "far": device},
        "persistent_device": "file",
        "selection": {
            "strategy": "first-match",
            "default_device": "file",
            # the seed's W999: very large messages to the grid (a database here too), whatever their mode
            "rules": [{"id": "W999", "device": "far", "weight": 90, "condition": "SIZE > 10"}],
        },
    }


@pytest.fixture(params=["grid", "sql"])
def far_device(request, tmp_path):
    if request.param == "grid":
        url = request.getfixturevalue("redis_url")
        return {"kind": "grid", "url": url, "namespace": f"np{uuid.uuid4().hex[:8]}"}
    url = request.getfixturevalue("postgres_url")
    return {"kind": "sql", "url": url, "broker_id": f"np{uuid.uuid4().hex[:8]}"}


def _send(port: int, destination: str, body: bytes, persistent: bool) -> None:
    client = RawStomp(port)
    client.connect()
    client.send("SEND", {"destination": destination, "persistent": "true" if persistent else "false",
                         "receipt": "r"}, body)
    assert client.read(10).command == "RECEIPT"
    client.close()


def _figures(broker) -> tuple[dict, dict]:
    store = broker.server.store
    placed = {(p["device"], p["rule"]): p["messages"] for p in store.placements()}
    held = {s.name: s.messages for s in store.status()}
    return placed, held


def test_a_non_persistent_message_ruled_to_a_far_device_is_held_there(broker_factory, tmp_path, far_device):
    data = str(tmp_path / "data")
    broker = broker_factory(data_dir=data, storage=_storage(tmp_path, far_device))
    big = b"y" * 20_000                                   # SIZE > 10 (KB): W999 chooses the far device
    _send(broker.port, "/queue/np", big, persistent=False)
    placed, held = broker.call(lambda: _figures(broker))
    assert placed == {("far", "W999"): 1}
    # counted where it is: the far device holds it, the heap's memory device is not charged with it
    assert held["far"] == 1, held
    assert held["memory"] == 0, held
    memory = broker.server.store.memory
    assert broker.call(lambda: memory.held_bytes) == 0
    # it is delivered whole, then gone from the device and the figures
    consumer = RawStomp(broker.port)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/np", "id": "1", "ack": "client-individual"})
    frame = consumer.read(10)
    assert frame.command == "MESSAGE" and frame.body == big
    assert frame.headers.get("persistent") == "false"
    consumer.send("ACK", {"id": frame.headers["ack"], "receipt": "a"})
    assert consumer.read(10).command == "RECEIPT"
    consumer.close()
    assert wait_for(lambda: broker.call(lambda: _figures(broker)) == ({}, {"memory": 0, "file": 0, "far": 0}))


def test_a_non_persistent_message_on_a_far_device_does_not_outlive_the_broker(broker_factory, tmp_path,
                                                                              far_device):
    """Held there, but still non-persistent: a restart finds it gone (the device deletes such rows and keys
    when it opens; spec/storage.md S2, G2), and the persistent message beside it comes back."""
    data = str(tmp_path / "data")
    first = broker_factory(data_dir=data, storage=_storage(tmp_path, far_device))
    _send(first.port, "/queue/np", b"n" * 20_000, persistent=False)
    _send(first.port, "/queue/np", b"p" * 20_000, persistent=True)
    assert first.call(lambda: _figures(first))[1]["far"] == 2
    first.stop()
    second = broker_factory(data_dir=data, storage=_storage(tmp_path, far_device))
    consumer = RawStomp(second.port)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/np", "id": "1", "ack": "auto"})
    frame = consumer.read(10)
    assert frame.command == "MESSAGE" and frame.body == b"p" * 20_000
    with pytest.raises(TimeoutError):
        consumer.read(1.0)
    consumer.close()


def test_the_memory_device_keeps_taking_what_its_rules_send_it(broker_factory, tmp_path, far_device):
    """The placement after such messages: a rule for memory still wins (the heap is not made to look full by
    messages that are elsewhere)."""
    storage = _storage(tmp_path, far_device)
    storage["devices"]["memory"] = {"kind": "memory", "capacity": 200_000}
    storage["selection"]["rules"].append({"id": "small-to-memory", "device": "memory", "weight": 50,
                                          "condition": "SIZE <= 10", "downgrade_durability": True})
    storage["selection"]["monitor"] = {"period": 0.05}
    broker = broker_factory(data_dir=str(tmp_path / "data"), storage=storage)
    for _ in range(12):
        _send(broker.port, "/queue/np", b"z" * 20_000, persistent=False)   # 240 KB: more than memory's capacity
    store = broker.server.store
    assert broker.call(lambda: store.memory.held_bytes) == 0
    monitor = store.selection.monitor
    checked = broker.call(lambda: monitor.refreshes)
    assert wait_for(lambda: broker.call(lambda: monitor.refreshes) >= checked + 6)    # two rounds of statuses
    assert broker.call(lambda: store.selection.health()["memory"].available)
    _send(broker.port, "/queue/small", b"s" * 100, persistent=False)
    placed, _ = broker.call(lambda: _figures(broker))
    assert placed.get(("memory", "small-to-memory")) == 1, placed
