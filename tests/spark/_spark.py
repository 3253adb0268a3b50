"""What the Spark suite needs (pyspark >= 4.2, pyarrow, a Java runtime) and what a missing piece means.

The rule is the one of ``tests/storage/services.py``: a skip that says how to get the piece, except
under CI (``CI`` set), where it is a failure, so CI never goes green without having run the connector.
Call :func:`need_spark` at the top of a test module, before importing pyspark.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.storage.services import in_ci

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "bindings" / "spark"


def _missing() -> str | None:
    absent = [m for m in ("pyspark", "pyarrow", "pandas") if importlib.util.find_spec(m) is None]
    if absent:
        return f"{', '.join(absent)} not installed"
    import pyspark
    major, minor = (int(x) for x in pyspark.__version__.split(".")[:2])
    if (major, minor) < (4, 2):
        return f"PySpark {pyspark.__version__} is older than 4.2"
    if shutil.which("java") is None:
        return "no Java runtime (java) on PATH"
    return None


def need_spark() -> None:
    why = _missing()
    if why is None:
        return
    reason = (f"{why}, so the Spark connector cannot be tested; get it with: "
              f"pip install -e \".[spark]\" (and a Java 17+ runtime)")
    if in_ci():
        pytest.fail(f"{reason} (CI is set: a missing one is a failure, not a skip)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def _stale(jar: Path) -> bool:
    built = jar.stat().st_mtime
    sources = [MODULE / "pom.xml", *(MODULE / "src" / "main").rglob("*"),
               *(ROOT / "bindings" / "java" / "src" / "main").rglob("*.java")]
    return any(p.is_file() and p.stat().st_mtime > built for p in sources)


def jvm_jar() -> tuple[str | None, str]:
    """The JVM source's jar (``PYMQ_SPARK_JAR``, or bindings/spark/target/pymq-spark.jar built now by
    build.sh when missing or older than its sources), or (None, why not)."""
    given = os.environ.get("PYMQ_SPARK_JAR")
    if given:
        return (given, "") if Path(given).is_file() else (None, f"PYMQ_SPARK_JAR={given} does not exist")
    jar = MODULE / "target" / "pymq-spark.jar"
    if jar.is_file() and not _stale(jar):
        return str(jar), ""
    mvn = os.environ.get("PYMQ_MVN") or shutil.which("mvn")
    if mvn is None or shutil.which("javac") is None:
        return None, "no Maven or javac to build bindings/spark (apt-get install maven openjdk-17-jdk-headless)"
    env = {**os.environ, "PYMQ_PYTHON": sys.executable, "PYMQ_MVN": mvn}
    done = subprocess.run(["bash", str(MODULE / "build.sh"), "-DskipTests"], env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    if done.returncode != 0 or not jar.is_file():
        return None, f"bindings/spark/build.sh failed: {(done.stderr or done.stdout)[-2000:]}"
    return str(jar), ""


def need_jvm_source(jar: str | None, why: str) -> None:
    """The JVM implementation's tests need its jar: a skip that says why, a failure under CI."""
    if jar is not None:
        return
    reason = f"the JVM Spark source is not available: {why}"
    if in_ci():
        pytest.fail(f"{reason} (CI is set: a missing one is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)
