"""The sink: rows become messages; with dedup=true, replayed writes are dropped by the broker."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import os

import pytest

import pymq
from tests.spark.test_batch import send
from tests.spark.test_streaming import texts

pytestmark = pytest.mark.spark


def duplicates(broker):
    return broker.call(lambda: broker.broker.duplicates)


def test_columns_become_message_headers(spark, impl, spark_broker, name):
    url = spark_broker.url
    df = spark.createDataFrame(
        [(b"\x00\x01", "/queue/" + name, 9, 60_000, 1, "c-1", "kind", "/queue/replies", "bytes"),
         (b"{\"a\": 2}", "/queue/" + name, None, None, None, None, None, None, "map")],
        "value binary, destination string, priority int, timeToLive long, deliveryMode int, "
        "correlationId string, type string, replyTo string, bodyType string")
    df.coalesce(1).write.format(impl.fmt).option("url", url).option("priority", "3").mode("append").save()
    with pymq.connect(url) as conn:
        got = conn.create_session().read_range(pymq.Queue(name)).messages
    first, second = got
    assert isinstance(first, pymq.BytesMessage) and first.data == b"\x00\x01"
    assert (first.priority, first.delivery_mode, first.correlation_id, first.type) == (9, 1, "c-1", "kind")
    assert first.reply_to == pymq.Queue("replies") and 0 < first.expiration - first.timestamp <= 60_000
    assert isinstance(second, pymq.MapMessage) and second.map == {"a": 2}
    assert (second.priority, second.delivery_mode, second.expiration) == (3, 2, 0)     # option defaults


def test_batch_dedup_drops_a_rerun_and_plain_writes_are_at_least_once(spark, impl, spark_broker, name):
    url = spark_broker.url
    df = spark.range(0, 50, numPartitions=3).selectExpr("cast(id as string) value")

    def write(**options):
        w = df.write.format(impl.fmt).option("url", url).option("queue", name).mode("append")
        for k, v in options.items():
            w = w.option(k, v)
        w.save()

    before = duplicates(spark_broker)
    write(dedup="true", dedupPrefix="nightly-2024-01-01")
    write(dedup="true", dedupPrefix="nightly-2024-01-01")         # the same job again: every row dropped
    assert duplicates(spark_broker) - before == 50
    assert sorted(texts(url, pymq.Queue(name)), key=int) == [str(i) for i in range(50)]
    write()                                                       # without dedup: sent again
    assert len(texts(url, pymq.Queue(name))) == 100


def test_a_replayed_micro_batch_is_dropped_with_dedup(spark, impl, spark_broker, name, tmp_path):
    url = spark_broker.url
    source, target = pymq.Topic(name), pymq.Queue(f"out.{name}")
    send(url, source, [f"o{i}" for i in range(12)])
    checkpoint = tmp_path / "ck"

    def run():
        q = (spark.readStream.format(impl.fmt).option("url", url).option("topic", name)
             .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "5").load()
             .selectExpr("upper(cast(value as string)) as value")
             .writeStream.format(impl.fmt).option("url", url).option("queue", f"out.{name}").option("dedup", "true")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        q.awaitTermination(180)
        assert q.exception() is None
        return q

    run()
    assert sorted(texts(url, target)) == sorted(f"O{i}" for i in range(12))
    # lose the record that the last batch (2, two rows) reached the sink: Spark runs it again on restart,
    # same query id, same batch id, same rows, so the same duplicate-detection ids
    commits = sorted(int(f) for f in os.listdir(checkpoint / "commits") if f.isdigit())
    assert commits == [0, 1, 2]
    os.remove(checkpoint / "commits" / "2")
    if (checkpoint / "commits" / ".2.crc").exists():
        os.remove(checkpoint / "commits" / ".2.crc")          # Spark's checksum of the file
    before = duplicates(spark_broker)
    run()
    assert duplicates(spark_broker) - before == 2
    assert sorted(texts(url, target)) == sorted(f"O{i}" for i in range(12))


def test_a_read_dataframe_written_back_keeps_expiration_and_sends_its_group_once(spark, impl, spark_broker, name):
    url, source = spark_broker.url, pymq.Queue(f"log.{name}")
    with pymq.connect(url) as conn:
        p = conn.create_session().create_producer(source)
        grouped = pymq.TextMessage("g", properties={"region": "eu"})
        grouped.group_id = "customer-1"
        p.send(grouped, time_to_live=3_600_000)
        p.send("forever")
        sent = conn.create_session().read_range(source).messages
    df = (spark.read.format(impl.fmt).option("url", url).option("queue", f"log.{name}")
          .option("includeProperties", "true").load())
    row = {r.value: r for r in df.collect()}[b"g"]
    assert row.properties == {"region": "eu"} and row.key == b"customer-1"
    df.write.format(impl.fmt).option("url", url).option("queue", f"copy.{name}").mode("append").save()
    with pymq.connect(url) as conn:
        copies = {m.text: m for m in conn.create_session().read_range(pymq.Queue(f"copy.{name}")).messages}
    original = {m.text: m for m in sent}
    # the absolute expiry travels (sent as the time left, so within the milliseconds the write took)
    assert abs(copies["g"].expiration - original["g"].expiration) < 60_000
    assert copies["g"].expiration > copies["g"].timestamp
    assert copies["forever"].expiration == 0
    assert copies["g"].group_id == "customer-1" and copies["g"].properties == {"region": "eu",
                                                                               "JMSXGroupID": "customer-1"}


def test_rows_past_one_bulk_frame_arrive_each_once_as_written(spark, impl, spark_broker, name):
    """One task's rows fill several bulk frames (about 8 MiB each) for two destinations, the second starting
    while the first's frame is part full: every row arrives once with its own value and key (the JVM sink
    keeps a sent frame's vectors and its IPC buffer for the next frame: a value of the frame before, an
    offset not reset, a buffer not grown would show here)."""
    from pyspark.sql import functions as F
    url, n = spark_broker.url, 120_000
    df = (spark.range(0, n, numPartitions=1)
          .selectExpr(f"if(id < {n * 3 // 4}, '/queue/{name}.a', '/queue/{name}.b') as destination",
                      "cast(id % 977 as string) as key",
                      "encode(concat(cast(id as string), ':', repeat(char(65 + id % 26), 40 + id % 90)), 'utf-8') "
                      "as value"))
    df.write.format(impl.fmt).option("url", url).mode("append").save()

    def figures(frame):
        return sorted(tuple(r) for r in frame.groupBy("destination").agg(
            F.count("*"), F.sum(F.crc32("value")), F.sum(F.crc32(F.col("key").cast("binary")))).collect())

    read = [spark.read.format(impl.fmt).option("url", url).option("queue", f"{name}.{part}").load()
            .select(F.lit(f"/queue/{name}.{part}").alias("destination"), "value", "key") for part in "ab"]
    assert figures(read[0].unionAll(read[1])) == figures(df)
