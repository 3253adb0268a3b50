"""The Spark connector's two implementations against their practical upper bounds, in one run.

    python bench/bench_spark.py              # 1M rows (several minutes)
    python bench/bench_spark.py --quick      # 20k rows: the CI smoke run
    python bench/bench_spark.py --rows 200000 --impls jvm --json /tmp/spark.json

Starts its own ``pymq-server`` (free port, temporary data directory, topics ``/topic/bench.*`` kept as
retained logs, default durability: persistent messages, ``sync_policy: always``) and a local
SparkSession (``local[2]``) with the JVM source's jar (``bindings/spark``, built by its build.sh when
missing; ``PYMQ_SPARK_JAR`` names another), so ``format("pymq")`` is the JVM source and the Python data
source is registered as ``pymq_python``; then, for each implementation (``--impls``, default both):

* **batch write** (after a warm-up write of N/10 rows with every writer): N rows (``value`` 100 bytes,
  ``key``) written to a retained topic (durable), best of ``WRITE_RUNS`` runs in turns with the same
  DataFrame written as Parquet (and, once, into a Python sink that drops Spark's Arrow batches: the Python
  API's ceiling for writes); and once to a queue while a STOMP consumer takes the messages;
* **batch read**: those N messages read back into ``count()`` and into a full scan
  (``sum(length(value))``), against the same two queries over the Parquet file and over a Python data
  source that yields ready Arrow batches of the read schema (the Python API's ceiling); best of five runs
  each (``READ_RUNS``), every query in turns;
* **streaming**: the N messages read by a stream at 100k messages per trigger into Spark's ``noop`` sink
  (messages/s and the median trigger time), against Spark's ``rate-micro-batch`` source at the same rows
  per trigger and against a Python streaming source of ready Arrow batches;
* **latency**: end to end, from the JMS timestamp a producer stamps at send to the moment the row reaches
  the query's sink (a JVM ForeachWriter, ``io.pymq.spark.LatencyProbe``, the same for every run), while
  the producer sends at each of ``--rates`` (default 5k and 50k msg/s; bulk SENDs every 2 ms,
  non-persistent): p50/p99/max over ``--latency-seconds``, after a warm-up of 2 s; for each
  implementation with ``trigger(processingTime="0 seconds")`` (a micro-batch as soon as the last one
  ends), and for the JVM source with real-time mode (``trigger(realTime=...)``, Spark 4.1+).

Parquet and the rate source are what Spark does with no broker at all, so the ratios say how close the
connector gets to free.  Every figure is printed with its baselines from the same run; nothing is
asserted about speed.  The exit status is 1 only if a count is wrong.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: runs of each read query, in turns; the best of each counts.  A 1M-row read takes under half a second,
#: so on a shared machine one burst of someone else's work can halve a run: five turns (three until
#: issue 12's third session) give each query a fair chance of one undisturbed run
READ_RUNS = 5
#: retained-topic writes of each writer, in turns; the best counts (a write takes a few seconds, and one
#: burst of someone else's work on this shared machine can halve a single run)
WRITE_RUNS = 2
#: the format name of each implementation in the benchmark's session
FORMATS = {"python": "pymq_python", "jvm": "pymq"}

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: the broker processes whose CPU is counted as the broker's (the benchmark's broker, and the two-worker
#: broker of the parallel read with its workers); everything else under this process is Spark's (its JVM
#: and Python workers)
BROKERS: list[int] = []


def start_broker(work: str, workers: int = 1) -> tuple[subprocess.Popen, str]:
    """A pymq-server on a free port (``workers`` processes: ``--workers``), data and log under ``work``."""
    tag = "broker" if workers == 1 else f"broker-{workers}w"
    config = os.path.join(work, "broker.yaml")
    with open(config, "w") as fh:
        # several 1M-row retained logs are kept (each writer's runs): enough message memory that none pages
        # out to its records (spec/spark.md §8), so the reads measured are reads, not re-reads of the disk
        fh.write('retention:\n  "/topic/bench.*": {ms: 86400000}\nmax_memory: 6GiB\n')
    log_path = os.path.join(work, f"{tag}.log")
    extra = [] if workers == 1 else ["--workers", str(workers)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pymq_server", "--port", "0", "--data-dir",
                                 os.path.join(work, f"data-{tag}"), "--config", config, "--log-level", "WARNING",
                                 *extra], stderr=log, cwd=ROOT)
    BROKERS.append(proc.pid)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        with open(log_path) as fh:
            text = fh.read()
        found = re.search(r"listening on ([\d.]+):(\d+)", text)
        if found and (workers == 1 or "pymq-server workers:" in text):
            return proc, f"stomp://{found.group(1)}:{found.group(2)}"
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"pymq-server did not start; see {log_path}")


def spark_session(jar: str | None):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *[p for p in paths if p != ROOT]])
    from pyspark.sql import SparkSession
    builder = SparkSession.builder
    if jar is not None:
        builder = builder.config("spark.jars", jar)
    spark = (builder.master("local[2]").appName("bench-spark")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             # the latency runs' real-time mode with a ForeachWriter, and a batch long enough for the run
             .config("spark.sql.streaming.realTimeMode.minBatchDuration", "1s")
             # a loaded machine starts Python workers slowly: their authentication handshake may take 120 s, not
             # 15 (Spark's own 10 s wait for the worker's connection cannot be configured)
             .config("spark.python.authenticate.socketTimeout", "120s")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g").getOrCreate())
    from pyspark_pymq import PymqPythonDataSource
    spark.dataSource.register(PymqPythonDataSource)
    # FATAL: stopping the endless rate stream makes its tasks log aborted commits, which are expected
    spark.sparkContext.setLogLevel("FATAL")
    return spark


def ready_arrow_source(rows: int, partitions: int):
    """A Python data source whose tasks yield ready Arrow batches of the pymq read schema (100-byte values,
    10k rows each): what Spark's Python data source API costs with no broker and no decoding at all, the
    ceiling any Python source can reach on this machine."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class ReadyPartition(InputPartition):
        def __init__(self, index: int, count: int) -> None:
            self.index, self.count = index, count

    class ReadyReader(DataSourceReader):
        def partitions(self):
            share = -(-rows // partitions)
            return [ReadyPartition(i, min(share, rows - i * share)) for i in range(partitions)]

        def read(self, partition):
            import pyarrow as pa

            from pyspark_pymq._arrow import arrow_schema
            from pyspark_pymq._decode import frames_to_batch
            size = 10_000
            frames = [({"pymq-seq": str(i), "message-id": f"ID:bench-{i}", "timestamp": "1700000000000",
                        "content-type": "application/octet-stream"}, str(i).rjust(100, "x").encode())
                      for i in range(size)]
            template = frames_to_batch(frames, "/topic/bench.rows", "topic", False)
            assert template.schema == arrow_schema(False)
            left = partition.count
            while left > 0:
                batch = template if left >= size else template.slice(0, left)
                left -= batch.num_rows
                yield batch
            del pa

    class ReadyArrow(DataSource):
        @classmethod
        def name(cls):
            return "ready_arrow"

        def schema(self):
            from pyspark_pymq._arrow import read_ddl
            return read_ddl(False)

        def reader(self, schema):
            return ReadyReader()

    return ReadyArrow


def ready_arrow_stream(rows: int, per_trigger: int):
    """The streaming twin of :func:`ready_arrow_source`: micro-batches of ``per_trigger`` ready rows (two
    partitions each) until ``rows``, then nothing: Spark's Python streaming API with no broker."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    class Span(InputPartition):
        def __init__(self, start: int, end: int) -> None:
            self.start, self.end = start, end

    class Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def initialOffset(self):
            return {"row": 0}

        def prepareForTriggerAvailableNow(self):
            pass

        def latestOffset(self, start=None, limit=None):
            return {"row": min(rows, (start or {"row": 0})["row"] + per_trigger)}

        def partitions(self, start, end):
            a, b = start["row"], end["row"]
            middle = (a + b) // 2
            return [Span(a, middle), Span(middle, b)]

        def read(self, partition):
            from pyspark_pymq._decode import frames_to_batch
            size = 10_000
            frames = [({"pymq-seq": str(i), "message-id": f"ID:bench-{i}", "timestamp": "1700000000000",
                        "content-type": "application/octet-stream"}, str(i).rjust(100, "x").encode())
                      for i in range(size)]
            template = frames_to_batch(frames, "/topic/bench.rows", "topic", False)
            left = partition.end - partition.start
            while left > 0:
                batch = template if left >= size else template.slice(0, left)
                left -= batch.num_rows
                yield batch

        def commit(self, end):
            pass

    class ReadyStream(DataSource):
        @classmethod
        def name(cls):
            return "ready_arrow_stream"

        def schema(self):
            from pyspark_pymq._arrow import read_ddl
            return read_ddl(False)

        def streamReader(self, schema):
            return Reader()

    return ReadyStream


def null_arrow_sink():
    """A Python data source whose writer takes Spark's Arrow batches and drops them: what Spark's Python
    writer API costs with no broker (the ceiling of any Python sink on this machine)."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class DropWriter(DataSourceArrowWriter):
        def write(self, iterator):
            for _ in iterator:
                pass
            return WriterCommitMessage()

    class NullArrow(DataSource):
        @classmethod
        def name(cls):
            return "null_arrow"

        def writer(self, schema, overwrite):
            return DropWriter()

    return NullArrow


def queue_consumer(url: str, queue: str, expected: int, done: dict) -> threading.Thread:
    """A live STOMP consumer of ``queue`` (auto-acknowledge) counting what it receives."""
    import pymq

    def run():
        with pymq.connect(url) as conn:
            consumer = conn.create_session().create_consumer(pymq.Queue(queue))
            done["ready"] = True
            got = 0
            deadline = time.monotonic() + 600
            while got < expected and time.monotonic() < deadline:
                if consumer.receive(1.0) is not None:
                    got += 1
            done["received"] = got
            done["at"] = time.perf_counter()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _proc_stats() -> dict[int, tuple[int, int, float]]:
    """pid -> (parent pid, start time in ticks, own CPU seconds) of every process on the machine."""
    out: dict[int, tuple[int, int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:                      # gone between the listing and the read
            continue
        out[int(entry)] = (int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    return out


class CpuSampler:
    """The CPU seconds of the Spark side and the broker side, each a process tree under this process,
    sampled every 0.2 s by a thread: a process's own time as last seen, kept after it exits (Spark's Python
    workers come and go, and their parent need not wait for them, so a parent's children's times would
    miss them); a process that exits loses at most its last 0.2 s.  The machine is shared, so CPU seconds
    are what to compare between runs: load stretches wall time far more than the CPU a piece of work takes."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], tuple[str, float]] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.sample()
            time.sleep(0.2)

    def sample(self) -> None:
        stats = _proc_stats()
        me = os.getpid()

        def side(pid: int) -> str | None:
            for _ in range(64):
                if pid in BROKERS:
                    return "broker"
                parent = stats.get(pid, (0, 0, 0.0))[0]
                if parent == me:
                    return "spark"
                if parent <= 1:
                    return None
                pid = parent
            return None

        with self.lock:
            for pid, (_, started, cpu) in stats.items():
                where = side(pid)
                if where is not None:
                    self.seen[(pid, started)] = (where, cpu)

    def totals(self) -> dict[tuple[int, int], tuple[str, float]]:
        self.sample()
        with self.lock:
            return dict(self.seen)


SAMPLER: list[CpuSampler] = []


def cpu_by_side() -> dict[tuple[int, int], tuple[str, float]]:
    """Every process of either side seen so far, with its CPU seconds (:class:`CpuSampler`)."""
    if not SAMPLER:
        SAMPLER.append(CpuSampler())
    return SAMPLER[0].totals()


def cpu_of_tree(root: int) -> dict[int, float]:
    """CPU seconds so far of ``root`` and each of its descendants (own time only), by pid."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(entry)] = int(fields[1])
            cpu[int(entry)] = sum(int(f) for f in fields[11:13]) / CLOCK_TICKS
    mine = {root}
    grew = True
    while grew:
        grew = False
        for pid, pp in parent.items():
            if pp in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return {pid: cpu[pid] for pid in mine if pid in cpu}


def timed(fn, cpu: dict | None = None):
    """(result, wall seconds); with ``cpu``, it is filled with the CPU seconds each side took."""
    before = cpu_by_side() if cpu is not None else None
    t0 = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - t0
    if cpu is not None and before is not None:
        after = cpu_by_side()
        sides = {"spark": 0.0, "broker": 0.0}
        for key, (where, seconds) in after.items():
            sides[where] += seconds - before.get(key, (where, 0.0))[1]
        cpu.update(sides)
    return result, elapsed


def best_of(runs, fn):
    """(result, best time) over ``runs`` runs: reads are repeatable, and the first of a kind pays for
    warming up (Python workers, page cache), whichever source it reads."""
    results = [timed(fn) for _ in range(runs)]
    return results[0][0], min(t for _, t in results)


def best_of_each(runs, fns, cpus: list[dict] | None = None):
    """:func:`best_of` for several queries run in turns (a, b, c, a, b, c, ...), not one after the other:
    on a machine shared with other work the load drifts within seconds, and in turns each query sees the
    same drift, so their ratio is not the ratio of two different moments.  With ``cpus`` (one dict per
    query) each gets the CPU seconds of its least costly run, per side (CPU varies far less with load
    than time: the least is the query's own cost with the least interference)."""
    times: list[list[float]] = [[] for _ in fns]
    results: list = [None] * len(fns)
    for _ in range(runs):
        for i, fn in enumerate(fns):
            cpu: dict = {}
            result, t = timed(fn, cpu if cpus is not None else None)
            results[i] = result if results[i] is None else results[i]
            times[i].append(t)
            if cpus is not None and (not cpus[i] or sum(cpu.values()) < sum(cpus[i].values())):
                cpus[i].clear()
                cpus[i].update(cpu)
    return [(results[i], min(times[i])) for i in range(len(fns))]


def per_million(cpu: dict, rows: int) -> dict:
    """CPU seconds per side per 1M rows, rounded for the table."""
    return {side: round(seconds * 1_000_000 / rows, 2) for side, seconds in cpu.items()}




def jvm_jar() -> str:
    given = os.environ.get("PYMQ_SPARK_JAR")
    if given:
        return given
    sys.path.insert(0, ROOT)
    from tests.spark._spark import jvm_jar as built
    jar, why = built()
    if jar is None:
        raise RuntimeError(f"the JVM source's jar: {why}")
    return jar


def latency_run(spark, fmt: str, topic: str, rate: int, seconds: float, trigger: str, work: str) -> dict:
    """The query ``fmt`` -> LatencyProbe with ``trigger`` ("0 seconds", or "realtime:<duration>") while a
    producer sends ``rate`` msg/s to ``topic`` in bulk SENDs every 2 ms; the latencies after a 2 s warm-up."""
    import pyarrow as pa

    import pymq
    from pymq.client.blocking import start_send_arrow
    jvm = spark._jvm
    probe = jvm.io.pymq.spark.LatencyProbe
    df = (spark.readStream.format(fmt).option("url", URL[0]).option("topic", topic)
          .option("startingOffsets", "earliest").load().select("timestamp"))
    writer = df._jdf.writeStream().foreach(jvm.io.pymq.spark.LatencyProbe()) \
        .option("checkpointLocation", os.path.join(work, f"ck-{topic}"))
    if trigger.startswith("realtime:"):
        # real-time mode takes the update output mode only (each row is its own result)
        writer = writer.outputMode("update").trigger(
            jvm.org.apache.spark.sql.streaming.Trigger.RealTime(trigger.split(":", 1)[1]))
    else:
        writer = writer.trigger(jvm.org.apache.spark.sql.streaming.Trigger.ProcessingTime(trigger))
    query = writer.start()
    sent = 0
    pending: list = []
    try:
        with pymq.connect(URL[0], timeout=120) as conn:
            session = conn.create_session()
            t0 = time.perf_counter()
            reset_at = t0 + 2.0
            was_reset = False
            while (now := time.perf_counter()) < t0 + 2.0 + seconds:
                if not was_reset and now >= reset_at:
                    # rows sent from now on are measured; earlier ones (the warm-up's) are not counted
                    probe.reset(int(time.time() * 1000))
                    measured_from = sent
                    was_reset = True
                due = int((now - t0) * rate)
                if due > sent:
                    n = due - sent
                    stamp = int(time.time() * 1000)
                    body = pa.array([b"x" * 100] * n, pa.binary())
                    batch = pa.record_batch([body, pa.array([stamp] * n, pa.int64()), pa.array([1] * n, pa.int32())],
                                            names=["body", "timestamp", "delivery_mode"])
                    sink = pa.BufferOutputStream()
                    with pa.ipc.new_stream(sink, batch.schema) as w:
                        w.write_batch(batch)
                    pending.append(start_send_arrow(session, f"/topic/{topic}", sink.getvalue().to_pybytes()))
                    sent = due
                    while len(pending) > 4:
                        pending.pop(0).result()
                time.sleep(0.002)
            for p in pending:
                p.result()
        deadline = time.monotonic() + 60
        expected = sent - measured_from
        while time.monotonic() < deadline and probe.count() < expected:
            time.sleep(0.05)
        return {"p50": probe.quantile(0.5), "p99": probe.quantile(0.99), "max": probe.quantile(1.0),
                "seen": probe.count(), "sent": expected, "unit": f"ms at {rate} msg/s ({trigger})"}
    finally:
        query.stop()


URL: list[str] = []


def parallel_reads(spark, work: str, url: str, rows: int, workers: int) -> dict:
    """``rows`` rows spread over 2W retained topics (two owned by each of W workers), written by the JVM
    source to the benchmark's broker and to a broker of W workers; then ``count()`` and a full scan of all
    of them in one query from each broker, in turns, best of READ_RUNS, CPU per side; and one more full
    scan of the W-worker broker with each worker's CPU, which shows every worker serving its own topics."""

    wproc, wurl = start_broker(work, workers)
    try:
        return _parallel_reads(spark, url, wproc, wurl, rows, workers)
    finally:
        wproc.terminate()
        try:
            wproc.wait(30)
        except subprocess.TimeoutExpired:
            wproc.kill()


def _parallel_reads(spark, url: str, wproc: subprocess.Popen, wurl: str, rows: int, workers: int) -> dict:
    from pyspark.sql import functions as F

    from pymq_server.cores.ownership import Ownership
    owners = Ownership(0, workers, "pymq")      # spec/cores.md §2's rule, as the broker's workers compute it
    topics: list[str] = []
    owned = dict.fromkeys(range(workers), 0)
    i = 0
    while len(topics) < 2 * workers:
        name = f"bench.spread.{i}"
        w = owners.owner(f"/topic/{name}")
        if owned[w] < 2:
            owned[w] += 1
            topics.append(name)
        i += 1
    share = rows // len(topics)
    part = (spark.range(share, numPartitions=2)
            .selectExpr("cast(id % 1000 as string) as key",
                        "encode(lpad(cast(id as string), 100, 'x'), 'utf-8') as value"))
    for u in (url, wurl):
        for t in topics:
            part.write.format("pymq").option("url", u).option("topic", t).mode("append").save()
    names = ",".join(f"/topic/{t}" for t in topics)

    def reader(u: str):
        return spark.read.format("pymq").option("url", u).option("destinations", names).option(
            "minPartitions", str(len(topics)))

    scan = F.sum(F.length("value")).alias("bytes")
    out: dict = {}
    total = share * len(topics)
    for label, query in (("count()", lambda u: reader(u).load().count()),
                         ("full scan", lambda u: reader(u).load().agg(scan).first()["bytes"])):
        brokers = [("1 process", url), (f"{workers} workers", wurl)]
        cpus: list[dict] = [{} for _ in brokers]
        results = best_of_each(READ_RUNS, [lambda u=u, q=query: q(u) for _, u in brokers], cpus)
        fig = {name: total / t for (name, _), (_, t) in zip(brokers, results, strict=True)}
        fig.update(unit="rows/s", topics=len(topics),
                   cpu={name: per_million(c, total) for (name, _), c in zip(brokers, cpus, strict=True)})
        out[f"parallel read {label}, {len(topics)} topics"] = fig
    # which process served the last scan: each of the W workers' own CPU during one more scan
    before = cpu_of_tree(wproc.pid)
    reader(wurl).load().agg(scan).first()
    after = cpu_of_tree(wproc.pid)
    out[f"parallel read full scan, {len(topics)} topics"]["per process"] = sorted(
        (round(after[p] - before.get(p, 0.0), 2) for p in after), reverse=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description="pymq Spark connector benchmark")
    parser.add_argument("--quick", action="store_true", help="20k rows, short latency runs (smoke test)")
    parser.add_argument("--rows", type=int, help="rows to write and read (default 1M, 20k with --quick)")
    parser.add_argument("--per-trigger", type=int, default=100_000, help="messages per streaming trigger")
    parser.add_argument("--rates", default="5000,50000", help="msg/s of the latency runs, comma-separated")
    parser.add_argument("--latency-seconds", type=float, help="measured seconds per latency run (default 10)")
    parser.add_argument("--impls", default="python,jvm", help="implementations to measure: python, jvm")
    parser.add_argument("--json", help="write the figures to this file ('-' for stdout)")
    parser.add_argument("--no-queue-write", dest="queue_write", action="store_false",
                        help="skip the writes into a queue with a live consumer (the longest part)")
    parser.add_argument("--workers", type=int, default=2,
                        help="workers of the parallel read's second broker (1: no parallel read)")
    args = parser.parse_args()
    rows = args.rows or (20_000 if args.quick else 1_000_000)
    latency_seconds = args.latency_seconds or (3 if args.quick else 10)
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    rates = [int(r) for r in args.rates.split(",") if r.strip()]

    def save() -> None:
        """The figures so far (written after each part: a later part that fails loses nothing)."""
        if args.json and args.json != "-":
            with open(args.json, "w") as fh:
                fh.write(json.dumps({"rows": rows, "per_trigger": args.per_trigger, "impls": impls,
                                     "figures": figures, "failures": failures, "complete": False}, indent=2))

    work = tempfile.mkdtemp(prefix="bench-spark-")
    broker, url = start_broker(work)
    URL[:] = [url]
    cpu_by_side()                       # the sampler starts: it knows every process from here on
    failures: list[str] = []
    figures: dict[str, dict] = {}
    try:
        spark = spark_session(jvm_jar() if "jvm" in impls else None)
        from pyspark.sql import functions as F

        def rows_of(count: int):
            return (spark.range(count, numPartitions=2)
                    .selectExpr("cast(id % 1000 as string) as key",
                                "encode(lpad(cast(id as string), 100, 'x'), 'utf-8') as value"))

        source = rows_of(rows)
        parquet = os.path.join(work, "rows.parquet")
        # warm-up: JVM, Python workers, the data source lookups, a write of a tenth of the rows with every
        # writer (the same query shape, so the JVM has compiled it before any writer is timed), and a read
        warm = rows_of(max(100, rows // 10))
        spark.dataSource.register(null_arrow_sink())
        for impl in impls:
            warm.write.format(FORMATS[impl]).option("url", url).option("topic", f"bench.warm.{impl}") \
                .mode("append").save()
            (spark.read.format(FORMATS[impl]).option("url", url).option("topic", f"bench.warm.{impl}")
             .option("minPartitions", "2").load().count())
        warm.write.mode("overwrite").parquet(os.path.join(work, "warm.parquet"))
        warm.write.format("null_arrow").mode("append").save()

        def reader(impl: str):
            return (spark.read.format(FORMATS[impl]).option("url", url).option("topic", f"bench.rows.{impl}")
                    .option("minPartitions", "2"))

        # retained-topic writes, in turns with Parquet's; each run of an implementation into a topic of its
        # own (the reads below read the first)
        write_times: dict[str, list[float]] = {impl: [] for impl in impls}
        parquet_times: list[float] = []
        write_cpu: dict[str, dict] = {}

        def least(name: str, cpu: dict) -> None:
            if name not in write_cpu or sum(cpu.values()) < sum(write_cpu[name].values()):
                write_cpu[name] = cpu

        for run in range(WRITE_RUNS):
            for impl in impls:
                topic = f"bench.rows.{impl}" + ("" if run == 0 else f".{run}")
                cpu: dict = {}
                _, t = timed(lambda i=impl, t=topic: source.write.format(FORMATS[i]).option("url", url)
                             .option("topic", t).mode("append").save(), cpu)
                write_times[impl].append(t)
                least(impl, cpu)
            cpu = {}
            _, t = timed(lambda: source.write.mode("overwrite").parquet(parquet), cpu)
            parquet_times.append(t)
            least("parquet", cpu)
        cpu = {}
        _, t_nw = timed(lambda: source.write.format("null_arrow").mode("append").save(), cpu)
        least("null Arrow sink", cpu)
        t_qw = min(parquet_times)
        print("writes:", write_times, "parquet", parquet_times, "null", t_nw, flush=True)
        save()
        figures["batch write (retained topic)"] = {
            **{impl: rows / min(ts) for impl, ts in write_times.items()}, "parquet": rows / t_qw,
            "null Arrow sink": rows / t_nw, "unit": "rows/s",
            "cpu": {name: per_million(c, rows) for name, c in write_cpu.items()}}

        # into a queue while a STOMP consumer takes the messages: the write, and the consumer's end
        for impl in (impls if args.queue_write else []):
            consumed: dict = {}
            queue = f"bench.live-queue.{impl}"
            consumer = queue_consumer(url, queue, rows, consumed)
            while "ready" not in consumed:
                time.sleep(0.05)
            t0 = time.perf_counter()
            source.write.format(FORMATS[impl]).option("url", url).option("queue", queue).mode("append").save()
            t_lw = time.perf_counter() - t0
            consumer.join(600)
            figures.setdefault("batch write (queue, live consumer)", {"parquet": rows / t_qw, "unit": "rows/s"})[
                impl] = rows / t_lw
            if consumed.get("received") != rows:
                failures.append(f"{impl}: the queue's consumer received {consumed.get('received')}, expected {rows}")
            else:
                figures.setdefault("queue consumer (to its last message)", {"unit": "msg/s"})[impl] = \
                    rows / (consumed["at"] - t0)

        spark.dataSource.register(ready_arrow_source(rows, 2))
        ready = spark.read.format("ready_arrow")
        queries = [(impl, (lambda i=impl: reader(i).load().count())) for impl in impls]
        queries += [("parquet", lambda: spark.read.parquet(parquet).count()),
                    ("ready Arrow", lambda: ready.load().count())]
        cpus: list[dict] = [{} for _ in queries]
        results = best_of_each(READ_RUNS, [q for _, q in queries], cpus)
        figures["batch read count()"] = {name: rows / t for (name, _), (_, t) in zip(queries, results, strict=True)}
        figures["batch read count()"]["unit"] = "rows/s"
        figures["batch read count()"]["cpu"] = {name: per_million(c, rows)
                                                for (name, _), c in zip(queries, cpus, strict=True)}
        print("count():", figures["batch read count()"], flush=True)
        save()
        for (name, _), (n, _) in zip(queries, results, strict=True):
            if n != rows:
                failures.append(f"count(): {name} {n}, expected {rows}")

        scan = F.sum(F.length("value")).alias("bytes")
        queries = [(impl, (lambda i=impl: reader(i).load().agg(scan).first()["bytes"])) for impl in impls]
        queries += [("parquet", lambda: spark.read.parquet(parquet).agg(scan).first()["bytes"]),
                    ("ready Arrow", lambda: ready.load().agg(scan).first()["bytes"])]
        cpus: list[dict] = [{} for _ in queries]
        results = best_of_each(READ_RUNS, [q for _, q in queries], cpus)
        figures["batch read full scan"] = {name: rows / t for (name, _), (_, t) in zip(queries, results, strict=True)}
        figures["batch read full scan"]["unit"] = "rows/s"
        figures["batch read full scan"]["cpu"] = {name: per_million(c, rows)
                                                for (name, _), c in zip(queries, cpus, strict=True)}
        print("full scan:", figures["batch read full scan"], flush=True)
        save()
        for (name, _), (b, _) in zip(queries, results, strict=True):
            if b != rows * 100:
                failures.append(f"full scan: {name} {b} bytes, expected {rows * 100}")

        # parallel reads of many destinations: the same rows in 2W topics (two owned by each worker), read by
        # one query from the benchmark's broker (one process) and from a broker running W workers, where
        # each task connects to the worker that owns its destination (spec/spark.md §2, owners)
        if "jvm" in impls and args.workers > 1:
            try:
                figures.update(parallel_reads(spark, work, url, rows, args.workers))
                print("parallel reads:", {k: v for k, v in figures.items() if k.startswith("parallel")}, flush=True)
                save()
            except Exception as exc:    # noqa: BLE001  (reported; the other runs still run)
                failures.append(f"parallel reads: {exc}")

        # streaming throughput: the same messages, args.per_trigger per micro-batch, into the noop sink
        def stream_run(df, name):
            for attempt in range(3):
                q = (df.writeStream.format("noop")
                     .option("checkpointLocation", os.path.join(work, f"{name}-{attempt}"))
                     .trigger(availableNow=True).start())
                t0 = time.perf_counter()
                try:
                    q.awaitTermination()
                    break
                except Exception as exc:   # noqa: BLE001
                    # Spark waits 10 s (not configurable) for a Python worker to start: on a loaded
                    # machine a Python source's stream can fail before its first batch; it is started
                    # again from its start, with a new checkpoint
                    if "failed to connect back" not in str(exc) or attempt == 2:
                        raise
                    print(f"{name}: a Python worker did not start in time; starting the stream again",
                          flush=True)
            elapsed = time.perf_counter() - t0
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            progress = [p for p in q.recentProgress if p["numInputRows"]]
            total = sum(p["numInputRows"] for p in progress)
            median_ms = statistics.median(p["durationMs"]["triggerExecution"] for p in progress)
            return total, elapsed, median_ms, len(progress)

        stream_figures: dict = {"unit": "msg/s"}
        trigger_figures: dict = {"unit": "ms"}
        s_batches = 1
        for impl in impls:
            stream_df = (spark.readStream.format(FORMATS[impl]).option("url", url).option("topic", f"bench.rows.{impl}")
                         .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", str(args.per_trigger))
                         .option("minPartitions", "2").load())
            s_total, s_time, s_median, s_batches = stream_run(stream_df, f"ck-{impl}")
            stream_figures[impl] = s_total / s_time
            trigger_figures[impl] = s_median
            if s_total != rows:
                failures.append(f"{impl}: stream read {s_total} messages, expected {rows}")
        spark.dataSource.register(ready_arrow_stream(rows, args.per_trigger))
        a_total, a_time, a_median, _ = stream_run(spark.readStream.format("ready_arrow_stream").load(), "ck-ready")
        rate_df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", str(args.per_trigger))
                   .option("numPartitions", "2").load()
                   .selectExpr("encode(lpad(cast(value as string), 100, 'x'), 'utf-8') as value"))
        # the rate source never runs out: stop it after as many batches as the pymq streams took
        q = (rate_df.writeStream.format("noop").option("checkpointLocation", os.path.join(work, "ck-rate"))
             .trigger(processingTime="0 seconds").start())
        t0 = time.perf_counter()
        while True:
            done = [p for p in q.recentProgress if p["numInputRows"]]
            if len(done) >= s_batches:
                break
            time.sleep(0.05)
        r_time = time.perf_counter() - t0
        q.stop()
        r_total = sum(p["numInputRows"] for p in done[:s_batches])
        stream_figures.update({"rate source": r_total / r_time, "ready Arrow": a_total / a_time})
        trigger_figures.update({"rate source": statistics.median(p["durationMs"]["triggerExecution"]
                                                                 for p in done[:s_batches]), "ready Arrow": a_median})
        figures["stream msg/s"] = stream_figures
        figures["stream trigger (median)"] = trigger_figures
        save()

        # end-to-end latency under a steady producer: each implementation's lowest-latency trigger
        for rate in rates:
            for impl in impls:
                triggers = ["0 seconds"] + (["realtime:5 minutes"] if impl == "jvm" else [])
                for trigger in triggers:
                    kind = "real-time" if trigger.startswith("realtime") else "micro-batch"
                    topic = f"bench.live.{impl}.{kind}.{rate}"
                    try:
                        fig = latency_run(spark, FORMATS[impl], topic, rate, latency_seconds, trigger, work)
                    except Exception as exc:   # noqa: BLE001  (reported; the other runs still run)
                        failures.append(f"latency {impl} {kind} at {rate}: {exc}")
                        continue
                    figures[f"latency {impl} {kind} {rate // 1000}k msg/s"] = fig
                    print(f"latency {impl} {kind} {rate}: {fig}", flush=True)
                    save()
                    if fig["seen"] < fig["sent"]:
                        failures.append(f"latency {impl} {kind} at {rate}: {fig['seen']} rows seen, "
                                        f"{fig['sent']} sent")
        spark.stop()
    finally:
        broker.terminate()
        try:
            broker.wait(30)
        except subprocess.TimeoutExpired:
            broker.kill()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\npymq Spark connector, {rows:,} rows of 100 B, local[2], {args.per_trigger:,} messages per trigger")
    for name, fig in figures.items():
        if name.startswith("latency"):
            print(f"{name:44} p50 {fig['p50']} ms, p99 {fig['p99']} ms, max {fig['max']} ms "
                  f"({fig['seen']} of {fig['sent']} rows)")
            continue
        if name.startswith("parallel read"):
            for b, value in fig.items():
                if isinstance(value, float):
                    cpu = fig["cpu"].get(b, {})
                    print(f"{name:44} {b:>10} {value:>12,.0f} {fig['unit']:<6} CPU-s per 1M rows: {cpu}")
                    name = ""
            if "per process" in fig:
                print(f"{'':44} CPU-s of each broker process in one more scan: {fig['per process']}")
            continue
        cpus = fig.get("cpu", {})
        bases = [k for k in fig if k not in (*impls, "unit", "cpu")]
        for impl in (i for i in impls if i in fig):
            ratios = ", ".join(f"{fig[impl] / fig[b]:.2f} of {b}" for b in bases if fig.get(b))
            cpu = f"  CPU-s per 1M rows: {cpus[impl]}" if impl in cpus else ""
            print(f"{name:38} {impl:>6} {fig[impl]:>12,.0f} {fig['unit']:<6} {ratios}{cpu}")
            name = ""
        for b in bases:
            cpu = f"  CPU-s per 1M rows: {cpus[b]}" if b in cpus else ""
            print(f"{'':38} {'':>6} {fig[b]:>12,.0f} {fig['unit']:<6} ({b}){cpu}")
    for failure in failures:
        print("FAILED:", failure)
    if args.json:
        out = json.dumps({"rows": rows, "per_trigger": args.per_trigger, "impls": impls, "figures": figures,
                          "failures": failures}, indent=2)
        if args.json == "-":
            print(out)
        else:
            with open(args.json, "w") as fh:
                fh.write(out)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
