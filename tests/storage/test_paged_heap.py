"""Heap per paged message is a small constant (issue 24 item 6; server/storage/file/index.py).

A queue whose persistent messages are paged out keeps only their keys in memory (backlog.py, 8 bytes each);
the file device's index keeps where each one is. On the landed main (ccb5094) that index cost about 330
bytes of heap per message (an object per message, two dict entries, a per-queue list), so a backlog of 40 x
max_memory of 1 KiB messages held 9.3 x max_memory of RSS. Now the index keeps the newest messages as objects
(a bounded number) and the others in parallel arrays, 32 bytes each: a paged message costs about 50 bytes
(index 32, backlog 8, page bookkeeping and array slack), measured here as the slope of the heap between two
fill levels, with the broker's tracemalloc (deterministic; not a timing).
"""
from __future__ import annotations

import gc
import tracemalloc

import pytest

from pymq_server.config import BrokerConfig
from tests.conftest import RawStomp, RunningBroker

#: bytes of heap one more paged persistent message may cost (spec: docs/operations.md, bench/README.md)
BOUND = 64


def _fill(port: int, start: int, count: int) -> None:
    producer = RawStomp(port)
    producer.connect()
    for i in range(start, start + count):
        headers = {"destination": "/queue/backlog", "persistent": "true"}
        if i == start + count - 1:
            headers["receipt"] = "last"
        producer.send("SEND", headers, b"%08d" % i + b"x" * 1016)
    assert producer.read(120).command == "RECEIPT"
    producer.close()


@pytest.mark.own_process      # the broker's heap alone (tests/conftest.py, pytest_pyfunc_call)
def test_a_paged_persistent_message_costs_a_small_constant_of_heap(tmp_path):
    broker = RunningBroker(BrokerConfig(port=0, data_dir=str(tmp_path / "data"), max_memory=256 * 1024,
                                        sync_policy="never"))
    try:
        device = broker.server.store.devices["file"]

        def heap() -> int:
            # everything written and checkpointed (page buffers waiting for a checkpoint are bounded by
            # checkpoint_bytes, not per message), then what is left allocated
            broker.call(broker.server.store.write_waiting)
            broker.call(device.flush)
            broker.call(device.checkpoint)
            broker.call(gc.collect)
            return broker.call(lambda: tracemalloc.get_traced_memory()[0])

        broker.call(tracemalloc.start)                # from the start: a block made before would count whole
        try:                                          # when it grows
            _fill(broker.port, 0, 4000)               # paging, and the index's hot tier full
            low = heap()
            _fill(broker.port, 4000, 24_000)
            high = heap()
        finally:
            broker.call(tracemalloc.stop)
        pager = broker.broker.host.pager
        assert broker.call(lambda: pager.paged) > 27_000, "the messages were paged out"
        per_message = (high - low) / 24_000
        assert per_message <= BOUND, f"{per_message:.1f} bytes of heap per paged message"
        # and every one is still there, in order
        consumer = RawStomp(broker.port)
        consumer.connect()
        consumer.send("SUBSCRIBE", {"destination": "/queue/backlog", "id": "1", "ack": "auto"})
        got = [int(consumer.read(30).body[:8]) for _ in range(28_000)]
        consumer.close()
        assert got == list(range(28_000))
    finally:
        broker.stop()
