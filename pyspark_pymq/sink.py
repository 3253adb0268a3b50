"""The pymq sink: ``df.write.format("pymq")`` and ``df.writeStream.format("pymq")``.

Each task sends its partition's rows through one transacted session, committing every
``transactionSize`` rows: one broker receipt per commit (a commit is durable once its receipt is back),
and the messages of one transaction become visible together.  A task returns only after its last commit,
so a batch Spark reports done is in the broker.  A task that fails and is retried sends again what its
earlier attempt had committed: at-least-once, like the Kafka sink.

With ``dedup=true`` every message carries a duplicate-detection id (spec/stomp.md §9) that depends only on
where the row sits, ``<query id>:<batch id>:<partition>:<row>`` for a stream (the query id survives
restarts from the checkpoint) and ``<write id>:<partition>:<row>`` for a batch write (``dedupPrefix``, or
an id drawn once per write on the driver, shared by all retries of its tasks).  A retried task or a
replayed micro-batch then sends the same ids, and the broker drops the copies it has seen within its
``dedup_window_ms``: effectively-once delivery, provided each partition's rows come in the same order
when replayed (true for replayed source offsets and row-wise transformations; otherwise give a
``dedupId`` column).
"""
from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from pymq.client.blocking import PendingReceipt, start_send_arrow
from pymq.errors import ConfigError, MessageFormatError
from pymq.message import now_ms
from pyspark_pymq._arrow import (
    IGNORED_COLUMNS,
    PROPERTY_VALUE_TYPES,
    WRITE_COLUMNS,
    batch_to_messages,
)
from pyspark_pymq._bulk import rows_to_bulk
from pyspark_pymq._connections import CONNECTIONS
from pyspark_pymq._options import WriteOptions
from pyspark_pymq._plan import batch_dedup_base, dedup_id, stream_dedup_base

log = logging.getLogger("pyspark_pymq")


@dataclass
class SentMessages(WriterCommitMessage):
    partition: int
    count: int


def check_schema(schema, opts: WriteOptions) -> None:
    """Refuse, on the driver, a DataFrame the sink cannot turn into messages."""
    names = [f.name for f in schema.fields]
    if "value" not in names:
        raise ConfigError(f"the DataFrame written to pymq needs a 'value' column (string or binary); "
                          f"it has {', '.join(names) or 'no columns'}")
    if "destination" in names and "topic" in names:
        raise ConfigError("columns 'destination' and 'topic' both say where a row goes; keep one")
    if opts.destination is None and "destination" not in names and "topic" not in names:
        raise ConfigError("say where to send: a 'destination' column (e.g. '/queue/orders'), a 'topic' "
                          "column (a topic name, as Kafka's sink takes it), or the 'destination', 'queue' or "
                          "'topic' option")
    for f in schema.fields:
        if f.name in IGNORED_COLUMNS:
            continue
        accepted = WRITE_COLUMNS.get(f.name)
        if accepted is None:
            raise ConfigError(f"column '{f.name}' has no meaning for the pymq sink; its columns are "
                              f"{', '.join(WRITE_COLUMNS)} (drop or rename the others)")
        kind = f.dataType.typeName()
        if kind not in accepted:
            raise ConfigError(f"column '{f.name}' must be of type {' or '.join(accepted)}, not {kind}")
        if f.name == "properties":
            key, value = f.dataType.keyType.typeName(), f.dataType.valueType.typeName()
            if key != "string" or value not in PROPERTY_VALUE_TYPES:
                raise ConfigError(f"column 'properties' must be a map from string to one of "
                                  f"{', '.join(PROPERTY_VALUE_TYPES)}; got map<{key},{value}>")


#: rows of one bulk SEND are cut so its body stays near this size (well under a broker's max_frame_size)
BULK_FRAME_BYTES = 4 * 1024 * 1024
#: bulk SENDs a task keeps on the wire unanswered (the next one is built while the broker takes this one)
BULK_FRAMES_IN_FLIGHT = 2


class _NoArrow(Exception):
    """The broker answered the first bulk SEND that it takes no Arrow: send per message instead."""


def _send(opts: WriteOptions, batches: Iterator[pa.RecordBatch], dedup_base: str | None,
          partition: int) -> SentMessages:
    """A task's rows: as bulk SENDs (spec/spark.md §7) unless ``arrow=false``, per message when the broker
    cannot take Arrow (then from the first row again, which its refusal left unsent)."""
    if not opts.arrow:
        return _send_all(opts, batches, dedup_base, partition)
    held: list[pa.RecordBatch] = []

    def remember() -> Iterator[pa.RecordBatch]:
        for batch in batches:
            held.append(batch)       # only until the first bulk SEND is answered (see _send_bulk)
            yield batch

    try:
        return _send_bulk(opts, remember(), dedup_base, partition, held)
    except _NoArrow:
        log.warning("the broker takes no Arrow bulk SEND (no pyarrow there): sending per message")
        return _send_all(opts, itertools.chain(held, batches), dedup_base, partition)


def _send_bulk(opts: WriteOptions, batches: Iterator[pa.RecordBatch], dedup_base: str | None, partition: int,
               held: list) -> SentMessages:
    """Rows gathered per destination, across Spark's Arrow batches (10,000 rows each by default), into
    bulk SENDs of about BULK_FRAME_BYTES: fewer, larger frames, each waiting once for its durable
    receipt.  After the first frame (whose answer says whether the broker takes Arrow at all), one frame
    stays in flight while the next is built: the broker appends and syncs frame k while Spark hands over
    the rows of frame k + 1.  The task reports success only after its last receipt."""
    defaults = {"delivery_mode": opts.delivery_mode, "priority": opts.priority,
                "time_to_live": opts.time_to_live}
    sent = 0
    pending: dict[str, tuple[list, int, int]] = {}      # destination -> (batches, bytes, first row)
    in_flight: list[tuple[PendingReceipt, str, int, int]] = []     # (receipt, destination, rows, first row)
    state = {"first": True}

    with CONNECTIONS.session(opts.connection) as session:
        def settle(limit: int) -> None:
            """Wait for receipts until at most ``limit`` frames are in flight."""
            while len(in_flight) > limit:
                receipt, dest, rows, first_row = in_flight.pop(0)
                try:
                    receipt.result()
                except MessageFormatError as exc:
                    if state["first"] and "no pyarrow" in str(exc):
                        raise _NoArrow() from None
                    raise MessageFormatError(f"a bulk SEND of {rows} rows to {dest}, from row {first_row} of "
                                             f"this partition on: {exc}") from None
                if state["first"]:
                    state["first"] = False
                    held.clear()

        def flush(dest: str) -> None:
            parts, _, first_row = pending.pop(dest)
            rows = sum(b.num_rows for b in parts)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, parts[0].schema) as writer:
                # one batch per frame: the broker keeps it as it comes (no combining of chunks there)
                writer.write_batch(parts[0] if len(parts) == 1 else
                                   pa.Table.from_batches(parts).combine_chunks().to_batches()[0])
            settle(0 if state["first"] else BULK_FRAMES_IN_FLIGHT - 1)
            in_flight.append((start_send_arrow(session, dest, sink.getvalue().to_pybytes()), dest, rows, first_row))
            if state["first"]:
                settle(0)          # the first frame's answer says whether the broker takes Arrow at all

        for batch in batches:
            for dest, rows in rows_to_bulk(batch, opts.destination, defaults, sent, dedup_base, now_ms()):
                parts, size, first_row = pending.get(dest, ([], 0, sent))
                if parts and parts[0].schema != rows.schema:
                    flush(dest)                   # a frame's batches share one schema
                    parts, size, first_row = [], 0, sent
                parts.append(rows)
                pending[dest] = (parts, size + rows.nbytes, first_row)
                if size + rows.nbytes >= BULK_FRAME_BYTES:
                    flush(dest)
            sent += batch.num_rows
        for dest in list(pending):
            flush(dest)
        settle(0)
    return SentMessages(partition, sent)


def _send_all(opts: WriteOptions, batches: Iterator[pa.RecordBatch], dedup_base: str | None,
              partition: int) -> SentMessages:
    defaults = {"delivery_mode": opts.delivery_mode, "priority": opts.priority,
                "time_to_live": opts.time_to_live}
    sent = 0
    with CONNECTIONS.session(opts.connection, transacted=True) as session:
        producer = session.create_producer()
        pending = 0
        for batch in batches:
            for row, dest, message, args in batch_to_messages(batch, opts.destination, defaults, sent):
                if dedup_base is not None and message.dedup_id is None:
                    message.dedup_id = dedup_id(dedup_base, row)
                producer.send(message, dest, **args)
                pending += 1
                if pending >= opts.transaction_size:
                    session.commit()
                    pending = 0
            sent += batch.num_rows
        if pending:
            session.commit()
    return SentMessages(partition, sent)


def _task():
    from pyspark import TaskContext
    context = TaskContext.get()
    return context, (context.partitionId() if context is not None else 0)


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: WriteOptions, schema) -> None:
        check_schema(schema, opts)
        self.opts = opts
        # drawn here, on the driver, once per write: every attempt of a task sees the same id
        self.write_id = opts.dedup_prefix or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentMessages:
        _, partition = _task()
        base = batch_dedup_base(self.write_id, partition) if self.opts.dedup else None
        return _send(self.opts, iterator, base, partition)

    def commit(self, messages) -> None:
        """Nothing to do: each task committed its own transactions before reporting success."""

    def abort(self, messages) -> None:
        """Messages already committed by finished tasks stay (a queue has no undo); with dedup=true a
        rerun with the same dedupPrefix does not send them twice."""


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: WriteOptions, schema) -> None:
        check_schema(schema, opts)
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentMessages:
        context, partition = _task()
        base = None
        if self.opts.dedup:
            # Spark's own local properties (not public API, stable since 2.x): the query id is kept in the
            # checkpoint, so a batch replayed after a restart gets the same ids
            query = context.getLocalProperty("sql.streaming.queryId") if context else None
            batch = context.getLocalProperty("streaming.sql.batchId") if context else None
            if not query or batch is None:
                raise ConfigError("dedup=true needs the streaming query id and batch id, which this Spark "
                                  "version does not give to the sink's tasks")
            base = stream_dedup_base(self.opts.dedup_prefix or query, batch, partition)
        return _send(self.opts, iterator, base, partition)

    def commit(self, messages, batchId: int) -> None:
        """Nothing to do: the tasks committed their transactions."""

    def abort(self, messages, batchId: int) -> None:
        """Sent messages stay; the replayed batch carries the same dedup ids when dedup=true."""
