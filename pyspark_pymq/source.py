"""The pymq data source: ``spark.read``/``readStream``/``write``/``writeStream`` ``.format("pymq")``.

Where each piece runs (measured; the contract is spec/spark.md):

* ``schema``, ``reader``, ``partitions`` of a batch read, and ``initialOffset``, ``latestOffset``,
  ``partitions``, ``commit`` of a stream run on the driver, in a Python planner process that may hold a
  broker connection.
* ``read(partition)`` runs on an executor, on a *separately pickled* copy of the reader made at planning
  time: it sees nothing the driver learnt later.  So every :class:`RangePartition` carries everything a
  read needs (connection options, destination, sequence range, selector, subscription), and readers
  drop their connections when pickled.
* ``commit(end)`` is lazy (Spark calls it while planning the next micro-batch) and ``stop()`` is not
  reliably called, so the one side effect of reading, the acknowledgement of ``consume`` mode, happens
  in ``commit`` and nowhere else: never in ``read`` (a retried or speculative task would acknowledge
  messages no committed batch holds).

Invariants: an offset is ``{destination: {"0": next_seq}}`` and a micro-batch reads exactly
``start <= seq < end`` of each destination, so replaying a checkpointed batch reads the same messages
(browse mode, within retention; consume mode, because nothing past the last committed offset is
acknowledged).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pymq.errors import (
    ConfigError,
    ConnectFailed,
    ConnectionClosed,
    DataLoss,
    MessageFormatError,
    PymqError,
)
from pymq.client.blocking import PendingRange, start_range
from pymq.errors import TimeoutError as BrokerTimeout
from pyspark_pymq._arrow import check_wire_schema, read_ddl, wire_columns, wire_to_read
from pyspark_pymq._connections import CONNECTIONS, settle_worker_heap
from pyspark_pymq._decode import frames_to_batch
from pyspark_pymq._filters import Pushdown, expression
from pyspark_pymq._options import (
    EARLIEST,
    LATEST,
    ConnectionOptions,
    ReadOptions,
    WriteOptions,
    destination_kind,
)
from pyspark_pymq._patterns import DestinationPattern
from pyspark_pymq._plan import Span, cap_messages, from_offset, split, to_offset

log = logging.getLogger("pyspark_pymq")
T = TypeVar("T")


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One executor task: ``start <= seq < end`` of one destination, and how to read it."""

    connection: ConnectionOptions
    destination: str
    start: int
    end: int
    selector: str | None = None
    subscription: str | None = None
    fetch_size: int = 10_000
    include_properties: bool = False
    check_loss: bool = False          # browse mode with failOnDataLoss
    source: str | None = None         # "queue" in consume mode: the queue it acknowledges, never a log
    retries: int = 3                  # consecutive fetches that lost their connection, tried again
    retry_interval_ms: int = 1_000
    filters: tuple = ()               # Spark filters pushed into the read, evaluated on each batch


#: failures of the connection rather than of the request: the same request on a new connection is safe
#: (a range read removes nothing; ``ack_upto`` and the driver's bounds are idempotent)
RETRYABLE = (ConnectionClosed, ConnectFailed, BrokerTimeout, OSError)


def retrying(fn: Callable[[], T], retries: int, interval_ms: int, what: str) -> T:
    """``fn()``, called again (after ``interval_ms``) up to ``retries`` times when the connection fails."""
    failures = 0
    while True:
        try:
            return fn()
        except RETRYABLE as exc:
            failures += 1
            if failures > retries:
                raise
            log.warning("%s failed (%s); retry %d of %d in %d ms", what, exc, failures, retries, interval_ms)
            time.sleep(interval_ms / 1000)


#: a bound on one Arrow answer's body bytes (at least one message is always sent): keeps a fetch of large
#: messages under the SDK's frame limit
ARROW_FETCH_BYTES = 32 * 1024 * 1024


#: range requests a task keeps on the wire: the broker builds (and the socket carries) the next answer
#: while the task converts the current one and Spark consumes it, instead of both sides taking turns
FETCHES_IN_FLIGHT = 2


def read_partition(p: RangePartition) -> Iterator[Any]:
    """Arrow record batches of the partition's range, at most ``fetch_size`` rows per fetch, in sequence
    order.  Each fetch asks for one Arrow frame (spec/spark.md §6) and takes a per-message answer from a
    broker that cannot give one.  Nothing is removed or acknowledged.

    The range is read in windows of ``fetch_size`` sequence numbers, :data:`FETCHES_IN_FLIGHT` of them
    asked ahead (``pymq.client.blocking.start_range``); the answers are taken in window order, so the rows
    still come in sequence order, and a window whose answer stopped early (its byte cap) is finished from
    where it stopped before the next window's rows.  A fetch whose connection fails is retried on a new
    connection from the cursor (the first sequence number not yet yielded; ``retries`` consecutive
    failures at most), so a retry neither skips nor repeats a row."""
    if p.start >= p.end:
        return
    settle_worker_heap()
    kind = destination_kind(p.destination)
    keep = expression(list(p.filters)) if p.filters else None
    cursor = p.start
    failures = 0
    while cursor < p.end:
        try:
            with CONNECTIONS.session(p.connection) as session:
                ahead: deque[tuple[int, PendingRange]] = deque()    # (window end, its request), in order
                asked = cursor                                       # where the next window starts
                while cursor < p.end:
                    while len(ahead) < FETCHES_IN_FLIGHT and asked < p.end:
                        # a window no wider than the fetch size: the broker never walks past one answer
                        upto = min(p.end, asked + p.fetch_size)
                        ahead.append((upto, _ask(session, p, asked, upto)))
                        asked = upto
                    upto, pending = ahead.popleft()
                    r = pending.result()
                    failures = 0
                    if p.check_loss:
                        # on every fetch, not only the first: retention (or another consumer of a queue) may
                        # remove messages while a long partition is read; skipping them would be a silent gap
                        check_loss(p.destination, cursor, r.earliest, p.end)
                    for batch in _batches(r, p, kind):
                        if keep is not None:
                            batch = batch.filter(keep)
                        if batch.num_rows:
                            yield batch
                    if r.next_seq <= cursor:
                        return                # the broker has nothing at or past the cursor in this range
                    cursor = r.next_seq
                    if cursor < upto:
                        # a limit ended the answer inside its window: the rest of the window comes next
                        ahead.appendleft((upto, _ask(session, p, cursor, upto)))
        except RETRYABLE as exc:
            failures += 1
            if failures > p.retries:
                raise
            log.warning("reading %s from %d failed (%s); retry %d of %d in %d ms", p.destination, cursor, exc,
                        failures, p.retries, p.retry_interval_ms)
            time.sleep(p.retry_interval_ms / 1000)


def _ask(session: Any, p: RangePartition, lo: int, hi: int) -> PendingRange:
    return start_range(session, p.destination, from_seq=lo, to_seq=hi, max_messages=p.fetch_size,
                       max_bytes=ARROW_FETCH_BYTES, selector=p.selector, subscription=p.subscription,
                       source=p.source, frames=True, arrow=True, columns=wire_columns(p.include_properties))


def _batches(r, p: RangePartition, kind: str) -> Iterator[Any]:
    """The read schema's batches of one fetch: the broker's Arrow answer converted column-wise, or its
    per-message frames decoded (spec/spark.md §4)."""
    if r.arrow is not None:
        for batch in wire_batches(r.arrow, p.destination, p.include_properties):
            yield wire_to_read(batch, p.destination, kind, p.include_properties)
    elif r.frames:
        yield frames_to_batch(r.frames, p.destination, kind, p.include_properties)


def wire_batches(data: bytes, destination: str, include_properties: bool) -> Iterator[pa.RecordBatch]:
    """The record batches of a range answer, each validated in full (offsets within their data, UTF-8
    text, ...) before anything computes on it: a malformed answer is a MessageFormatError that says so,
    never a reader's crash on bad offsets (pyarrow's IPC reader checks the framing, not the values)."""
    def malformed(exc: Exception) -> MessageFormatError:
        return MessageFormatError(f"the broker's Arrow answer for {destination} is not a valid Arrow IPC stream "
                                  f"of a pymq message batch: {exc}")
    try:
        reader = pa.ipc.open_stream(data)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise malformed(exc) from None
    check_wire_schema(reader.schema, include_properties)
    while True:
        try:
            batch = reader.read_next_batch()
            batch.validate(full=True)
        except StopIteration:
            return
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise malformed(exc) from None
        yield batch


def check_loss(destination: str, cursor: int, earliest: int, end: int) -> None:
    """DataLoss if messages from ``cursor`` on were planned for a read but are no longer held."""
    if earliest > cursor:
        raise DataLoss(
            f"{destination}: messages {cursor}..{min(earliest, end) - 1} were planned for this read but the "
            f"broker no longer holds them (retention or other consumers removed them; earliest available is "
            f"{earliest}). Set failOnDataLoss=false to read what is left",
            destination=destination, requested=cursor, earliest=earliest)


class _DriverSide:
    """The driver's connection: opened on first use, reopened if it failed, never pickled."""

    _conn: Any = None
    _session: Any = None

    def _broker(self, connection: ConnectionOptions):
        conn = self._conn
        if conn is None or conn.closed or getattr(conn, "_error", None) is not None:
            self._close()
            self._conn = connection.connect()
            self._session = self._conn.create_session()
        return self._session

    def _close(self) -> None:
        conn, self._conn, self._session = self._conn, None, None
        if conn is not None:
            try:
                conn.close()
            except (PymqError, OSError):
                pass                   # a failed connection has nothing left to release

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_conn", None)
        state.pop("_session", None)
        return state


def _resolve(session, opts: ReadOptions) -> tuple[str, ...]:
    """The destinations a query reads: those named, or those the broker lists that match the pattern."""
    if opts.pattern is None:
        return opts.destinations
    try:
        listing = session.connection.queue_manager().destinations()
    except PymqError as exc:
        raise ConfigError(f"option 'destinationPattern' needs the broker's destination listing (admin "
                          f"operation list-destinations), which failed: {exc}") from None
    names = {*listing.get("queues", ()), *listing.get("topics", ()), *listing.get("logs", ())}
    pattern = DestinationPattern(opts.pattern)
    return tuple(sorted(n for n in names if pattern.matches(n)))


def _bounds(session, opts: ReadOptions, dest: str) -> tuple[int, int] | None:
    """(earliest available, latest assigned) sequence numbers of ``dest`` (its subscription for a topic);
    None when the broker says there is nothing there a reader could ever read (a topic without a
    retained log, read without a subscription)."""
    r = session.read_range(dest, max_messages=0, subscription=_sub(opts, dest), source=_source(opts))
    if r.source == "none":
        return None
    return r.earliest, r.latest


def _readable(session, opts: ReadOptions, dests) -> Iterator[tuple[str, tuple[int, int]]]:
    """(destination, bounds) of each of ``dests`` the query can read.  A topic the broker keeps no log
    for (and that the query reads without a subscription) would yield nothing, ever: named, or already
    in the query's offsets, it is refused with the reason; matched by a pattern, it is left out."""
    for dest in dests:
        bounds = _bounds(session, opts, dest)
        if bounds is not None:
            yield dest, bounds
        elif opts.pattern is None or dest in opts.destinations:
            raise ConfigError(
                f"{dest} keeps no retained log on the broker and the query reads it without a subscription, so "
                f"there is nothing it could ever read: give it retention in the broker's configuration "
                f"(retention: {{\"{dest}\": {{ms: ...}}}}), or read a durable subscription of it with option "
                f"'subscription'")
        else:
            log.warning("%s matches destinationPattern but keeps no retained log: nothing to read there", dest)


def _sub(opts: ReadOptions, dest: str) -> str | None:
    return opts.subscription if destination_kind(dest) == "topic" else None


def _source(opts: ReadOptions) -> str | None:
    """Consume mode reads (and acknowledges) the live queue, even where the destination has a log."""
    return "queue" if opts.mode == "consume" else None


def _first_at(session, opts: ReadOptions, dest: str, timestamp: int) -> int:
    """The sequence number of the first message with JMSTimestamp >= ``timestamp`` (or where the next
    one will be)."""
    r = session.read_range(dest, from_timestamp=timestamp, max_messages=1, subscription=_sub(opts, dest),
                           source=_source(opts))
    return r.messages[0].sequence if r.messages else r.next_seq


def _start(session, opts: ReadOptions, dest: str, default: str, bounds: tuple[int, int]) -> int:
    earliest, latest = bounds
    if opts.starting_timestamp is not None:
        return _first_at(session, opts, dest, opts.starting_timestamp)
    if opts.starting_by_timestamp is not None:
        # destinations left out start at their earliest message, as with startingOffsets
        at = opts.starting_by_timestamp.get(dest)
        return earliest if at is None else _first_at(session, opts, dest, at)
    spec = opts.starting if opts.starting is not None else default
    if isinstance(spec, dict):
        spec = spec.get(dest, EARLIEST)
    if spec in ("earliest", EARLIEST):
        return earliest
    if spec in ("latest", LATEST):
        return latest + 1
    return int(spec)


def _end(session, opts: ReadOptions, dest: str, bounds: tuple[int, int]) -> int:
    """Where a batch read of ``dest`` stops (exclusive): endingOffsets, or the first message stamped at or
    after endingTimestamp / the destination's endingOffsetsByTimestamp (Kafka's rule), else the latest."""
    at = opts.ending_timestamp
    if opts.ending_by_timestamp is not None:
        at = opts.ending_by_timestamp.get(dest)
    if at is not None:
        return _first_at(session, opts, dest, at)
    spec = opts.ending.get(dest, LATEST) if isinstance(opts.ending, dict) else opts.ending
    return bounds[1] + 1 if spec in ("latest", LATEST) else int(spec)


def _partitions(opts: ReadOptions, spans: list[Span], selector: str | None,
                filters: tuple = ()) -> list[RangePartition]:
    pieces = split(spans, opts.min_partitions, opts.max_messages_per_partition)
    check = opts.mode == "browse" and opts.fail_on_data_loss
    return [RangePartition(opts.connection, s.destination, s.start, s.end, selector=selector,
                           subscription=_sub(opts, s.destination), fetch_size=opts.fetch_size,
                           include_properties=opts.include_properties, check_loss=check, source=_source(opts),
                           retries=opts.fetch_retries, retry_interval_ms=opts.fetch_retry_interval_ms,
                           filters=filters)
            for s in pieces]


class BatchReader(DataSourceReader):
    """``spark.read.format("pymq")``: everything between startingOffsets and endingOffsets, read once."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.pushdown: Pushdown | None = None      # set by pushFilters (PushdownBatchReader)

    def partitions(self) -> list[RangePartition]:
        opts = self.opts
        return retrying(self._plan, opts.fetch_retries, opts.fetch_retry_interval_ms, "planning the read")

    def _plan(self) -> list[RangePartition]:
        opts = self.opts
        push = self.pushdown
        spans = []
        with CONNECTIONS.session(opts.connection) as session:
            kept = [d for d in _resolve(session, opts) if push is None or push.keeps(d, destination_kind(d))]
            for dest, bounds in _readable(session, opts, kept):
                start = _start(session, opts, dest, "earliest", bounds)
                end = _end(session, opts, dest, bounds)
                if push is not None:
                    start, end = push.narrow(start, end)
                spans.append(Span(dest, start, max(start, end)))
        filters = tuple(push.filters) if push is not None else ()
        # Spark needs at least one partition; an empty range reads nothing (and connects to nothing)
        return _partitions(opts, spans, opts.selector, filters) or [RangePartition(opts.connection, "/queue/-", 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RangePartition), partition
        return read_partition(partition)


class PushdownBatchReader(BatchReader):
    """A batch reader that takes Spark's filters (``filterPushdown=true`` and the Spark setting
    ``spark.sql.python.filterPushdown.enabled=true``; Spark refuses a reader with ``pushFilters``
    while that setting is off, so pushing is opt-in)."""

    def pushFilters(self, filters):
        from pyspark_pymq._filters import translate
        self.pushdown, remaining = translate(list(filters))
        return iter(remaining)


class StreamReader(_DriverSide, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("pymq")``: micro-batches of sequence ranges (see module doc)."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._target: dict[str, int] | None = None       # Trigger.AvailableNow stops here
        self._latest: dict[str, int] = {}                 # last seen, for reportLatestOffset
        self._earliest: dict[str, int] = {}               # failOnDataLoss=false: start of what is left
        self._acked: dict[str, int] = {}                  # consume mode: acknowledged below this
        self._last_trigger: float | None = None           # minOffsetsPerTrigger: when a batch last fired

    def _retrying(self, fn: Callable[[], T], what: str) -> T:
        # each driver call below is safe to repeat whole: it reads bounds, and acknowledges idempotently
        return retrying(fn, self.opts.fetch_retries, self.opts.fetch_retry_interval_ms, what)

    # -- offsets (driver) -------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        return self._retrying(self._initial_offset, "finding the initial offset")

    def _initial_offset(self) -> dict:
        opts = self.opts
        session = self._broker(opts.connection)
        positions = {}
        for dest, bounds in _readable(session, opts, _resolve(session, opts)):
            if opts.mode == "consume":
                # the broker's cursor: the first message not acknowledged, so a query whose checkpoint is
                # lost starts again after the last committed batch (at-least-once)
                positions[dest] = bounds[0]
            else:
                positions[dest] = _start(session, opts, dest, "latest", bounds)
        return to_offset(positions)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_messages_per_trigger is not None:
            return ReadMaxRows(self.opts.max_messages_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        def target() -> dict[str, int]:
            session = self._broker(self.opts.connection)
            return {d: bounds[1] + 1 for d, bounds in _readable(session, self.opts, _resolve(session, self.opts))}
        self._target = self._retrying(target, "finding where Trigger.AvailableNow stops")

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return self._retrying(lambda: self._latest_offset(start, limit), "planning the next micro-batch")

    def _latest_offset(self, start: dict, limit: ReadLimit) -> dict:
        opts = self.opts
        session = self._broker(opts.connection)
        pos = from_offset(start)
        if opts.mode == "consume":
            self._acknowledge(pos)
        end: dict[str, int] = {}
        skip: dict[str, int] = {}       # failOnDataLoss=false: where a destination's messages start again
        # a pattern is resolved again at every trigger, so destinations created later join the query
        for dest, (earliest, latest) in _readable(session, opts, sorted(set(_resolve(session, opts)) | set(pos))):
            self._latest[dest] = latest + 1
            if dest not in pos:
                # A destination new to the query joins at its earliest message: this batch only records
                # that position (reads nothing of it), so every batch's range is fixed by its two offsets
                # and a replay reads the same messages.
                end[dest] = earliest
                continue
            if earliest > pos[dest]:
                if opts.mode == "browse" and opts.fail_on_data_loss:
                    raise DataLoss(
                        f"{dest}: the query is at offset {pos[dest]} but the broker's earliest available "
                        f"message is {earliest}: messages {pos[dest]}..{earliest - 1} were removed (retention, "
                        f"or other consumers of a queue) before the query read them. Set failOnDataLoss=false "
                        f"to go on", destination=dest, requested=pos[dest], earliest=earliest)
                # failOnDataLoss=false: the gap holds nothing, so the read limit counts from where the
                # messages start again; counted from the old position it would plan empty batches inside
                # the gap, and never leave it while producers add more than the limit per trigger
                self._earliest[dest] = earliest
                skip[dest] = earliest
            stop = latest + 1
            if self._target is not None:
                # Trigger.AvailableNow: nothing past what existed when the query started, and nothing of
                # a destination that appeared since
                stop = min(stop, self._target.get(dest, pos[dest]))
            end[dest] = max(pos[dest], stop)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        if isinstance(limit, ReadMaxRows) and opts.max_bytes_per_trigger is not None:
            max_bytes = opts.max_bytes_per_trigger            # both options: both caps
        counted = {**pos, **skip}
        if opts.min_messages_per_trigger is not None and self._target is None and \
                self._held_back(counted, end, opts.min_messages_per_trigger):
            return to_offset(pos)
        if max_rows is not None:
            end = cap_messages(counted, end, max_rows)      # a new destination (no start) has nothing to cap
        if max_bytes is not None:
            end = self._cap_bytes(session, counted, end, max_bytes)
        return to_offset(end)

    def _held_back(self, counted: dict[str, int], end: dict[str, int], minimum: int) -> bool:
        """minOffsetsPerTrigger (Kafka's rule): wait for ``minimum`` messages, unless maxTriggerDelay has
        passed since the last micro-batch (or none has been planned yet).  Counted as sequence widths, an
        upper bound of the messages (gaps are possible), as Kafka counts offsets."""
        now = time.monotonic()
        if self._last_trigger is not None and (now - self._last_trigger) * 1000 < self.opts.max_trigger_delay_ms:
            waiting = sum(max(0, end[d] - counted[d]) for d in end if d in counted)
            if waiting < minimum:
                return True
        self._last_trigger = now
        return False

    def _cap_bytes(self, session, pos: dict[str, int], end: dict[str, int], budget: int) -> dict[str, int]:
        # The broker has no size-only query, so this reads the candidate messages (up to the budget) on
        # the driver to learn where the budget runs out.  Costs one extra transfer of each batch.
        widths = {d: end[d] - pos[d] for d in end if d in pos and end[d] > pos[d]}
        total = sum(widths.values())
        out = dict(end)
        for dest, width in widths.items():
            share = max(1, budget * width // total)
            r = session.read_range(dest, from_seq=pos[dest], to_seq=end[dest], max_bytes=share,
                                   selector=self.opts.selector, subscription=_sub(self.opts, dest),
                                   source=_source(self.opts), arrow=True, frames=True)
            out[dest] = min(end[dest], max(pos[dest], r.next_seq))
        return out

    def reportLatestOffset(self) -> dict | None:
        return to_offset(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> list[RangePartition]:
        # a destination absent from ``start`` joined in this batch: nothing of it is read yet.  A gap this
        # driver saw trimmed (failOnDataLoss=false) is not split into partitions that would read nothing;
        # a replay planned by another driver process reads the same messages through the gap.
        pos, stop = from_offset(start), from_offset(end)
        spans = [Span(d, min(stop[d], max(pos.get(d, stop[d]), self._earliest.get(d, 0))), stop[d])
                 for d in stop]
        return _partitions(self.opts, spans, self.opts.selector)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RangePartition), partition
        return read_partition(partition)

    def commit(self, end: dict) -> None:
        """Spark has committed every batch up to ``end``: in consume mode, acknowledge below it."""
        if self.opts.mode == "consume":
            self._retrying(lambda: self._acknowledge(from_offset(end)), "acknowledging a committed batch")

    def _acknowledge(self, upto: dict[str, int]) -> None:
        """``ack_upto`` each destination below its position, once per position.  Called from ``commit``
        and from ``latestOffset``: Spark asks for the next batch only from a start whose batch is in its
        commit log, but calls ``commit`` lazily, while planning a batch that has data; so without this a
        query over an idle queue would leave its last batch unacknowledged until more messages came."""
        session = None
        for dest, seq in upto.items():
            if self._acked.get(dest) == seq:
                continue
            if session is None:
                session = self._broker(self.opts.connection)
            session.ack_upto(dest, seq, subscription=_sub(self.opts, dest))
            self._acked[dest] = seq

    def stop(self) -> None:
        self._close()


class PymqDataSource(DataSource):
    """The ``pymq`` format.  Options: pyspark_pymq/README.md."""

    @classmethod
    def name(cls) -> str:
        return "pymq"

    def schema(self) -> str:
        # called by load() for reads only (writes take the DataFrame's schema): the earliest place to
        # refuse bad read options, before any job or stream starts
        return read_ddl(ReadOptions.parse(self.options, streaming=None).include_properties)

    def reader(self, schema) -> BatchReader:
        opts = ReadOptions.parse(self.options, streaming=False)
        return PushdownBatchReader(opts) if opts.filter_pushdown else BatchReader(opts)

    def streamReader(self, schema) -> StreamReader:
        opts = ReadOptions.parse(self.options, streaming=True)
        if opts.filter_pushdown:
            raise ConfigError("option 'filterPushdown' applies to batch reads (Spark pushes no filters into "
                              "streaming sources); use 'selector' to filter a stream on the broker")
        return StreamReader(opts)

    def writer(self, schema, overwrite: bool):
        from pyspark_pymq.sink import BatchWriter
        if overwrite:
            raise ConfigError("pymq destinations are append-only: a batch write cannot replace what a "
                              "destination holds; use mode('append')")
        return BatchWriter(WriteOptions.parse(self.options), schema)

    def streamWriter(self, schema, overwrite: bool):
        # ``overwrite`` is outputMode("complete"): every trigger sends the whole result table again, as
        # the Kafka sink does; nothing already sent is taken back
        from pyspark_pymq.sink import StreamWriter
        return StreamWriter(WriteOptions.parse(self.options), schema)


class PymqPythonDataSource(PymqDataSource):
    """The same data source under the name ``pymq_python``.  With the JVM source's jar on Spark's classpath
    (bindings/spark) ``format("pymq")`` is the JVM source; a session that wants this one as well (to compare
    them, or for an option the JVM source lacks) registers it under this name:
    ``spark.dataSource.register(PymqPythonDataSource)``, then ``format("pymq_python")``."""

    @classmethod
    def name(cls) -> str:
        return "pymq_python"
