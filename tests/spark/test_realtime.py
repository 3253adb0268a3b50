"""Real-time mode (Spark 4.1+, ``trigger(realTime=...)``) with the JVM source: a task per destination reads
messages as they arrive for the length of a batch, and the batch's end offset is where the tasks stopped, so
a restarted query goes on from there (the Python data source has no real-time mode: PySpark's Python
sources are micro-batch only)."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import json

import pytest

import pymq
from tests.conftest import wait_for
from tests.spark.test_batch import send, seqs

pytestmark = pytest.mark.spark


def test_real_time_mode_reads_messages_as_they_come_and_commits_where_it_stopped(spark, jvm_source, spark_broker,
                                                                                  name, tmp_path):
    from tests.spark._spark import need_jvm_source
    need_jvm_source(*jvm_source)
    url, topic = spark_broker.url, pymq.Topic(name)
    jvm = spark._jvm
    probe = jvm.io.pymq.spark.LatencyProbe
    spark.conf.set("spark.sql.streaming.realTimeMode.minBatchDuration", "1s")

    def start():
        df = (spark.readStream.format("pymq").option("url", url).option("topic", name)
              .option("startingOffsets", "earliest").load().select("timestamp"))
        return (df._jdf.writeStream().foreach(jvm.io.pymq.spark.LatencyProbe()).outputMode("update")
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(jvm.org.apache.spark.sql.streaming.Trigger.RealTime("2 seconds")).start())

    probe.reset()
    query = start()
    try:
        send(url, topic, [f"a{i}" for i in range(20)])
        assert wait_for(lambda: probe.count() >= 20, timeout=120)
        send(url, topic, [f"b{i}" for i in range(5)])              # while the same batch still runs
        assert wait_for(lambda: probe.count() >= 25, timeout=120)
        # a batch ends after its duration and commits where its task stopped: one past the last message
        last = seqs(url, topic)[-1]

        def committed() -> bool:
            progress = query.lastProgress()
            if progress is None:
                return False
            end = json.loads(progress.sources()[0].endOffset())
            return end == {f"/topic/{name}": {"0": last + 1}}
        assert wait_for(committed, timeout=120)
    finally:
        query.stop()
    assert probe.count() == 25
    # restarted from the checkpoint: nothing again, then what came while it was stopped
    send(url, topic, ["c0", "c1"])
    query = start()
    try:
        assert wait_for(lambda: probe.count() >= 27, timeout=120)
    finally:
        query.stop()
    assert probe.count() == 27
