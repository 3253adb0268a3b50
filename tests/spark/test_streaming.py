"""Streaming reads: checkpointed offsets, restarts, read limits, consume-mode acknowledgement, data loss."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import json
import threading

import pytest

import pymq
from tests.conftest import wait_for
from tests.spark.test_batch import send, seqs

pytestmark = pytest.mark.spark


def texts(url, dest, **kw):
    with pymq.connect(url) as conn:
        return [m.text for m in conn.create_session().read_range(dest, **kw).messages]


class BatchLog:
    """An idempotent sink: micro-batch id -> its rows.  A replayed batch overwrites itself, and must bring
    exactly the rows it had (the offsets in the checkpoint fix them)."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: dict[int, list[str]] = {}
        self.attempts: dict[int, list[list[str]]] = {}
        self.fail_on = fail_on
        self.lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        rows = sorted(r.v for r in df.selectExpr("cast(value as string) v").collect())
        with self.lock:
            self.attempts.setdefault(batch_id, []).append(rows)
            if batch_id == self.fail_on:
                raise RuntimeError(f"sink crashed in batch {batch_id}")
            self.batches[batch_id] = rows

    def all_rows(self) -> list[str]:
        return sorted(v for rows in self.batches.values() for v in rows)

    def check_replays_identical(self) -> None:
        for batch_id, attempts in self.attempts.items():
            assert all(a == attempts[0] for a in attempts), f"batch {batch_id} replayed with other rows"

    def check_each_row_in_one_batch(self) -> None:
        seen = [v for rows in self.batches.values() for v in rows]
        assert len(seen) == len(set(seen)), "a message was processed by two different micro-batches"


def stream(spark, impl, url, **options):
    reader = spark.readStream.format(impl.fmt).option("url", url)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def run(df, sink, checkpoint, available_now=True):
    writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="0 seconds")
    return writer.start()


def test_restarts_from_the_checkpoint_read_every_message_exactly_once(spark, impl, spark_broker, name, tmp_path):
    url, topic = spark_broker.url, pymq.Topic(name)
    send(url, topic, [f"a{i}" for i in range(30)])
    sink = BatchLog()
    checkpoint = tmp_path / "ck"
    df = stream(spark, impl, url, topic=name, startingOffsets="earliest", maxMessagesPerTrigger=7)

    # a query that runs on its own trigger and is stopped wherever it happens to be
    q = run(df, sink, checkpoint, available_now=False)
    assert wait_for(lambda: len(sink.batches) >= 2, timeout=120)
    q.stop()
    send(url, topic, [f"b{i}" for i in range(20)])

    # restarted from its checkpoint: on from where it stopped, up to what exists now, then it ends
    q = run(df, sink, checkpoint)
    q.awaitTermination(180)
    assert q.exception() is None
    expected = sorted([f"a{i}" for i in range(30)] + [f"b{i}" for i in range(20)])
    assert sink.all_rows() == expected
    sink.check_each_row_in_one_batch()
    sink.check_replays_identical()
    assert all(len(rows) <= 7 for rows in sink.batches.values())      # maxMessagesPerTrigger
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    assert progress and json.loads(progress[-1]["sources"][0]["endOffset"]) == {
        f"/topic/{name}": {"0": seqs(url, topic)[-1] + 1}}

    # and again: nothing new, nothing read twice
    before = dict(sink.batches)
    q = run(df, sink, checkpoint)
    q.awaitTermination(120)
    assert sink.batches == before


def test_a_pattern_picks_up_destinations_created_later(spark, impl, spark_broker, name, tmp_path):
    url = spark_broker.url
    send(url, pymq.Topic(f"{name}.a"), ["a0", "a1", "a2"])
    df = stream(spark, impl, url, destinationPattern=f"/topic/{name}.*", startingOffsets="earliest")
    sink = BatchLog()
    run(df, sink, tmp_path / "ck").awaitTermination(120)
    assert sink.all_rows() == ["a0", "a1", "a2"]
    send(url, pymq.Topic(f"{name}.b"), ["b0", "b1"])      # a new destination: read from its start
    send(url, pymq.Topic(f"{name}.a"), ["a3"])
    run(df, sink, tmp_path / "ck").awaitTermination(120)
    assert sink.all_rows() == ["a0", "a1", "a2", "a3", "b0", "b1"]
    sink.check_each_row_in_one_batch()


def test_bytes_per_trigger(spark, impl, spark_broker, name, tmp_path):
    url = spark_broker.url
    send(url, pymq.Topic(name), [pymq.BytesMessage(bytes([i]) * 100) for i in range(12)])
    sink = BatchLog()
    q = run(stream(spark, impl, url, topic=name, startingOffsets="earliest", maxBytesPerTrigger=250), sink,
            tmp_path / "ck")
    q.awaitTermination(180)
    assert q.exception() is None
    assert len(sink.all_rows()) == 12 and len(sink.batches) >= 3
    assert all(len(rows) <= 4 for rows in sink.batches.values())
    sink.check_each_row_in_one_batch()


def test_consume_mode_acknowledges_only_committed_batches(spark, impl, spark_broker, name, tmp_path):
    url, queue = spark_broker.url, pymq.Queue(name)
    send(url, queue, [f"m{i:02d}" for i in range(20)])
    sequence = seqs(url, queue)
    df = stream(spark, impl, url, queue=name, mode="consume", maxMessagesPerTrigger=5)
    checkpoint = tmp_path / "ck"

    # the query dies in the middle of its third micro-batch
    crashing = BatchLog(fail_on=2)
    q = run(df, crashing, checkpoint, available_now=False)
    with pytest.raises(Exception, match="sink crashed in batch 2"):
        q.awaitTermination(180)
    assert crashing.attempts[2] == [[f"m{i:02d}" for i in range(10, 15)]]
    # batches 0 and 1 were committed and acknowledged; the crashed batch and everything after it wait
    assert seqs(url, queue) == sequence[10:]

    # restarted from its checkpoint: the crashed batch again (same messages), then the rest
    sink = BatchLog()
    q = run(df, sink, checkpoint)
    q.awaitTermination(180)
    assert q.exception() is None
    assert sorted(sink.batches) == [2, 3]
    assert sink.batches[2] == crashing.attempts[2][0]
    assert sink.all_rows() == [f"m{i:02d}" for i in range(10, 20)]
    # Spark commits a batch lazily, while planning one with data; the query also acknowledges the batch
    # Spark committed when it asks for the next one, so the last batch does not wait for more messages
    assert seqs(url, queue) == []

    # a query that lost its checkpoint starts at the subscription's cursor: the first unacknowledged
    send(url, queue, ["m20", "m21"])
    lost = BatchLog()
    q = run(df, lost, tmp_path / "new-ck")
    q.awaitTermination(180)
    assert lost.all_rows() == ["m20", "m21"]
    assert texts(url, queue) == []

    # and the original query, restarted, finds nothing it has not already acknowledged or seen acknowledged
    later = BatchLog()
    q = run(df, later, checkpoint)
    q.awaitTermination(180)
    assert q.exception() is None and later.all_rows() == []


def test_consume_mode_on_a_topic_owns_a_durable_subscription(spark, impl, broker_factory, name, tmp_path):
    # a topic without a retained log: its durable subscription holds what the query has not acknowledged
    url, topic = broker_factory().url, pymq.Topic(name)
    df = stream(spark, impl, url, topic=name, mode="consume", subscription="orders-query")
    sink = BatchLog()
    q = run(df, sink, tmp_path / "ck")                  # creates the subscription, reads nothing yet
    q.awaitTermination(120)
    send(url, topic, [f"e{i}" for i in range(6)])
    q = run(df, sink, tmp_path / "ck")
    q.awaitTermination(120)
    assert sink.all_rows() == [f"e{i}" for i in range(6)]
    assert texts(url, topic, subscription="orders-query") == []        # acknowledged once committed
    send(url, topic, ["e6"])
    assert texts(url, topic, subscription="orders-query") == ["e6"]
    q = run(df, sink, tmp_path / "ck")
    q.awaitTermination(120)
    assert sink.all_rows() == [f"e{i}" for i in range(7)]
    assert texts(url, topic, subscription="orders-query") == []


def test_fail_on_data_loss(spark, impl, spark_broker, name, tmp_path):
    url, queue = spark_broker.url, pymq.Queue(name)       # no retention: the range is what waits
    send(url, queue, [f"x{i}" for i in range(6)])
    first = seqs(url, queue)[0]
    with pymq.connect(url) as conn:
        consumer = conn.create_session().create_consumer(queue)
        assert [consumer.receive(5).text for _ in range(2)] == ["x0", "x1"]
        consumer.close()
    starting = json.dumps({f"/queue/{name}": {"0": first}})
    q = run(stream(spark, impl, url, queue=name, startingOffsets=starting), BatchLog(), tmp_path / "a")
    with pytest.raises(Exception, match="were removed"):
        q.awaitTermination(120)
    with pytest.raises(Exception, match="no longer holds them"):
        (spark.read.format(impl.fmt).option("url", url).option("queue", name)
         .option("startingOffsets", starting).load().collect())
    sink = BatchLog()
    q = run(stream(spark, impl, url, queue=name, startingOffsets=starting, failOnDataLoss="false"), sink, tmp_path / "b")
    q.awaitTermination(120)
    assert q.exception() is None and sink.all_rows() == [f"x{i}" for i in range(2, 6)]
