"""The two implementations of the ``pymq`` format, behind one face, so each behaviour test has one body.

* ``python``: the Python data source (``pyspark_pymq``), registered in the test session under the name
  ``pymq_python`` (the JVM source owns ``pymq`` when its jar is on the classpath, as it is here);
* ``jvm``: the DataSource V2 of ``bindings/spark`` (``format("pymq")`` with ``spark.jars`` set).

Tests that go through Spark use :attr:`Implementation.fmt`.  Tests that call the driver's and the tasks'
steps one at a time (a removal between two fetches, a trigger planned by hand) use :meth:`reader`,
:meth:`batch`, :meth:`partition` and :meth:`values`; for the JVM those go through py4j to
``io.pymq.spark.Probe`` in the test session's driver JVM, and its errors come back as pymq's own
(``DataLoss``, ``ConfigError``, ``ConnectionClosed``, ...), so a test's ``pytest.raises`` is the same.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from pymq.errors import ERROR_CODES, PymqError


class Implementation:
    name = ""
    fmt = ""

    def __repr__(self) -> str:
        return self.name


class PythonImpl(Implementation):
    name = "python"
    fmt = "pymq_python"

    def reader(self, url: str, **options: str):
        from pyspark_pymq._options import ReadOptions
        from pyspark_pymq.source import StreamReader
        return StreamReader(ReadOptions.parse({"url": url, **options}, streaming=True))

    def batch(self, url: str, **options: str) -> list:
        from pyspark_pymq._options import ReadOptions
        from pyspark_pymq.source import BatchReader
        return BatchReader(ReadOptions.parse({"url": url, **options}, streaming=False)).partitions()

    def partition(self, url: str, destination: str, start: int, end: int, *, fetch_size: int = 10_000,
                  check_loss: bool = False, retries: int = 3, retry_interval_ms: int = 1000):
        from pyspark_pymq._options import ConnectionOptions
        from pyspark_pymq.source import RangePartition
        return RangePartition(ConnectionOptions(url), destination, start, end, fetch_size=fetch_size,
                              check_loss=check_loss, retries=retries, retry_interval_ms=retry_interval_ms)

    def batches(self, partition) -> Iterator[list[str]]:
        """Each batch of a task's read, as its values (text)."""
        from pyspark_pymq.source import read_partition
        for batch in read_partition(partition):
            yield [v.decode() for v in batch.column("value").to_pylist()]

    def values(self, partitions) -> list[str]:
        return [v for p in partitions for b in self.batches(p) for v in b]

    @contextlib.contextmanager
    def fetches_in_flight(self, n: int):
        from pyspark_pymq import source
        old, source.FETCHES_IN_FLIGHT = source.FETCHES_IN_FLIGHT, n
        try:
            yield
        finally:
            source.FETCHES_IN_FLIGHT = old


def _translated(exc: Exception) -> Exception:
    """A Java PymqException (through py4j) as the pymq error of its code."""
    java = getattr(exc, "java_exception", None)
    while java is not None:
        if java.getClass().getName() == "io.pymq.spark.PymqException":
            code = java.code()
            cls = ERROR_CODES.get(code, PymqError)
            fields: dict[str, Any] = {}
            if code == "data-loss":
                fields = {"destination": java.destination(), "requested": java.requested(),
                          "earliest": java.earliest()}
            return cls(java.getMessage(), **fields)
        java = java.getCause()
    return exc


def _jvm(call):
    from py4j.protocol import Py4JJavaError
    try:
        return call()
    except Py4JJavaError as exc:
        raise _translated(exc) from None


class _JvmPartition:
    def __init__(self, handle) -> None:
        self.handle = handle
        self.destination = handle.destination()
        self.start = handle.start()
        self.end = handle.end()
        self.retries = handle.retries()
        self.worker = handle.worker()


class _JvmReader:
    """The stream's driver side with the Python reader's methods (offsets as dicts, limits as objects)."""

    def __init__(self, handle) -> None:
        self.handle = handle

    def initialOffset(self) -> dict:
        return json.loads(_jvm(self.handle.initialOffset))

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else 0 if isinstance(limit, ReadAllAvailable) else -1
        return json.loads(_jvm(lambda: self.handle.latestOffset(json.dumps(start), rows)))

    def partitions(self, start: dict, end: dict) -> list:
        return [_JvmPartition(p) for p in _jvm(lambda: self.handle.partitions(json.dumps(start), json.dumps(end)))]

    def commit(self, end: dict) -> None:
        _jvm(lambda: self.handle.commit(json.dumps(end)))

    def prepareForTriggerAvailableNow(self) -> None:
        _jvm(self.handle.prepareForTriggerAvailableNow)

    def reportLatestOffset(self) -> dict | None:
        text = _jvm(self.handle.reportLatestOffset)
        return None if text is None else json.loads(text)

    def stop(self) -> None:
        _jvm(self.handle.stop)


class JvmImpl(Implementation):
    name = "jvm"
    fmt = "pymq"

    def __init__(self, spark) -> None:
        self.spark = spark

    @property
    def probe(self):
        return self.spark._jvm.io.pymq.spark.Probe

    def _map(self, options: dict[str, str]):
        return {str(k): str(v) for k, v in options.items()}

    def reader(self, url: str, **options: str) -> _JvmReader:
        return _JvmReader(_jvm(lambda: self.probe.stream(self._map({"url": url, **options}))))

    def batch(self, url: str, **options: str) -> list:
        return [_JvmPartition(p) for p in _jvm(lambda: self.probe.batch(self._map({"url": url, **options})))]

    def partition(self, url: str, destination: str, start: int, end: int, *, fetch_size: int = 10_000,
                  check_loss: bool = False, retries: int = 3, retry_interval_ms: int = 1000):
        return _JvmPartition(_jvm(lambda: self.probe.partition(url, destination, start, end, fetch_size, check_loss,
                                                               retries, retry_interval_ms)))

    def batches(self, partition) -> Iterator[list[str]]:
        reader = _jvm(partition.handle.open)
        try:
            while True:
                got = _jvm(reader.next)
                if got is None:
                    return
                partition.connected_worker = reader.worker()
                yield list(got)
        finally:
            _jvm(reader.close)

    def values(self, partitions) -> list[str]:
        return [v for p in partitions for b in self.batches(p) for v in b]

    @contextlib.contextmanager
    def fetches_in_flight(self, n: int):
        old = self.probe.fetchesInFlight()
        self.probe.fetchesInFlight(n)
        try:
            yield
        finally:
            self.probe.fetchesInFlight(old)
