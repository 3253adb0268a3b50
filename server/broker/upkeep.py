"""What a queue does outside dispatch: housekeeping (expiry, delivery timeouts), overflow (drop-oldest,
producers paused by ``max_depth``), and removals that skip delivery (purge, ack-up-to).

A part of :class:`~pymq_server.broker.queue.MessageQueue` (its base class), kept apart so each file
reads as one concern; the entry states and their guard are states.py's.
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from pymq_server.broker.states import ACQUIRED, READY, SCHEDULED, Event, transition

if TYPE_CHECKING:
    from pymq_server.broker.backlog import Backlog
    from pymq_server.broker.entry import Entry, QueueHost
    from pymq_server.broker.ready import ReadyIndex
    from pymq_server.broker.stats import QueueStats
    from pymq_server.config import QueueConfig


class QueueUpkeep:
    host: QueueHost
    name: str
    config: QueueConfig
    ready: ReadyIndex
    backlog: Backlog
    stats: QueueStats
    scheduled: int
    grouped_ready: int
    _expiring: list
    _timeouts: list
    _blocked: set

    if TYPE_CHECKING:       # MessageQueue's
        @property
        def depth(self) -> int: ...
        def _drop(self, entry: Entry) -> None: ...
        def _expire(self, entry: Entry) -> None: ...
        def _depth_delta(self, delta: int, now: float | None = None) -> None: ...
        def _admit(self, entries: list) -> None: ...
        def release(self, entry: Entry, *, failed: bool = True, requeue: bool = True,
                    dispatch: bool = True) -> None: ...
        def dispatch(self) -> None: ...

    def remove_ready(self, entries: list) -> None:
        """Complete ready entries without delivering them (cumulative ack up to a sequence number)."""
        now = self.host.clock()
        for entry in entries:
            entry.state = transition(entry.state, Event.PURGE)
            self.ready.remove(entry)
            if entry.message.group_id is not None:
                self.grouped_ready -= 1
            self.stats.removed += 1
            self._drop(entry)
        if entries:
            self._depth_delta(-len(entries), now)

    def _page_more(self) -> bool:
        """A consumer with a selector (or a group owned elsewhere) found nothing it may take in the ready
        index: the backlog's next step joins it while memory has room (a bulk block's rows are in memory
        already, so this costs no read), and True when it did. While memory is short nothing more comes
        in (the known limit in backlog.py's docstring)."""
        backlog = self.backlog
        assert backlog.pager is not None      # a backlog with entries has a pager
        if not backlog.pager.flow.room():
            return False
        self._admit(backlog.take(self))
        return True

    def purge(self) -> int:
        """Remove every waiting message (ready, and the backlog's, read back one run at a time)."""
        count = self._purge(self.ready.clear())
        self.grouped_ready = 0
        while self.backlog.count:
            count += self._purge(self.backlog.take(self))
        return count

    def _purge(self, entries: list) -> int:
        for entry in entries:
            entry.state = transition(entry.state, Event.PURGE)
            self._drop(entry)
        if entries:
            self.stats.removed += len(entries)
            self._depth_delta(-len(entries))
        return len(entries)

    def remove_below(self, upto: int) -> None:
        """Complete every waiting message below sequence number ``upto`` without delivering it
        (ack-up-to): ready ones, then the backlog's from its head while its runs hold such messages."""
        self.remove_ready(list(self.ready.by_seq(0, upto)))
        while self.backlog.count:
            entries = self.backlog.take(self)
            self._admit(entries)
            below = [e for e in entries if e.message.seq < upto and e.state is READY]
            self.remove_ready(below)
            if len(below) < len(entries):
                break

    def expire_ready(self, now_ms: int) -> int:
        """Housekeeping: remove ready entries whose time has passed (never delivered).  Reads only the
        entries due, from a heap: no scan of the queue."""
        heap = self._expiring
        gone = 0
        while heap and heap[0][0] <= now_ms:
            _, _, entry = heapq.heappop(heap)
            state = entry.state
            if state is READY:
                self.ready.remove(entry)
                if entry.message.group_id is not None:
                    self.grouped_ready -= 1
            elif state is SCHEDULED:
                self.scheduled -= 1
            else:
                continue                      # delivered meanwhile: its consumer's outcome decides
            self._expire(entry)
            gone += 1
        if gone and self._blocked:
            self._maybe_unblock()
        return gone

    def reclaim_timed_out(self, now: float) -> int:
        """Housekeeping: messages held by a consumer past ``delivery_timeout_ms`` are assumed lost and
        become ready again (a failed delivery: the count goes up, redelivery delay applies)."""
        heap = self._timeouts
        reclaimed = 0
        while heap and heap[0][0] <= now:
            _, _, deliveries, entry = heapq.heappop(heap)
            if entry.state is not ACQUIRED or entry.deliveries != deliveries:
                continue           # acked, or redelivered since: this deadline is stale
            consumer = entry.consumer
            if consumer is not None:
                consumer.session.forget_delivery(consumer, entry)
            self.release(entry, failed=True, dispatch=False)
            reclaimed += 1
        if reclaimed:
            self.dispatch()
        return reclaimed

    def drop_oldest(self) -> None:
        """Overflow ``drop-oldest``: the ready entry with the lowest sequence number goes (counted)."""
        if not self.ready.count and self.backlog.count:
            self._admit(self.backlog.take(self))
        oldest = min(self.ready, key=lambda e: e.message.seq, default=None)
        if oldest is None:
            return
        self.ready.remove(oldest)
        if oldest.message.group_id is not None:
            self.grouped_ready -= 1
        oldest.state = transition(oldest.state, Event.PURGE)
        self.stats.dropped += 1
        self._depth_delta(-1)
        self._drop(oldest)

    def block_producer(self, session) -> None:
        """Overflow ``block``: stop taking frames from ``session`` until the queue has room."""
        if session not in self._blocked:
            self._blocked.add(session)
            session.pause_input("queue-full:" + self.name)

    def _maybe_unblock(self) -> None:
        if self.depth < self.config.max_depth or not self.config.max_depth:
            blocked, self._blocked = self._blocked, set()
            for session in blocked:
                self.host.call_soon(session.resume_input, "queue-full:" + self.name)
