"""Real-time mode (Spark 4.1+, ``trigger(realTime=...)``) with the JVM source: a task per destination reads
messages as they arrive for the length of a batch, and the batch's end offset is where the tasks stopped, so
a restarted query goes on from there (the Python data source has no real-time mode: PySpark's Python
sources are micro-batch only)."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import json
from collections import Counter
from pathlib import Path

import pytest

import pymq
from tests.conftest import wait_for
from tests.spark.test_batch import send, seqs

pytestmark = pytest.mark.spark


def committed_offsets(checkpoint: Path, dest: str) -> int | None:
    """The next sequence number of ``dest`` in the checkpoint's last committed batch (its offsets entry
    with a commit entry), or None before any commit: where a restarted query goes on."""
    done = checkpoint / "commits"
    commits = [int(p.name) for p in done.glob("[0-9]*")] if done.is_dir() else []
    if not commits:
        return None
    for line in (checkpoint / "offsets" / str(max(commits))).read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and dest in entry:
            return int(entry[dest]["0"])
    raise AssertionError(f"no offset of {dest} in batch {max(commits)} of {checkpoint}")


def test_real_time_mode_reads_messages_as_they_come_and_commits_where_it_stopped(spark, jvm_source, spark_broker,
                                                                                  name, tmp_path):
    """Exactly-once by ids: what a sink publishes per (epoch, partition) when its task ends well holds every
    message once, across a stop in the middle of a batch and a restart from the checkpoint; what a sink that
    writes as rows come sees holds again only messages past the last committed offset (a stopped batch is
    read again from there: Spark's foreach sink is at-least-once, spec/spark.md §1)."""
    from tests.spark._spark import need_jvm_source
    need_jvm_source(*jvm_source)
    url, topic, dest = spark_broker.url, pymq.Topic(name), f"/topic/{name}"
    jvm = spark._jvm
    rows = jvm.io.pymq.spark.EpochRows
    checkpoint = tmp_path / "ck"
    spark.conf.set("spark.sql.streaming.realTimeMode.minBatchDuration", "1s")

    def start():
        df = (spark.readStream.format("pymq").option("url", url).option("topic", name)
              .option("startingOffsets", "earliest").load().selectExpr("CAST(value AS STRING) AS id"))
        return (df._jdf.writeStream().foreach(jvm.io.pymq.spark.EpochRows()).outputMode("update")
                .option("checkpointLocation", str(checkpoint))
                .trigger(jvm.org.apache.spark.sql.streaming.Trigger.RealTime("2 seconds")).start())

    def handed() -> list[str]:
        return list(rows.handed())

    rows.reset()
    sent: list[str] = []
    query = start()
    try:
        sent += [f"a{i}" for i in range(20)]
        send(url, topic, sent[-20:])
        assert wait_for(lambda: len(handed()) >= 20, timeout=120)
        sent += [f"b{i}" for i in range(5)]
        send(url, topic, sent[-5:])                          # while the same batch still runs
        assert wait_for(lambda: len(handed()) >= 25, timeout=120)
        # a batch ends after its duration and commits where its task stopped: one past the last message
        last = seqs(url, topic)[-1]
        assert wait_for(lambda: committed_offsets(checkpoint, dest) == last + 1, timeout=120)
        assert Counter(handed()) == Counter(sent)
        # the commit boundary: a message handed to the sink by a batch that the stop cuts short
        sent.append("m0")
        send(url, topic, ["m0"])
        assert wait_for(lambda: "m0" in handed(), timeout=120)
    finally:
        query.stop()
    m0 = seqs(url, topic)[-1]
    at_stop = committed_offsets(checkpoint, dest)
    assert at_stop in (m0, m0 + 1)                    # below m0, or past it when its batch ended first
    # restarted from the checkpoint: from the last committed offset, then what came while it was stopped
    sent += ["c0", "c1"]
    send(url, topic, ["c0", "c1"])
    last = seqs(url, topic)[-1]
    query = start()
    try:
        assert wait_for(lambda: Counter(rows.published()) == Counter(sent), timeout=120), (
            sorted(rows.published()), sorted(sent))
        assert wait_for(lambda: committed_offsets(checkpoint, dest) == last + 1, timeout=120)
    finally:
        query.stop()
    # exactly once by ids in what was published; read again only past the committed offset
    assert sorted(rows.published()) == sorted(sent)
    again = {i for i, n in Counter(handed()).items() if n > 1}
    assert again <= {"m0", "c0", "c1"}, again
    assert set(handed()) == set(sent)
    if at_stop == m0:
        assert "m0" in again                          # its batch never committed: read again, published once
    else:
        assert "m0" not in again
