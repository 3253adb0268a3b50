"""A bulk SEND's rows through the placement path (spec/spark.md §7): the rules of placement.py, in
their order, applied to the frame as a whole and column-wise. Every row is checked before any is numbered;
then the rows become one stored record (the SEND's own body) held by the topic's retained log as a sealed
segment and by each queue that takes them — the queue, or the topic's subscriptions — as a bulk block
(blocks.py), with no per-message object; where a row must be placed on its own (a subscription's selector,
routing in a cluster, ``drop-oldest`` making room, storage rules choosing per message) every row becomes a
message placed one by one through :meth:`Placement.commit`.

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
        units = self._units(target, queue, log, peers, make_room, client)
        if units is not None:
            # one stored record; the log's segment and a block in each queue: no message object per row
            return BulkResult(first_seq, n, len(dropped),
                              self._hold_as_unit(destination, log, units, body, rows, dropped, first_key, arrival,
                                                 (priority, ttl), client, policy.dedup))
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

    def _units(self, target: Any, queue: MessageQueue | None, log: RetainedLog | None, peers: list | None,
               make_room: int, client: Client | None) -> list[MessageQueue] | None:
        """The queues that take the frame's rows as one bulk block each (a topic's subscriptions, or the
        queue), with the log's segment: None when some row must be placed on its own (a selector
        subscription, a queue's log or routing in a cluster, ``drop-oldest`` making room, storage rules
        choosing per message)."""
        if self.cluster.active:
            return None
        if queue is None and not target.subscriptions and log is not None:
            return []                       # only the log keeps them
        if self.store.choose is not self.store._default:
            return None
        if queue is not None:
            return [queue] if peers is None and not make_room and log is None else None
        subs = [sub for sub in target.subscriptions.values()
                if not (sub.no_local and client is not None and sub.owner == client.id)]
        if any(sub.selector is not None for sub in subs) or (not subs and log is None):
            return None
        return [sub.queue for sub in subs]

    def _hold_as_unit(self, destination: str, log: RetainedLog | None, queues: list[MessageQueue], body: bytes,
                      rows: Any, dropped: list[int], first_key: int, arrival: int, defaults: tuple[int, int],
                      client: Client | None, dedup: bool) -> bool:
        """Rules 6–8 for rows kept as a unit: one stored record (the SEND's own body) with a reference for
        the log and each durable queue, the log's sealed segment, a bulk block in each queue (blocks.py)."""
        refs = ([log.name] if log is not None else []) + [q.name for q in queues if q.durable]
        key = self.seqs.next("")
        holder = bulk_rows.segment_record(body, rows, dropped, destination, key, f"ID:{self.node_id}-{key}",
                                          first_key, self.node_id, arrival, (self.default_persistent, *defaults))
        stored = self.store.hold(holder, refs) if holder.persistent and refs else False
        self.flow.held(holder)
        if dedup:
            for dedup_id in rows.column("dedup_id").drop_null().to_pylist():
                self.dedup.remember(destination, dedup_id)
        if log is not None:
            log.append_segment(rows, first_key, holder)
        for queue in queues:
            block = BulkBlock(rows, holder, queue.name, first_key, stored and queue.durable)
            if client is not None:
                block.producer, block.client_id, block.user = client.id, client.client_id, client.user.name
            queue.enqueue_block(block)
            if client is not None and queue.config.overflow == "block" and queue.config.max_depth and \
                    queue.depth >= queue.config.max_depth:
                queue.block_producer(client)
        return stored


