"""A bulk SEND's rows through the placement path (spec/spark.md §7): the rules of placement.py, in
their order, applied to the frame as a whole and column-wise. Every row is checked before any is numbered;
then the rows become one stored record (the SEND's own body) held by the topic's retained log as a sealed
segment and by each queue that takes them — the queue, or the topic's subscriptions — as a bulk block
(blocks.py), with no per-message object; where a row must be placed on its own (a subscription's selector,
routing in a cluster, ``drop-oldest`` making room, storage rules choosing per message) every row becomes a
message placed one by one through :meth:`Placement.commit`.

Composed into :class:`placement.Placement`, whose state (store, sequences, logs, dedup window, cluster) it
reads, and whose commit it calls for rows placed one by one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pymq_server.broker import bulk_rows, segments
from pymq_server.broker import placement_rules as rules
from pymq_server.broker.placement_rules import Plan
from pymq_server.broker.blocks import BulkBlock
from pymq_server.broker.bulk_rows import BulkResult
from pymq_server.broker.clients import Client
from pymq_server.broker.message import now_ms
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.topic import Topic


if TYPE_CHECKING:
    from pymq_server.broker.placement import Placement
    from pymq_server.broker.log import RetainedLog


class BulkPlacement:
    """Placement's bulk SEND path (module docstring), over the state of the :class:`Placement` it serves."""

    def __init__(self, placement: Placement) -> None:
        self.placement = placement

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

        node_id, persistent = self.placement.node_id, self.placement.default_persistent

        def complete(rows: Any, first_seq: int, first_key: int) -> Any:
            return bulk_rows.complete_bulk(rows, first_seq=first_seq, first_key=first_key, node_id=node_id,
                                           now=arrival, persistent=persistent, priority=priority,
                                           ttl=ttl)

        # 1 duplicates (look-up): the dedup column against the window, and against earlier rows of the frame
        dropped = self._duplicate_rows(destination, batch) if policy.dedup else []
        batch = bulk_rows.drop_rows(batch, dropped)
        n = batch.num_rows
        peers: list | None = None
        grows: list[bool] = []
        if queue is not None and n:
            cfg = queue.config
            schema = queue.schema if policy.schema else None
            route = policy.routing and queue.kind == "queue" and self.placement.cluster.active
            depth = policy.depth and bool(cfg.max_depth)
            needs_rows = schema is not None or route or (depth and cfg.last_value_key is not None)
            headers = segments.row_headers(complete(batch, 0, 0)) if needs_rows else []
            if schema is not None:                                               # 2 schema, every row
                rules.check_schema(schema, destination, headers, numbered=True)
            if route:                                                            # 3 routing, row by row
                # by the ids the rows are given at 5 (nothing numbers keys in between): spec/routing.md §2.3
                first, prefix = self.placement.seqs.peek(""), self.placement.id_prefix
                peers = [self.placement.cluster.route_queue(queue, row, f"{prefix}{first + i}")
                         for i, row in enumerate(headers)]
            if depth:                                                            # 4 depth, the frame at once
                if needs_rows:
                    local = headers if peers is None else \
                        [row for row, peer in zip(headers, peers, strict=True) if peer is None]
                    grows = rules.growing(queue, local, None)
                else:
                    grows = [True] * n
                rules.check_depth(queue, sum(grows), None, what=f"the bulk SEND's {n} rows")
        make_room = queue is not None and bool(grows) and queue.config.overflow == "drop-oldest" and \
            queue.depth + sum(grows) > queue.config.max_depth
        if n == 0:
            return BulkResult(self.placement.seqs.peek(destination), 0, len(dropped), False)
        matched = target.matched() if queue is None else []
        if matched:                 # a topic some pattern subscriptions read (topic.py)
            self.placement.pattern_floor(target, n)
        first_seq = self.placement.seqs.take(destination, n)                               # 5 one block of numbers
        first_key = self.placement.seqs.take("", n)
        rows = complete(batch, first_seq, first_key)
        log = self.placement.logs.get(destination) if policy.log else None
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
                    routed = policy.routing and self.placement.cluster.active
                    outboxes = self.placement.cluster.topic_outboxes(target, message) if routed else []
                    plans.append(Plan(path, message, [sub.queue for sub in target.targets(message, matched)], outboxes,
                                      log, None, None, dedup_ids[i], destination))
                else:
                    peer = None if peers is None else peers[i]
                    if peer is None:
                        # drop-oldest makes room as each row that makes the queue deeper enters, as for a SEND
                        drop = queue if make_room else None
                        plans.append(Plan(path, message, [queue], [], log, drop, None, dedup_ids[i], destination))
                    else:
                        plans.append(Plan(path, message, [self.placement.cluster.outbox(peer)], [], None, None, None,
                                          dedup_ids[i], destination))
            stored = False
            for plan in plans:                                                       # 6-8 per row's message
                stored = self.placement.commit(plan, client)[1] or stored
        if queue is not None and client is not None and rules.must_block(queue):
            queue.block_producer(client)
        return BulkResult(first_seq, n, len(dropped), stored)

    def _duplicate_rows(self, destination: str, batch: Any) -> list[int]:
        """Rule 1 over the frame's dedup column (placement_rules.duplicate_rows)."""
        if "dedup_id" not in batch.schema.names:
            return []
        ids = batch.column("dedup_id")
        if ids.null_count == len(ids):
            return []
        return rules.duplicate_rows(self.placement.dedup, destination, ids.to_pylist())

    def _units(self, target: Any, queue: MessageQueue | None, log: RetainedLog | None, peers: list | None,
               make_room: bool, client: Client | None) -> list[MessageQueue] | None:
        """The queues that take the frame's rows as one bulk block each (a topic's subscriptions, or the
        queue), with the log's segment: None when some row must be placed on its own (a selector
        subscription, a queue's log or routing in a cluster, ``drop-oldest`` making room, storage rules
        choosing per message)."""
        if self.placement.cluster.active:
            return None
        if queue is None and not target.subscriptions and log is not None:
            return []                       # only the log keeps them
        if self.placement.store.uses_rules:
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
        refs = rules.stored_references(queues, log, [])
        key = self.placement.seqs.next("")
        node_id = self.placement.node_id
        holder = bulk_rows.segment_record(body, rows, dropped, destination, key, f"{self.placement.id_prefix}{key}",
                                          first_key, node_id, arrival, (self.placement.default_persistent, *defaults))
        stored = self.placement.store.hold(holder, refs) if holder.persistent and refs else False
        self.placement.flow.held(holder)
        if dedup:
            for dedup_id in rows.column("dedup_id").drop_null().to_pylist():
                self.placement.dedup.remember(destination, dedup_id)
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


