"""A bulk SEND's rows through the placement path (spec/spark.md §7): the rules of placement.py, in
their order, applied to the frame as a whole and column-wise. Every row is checked before any is numbered;
then the rows that only a topic's retained log keeps become one sealed segment and one stored record, the
rows for a queue one stored record and one bulk block (blocks.py), each without a per-message object; other
rows (a topic's subscribers, a queue routed in a cluster or making room with ``drop-oldest``) become
messages placed one by one through :meth:`Placement.commit`.

A mixin of :class:`placement.Placement`, whose state (store, sequences, logs, dedup window, cluster) it uses.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pymq_server.broker import bulk_rows, segments
from pymq_server.broker.blocks import BulkBlock
from pymq_server.broker.bulk_rows import BulkResult
from pymq_server.broker.clients import Client
from pymq_server.broker.message import now_ms
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.topic import Topic

from pymq.errors import QueueFull, SchemaViolation

if TYPE_CHECKING:
    from pymq_server.broker.dedup import DuplicateWindow
    from pymq_server.broker.flow import MemoryFlow
    from pymq_server.broker.log import RetainedLog, RetainedLogs
    from pymq_server.broker.membership import ClusterMembership
    from pymq_server.broker.placement import Plan
    from pymq_server.broker.requests import SendResult
    from pymq_server.broker.sequences import SequenceBook
    from pymq_server.storage.store import HoldingStore


class BulkPlacement:
    """Placement's bulk SEND path (module docstring)."""

    # Placement's state, set by its __init__
    node_id: str
    default_persistent: bool
    store: HoldingStore
    seqs: SequenceBook
    logs: RetainedLogs
    dedup: DuplicateWindow
    flow: MemoryFlow
    cluster: ClusterMembership

    def commit(self, plan: Any, client: Client | None, stored_by: Any = None) -> SendResult:
        raise NotImplementedError     # Placement's

    def place_rows(self, path: Any, policy: Any, target: Any, batch: Any, body: bytes,
                   client: Client | None) -> BulkResult:
        """Put a bulk SEND's rows (``batch``, read and checked by bulk_rows.read_bulk; ``body`` the frame's
        IPC stream) under ``target`` with ``policy``, the rules of its bulk ``path``, in the usual order,
        column-wise."""
        destination = target.destination
        queue = target if isinstance(target, MessageQueue) else None
        priority, ttl = 4, 0
        if queue is not None and policy.defaults:
            priority, ttl = queue.config.default_priority, queue.config.default_expiration_ms
        arrival = now_ms()

        def complete(rows: Any, first_seq: int, first_key: int) -> Any:
            return bulk_rows.complete_bulk(rows, first_seq=first_seq, first_key=first_key, node_id=self.node_id,
                                           now=arrival, persistent=self.default_persistent, priority=priority,
                                           ttl=ttl)

        # 1 duplicates (look-up): the dedup column against the window, and against earlier rows of the frame
        dropped = self._duplicate_rows(destination, batch) if policy.dedup else []
        batch = bulk_rows.drop_rows(batch, dropped)
        n = batch.num_rows
        peers: list | None = None
        make_room = 0
        if queue is not None and n:
            schema = queue.schema if policy.schema else None
            route = policy.routing and queue.kind == "queue" and self.cluster.active
            headers = segments.row_headers(complete(batch, 0, 0)) if schema is not None or route else []
            if schema is not None:                                               # 2 schema, every row
                for i, row in enumerate(headers):
                    try:
                        schema.check(row, destination)
                    except SchemaViolation as exc:
                        raise SchemaViolation(f"bulk SEND row {i}: {exc}") from None
            if route:                                                            # 3 routing, row by row
                peers = [self.cluster.route_queue(queue, row) for row in headers]
            if policy.depth:                                                     # 4 depth, the frame at once
                make_room = self._room(queue, n if peers is None else peers.count(None))
        if n == 0:
            return BulkResult(self.seqs.peek(destination), 0, len(dropped), False)
        first_seq = self.seqs.take(destination, n)                               # 5 one block of numbers
        first_key = self.seqs.take("", n)
        rows = complete(batch, first_seq, first_key)
        log = self.logs.get(destination) if policy.log else None
        if isinstance(target, Topic) and log is not None and not target.subscriptions and not self.cluster.active:
            # only the log keeps these rows: one sealed segment, one stored record, no message objects
            return BulkResult(first_seq, n, len(dropped),
                              self._log_segment(log, body, rows, dropped, first_key, arrival, (priority, ttl)))
        if queue is not None and peers is None and not make_room and log is None and \
                self.store.choose is self.store._default:
            # one block in the queue, one stored record: rows become messages as consumers take them
            return BulkResult(first_seq, n, len(dropped),
                              self._queue_block(queue, body, rows, dropped, first_key, arrival, (priority, ttl),
                                                client, policy.dedup))
        with bulk_rows.collector_paused():     # tens of thousands of objects at once (see there)
            made = bulk_rows.materialize_rows(rows, destination, first_key, client)
            dedup_ids = rows.column("dedup_id").to_pylist() if policy.dedup else [None] * n
            plans: list[Plan] = []
            for i, message in enumerate(made):
                if queue is None:
                    assert isinstance(target, Topic)
                    routed = policy.routing and self.cluster.active
                    outboxes = self.cluster.topic_outboxes(target, message) if routed else []
                    plans.append((path, message, [sub.queue for sub in target.targets(message)], outboxes,
                                  log, None, None, dedup_ids[i], destination))
                else:
                    peer = None if peers is None else peers[i]
                    if peer is None:
                        plans.append((path, message, [queue], [], log, None, None, dedup_ids[i], destination))
                    else:
                        plans.append((path, message, [self.cluster.outbox(peer)], [], None, None, None,
                                      dedup_ids[i], destination))
            for _ in range(make_room):
                queue.drop_oldest()  # type: ignore[union-attr]
            stored = False
            for plan in plans:                                                       # 6-8 per row's message
                stored = self.commit(plan, client)[1] or stored
        if queue is not None and client is not None and queue.config.overflow == "block" and \
                queue.config.max_depth and queue.depth >= queue.config.max_depth:
            queue.block_producer(client)
        return BulkResult(first_seq, n, len(dropped), stored)

    def _duplicate_rows(self, destination: str, batch: Any) -> list[int]:
        """Rows whose dedup id reached the destination within the window, or appears earlier in the frame."""
        if "dedup_id" not in batch.schema.names:
            return []
        ids = batch.column("dedup_id")
        if ids.null_count == len(ids):
            return []
        out, earlier = [], set()
        for i, dedup_id in enumerate(ids.to_pylist()):
            if dedup_id is None:
                continue
            if dedup_id in earlier:
                self.dedup.duplicates += 1
                out.append(i)
            elif self.dedup.seen(destination, dedup_id):
                out.append(i)
            earlier.add(dedup_id)
        return out

    @staticmethod
    def _room(queue: MessageQueue, n: int) -> int:
        """Rule 4 for ``n`` rows at once: raises for ``reject``, or how many to drop for ``drop-oldest``."""
        cfg = queue.config
        if not cfg.max_depth or queue.depth + n <= cfg.max_depth:
            return 0
        if cfg.overflow == "reject":
            raise QueueFull(f"queue '{queue.destination}' holds {queue.depth} of {cfg.max_depth} messages; the "
                            f"bulk SEND's {n} rows were refused", destination=queue.destination)
        if cfg.overflow == "drop-oldest":
            return min(queue.ready.count, queue.depth + n - cfg.max_depth)
        return 0

    def _log_segment(self, log: RetainedLog, body: bytes, rows: Any, dropped: list[int], first_key: int,
                     arrival: int, defaults: tuple[int, int]) -> bool:
        """Rules 6–8 for rows only a retained log keeps: one stored record (the SEND's own body), one segment."""
        holder, stored = self._hold_record(log.name, log.destination, body, rows, dropped, first_key, arrival,
                                           defaults, True)
        log.append_segment(rows, first_key, holder)
        return stored

    def _queue_block(self, queue: MessageQueue, body: bytes, rows: Any, dropped: list[int], first_key: int,
                     arrival: int, defaults: tuple[int, int], client: Client | None, dedup: bool) -> bool:
        """Rules 6–8 for a queue's rows: one stored record, one bulk block in the queue (blocks.py)."""
        holder, stored = self._hold_record(queue.name, queue.destination, body, rows, dropped, first_key, arrival,
                                           defaults, dedup, queue.durable)
        block = BulkBlock(rows, holder, queue.name, first_key, stored)
        if client is not None:
            block.producer, block.client_id, block.user = client.id, client.client_id, client.user.name
        queue.enqueue_block(block)
        if client is not None and queue.config.overflow == "block" and queue.config.max_depth and \
                queue.depth >= queue.config.max_depth:
            queue.block_producer(client)
        return stored

    def _hold_record(self, ref: str, destination: str, body: bytes, rows: Any, dropped: list[int], first_key: int,
                     arrival: int, defaults: tuple[int, int], dedup: bool, durable: bool = True) -> tuple[Any, bool]:
        """A bulk SEND's one record (the SEND's own body) held with a reference for ``ref`` (a log or a
        queue), its rows' dedup ids remembered: (the record's message object, whether a device stores it)."""
        key = self.seqs.next("")
        holder = bulk_rows.segment_record(body, rows, dropped, destination, key, f"ID:{self.node_id}-{key}",
                                          first_key, self.node_id, arrival, (self.default_persistent, *defaults))
        stored = self.store.hold(holder, [ref]) if holder.persistent and durable else False
        self.flow.held(holder)
        if dedup:
            for dedup_id in rows.column("dedup_id").drop_null().to_pylist():
                self.dedup.remember(destination, dedup_id)
        return holder, stored

