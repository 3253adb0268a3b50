"""No silent gaps: messages removed while a query reads, trimmed gaps under a read limit, and consume mode
over an idle queue.  The driver's and the executors' steps are called one at a time against a real broker
(tests/spark/_impls.py: the Python data source's own objects, the JVM source's through py4j), so each case
is exact: the removal happens between two named steps.  Each body runs against both implementations."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

import pymq
from pymq.errors import DataLoss
from pyspark_pymq._plan import from_offset, to_offset
from tests.spark.test_batch import send, seqs

pytestmark = pytest.mark.spark


def remove_below(url: str, queue: pymq.Queue, seq: int) -> None:
    """Another owner of the queue takes everything below ``seq`` (acknowledged, with a receipt)."""
    with pymq.connect(url) as conn:
        conn.create_session().ack_upto(queue, seq)


@pytest.mark.parametrize("fail", [True, False])
def test_messages_removed_while_a_partition_is_read_fail_the_read(impl, spark_broker, name, fail):
    url, queue = spark_broker.url, pymq.Queue(name)        # no retention: a browse reads what waits
    send(url, queue, [f"x{i:02d}" for i in range(30)])
    s = seqs(url, queue)
    part = impl.partition(url, f"/queue/{name}", s[0], s[-1] + 1, fetch_size=10, check_loss=fail)
    # one fetch at a time, so the removal falls exactly between two fetches (the pipelined read: below)
    with impl.fetches_in_flight(1):
        batches = impl.batches(part)
        assert next(batches)[-1] == "x09"
        remove_below(url, queue, s[20])                     # x10..x19 go while the task is between fetches
        if fail:
            with pytest.raises(DataLoss, match=r"no longer holds them") as err:
                next(batches)
            assert (err.value.requested, err.value.earliest) == (s[10], s[20])
        else:
            assert [v for b in batches for v in b] == [f"x{i:02d}" for i in range(20, 30)]


def test_a_single_message_removed_while_a_partition_is_read_fails_the_read(impl, spark_broker, name):
    """The smallest gap (issue 31): one message, the very next the task would read, gone between two fetches."""
    url, queue = spark_broker.url, pymq.Queue(name)
    send(url, queue, [f"x{i:02d}" for i in range(20)])
    s = seqs(url, queue)
    part = impl.partition(url, f"/queue/{name}", s[0], s[-1] + 1, fetch_size=10, check_loss=True)
    with impl.fetches_in_flight(1):
        batches = impl.batches(part)
        assert next(batches)[-1] == "x09"
        remove_below(url, queue, s[11])                     # x10 alone goes
        with pytest.raises(DataLoss, match=r"no longer holds them") as err:
            next(batches)
        assert (err.value.requested, err.value.earliest) == (s[10], s[11])


def test_a_single_message_removed_before_a_trigger_fails_its_planning(impl, spark_broker, name):
    url, queue = spark_broker.url, pymq.Queue(name)
    send(url, queue, ["a", "b", "c"])
    s = seqs(url, queue)
    remove_below(url, queue, s[1])                          # "a" alone goes
    with pytest.raises(DataLoss, match="were removed") as err:
        impl.reader(url, queue=name).latestOffset(to_offset({f"/queue/{name}": s[0]}), ReadAllAvailable())
    assert (err.value.requested, err.value.earliest) == (s[0], s[1])
    # and no gap, no error: planned from where the messages are
    end = impl.reader(url, queue=name).latestOffset(to_offset({f"/queue/{name}": s[1]}), ReadAllAvailable())
    assert from_offset(end) == {f"/queue/{name}": s[2] + 1}


def test_a_pipelined_read_reports_messages_removed_before_it_asked_for_them(impl, spark_broker, name):
    """With fetches asked ahead, a window asked before the removal may still bring its rows (they were
    read, so nothing is lost); any window asked after it reports the loss: the rows before the error are a
    prefix of the range, never a row from behind the gap."""
    url, queue = spark_broker.url, pymq.Queue(name)
    send(url, queue, [f"x{i:02d}" for i in range(40)])
    s = seqs(url, queue)
    part = impl.partition(url, f"/queue/{name}", s[0], s[-1] + 1, fetch_size=10, check_loss=True)
    with impl.fetches_in_flight(2):
        batches = impl.batches(part)
        seen = list(next(batches))
        remove_below(url, queue, s[30])                     # x10..x29 go while later windows are in flight
        with pytest.raises(DataLoss, match=r"no longer holds them") as err:
            for batch in batches:
                seen += batch
    assert seen in ([f"x{i:02d}" for i in range(10)], [f"x{i:02d}" for i in range(20)])
    assert (err.value.requested, err.value.earliest) == (s[len(seen)], s[30])


def test_a_trimmed_gap_under_a_read_limit_plans_batches_of_what_is_left(impl, spark_broker, name):
    url, queue = spark_broker.url, pymq.Queue(name)
    send(url, queue, [f"y{i:02d}" for i in range(30)])
    s = seqs(url, queue)
    r = impl.reader(url, queue=name, failOnDataLoss="false", maxMessagesPerTrigger="5")
    start = to_offset({f"/queue/{name}": s[0]})
    remove_below(url, queue, s[20])                         # the query's next 20 messages are gone
    end = r.latestOffset(start, ReadMaxRows(5))
    # counted from where the messages start again, not from the old position inside the gap
    assert from_offset(end) == {f"/queue/{name}": s[25]}
    parts = r.partitions(start, end)
    assert impl.values(parts) == [f"y{i:02d}" for i in range(20, 25)]
    assert all(p.start >= s[20] for p in parts)             # no partition planned inside the gap

    # producers adding more than the limit per trigger while the gap is trimmed again: still progress
    remove_below(url, queue, s[28])
    send(url, queue, [f"z{i}" for i in range(10)])
    following = r.latestOffset(end, ReadMaxRows(5))
    assert impl.values(r.partitions(end, following)) == ["y28", "y29", "z0", "z1", "z2"]


def test_fail_on_data_loss_is_checked_when_a_trigger_is_planned(impl, spark_broker, name):
    url, queue = spark_broker.url, pymq.Queue(name)
    send(url, queue, ["a", "b", "c"])
    s = seqs(url, queue)
    remove_below(url, queue, s[1])
    with pytest.raises(DataLoss, match="were removed"):
        impl.reader(url, queue=name).latestOffset(to_offset({f"/queue/{name}": s[0]}), ReadAllAvailable())


def test_consume_mode_acknowledges_the_committed_batch_while_the_queue_is_idle(impl, spark_broker, name):
    url, queue = spark_broker.url, pymq.Queue(name)
    send(url, queue, ["m0", "m1", "m2"])
    r = impl.reader(url, queue=name, mode="consume")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    assert impl.values(r.partitions(start, end)) == ["m0", "m1", "m2"]
    assert seqs(url, queue) != []                   # read, not acknowledged: the batch is not committed yet
    # Spark committed the batch and asks for the next one from its end; nothing new arrives, so it plans
    # no batch and never calls commit(end) (commit is lazy): the start alone must acknowledge
    assert r.latestOffset(end, ReadAllAvailable()) == end
    assert seqs(url, queue) == []
    r.stop()


def test_a_topic_without_retention_is_refused_at_start_with_the_reason(impl, broker_factory, name):
    from pymq.errors import ConfigError
    url = broker_factory(retention={"/topic/kept.*": {"ms": 60_000}}).url
    with pymq.connect(url) as conn:
        conn.create_session().create_producer(pymq.Topic(name)).send("gone at once: no log, no subscriber")
    for make in (lambda: impl.reader(url, topic=name).initialOffset(), lambda: impl.batch(url, topic=name)):
        with pytest.raises(ConfigError, match=f"/topic/{name} keeps no retained log.*'subscription'"):
            make()
    # a durable subscription of it is readable; a pattern leaves such a topic out and reads the others
    assert list(impl.reader(url, topic=name, subscription="s1").initialOffset()) == [f"/topic/{name}"]
    with pymq.connect(url) as conn:
        conn.create_session().create_producer(pymq.Topic(f"kept.{name}")).send("kept")
    with pytest.raises(ConfigError, match="not a glob"):             # destinationPattern was a glob before
        impl.reader(url, destinationPattern="/topic/kept*")
    r = impl.reader(url, destinationPattern="/topic/#", startingOffsets="earliest")      # every topic
    start = r.initialOffset()
    assert f"/topic/kept.{name}" in from_offset(start) and f"/topic/{name}" not in from_offset(start)


def test_a_consuming_query_shows_its_lag_in_the_broker_metrics(impl, spark_broker, name):
    from pymq_server.admin.ops import queue_metrics
    url, queue = spark_broker.url, pymq.Queue(name)
    send(url, queue, ["m0", "m1", "m2"])
    r = impl.reader(url, queue=name, mode="consume")
    start = r.initialOffset()

    def figures():
        return spark_broker.call(lambda: queue_metrics(spark_broker.broker.get_queue(name), 0.0))

    assert figures()["acked_upto"] == 0 and figures()["lag_s"] >= 0 and figures()["ready"] == 3
    end = r.latestOffset(start, ReadAllAvailable())
    r.commit(end)
    after = figures()
    assert after["acked_upto"] == from_offset(end)[f"/queue/{name}"] and after["ready"] == 0
    assert after["lag_s"] == 0.0
    r.stop()
