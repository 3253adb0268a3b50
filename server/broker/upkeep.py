"""What a queue does outside dispatch: housekeeping (expiry, delivery timeouts), overflow (drop-oldest,
producers paused by ``max_depth``), and removals that skip delivery (purge, ack-up-to).

Composed into :class:`~pymq_server.broker.queue.MessageQueue` (``queue.upkeep``), whose ready index, backlog,
counters and entry outcomes it uses; it owns the heaps housekeeping reads (entries by expiry, deliveries by
deadline) and the producers paused by ``max_depth``. The entry states and their guard are states.py's.
"""
from __future__ import annotations

import heapq
from types import MappingProxyType
from typing import TYPE_CHECKING, cast

from pymq_server.broker.states import ACQUIRED, READY, SCHEDULED, Event, transition

if TYPE_CHECKING:
    from pymq_server.broker.queue import MessageQueue


#: the scheduled entries (MessageQueue.timed) of a queue that has none, shared and read-only (MessageQueue._park
#: makes the queue a dict of its own: an empty one is 64 bytes, and most queues never schedule)
NOT_TIMED: dict = cast(dict, MappingProxyType({}))
#: the producers paused by a queue that pauses none (never added to: QueueUpkeep.block_producer makes a set)
NOT_BLOCKED: set = cast(set, frozenset())


class QueueUpkeep:
    """One queue's housekeeping, overflow and removals (module docstring)."""

    __slots__ = ("queue", "expiring", "timeouts", "blocked")

    def __init__(self, queue: MessageQueue) -> None:
        self.queue = queue
        self.expiring: list = []           # heap (expires, seq, entry) for housekeeping, no scans
        self.timeouts: list = []           # heap (deadline, seq, deliveries, entry) of acquired entries
        # producer sessions paused by max_depth (overflow=block): a set of its own only while one is (an empty
        # set is 216 bytes, and most queues never pause anyone)
        self.blocked: set = NOT_BLOCKED

    def remove_ready(self, entries: list) -> None:
        """Complete ready entries without delivering them (cumulative ack up to a sequence number)."""
        now = self.queue.host.clock()
        for entry in entries:
            entry.state = transition(entry.state, Event.PURGE)
            self.queue.ready.remove(entry)
            if entry.message.group_id is not None:
                self.queue.grouped_ready -= 1
            self.queue.stats.removed += 1
            self.queue._drop(entry)
        if entries:
            self.queue._depth_delta(-len(entries), now)

    def purge(self) -> int:
        """Remove every waiting message (ready, scheduled, and the backlog's, read back one run at a time)."""
        count = self._purge(self.queue.ready.clear())
        self.queue.grouped_ready = 0
        timed = list(self.queue.timed)          # their timers find them completed and do nothing
        self.queue.timed = NOT_TIMED
        count += self._purge(timed)
        while self.queue.backlog.count:
            count += self._purge(self.queue.backlog.take(self.queue))
        return count

    def _purge(self, entries: list) -> int:
        for entry in entries:
            entry.state = transition(entry.state, Event.PURGE)
            self.queue._drop(entry)
        if entries:
            self.queue.stats.removed += len(entries)
            self.queue._depth_delta(-len(entries))
        return len(entries)

    def remove_below(self, upto: int) -> None:
        """Complete every waiting message below sequence number ``upto`` without delivering it
        (ack-up-to): ready ones, then the backlog's from its head while its runs hold such messages."""
        self.remove_ready(list(self.queue.ready.by_seq(0, upto)))
        while self.queue.backlog.count:
            entries = self.queue.backlog.take(self.queue)
            self.queue._admit(entries)
            below = [e for e in entries if e.message.seq < upto and e.state is READY]
            self.remove_ready(below)
            if len(below) < len(entries):
                break

    def expire_ready(self, now_ms: int) -> int:
        """Housekeeping: remove ready entries whose time has passed (never delivered).  Reads only the
        entries due, from a heap: no scan of the queue."""
        heap = self.expiring
        gone = 0
        while heap and heap[0][0] <= now_ms:
            _, _, entry = heapq.heappop(heap)
            state = entry.state
            if state is READY:
                self.queue.ready.remove(entry)
                if entry.message.group_id is not None:
                    self.queue.grouped_ready -= 1
            elif state is SCHEDULED:
                del self.queue.timed[entry]
            else:
                continue                      # delivered meanwhile: its consumer's outcome decides
            self.queue._expire(entry)
            gone += 1
        if gone and self.blocked:
            self.maybe_unblock()
        return gone

    def reclaim_timed_out(self, now: float) -> int:
        """Housekeeping: messages held by a consumer past ``delivery_timeout_ms`` are assumed lost and
        become ready again (a failed delivery: the count goes up, redelivery delay applies)."""
        heap = self.timeouts
        reclaimed = 0
        while heap and heap[0][0] <= now:
            _, _, deliveries, entry = heapq.heappop(heap)
            if entry.state is not ACQUIRED or entry.deliveries != deliveries:
                continue           # acked, or redelivered since: this deadline is stale
            consumer = entry.consumer
            if consumer is not None:
                consumer.session.forget_delivery(consumer, entry)
            self.queue.release(entry, failed=True, dispatch=False)
            reclaimed += 1
        if reclaimed:
            self.queue.dispatch()
        return reclaimed

    def drop_oldest(self) -> None:
        """Overflow ``drop-oldest``: the ready entry with the lowest sequence number goes (counted)."""
        if not self.queue.ready.count and self.queue.backlog.count:
            self.queue._admit(self.queue.backlog.take(self.queue))
        oldest = min(self.queue.ready, key=lambda e: e.message.seq, default=None)
        if oldest is None:
            return
        self.queue.ready.remove(oldest)
        if oldest.message.group_id is not None:
            self.queue.grouped_ready -= 1
        oldest.state = transition(oldest.state, Event.PURGE)
        self.queue.stats.dropped += 1
        self.queue._depth_delta(-1)
        self.queue._drop(oldest)

    def block_producer(self, session) -> None:
        """Overflow ``block``: stop taking frames from ``session`` until the queue has room."""
        if session not in self.blocked:
            if self.blocked is NOT_BLOCKED:
                self.blocked = set()
            self.blocked.add(session)
            session.pause_input("queue-full:" + self.queue.name)

    def maybe_unblock(self) -> None:
        if self.queue.depth < self.queue.config.max_depth or not self.queue.config.max_depth:
            blocked, self.blocked = self.blocked, NOT_BLOCKED
            for session in blocked:
                self.queue.host.call_soon(session.resume_input, "queue-full:" + self.queue.name)
