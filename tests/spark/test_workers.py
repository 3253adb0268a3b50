"""A read of many destinations of a broker running several workers (spec/cores.md) is served by every
worker: the JVM source plans each task with the worker that owns its destination (spec/spark.md §2,
owners) and the task connects there, so nothing is forwarded between workers. The owner follows the rule
the broker's data directory keeps (CONNECTED's ``pymq-placement``): numbered, or the hash alone for a
directory written before the numbered rule."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import json

import pytest

import pymq
from pymq.destination import as_destination
from tests.spark.test_batch import send

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("placement", ["numbered", "hash"])
def test_each_task_reads_from_the_worker_that_owns_its_destination(spark, jvm_source, tmp_path, placement):
    from pymq.routing import GroupRouter
    from tests.conftest import RawStomp
    from tests.cores.conftest import spec_owner, start_broker, stop_broker
    from tests.spark._impls import JvmImpl
    from tests.spark._spark import need_jvm_source
    need_jvm_source(*jvm_source)
    data = tmp_path / "data"
    if placement == "hash":     # a data directory written before the numbered rule
        data.mkdir()
        (data / "cores.json").write_text(json.dumps({"workers": 2}))
    router = GroupRouter(["w0", "w1"])
    cluster = start_broker(str(data))
    try:
        url = f"stomp://127.0.0.1:{cluster.port}"
        # CONNECTED says the home worker and how many there are (what the owner rule needs)
        c = RawStomp(cluster.port)
        frame = c.connect()
        c.sock.close()
        assert frame.headers["pymq-worker"] in ("0", "1") and frame.headers["pymq-workers"] == "2"
        assert frame.headers["pymq-placement"] == placement     # and which owner rule
        owner = {}
        i = 0
        while len(owner) < 6:                      # three queues owned by each worker
            name = f"/queue/spread.{i}"
            # spec/cores.md §2: numbered names round-robin, or every name hashed whole
            w = spec_owner(name) if placement == "numbered" else int(router.route(name)[1:])
            if sum(1 for v in owner.values() if v == w) < 3:
                owner[name] = w
            i += 1
        for q in owner:
            send(url, as_destination(q), [f"{q}#{k}" for k in range(4)])
        impl = JvmImpl(spark)
        parts = impl.batch(url, destinations=",".join(owner), minPartitions="1")
        assert {p.destination: p.worker for p in parts} == owner
        got = []
        for p in parts:
            got += impl.values([p])
            assert p.connected_worker == owner[p.destination], p.destination   # connected to the owner
        assert sorted(got) == sorted(f"{q}#{k}" for q in owner for k in range(4))
        # and through Spark, the same rows
        df = spark.read.format(impl.fmt).option("url", url).option("destinations", ",".join(owner)).load()
        assert sorted(r.v for r in df.selectExpr("cast(value as string) v").collect()) == sorted(got)
    finally:
        stop_broker(cluster)
