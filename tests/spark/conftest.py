"""Fixtures of the Spark connector suite: one local SparkSession for the whole run, one broker.

Starting a JVM costs seconds and the first Python data source query a few more, so the session is
shared by every test (``local[2]``, UI off, two shuffle partitions) and so is the broker (its
destinations are named per test).  Spark's Python workers run this interpreter (``PYSPARK_PYTHON``), and
the repository root is on their ``PYTHONPATH``: that is where an installed pymq puts ``pyspark_pymq``,
and what lets Spark find the ``pymq`` format without a ``register()`` call (an editable install hides
top-level modules from ``pkgutil.iter_modules``, which Spark's lookup uses).
"""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import RunningBroker

ROOT = str(Path(__file__).resolve().parents[2])

RETENTION = {"/topic/*": {"ms": 3_600_000}, "/queue/log.*": {"ms": 3_600_000}}


@pytest.fixture(scope="session")
def jvm_source():
    """(jar, why not): the JVM source's jar, built if needed (once per run)."""
    from tests.spark._spark import jvm_jar
    return jvm_jar()


@pytest.fixture(scope="session")
def spark(jvm_source):
    from tests.spark._spark import need_spark
    need_spark()
    # the workers run this interpreter, with the installed pyspark rather than Spark's pyspark.zip: a worker
    # then starts in a third of the time, well inside Spark's fixed 10 s wait for a streaming source's worker
    # (tests/spark/worker_python.sh)
    os.environ["PYMQ_WORKER_PYTHON"] = sys.executable
    os.environ["PYSPARK_PYTHON"] = str(Path(__file__).with_name("worker_python.sh"))
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *paths])
    from pyspark.sql import SparkSession
    builder = SparkSession.builder
    if jvm_source[0] is not None:
        # the JVM source's jar: format("pymq") is the JVM source in this session; the Python one is
        # registered below as pymq_python, so each test runs against both (tests/spark/_impls.py)
        builder = builder.config("spark.jars", jvm_source[0])
    session = (builder.master("local[2]").appName("pymq-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               # a loaded machine starts Python workers slowly: their authentication handshake may take 120 s, not
               # 15 (Spark's own 10 s wait for the worker's connection cannot be configured)
               .config("spark.python.authenticate.socketTimeout", "120s")
               .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    from pyspark_pymq import PymqPythonDataSource
    session.dataSource.register(PymqPythonDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_broker(tmp_path_factory):
    """A broker shared by the Spark tests: topics and ``/queue/log.*`` keep a retained log."""
    from pymq_server.config import BrokerConfig
    data = tmp_path_factory.mktemp("spark-broker")
    rb = RunningBroker(BrokerConfig.from_dict(dict(host="127.0.0.1", port=0, data_dir=str(data),
                                                   retention=RETENTION, sync_policy="never")))
    yield rb
    rb.stop()


@pytest.fixture
def name():
    """A destination name no other test uses."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture(params=["python", "jvm"])
def impl(request, spark, jvm_source):
    """Each implementation of the format in turn (tests/spark/_impls.py)."""
    from tests.spark._impls import JvmImpl, PythonImpl
    if request.param == "python":
        return PythonImpl()
    from tests.spark._spark import need_jvm_source
    need_jvm_source(*jvm_source)
    return JvmImpl(spark)
