"""What the Spark suite needs (pyspark >= 4.2, pyarrow, a Java runtime) and what a missing piece means.

The rule is the one of ``tests/storage/services.py``: a skip that says how to get the piece, except
under CI (``CI`` set), where it is a failure, so CI never goes green without having run the connector.
Call :func:`need_spark` at the top of a test module, before importing pyspark.
"""
from __future__ import annotations

import importlib.util
import shutil

import pytest

from tests.storage.services import in_ci


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
