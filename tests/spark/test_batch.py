"""Batch reads and writes through a real SparkSession against a real broker."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import json
import time

import pytest

import pymq
from tests.conftest import wait_for

pytestmark = pytest.mark.spark


def send(url, dest, bodies, **kw):
    with pymq.connect(url) as conn:
        s = conn.create_session(transacted=True)
        p = s.create_producer(dest)
        sent = [p.send(b, **kw) for b in bodies]
        s.commit()
        return sent


def seqs(url, dest, **kw):
    with pymq.connect(url) as conn:
        return [m.sequence for m in conn.create_session().read_range(dest, **kw).messages]


def test_write_then_read_round_trip(spark, impl, spark_broker, name):
    url = spark_broker.url
    rows = [(f"order-{i}", f"c{i % 3}", i % 10, {"n": str(i), "region": "eu" if i % 2 else "us"}, f"corr-{i}")
            for i in range(40)]
    df = spark.createDataFrame(rows, "value string, key string, priority int, properties map<string,string>, "
                                     "correlationId string").repartition(3)
    # found by name, without spark.dataSource.register(): pyspark_pymq exposes DefaultSource
    df.write.format(impl.fmt).option("url", url).option("topic", name).mode("append").save()

    read = (spark.read.format(impl.fmt).option("url", url).option("topic", name)
            .option("includeProperties", "true").option("minPartitions", "4").load())
    assert read.rdd.getNumPartitions() == 4
    got = read.collect()
    assert sorted(r.value.decode() for r in got) == sorted(r[0] for r in rows)
    assert len({r.offset for r in got}) == 40                       # each message once over 4 partitions
    by_value = {r.value.decode(): r for r in got}
    for value, key, prio, props, corr in rows:
        r = by_value[value]
        assert (r.key, r.priority, r.correlationId, r.bodyType) == (key.encode(), prio, corr, "text")
        assert r.properties["n"] == props["n"] and "JMSXGroupID" not in r.properties     # it is the key
        assert (r.destination, r.destinationType, r.partition, r.deliveryMode) == (f"/topic/{name}", "topic", 0, 2)

    # a read DataFrame written elsewhere as it is: bodies, groups, properties and headers travel along
    read.write.format(impl.fmt).option("url", url).option("queue", f"copy.{name}").mode("append").save()
    with pymq.connect(url) as conn:
        copies = {m.text: m for m in conn.create_session().read_range(pymq.Queue(f"copy.{name}")).messages}
    assert sorted(copies) == sorted(r[0] for r in rows)
    for value, key, prio, props, corr in rows:
        m = copies[value]
        assert (m.group_id, m.priority, m.correlation_id, m.properties["region"]) == (key, prio, corr, props["region"])

    # reading never removes: a second read, now with a selector pushed to the broker
    eu = (spark.read.format(impl.fmt).option("url", url).option("topic", name).option("selector", "region = 'eu'")
          .load().selectExpr("cast(value as string) v").collect())
    assert sorted(r.v for r in eu) == sorted(v for v, *_, p, _ in rows if p["region"] == "eu")


def test_offsets_bound_a_batch_read_and_reads_span_destinations(spark, impl, spark_broker, name):
    url = spark_broker.url
    send(url, pymq.Queue(f"log.{name}"), [f"q{i}" for i in range(10)])
    send(url, pymq.Topic(name), [f"t{i}" for i in range(5)])
    q = seqs(url, pymq.Queue(f"log.{name}"))
    starting = json.dumps({f"/queue/log.{name}": {"0": q[3]}, f"/topic/{name}": {"0": -2}})
    ending = json.dumps({f"/queue/log.{name}": {"0": q[7]}})
    df = (spark.read.format(impl.fmt).option("url", url).option("destinations", f"/queue/log.{name},/topic/{name}")
          .option("startingOffsets", starting).option("endingOffsets", ending).load())
    got = sorted((r.destination, r.value.decode()) for r in df.collect())
    assert got == sorted([(f"/queue/log.{name}", f"q{i}") for i in range(3, 7)] +
                         [(f"/topic/{name}", f"t{i}") for i in range(5)])
    # latest as a start reads nothing
    assert spark.read.format(impl.fmt).option("url", url).option("topic", name) \
        .option("startingOffsets", "latest").load().count() == 0
    # a start by time: the first message stamped at or after it, and what follows
    stamped = int(time.time() * 1000)                  # the earlier messages carry this millisecond or earlier
    assert wait_for(lambda: int(time.time() * 1000) > stamped)
    cut = send(url, pymq.Topic(name), ["late-1", "late-2"])[0].timestamp
    late = (spark.read.format(impl.fmt).option("url", url).option("topic", name)
            .option("startingTimestamp", str(cut)).load().selectExpr("cast(value as string) v").collect())
    assert sorted(r.v for r in late) == ["late-1", "late-2"]
    # a pattern is matched against the broker's destinations with the broker's wildcards: '#' takes zero
    # words, so here the topic and not the queue log.<name>
    matched = (spark.read.format(impl.fmt).option("url", url)
               .option("destinationPattern", f"/topic/{name}.#,/queue/{name}.#")
               .load().groupBy("destination").count().collect())
    assert {(r.destination, r["count"]) for r in matched} == {(f"/topic/{name}", 7)}


def test_explicit_registration(spark, spark_broker, name):
    # the Python data source registered by hand under its second name (the session's jar owns "pymq")
    from pyspark_pymq import PymqPythonDataSource
    spark.dataSource.register(PymqPythonDataSource)
    send(spark_broker.url, pymq.Topic(name), ["x", "y"])
    df = spark.read.format("pymq_python").option("url", spark_broker.url).option("topic", name).load()
    assert df.count() == 2
    assert "(Python)" in df._jdf.queryExecution().executedPlan().toString()


def test_filters_pushed_down_give_the_same_rows(spark, impl, spark_broker, name):
    url = spark_broker.url
    send(url, pymq.Topic(name), [pymq.TextMessage(f"m{i}", correlation_id=f"c{i % 4}") for i in range(30)])
    first = seqs(url, pymq.Topic(name))[0]
    where = f"offset >= {first + 5} AND correlationId IN ('c1', 'c2') AND priority = 4"

    def rows(pushdown):
        df = (spark.read.format(impl.fmt).option("url", url).option("topic", name)
              .option("filterPushdown", str(pushdown).lower()).load().where(where))
        plan = df._jdf.queryExecution().optimizedPlan().toString()
        return plan, sorted(r.value.decode() for r in df.collect())

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        pushed_plan, pushed = rows(True)
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    plain_plan, plain = rows(False)
    expected = sorted(f"m{i}" for i in range(5, 30) if i % 4 in (1, 2))
    assert pushed == plain == expected
    # Spark keeps no Filter for what the source took over (the broker's selector and the offset window)
    assert "IN (c1,c2)" in plain_plan and "priority" in plain_plan
    assert "Filter" not in pushed_plan, pushed_plan


def _no_job_started(spark, action):
    sc = spark.sparkContext
    group = "bad-options"
    sc.setJobGroup(group, "options that must be refused before any job")
    try:
        with pytest.raises(Exception) as info:
            action()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert list(sc.statusTracker().getJobIdsForGroup(group)) == []
    return str(info.value)


@pytest.mark.parametrize("options, message", [
    ({"queue": "a", "topic": "b"}, "exactly one of 'queue', 'topic', 'destinations' or 'destinationPattern'"),
    ({"queue": "a", "startingOffset": "earliest"}, "did you mean 'startingOffsets'"),
    ({"queue": "a", "selector": "price >"}, "not a valid JMS selector"),
    ({"queue": "a", "mode": "consume"}, "needs a streaming query"),
    ({"topic": "a"}, "'url' is required"),
])
def test_bad_read_options_are_refused_before_any_job(spark, impl, spark_broker, options, message):
    def load():
        reader = spark.read.format(impl.fmt)
        if "url" not in options and options != {"topic": "a"}:
            reader = reader.option("url", spark_broker.url)
        for k, v in options.items():
            reader = reader.option(k, v)
        reader.load().collect()
    assert message in _no_job_started(spark, load)


def test_bad_writes_are_refused_before_any_job(spark, impl, spark_broker):
    url = spark_broker.url
    df = spark.createDataFrame([("x", 1)], "value string, colour int")
    msg = _no_job_started(spark, lambda: df.write.format(impl.fmt).option("url", url).option("queue", "q")
                          .mode("append").save())
    assert "column 'colour' has no meaning for the pymq sink" in msg
    msg = _no_job_started(spark, lambda: df.select("value").write.format(impl.fmt).option("url", url)
                          .option("queue", "q").mode("overwrite").save())
    assert "append-only" in msg
    msg = _no_job_started(spark, lambda: df.select("value").write.format(impl.fmt).option("url", url)
                          .mode("append").save())
    assert "say where to send" in msg
