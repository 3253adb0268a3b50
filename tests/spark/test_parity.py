"""What Spark's Kafka connector offers and pymq's does too: starting and ending by timestamp, a minimum per
trigger with a maximum delay, fetch retries, the timestampType column, a ``topic`` column in the sink,
every ``pymq.*`` connection option, and the latest offset in a query's progress.  Each body runs against
both implementations (tests/spark/_impls.py)."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import json
import socket
import threading
import time

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

import pymq
from pymq.errors import ConnectionClosed
from pyspark_pymq._plan import from_offset
from tests.conftest import wait_for
from tests.spark.test_batch import seqs

pytestmark = pytest.mark.spark


def test_starting_and_ending_by_timestamp(impl, spark_broker, name):
    def batch(url: str, **options) -> list[str]:
        return impl.values(impl.batch(url, **options))

    url = spark_broker.url
    a, b = pymq.Topic(f"{name}.a"), pymq.Topic(f"{name}.b")
    stamps = {}
    with pymq.connect(url) as conn:
        p = conn.create_session().create_producer()
        for i in range(6):
            for dest in (a, b):
                sent = p.send(f"{dest.name[-1]}{i}", dest)
                stamps[f"{dest.name[-1]}{i}"] = sent.timestamp
            stamped = int(time.time() * 1000)     # the round's messages carry this millisecond or earlier
            assert wait_for(lambda: int(time.time() * 1000) > stamped)      # distinct milliseconds per round
    both = f"/topic/{name}.a,/topic/{name}.b"
    t2, t4 = stamps["a2"], stamps["a4"]
    assert t2 < t4 and stamps["a3"] > t2
    # every destination from its first message stamped at or after the time
    assert sorted(batch(url, destinations=both, startingTimestamp=str(t4))) == ["a4", "a5", "b4", "b5"]
    # per destination; one left out starts at its earliest message
    by_ts = json.dumps({f"/topic/{name}.a": {"0": t4}})
    assert sorted(batch(url, destinations=both, startingOffsetsByTimestamp=by_ts)) == \
        sorted(["a4", "a5"] + [f"b{i}" for i in range(6)])
    # endings are exclusive: up to the first message stamped at or after the time
    assert sorted(batch(url, destinations=both, endingTimestamp=str(t2))) == ["a0", "a1", "b0", "b1"]
    ends = json.dumps({f"/topic/{name}.b": {"0": t2}})
    assert sorted(batch(url, destinations=both, endingOffsetsByTimestamp=ends, startingTimestamp=str(t4))) == \
        ["a4", "a5"]
    # a time after every message: nothing (the start is where the next message will be)
    assert batch(url, topic=f"{name}.a", startingTimestamp=str(stamps["a5"] + 60_000)) == []


def test_min_messages_per_trigger_waits_until_max_trigger_delay(impl, spark_broker, name):
    url, queue = spark_broker.url, pymq.Queue(f"log.{name}")
    r = impl.reader(url, queue=f"log.{name}", startingOffsets="earliest", minOffsetsPerTrigger="5",
                    maxTriggerDelay="400ms")
    start = r.initialOffset()
    # no micro-batch planned yet: the first trigger fires with what there is (Kafka's rule)
    assert r.latestOffset(start, ReadAllAvailable()) == start
    with pymq.connect(url) as conn:
        p = conn.create_session().create_producer(queue)
        for i in range(3):
            p.send(f"m{i}")
    held = time.monotonic()
    assert r.latestOffset(start, ReadAllAvailable()) == start          # 3 < 5: held back
    while time.monotonic() - held < 0.5:        # the trigger's delay running out is the behaviour tested
        time.sleep(0.05)
    end = r.latestOffset(start, ReadAllAvailable())                    # the delay passed: fires with 3
    assert impl.values(r.partitions(start, end)) == ["m0", "m1", "m2"]
    with pymq.connect(url) as conn:
        p = conn.create_session().create_producer(queue)
        for i in range(3, 9):
            p.send(f"m{i}")
    following = r.latestOffset(end, ReadAllAvailable())                # 6 >= 5: at once
    assert impl.values(r.partitions(end, following)) == [f"m{i}" for i in range(3, 9)]
    r.stop()


class CuttingProxy:
    """A TCP proxy to the broker whose connections can all be cut at once (a broker or network failure)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self.lock:
            doomed, self.sockets = self.sockets, []
        for s in doomed:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.server.close()
        self.cut()


@pytest.mark.parametrize("retries", [0, 2])
def test_a_fetch_that_loses_its_connection_is_retried_from_its_cursor(impl, spark_broker, name, retries):
    url, queue = spark_broker.url, pymq.Queue(f"log.{name}")
    with pymq.connect(url) as conn:
        s = conn.create_session(transacted=True)
        p = s.create_producer(queue)
        for i in range(100):
            p.send(f"r{i:02d}")
        s.commit()
    s = seqs(url, queue)
    proxy = CuttingProxy(spark_broker.port)
    try:
        part, = impl.batch(f"stomp://127.0.0.1:{proxy.port}", queue=f"log.{name}", fetchSize="10",
                           fetchRetries=str(retries), fetchRetryIntervalMs="0", minPartitions="1")
        assert (part.start, part.end, part.retries) == (s[0], s[-1] + 1, retries)
        batches = impl.batches(part)
        got = list(next(batches))
        proxy.cut()                                             # between two fetches of one task
        if retries == 0:
            # the fetches already answered may still come out (two are in flight), then the first one
            # over the cut connection fails: ten fetches, so one always does
            with pytest.raises(ConnectionClosed):
                for _ in batches:
                    pass
            return
        got += [v for b in batches for v in b]
        assert got == [f"r{i:02d}" for i in range(100)]     # nothing skipped or repeated
    finally:
        proxy.close()


def test_the_driver_retries_planning_when_its_connection_fails(impl, spark_broker, name):
    url, queue = spark_broker.url, pymq.Queue(f"log.{name}")
    with pymq.connect(url) as conn:
        conn.create_session().create_producer(queue).send("one")
    proxy = CuttingProxy(spark_broker.port)
    try:
        r = impl.reader(f"stomp://127.0.0.1:{proxy.port}", queue=f"log.{name}", startingOffsets="earliest",
                        fetchRetryIntervalMs="0")
        start = r.initialOffset()
        proxy.cut()
        end = r.latestOffset(start, ReadAllAvailable())
        assert impl.values(r.partitions(start, end)) == ["one"]
        r.stop()
    finally:
        proxy.close()


def test_timestamp_type_topic_column_and_latest_offset_in_progress(spark, impl, spark_broker, name, tmp_path):
    url = spark_broker.url
    rows = [("k1", "v1", name), ("k2", "v2", f"/topic/{name}")]
    (spark.createDataFrame(rows, "key string, value string, topic string").coalesce(1)
     .write.format(impl.fmt).option("url", url).mode("append").save())
    df = spark.read.format(impl.fmt).option("url", url).option("topic", name).load()
    got = df.selectExpr("cast(value as string) v", "timestampType").collect()
    assert sorted((r.v, r.timestampType) for r in got) == [("v1", 0), ("v2", 0)]

    q = (spark.readStream.format(impl.fmt).option("url", url).option("topic", name)
         .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "1").load()
         .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    assert len(progress) == 2
    source = progress[0]["sources"][0]
    # the broker's latest (what the query could read) next to where the batch ended: the lag
    latest = seqs(url, pymq.Topic(name))[-1] + 1
    assert json.loads(source["latestOffset"]) == {f"/topic/{name}": {"0": latest}}
    assert from_offset(json.loads(source["endOffset"])) == {f"/topic/{name}": latest - 1}


def test_tls_urls_and_tls_options_pass_through(impl, spark_broker, tmp_path, name):
    """A stomps:// broker (a TLS proxy with a CA made here) read from a task, the CA given as an option."""
    from tests.client.tls import Authority, TlsProxy
    authority = Authority(tmp_path)
    proxy = TlsProxy(authority.issue("server", dns=("localhost",)), spark_broker.port)
    try:
        url = f"stomps://localhost:{proxy.port}"
        with pymq.connect(spark_broker.url) as conn:
            conn.create_session().create_producer(pymq.Queue(f"log.tls-{name}")).send("secret")
        assert impl.values(impl.batch(url, queue=f"log.tls-{name}", **{"pymq.tls.ca_file": str(authority.ca_file)})) \
            == ["secret"]
        # without the CA the broker's certificate is not trusted: the connection is refused
        with pytest.raises(Exception):
            impl.values(impl.batch(url, queue=f"log.tls-{name}", fetchRetries="0"))
    finally:
        proxy.close()


def test_tls_options_are_checked(spark_broker, tmp_path):
    from pymq.errors import ConfigError
    from pyspark_pymq._options import ConnectionOptions
    options = ConnectionOptions.parse({"url": "stomps://localhost:1", "pymq.tls.caFile": "/ca.pem",
                                       "pymq.tls.verify": "true"})
    assert dict(options.get("tls")) == {"ca_file": "/ca.pem", "verify": True}
    for bad, words in [({"pymq.tls.caFile": "x"}, "need a TLS URL"), ({"pymq.tls.cafle": "x"}, "unknown TLS option"),
                       ({"pymq.tls": "x"}, "one by one"), ({"pymq.tls.verify": "maybe"}, "true or false")]:
        with pytest.raises(ConfigError, match=words):
            plain = "pymq.tls.caFile" in bad
            ConnectionOptions.parse({"url": "stomp://h:1" if plain else "stomps://h:1", **bad})
    with pytest.raises(ConfigError, match="vm://"):
        ConnectionOptions.parse({"url": "vm://x"})
    with pytest.raises(ConfigError, match="option 'url'"):
        ConnectionOptions.parse({"url": "stomps://h:1?nope=1"})
