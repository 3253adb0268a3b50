"""Spark finds the ``pymq`` format by name, however pymq was installed (an editable install included)."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.spark._spark import need_spark

need_spark()

import pytest

pytestmark = pytest.mark.spark

# Spark's own lookup (pyspark.sql.worker.lookup_data_sources._main), run in a fresh interpreter that sees
# only the installation: no PYTHONPATH, and a working directory outside the repository
LOOKUP = """
import io, struct
from pyspark.sql.worker.lookup_data_sources import _main
out = io.BytesIO()
_main(io.BytesIO(), out)
data = out.getvalue()
count = struct.unpack(">i", data[:4])[0]
names, at = [], 4
for _ in range(count):
    size = struct.unpack(">i", data[at:at + 4])[0]
    names.append(data[at + 4:at + 4 + size].decode())
    at += 4 + size
    at += 4 + struct.unpack(">i", data[at:at + 4])[0]      # the pickled class
print(",".join(names))
"""


def test_spark_lookup_finds_the_pymq_format_in_this_installation(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", LOOKUP], check=False, cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "pymq" in done.stdout.strip().split(","), (
        "Spark's data source lookup does not list pyspark_pymq in this installation; an editable install "
        "made before setup.py gained its lookup hook needs `pip install -e .` again")


TABLE_CLASS = """
import os, sys
from pyspark.sql import SparkSession
builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
if len(sys.argv) > 1:
    builder = builder.config("spark.jars", sys.argv[1])
spark = builder.getOrCreate()
df = spark.read.format("pymq").option("url", "stomp://127.0.0.1:9").option("topic", "t").load()
print(df._jdf.queryExecution().analyzed().table().getClass().getName())
spark.stop()
"""


def test_configuration_alone_chooses_the_implementation(spark, jvm_source, tmp_path):
    """format("pymq") is the JVM source when its jar is on Spark's classpath and the Python data source
    otherwise: nothing in the code changes, only spark.jars."""
    from tests.spark._spark import need_jvm_source
    need_jvm_source(*jvm_source)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}

    def table_class(*args: str) -> str:
        done = subprocess.run([sys.executable, "-c", TABLE_CLASS, *args], check=False, cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    assert table_class() == "org.apache.spark.sql.execution.datasources.v2.python.PythonTable"
    assert table_class(jvm_source[0]) == "io.pymq.spark.PymqSource$PymqTable"


def test_the_suite_s_python_workers_import_the_installed_pyspark(spark):
    """tests/spark/worker_python.sh: the workers import the installed pyspark (with its bytecode cache), not
    Spark's pyspark.zip, which they would compile again at each start (a streaming source's worker has a fixed
    10 s to connect back)."""
    def where(_):
        import sys

        import pyspark
        return [(pyspark.__file__, [p for p in sys.path if p.endswith(("pyspark.zip", "src.zip"))])]

    [(module, zips)] = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert ".zip" not in module and zips == [], (module, zips)
