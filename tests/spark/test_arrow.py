"""Messages to Arrow and back, and the executors' connection cache (no Spark JVM needed)."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import pyarrow as pa
import pytest

import pymq
from pymq.errors import MessageFormatError
from pyspark_pymq._arrow import batch_to_messages
from pyspark_pymq._connections import ConnectionCache
from pyspark_pymq._options import ConnectionOptions
from tests.conftest import wait_for

DEFAULTS = {"delivery_mode": 2, "priority": 4, "time_to_live": 0}


def test_a_map_read_back_is_the_same_map_when_written(broker):
    from pyspark_pymq._decode import frames_to_batch
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        s.create_producer(pymq.Queue("arrow")).send(pymq.MapMessage({"a": 1, "b": b"\x01"}))
        frames = s.read_range(pymq.Queue("arrow"), frames=True).frames
    value = frames_to_batch(frames, "/queue/arrow", "queue", False).column("value")[0].as_py()
    # a map body keeps its wire form, so writing it back with bodyType 'map' gives the same map
    [(_, _, again, _)] = batch_to_messages(pa.RecordBatch.from_pylist(
        [{"value": value, "bodyType": "map"}]), "/queue/x", DEFAULTS, 0)
    assert again.map == {"a": 1, "b": b"\x01"}


def test_rows_become_messages():
    batch = pa.RecordBatch.from_pylist([
        {"value": "t", "key": b"g1", "priority": 9, "timeToLive": 5, "deliveryMode": "non_persistent",
         "correlationId": "c", "properties": [("n", 1), ("s", None)], "destination": "/topic/x", "dedupId": "d"},
        {"value": None, "key": None, "priority": None, "timeToLive": None, "deliveryMode": None,
         "correlationId": None, "properties": None, "destination": "/queue/y", "dedupId": None},
    ], schema=pa.schema([("value", pa.string()), ("key", pa.binary()), ("priority", pa.int32()),
                         ("timeToLive", pa.int64()), ("deliveryMode", pa.string()), ("correlationId", pa.string()),
                         ("properties", pa.map_(pa.string(), pa.int64())), ("destination", pa.string()),
                         ("dedupId", pa.string())]))
    (r0, d0, m0, a0), (r1, d1, m1, a1) = batch_to_messages(batch, None, DEFAULTS, 10)
    assert (r0, r1, d0, d1) == (10, 11, "/topic/x", "/queue/y")
    assert isinstance(m0, pymq.TextMessage) and m0.text == "t" and m0.group_id == "g1"
    assert m0.properties == {"JMSXGroupID": "g1", "n": 1} and m0.correlation_id == "c" and m0.dedup_id == "d"
    assert a0 == {"delivery_mode": 1, "priority": 9, "time_to_live": 5} and a1 == DEFAULTS
    assert isinstance(m1, pymq.TextMessage) and m1.text == ""
    # the option wins over the column (as the Kafka sink's topic option)
    assert [d for _, d, _, _ in batch_to_messages(batch, "/queue/opt", DEFAULTS, 0)] == ["/queue/opt"] * 2


@pytest.mark.parametrize("row, column", [
    ({"value": "x", "destination": None}, "destination"),
    ({"value": "x", "destination": "orders"}, "destination"),
    ({"value": "x", "destination": "/queue/a", "priority": 12}, "priority"),
    ({"value": "x", "destination": "/queue/a", "deliveryMode": "sometimes"}, "deliveryMode"),
    ({"value": b"\xff", "destination": "/queue/a", "bodyType": "text"}, "value"),
    ({"value": "x", "destination": "/queue/a", "properties": [("bad,name", "v")]}, "properties"),
])
def test_a_bad_row_names_its_row_and_column(row, column):
    good = {**{k: None for k in row}, "value": row["value"], "destination": "/queue/a"}
    batch = pa.RecordBatch.from_pylist([good, row, good])
    sent = []
    with pytest.raises(MessageFormatError) as info:
        for item in batch_to_messages(batch, None, DEFAULTS, 40):
            sent.append(item[0])
    assert sent == [40] and info.value.row == 41 and info.value.column == column
    assert f"row 41 of this partition, column '{column}'" in str(info.value)


def test_connection_cache_is_bounded_and_drops_broken_connections(broker_factory):
    brokers = [broker_factory() for _ in range(3)]
    cache = ConnectionCache(limit=2)
    options = [ConnectionOptions(b.url) for b in brokers]
    first = cache.take(options[0])
    cache.give_back(options[0], first)
    assert cache.take(options[0]) is first               # reused, and out of the cache while in use
    assert len(cache) == 0
    cache.give_back(options[0], first)
    for o in options[1:]:
        cache.give_back(o, cache.take(o))
    assert len(cache) == 2 and first.closed               # least recently used went out, closed
    # a session that fails drops its connection instead of caching it
    with pytest.raises(pymq.PymqError):
        with cache.session(options[1]) as s:
            s.read_range("/queue/x", selector="n >")      # the broker refuses the selector and closes
    assert len(cache) == 1
    # a connection whose broker went away is not handed out again: a new one is tried (and fails here)
    cached = cache.take(options[2])
    cache.give_back(options[2], cached)
    brokers[2].stop()
    assert wait_for(lambda: getattr(cached, "_error", None) is not None)
    with pytest.raises(pymq.PymqError):
        cache.take(options[2])
    assert cached.closed
    cache.clear()
    assert len(cache) == 0


def test_a_worker_heap_is_settled_once(monkeypatch):
    import gc

    from pyspark_pymq import _connections
    monkeypatch.setattr(_connections, "_heap_settled", False)
    frozen_before = gc.get_freeze_count()
    try:
        assert _connections.settle_worker_heap() is True
        # what was alive is out of the collector's passes (Spark collects after every task)
        assert gc.get_freeze_count() > frozen_before
        assert _connections.settle_worker_heap() is False
    finally:
        gc.unfreeze()
