"""Spark data source for pymq: destinations read and written as DataFrames, batch and streaming.

    spark.read.format("pymq").option("url", "stomp://127.0.0.1:61613").option("topic", "orders").load()

Spark (>= 4.0) registers every top-level ``pyspark_*`` module that exposes ``DefaultSource`` by itself,
so installing pymq with the ``spark`` extra is enough; ``spark.dataSource.register(PymqDataSource)``
works too.  Options, schema and guarantees: pyspark_pymq/README.md.  The connector needs PySpark 4.2 or
later (read limits and Trigger.AvailableNow for Python sources) and pyarrow.  On an older PySpark the
format is still found, and using it raises an error that says so, instead of breaking Spark's data
source lookup for every other source in the environment.  Without PySpark the package imports (its
option and plan modules need only pymq) and ``DefaultSource`` is an ImportError that says what is missing.
"""
from __future__ import annotations

from typing import Any

try:
    from pyspark_pymq.source import PymqDataSource, PymqPythonDataSource, RangePartition
except ImportError as _missing:
    _reason = str(_missing)
    import importlib.util as _util

    if _util.find_spec("pyspark") is not None:  # a PySpark too old (or without pyarrow) for the connector
        from pyspark.sql.datasource import DataSource as _DataSource

        from pymq.errors import ConfigError as _ConfigError

        class PymqDataSource(_DataSource):  # type: ignore[no-redef]
            @classmethod
            def name(cls) -> str:
                return "pymq"

            def _refuse(self, *args: Any, **kwargs: Any) -> Any:
                import pyspark
                raise _ConfigError(f"the pymq Spark connector needs PySpark >= 4.2 with pyarrow; this is "
                                   f"PySpark {pyspark.__version__} ({_reason})")

            schema = reader = writer = streamReader = streamWriter = _refuse

        class PymqPythonDataSource(PymqDataSource):  # type: ignore[no-redef]
            @classmethod
            def name(cls) -> str:
                return "pymq_python"

        DefaultSource: Any = PymqDataSource
    else:
        def __getattr__(name: str) -> Any:
            if name in ("DefaultSource", "PymqDataSource", "PymqPythonDataSource", "RangePartition"):
                raise ImportError(f"pyspark_pymq.{name} needs PySpark >= 4.2 and pyarrow "
                                  f"(pip install -e \".[spark]\"): {_reason}")
            raise AttributeError(name)
else:
    DefaultSource = PymqDataSource

__all__ = ["DefaultSource", "PymqDataSource", "PymqPythonDataSource", "RangePartition"]
