"""The JVM source cuts a read by bytes, not by message counts (spec/spark.md §2, split by bytes): a topic of
eight 1 MiB messages then 800 small ones, read by two partitions, ends the first piece at the message whose
bytes reach half of all the bytes, the fifth large one (by width the first piece would take all eight and
396 small ones)."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import pytest

import pymq
from tests.spark.test_batch import send, seqs

pytestmark = pytest.mark.spark


def test_a_read_is_split_by_bytes(spark, jvm_source, spark_broker, name):
    from tests.spark._impls import JvmImpl
    from tests.spark._spark import need_jvm_source
    need_jvm_source(*jvm_source)
    url, topic = spark_broker.url, pymq.Topic(name)
    send(url, topic, [pymq.BytesMessage(bytes([i]) * (1 << 20)) for i in range(8)])
    send(url, topic, [f"s{i:03d}" for i in range(800)])
    s = seqs(url, topic)
    impl = JvmImpl(spark)
    parts = impl.batch(url, topic=name, minPartitions="2")
    assert [(p.start, p.end) for p in parts] == [(s[0], s[5]), (s[5], s[-1] + 1)]
    got = impl.values(parts)
    assert len(got) == 808 and sorted(v for v in got if v.startswith("s")) == [f"s{i:03d}" for i in range(800)]
    df = spark.read.format(impl.fmt).option("url", url).option("topic", name).option("minPartitions", "2").load()
    assert df.count() == 808
    assert df.selectExpr("sum(length(value))").first()[0] == 8 * (1 << 20) + 800 * 4
