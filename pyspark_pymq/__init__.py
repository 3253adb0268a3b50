"""Spark data source for pymq: destinations read and written as DataFrames, batch and streaming.

    spark.read.format("pymq").option("url", "stomp://127.0.0.1:61613").option("topic", "orders").load()

Spark (>= 4.0) registers every top-level ``pyspark_*`` module that exposes ``DefaultSource`` by itself,
so installing pymq with the ``spark`` extra is enough; ``spark.dataSource.register(PymqDataSource)``
works too.  Options, schema and guarantees: pyspark_pymq/README.md.  The connector needs PySpark 4.2 or
later (read limits and Trigger.AvailableNow for Python sources); on an older PySpark the format is
still found, and using it raises an error that says so, instead of breaking Spark's data source lookup
for every other source in the environment.
"""
from __future__ import annotations

try:
    from pyspark_pymq.source import PymqDataSource, RangePartition
except ImportError as _missing:      # pyspark absent or older than 4.2
    from pyspark.sql.datasource import (
        DataSource as _DataSource,  # absent before 4.0: nothing to offer
    )

    from pymq.errors import ConfigError as _ConfigError

    _reason = str(_missing)

    class PymqDataSource(_DataSource):  # type: ignore[no-redef]
        @classmethod
        def name(cls) -> str:
            return "pymq"

        def _refuse(self, *args, **kwargs):
            import pyspark
            raise _ConfigError(f"the pymq Spark connector needs PySpark >= 4.2 with pyarrow; this is PySpark "
                               f"{pyspark.__version__} ({_reason})")

        schema = reader = writer = streamReader = streamWriter = _refuse

    RangePartition = None  # type: ignore[assignment,misc]

DefaultSource = PymqDataSource

__all__ = ["DefaultSource", "PymqDataSource", "RangePartition"]
