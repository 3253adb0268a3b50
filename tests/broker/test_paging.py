"""Paging (issue 11 item 6; server/broker/backlog.py): above max_memory a queue's waiting messages go to
disk and come back in order; producers are paused only when the disk limit is reached.

On the landed main 6 MB sent into a 2 MB ``max_memory`` stalled the producer for good: no receipt ever
came for the last SEND.
"""
from __future__ import annotations

import pytest

from tests.conftest import RawStomp, wait_for

MiB = 1 << 20


def _fill(port: int, destination: str, count: int, size: int, persistent: bool, **extra) -> None:
    producer = RawStomp(port)
    producer.connect()
    for i in range(count):
        headers = {"destination": destination, "persistent": "true" if persistent else "false", **extra}
        if i == count - 1:
            headers["receipt"] = "last"
        producer.send("SEND", headers, b"%08d" % i + b"x" * (size - 8))
    frame = producer.read(60)             # landed main: TimeoutError, the producer is paused for good
    assert frame.command == "RECEIPT", frame
    producer.close()


def _drain(port: int, destination: str, count: int, ack: str = "auto") -> list[int]:
    consumer = RawStomp(port)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": destination, "id": "1", "ack": ack})
    seen = []
    for _ in range(count):
        frame = consumer.read(30)
        assert frame.command == "MESSAGE", frame
        seen.append(int(frame.body[:8]))
        if ack != "auto":
            consumer.send("ACK", {"id": frame.headers["ack"]})
    consumer.close()
    return seen


@pytest.mark.parametrize("persistent", [False, True], ids=["non-persistent", "persistent"])
def test_six_megabytes_into_two_no_longer_stall_and_come_back_in_order(broker_factory, persistent):
    broker = broker_factory(max_memory=2 * MiB, storage={"devices": {"memory": {}, "file": {"fsync": False}}})
    count = 6 * MiB // 1024
    _fill(broker.port, "/queue/big", count, 1024, persistent)
    flow = broker.broker.flow
    assert broker.call(lambda: flow.held_bytes) <= 2 * MiB
    assert broker.call(lambda: broker.broker.host.pager.paged) > count // 2      # most of it is on disk
    assert not broker.call(lambda: broker.broker.memory_high)
    queue = broker.broker.destinations.queues["big"]
    assert broker.call(lambda: queue.depth) == count
    assert _drain(broker.port, "/queue/big", count, "client-individual") == list(range(count))
    assert wait_for(lambda: broker.call(lambda: queue.depth) == 0)
    assert broker.call(lambda: broker.broker.host.pager.paged) == 0
    device = broker.server.store.devices["file"]
    assert wait_for(lambda: broker.call(lambda: device.status().messages) == 0)


def test_a_paged_queue_browses_purges_and_acks_up_to_with_its_backlog(broker_factory):
    broker = broker_factory(max_memory=256 * 1024, storage={"devices": {"memory": {}, "file": {"fsync": False}}})
    count = 1500
    _fill(broker.port, "/queue/b", count, 1024, False)
    queue = broker.broker.destinations.queues["b"]
    assert broker.call(lambda: queue.backlog.count) > count // 2
    browser = RawStomp(broker.port)
    browser.connect()
    browser.send("SUBSCRIBE", {"destination": "/queue/b", "id": "b", "browser": "true"})
    browsed, seqs = [], []
    while True:
        frame = browser.read(10)
        if frame.headers.get("browser") == "end":
            break
        browsed.append(int(frame.body[:8]))
        seqs.append(int(frame.headers["pymq-seq"]))
    browser.close()
    assert browsed == list(range(count))           # the paged part too, in order
    # ack-up-to: every message below the 900th's sequence number goes, the paged part included
    reader = RawStomp(broker.port)
    reader.connect()
    reader.send("ACK", {"id": "pymq-upto", "destination": "/queue/b", "pymq-ack-upto": str(seqs[900]),
                        "receipt": "a"})
    assert reader.read(10).command == "RECEIPT"
    reader.close()
    depth = broker.call(lambda: queue.depth)
    assert depth == count - 900, depth
    assert _drain(broker.port, "/queue/b", 10, "client-individual") == list(range(900, 910))
    depth -= 10                                     # (what was sent and not acknowledged comes back)
    assert wait_for(lambda: broker.call(lambda: queue.depth == depth and not queue.acquired))
    assert broker.call(lambda: queue.purge()) == depth
    assert broker.call(lambda: queue.depth) == 0 and broker.call(lambda: queue.backlog.count) == 0
    device = broker.server.store.devices["file"]
    assert wait_for(lambda: broker.call(lambda: device.status().messages) == 0)


def test_a_paged_persistent_backlog_survives_kill_9_in_order(tmp_path):
    """Every receipted persistent message of a backlog that was on disk comes back after kill -9, once and
    in order, and recovery pages again (memory stays short)."""
    from tests.storage.disks import BrokerProcess
    config = tmp_path / "broker.yaml"
    config.write_text(f"max_memory: {2 * MiB}\n")
    data = tmp_path / "data"
    bp = BrokerProcess(data, config=str(config))
    try:
        count = 6 * MiB // 1024
        _fill(bp.port, "/queue/big", count, 1024, True)
        bp.kill()
        bp = BrokerProcess(data, config=str(config))
        assert _drain(bp.port, "/queue/big", count, "client-individual") == list(range(count))
        assert bp.terminate() == 0
    finally:
        if bp.proc.poll() is None:
            bp.kill()
