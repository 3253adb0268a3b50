"""A queue: entries waiting in priority-then-sequence order, consumers, dispatch, acks and dead letters.

Every destination a consumer reads from is a :class:`MessageQueue`: a point-to-point queue, a durable or
shared topic subscription, or the private queue behind a non-durable topic subscriber.  Topic messages
are not copied: each subscription queue holds an :class:`Entry` pointing at the one shared message.

Invariants:
* an entry is in exactly one place: the ready index (READY), the scheduler (SCHEDULED), a consumer's
  unacknowledged set (ACQUIRED), or nowhere (COMPLETED / DEAD / EXPIRED); states.py is the table;
* ready entries are taken highest priority first, then lowest sequence number (creation order);
* nothing polls: dispatch runs when an entry becomes ready, a consumer arrives, gains credit or becomes
  writable again.
"""
from __future__ import annotations

import bisect
import heapq
from typing import Callable, Iterator

from pymq_server.broker import states
from pymq_server.broker.states import ACQUIRED, COMPLETED, DEAD, EXPIRED, READY, SCHEDULED

_T = states.TRANSITIONS
# the hot path's transitions, read from the one table once (not re-hashed per message)
_ON_ACQUIRE = _T[(READY, "acquire")]
_ON_ACK = _T[(ACQUIRED, "ack")]


class Entry:
    """One message's place in one queue."""

    __slots__ = ("message", "queue", "state", "deliveries", "consumer", "token", "enqueued_at",
                 "acquired_at", "stored", "first_in_group")

    def __init__(self, message, queue: "MessageQueue", now: float) -> None:
        self.message = message
        self.queue = queue
        self.state = READY
        self.deliveries = 0
        self.consumer = None
        self.token = None
        self.enqueued_at = now
        self.acquired_at = 0.0
        self.stored = False          # holds a storage reference that must be removed when done
        self.first_in_group = False  # the first delivery of its group to a new owner (JMSXGroupFirstForConsumer)

    def __repr__(self) -> str:
        return f"<Entry {self.message.message_id} {self.state} in {self.queue.name}>"


class ReadyIndex:
    """Entries by priority (9 first), then sequence.

    Per priority, fresh entries append to a list read from a moving head (O(1) both ends, and sorted
    by sequence, so a position is a binary search away); an entry that arrives out of sequence order
    (redelivered, delayed) goes to a small heap beside it.

    Selective takes (selectors, groups) resume where the consumer's last scan stopped: an entry a
    consumer rejected stays rejected — selectors and messages do not change — unless a group is
    released, which bumps ``epoch`` and resets every cursor.  Draining a backlog with selective
    consumers is then linear, not quadratic.
    """

    __slots__ = ("_fifo", "_head", "_heap", "_tail", "count", "epoch")

    def __init__(self) -> None:
        self._fifo: list[list | None] = [None] * 10
        self._head = [0] * 10
        self._heap: list[list | None] = [None] * 10
        # per priority, the highest sequence number its list ever held: a consumer's cursor may have
        # passed anything below it, so an entry coming back below it must go to the heap (always
        # scanned), even when the list is empty at that moment
        self._tail = [-1] * 10
        self.count = 0
        self.epoch = 0

    def __len__(self) -> int:
        return self.count

    def push(self, entry: Entry) -> None:
        p = entry.message.priority
        fifo = self._fifo[p]
        if fifo is None:
            fifo = self._fifo[p] = []
        seq = entry.message.seq
        if seq > self._tail[p]:
            fifo.append(entry)
            self._tail[p] = seq
        else:
            heap = self._heap[p]
            if heap is None:
                heap = self._heap[p] = []
            heapq.heappush(heap, (seq, entry.message.key, entry))
        self.count += 1

    def _pop_fifo(self, p: int) -> Entry:
        fifo = self._fifo[p]
        head = self._head[p]
        entry = fifo[head]
        fifo[head] = None
        head += 1
        if head == len(fifo):
            fifo.clear()
            head = 0
        elif head > 4096 and head * 2 > len(fifo):
            del fifo[:head]
            head = 0
        self._head[p] = head
        return entry

    def pop(self) -> Entry | None:
        if not self.count:
            return None
        for p in range(9, -1, -1):
            fifo = self._fifo[p]
            heap = self._heap[p]
            has_fifo = fifo is not None and len(fifo) > self._head[p]
            if heap:
                self.count -= 1
                if has_fifo and fifo[self._head[p]].message.seq < heap[0][0]:
                    return self._pop_fifo(p)
                return heapq.heappop(heap)[2]
            if has_fifo:
                self.count -= 1
                return self._pop_fifo(p)
        return None

    def _level(self, p: int, start: int):
        """Level ``p`` in sequence order, the list part from index ``start``: (entry, list index or -1)."""
        fifo = self._fifo[p] or ()
        heap = self._heap[p]
        n = len(fifo)
        i = start
        if heap:
            for _, _, h in sorted(heap, key=lambda item: (item[0], item[1])):
                while i < n and fifo[i].message.seq < h.message.seq:
                    yield fifo[i], i
                    i += 1
                yield h, -1
        while i < n:
            yield fifo[i], i
            i += 1

    def __iter__(self) -> Iterator[Entry]:
        """Ready entries in delivery order, without removing them (browsing)."""
        for p in range(9, -1, -1):
            if self._fifo[p] or self._heap[p]:
                for entry, _ in list(self._level(p, self._head[p])):
                    yield entry

    def _index(self, p: int, entry: Entry) -> int:
        fifo = self._fifo[p]
        if fifo is None:
            return -1
        i = bisect.bisect_left(fifo, entry.message.seq, lo=self._head[p], key=_entry_seq)
        return i if i < len(fifo) and fifo[i] is entry else -1

    def remove(self, entry: Entry) -> None:
        p = entry.message.priority
        i = self._index(p, entry)
        if i >= 0:
            if i == self._head[p]:
                self._pop_fifo(p)
            else:
                del self._fifo[p][i]
            self.count -= 1
            return
        heap = self._heap[p]
        if heap:
            for j, item in enumerate(heap):
                if item[2] is entry:
                    heap[j] = heap[-1]
                    heap.pop()
                    heapq.heapify(heap)
                    self.count -= 1
                    return
        raise KeyError(entry)

    def take_first(self, accept: Callable[[Entry], bool], cursor: list | None = None) -> Entry | None:
        """The first entry in delivery order that ``accept`` takes.  ``cursor`` ([epoch, seq per
        priority]) belongs to one consumer: its scan resumes after the entries it rejected before."""
        if cursor is not None and cursor[0] != self.epoch:
            cursor[0] = self.epoch
            cursor[1] = [-1] * 10
        for p in range(9, -1, -1):
            fifo = self._fifo[p]
            if not fifo and not self._heap[p]:
                continue
            head = self._head[p]
            start = head
            if cursor is not None and fifo:
                start = bisect.bisect_right(fifo, cursor[1][p], lo=head, key=_entry_seq)
            for entry, index in self._level(p, start):
                if accept(entry):
                    self.remove(entry)
                    return entry
                if cursor is not None and index >= 0:
                    cursor[1][p] = entry.message.seq     # rejected: never look at it again
        return None

    def clear(self) -> list[Entry]:
        out = list(self)
        self._fifo = [None] * 10
        self._head = [0] * 10
        self._heap = [None] * 10
        self.count = 0
        return out


def _entry_seq(entry) -> int:
    return entry.message.seq


class QueueStats:
    """The nine queue metrics of seed 001, kept incrementally (no scans)."""

    __slots__ = ("added", "removed", "failed", "expired", "peak_depth", "wait_total", "wait_max",
                 "wait_count", "_depth_area", "_depth_since", "_started", "delivered", "dead_lettered",
                 "dropped", "acknowledged")

    def __init__(self, now: float) -> None:
        self.added = 0
        self.removed = 0
        self.failed = 0
        self.expired = 0
        self.peak_depth = 0
        self.wait_total = 0.0
        self.wait_max = 0.0
        self.wait_count = 0
        self.delivered = 0
        self.dead_lettered = 0
        self.dropped = 0
        self.acknowledged = 0       # completed by a consumer's ack (auto acks included); purges are not
        self._depth_area = 0.0      # integral of depth over time, for the time-weighted average
        self._depth_since = now
        self._started = now

    def depth_changed(self, old_depth: int, new_depth: int, now: float) -> None:
        self._depth_area += old_depth * (now - self._depth_since)
        self._depth_since = now
        if new_depth > self.peak_depth:
            self.peak_depth = new_depth

    def average_depth(self, depth: int, now: float) -> float:
        span = now - self._started
        if span <= 0:
            return float(depth)
        return (self._depth_area + depth * (now - self._depth_since)) / span

    def waited(self, seconds: float) -> None:
        self.wait_total += seconds
        self.wait_count += 1
        if seconds > self.wait_max:
            self.wait_max = seconds


class MessageQueue:
    """A queue or subscription with its consumers."""

    def __init__(self, broker, name: str, destination: str, *, kind: str = "queue",
                 config=None, durable: bool = True) -> None:
        self.broker = broker
        self.name = name                  # storage / admin name, e.g. "orders" or "sub:cid:name"
        self.destination = destination   # what MESSAGE frames say, e.g. "/queue/orders"
        self.kind = kind                  # "queue" | "subscription" | "temp"
        self.config = config if config is not None else broker.config.queue_defaults
        self.durable = durable            # keeps storage references for persistent messages
        self.ready = ReadyIndex()
        self.consumers: list = []
        self.acquired = 0
        self.scheduled = 0
        self._rr = 0
        self._dispatching = False
        now = broker.clock()
        self.stats = QueueStats(now)
        self.owner = None                 # session of a temporary queue / exclusive subscription
        self.schema = None                # MessageSchema or None (set by the broker)
        self.group_owners: dict = {}      # JMSXGroupID -> consumer; no limit (ActiveMQ's 1024 is a trap)
        self.grouped_ready = 0            # ready entries that belong to a group (0: dispatch fast path)
        self._expiring: list = []         # heap (expires, seq, entry) for housekeeping, no scans
        self._timeouts: list = []         # heap (deadline, seq, deliveries, entry) of acquired entries
        self._blocked: set = set()        # producer sessions paused by max_depth (overflow=block)

    # -- depth ----------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Messages in the queue that are not completed: ready, scheduled and in flight."""
        return self.ready.count + self.acquired + self.scheduled

    def _depth_delta(self, delta: int, now: float | None = None) -> None:
        depth = self.ready.count + self.acquired + self.scheduled
        self.stats.depth_changed(depth - delta, depth, self.broker.clock() if now is None else now)

    # -- entry points ---------------------------------------------------------------------------
    def enqueue(self, message, stored: bool = False, now: float | None = None) -> Entry:
        """A new message for this queue; ``stored``: a device holds a reference for this queue that
        must be removed when the entry completes (set before dispatch, which may complete it at once)."""
        now = self.broker.clock() if now is None else now
        entry = Entry(message, self, now)
        entry.stored = stored
        message.refs += 1
        self.stats.added += 1
        if message.deliver_at and message.deliver_at > self.broker.now_ms():
            entry.state = SCHEDULED
            self.scheduled += 1
            self._depth_delta(1)
            self.broker.schedule_at_ms(message.deliver_at, self._make_due, entry)
        else:
            self._push_ready(entry)
            self._depth_delta(1, now)
            if self.consumers:
                self.dispatch()
        if message.expires:
            heapq.heappush(self._expiring, (message.expires, message.seq, entry))
        return entry

    def _push_ready(self, entry: Entry) -> None:
        self.ready.push(entry)
        if entry.message.group_id is not None:
            self.grouped_ready += 1

    def _make_due(self, entry: Entry) -> None:
        if entry.state is not SCHEDULED:
            return
        entry.state = _T[(SCHEDULED, "due")]
        self.scheduled -= 1
        self._push_ready(entry)
        self.dispatch()

    def add_consumer(self, consumer) -> None:
        self.consumers.append(consumer)
        self.dispatch()

    def remove_consumer(self, consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            pass
        if self.group_owners:
            # its groups move: the next message of each goes to another consumer, flagged
            for group in [g for g, c in self.group_owners.items() if c is consumer]:
                del self.group_owners[group]
        self.ready.epoch += 1       # entries other consumers rejected for its groups are open again

    # -- dispatch -------------------------------------------------------------------------------
    def dispatch(self) -> None:
        """Hand ready entries to consumers round-robin, while some consumer has credit."""
        if self._dispatching:
            return
        consumers = self.consumers
        ready = self.ready
        if not consumers or not ready.count:
            return
        self._dispatching = True
        try:
            n = len(consumers)
            i = self._rr
            idle = 0
            now_ms = 0
            while ready.count and idle < n:
                if n != len(consumers):
                    n = len(consumers)
                    if not n:
                        break
                consumer = consumers[i % n]
                i += 1
                if not consumer.can_take():
                    idle += 1
                    continue
                if consumer.selector is None and not self.grouped_ready:
                    entry = ready.pop()
                else:
                    entry = ready.take_first(self._acceptor(consumer), consumer.scan)
                    if entry is None:
                        idle += 1
                        continue
                    if entry.message.group_id is not None:
                        self.grouped_ready -= 1
                        self._assign_group(entry, consumer)
                expires = entry.message.expires
                if expires:
                    if not now_ms:
                        now_ms = self.broker.now_ms()
                    if expires <= now_ms:
                        self._expire(entry)
                        i -= 1
                        continue
                idle = 0
                self._acquire(entry, consumer)
            self._rr = i % n if n else 0
        finally:
            self._dispatching = False

    def _acceptor(self, consumer):
        """What ``consumer`` may take: its selector's matches, and no message of a group another
        live consumer owns (so each group is consumed in order by one consumer)."""
        owners = self.group_owners
        selector = consumer.selector

        def accept(entry) -> bool:
            message = entry.message
            group = message.group_id
            if group is not None:
                owner = owners.get(group)
                if owner is not None and owner is not consumer and owner.active:
                    return False
            return selector is None or selector.matches(message.selector_values())
        return accept

    def _assign_group(self, entry: Entry, consumer) -> None:
        group = entry.message.group_id
        owner = self.group_owners.get(group)
        if owner is not consumer:
            self.group_owners[group] = consumer
            entry.first_in_group = True
        else:
            entry.first_in_group = False
        if entry.message.headers.get("JMSXGroupSeq") == "-1":
            del self.group_owners[group]       # the producer closed the group (ActiveMQ convention)
            self.ready.epoch += 1

    def _acquire(self, entry: Entry, consumer) -> None:
        entry.state = _ON_ACQUIRE
        entry.deliveries += 1
        entry.consumer = consumer
        now = self.broker.clock()
        entry.acquired_at = now
        self.acquired += 1
        stats = self.stats
        stats.delivered += 1
        if entry.deliveries == 1:
            stats.waited(now - entry.enqueued_at)
        timeout = self.config.delivery_timeout_ms
        if timeout:
            heapq.heappush(self._timeouts, (now + timeout / 1000.0, entry.message.seq, entry.deliveries, entry))
        consumer.deliver(entry)

    # -- outcomes -------------------------------------------------------------------------------
    def complete(self, entry: Entry) -> None:
        """The consumer acknowledged: the entry is done and its storage reference goes."""
        if entry.state is not ACQUIRED:
            states.transition(entry.state, "ack")   # raises IllegalTransition with the reason
        entry.state = _ON_ACK
        self.acquired -= 1
        stats = self.stats
        stats.removed += 1
        stats.acknowledged += 1
        self._depth_delta(-1)
        self._drop(entry)
        if self._blocked:
            self._maybe_unblock()

    def release(self, entry: Entry, *, failed: bool = True, requeue: bool = True, dispatch: bool = True) -> None:
        """Back to ready after a NACK or a lost consumer, or to the dead-letter queue at the maximum.

        Releasing several entries at once (a cumulative NACK, a consumer that left) passes
        ``dispatch=False`` and dispatches once after the last: every released entry is back in the
        ready index before any is handed out again, so they go out first and in their original order."""
        self.acquired -= 1
        entry.consumer = None
        entry.token = None
        if failed:
            self.stats.failed += 1
        message = entry.message
        if message.expires and message.expires <= self.broker.now_ms():
            entry.state = _T[(ACQUIRED, "expire")]
            self.stats.expired += 1
            self._depth_delta(-1)
            self.broker.on_expired(entry)
            self._drop(entry)
            return
        limit = self.config.max_deliveries
        if not requeue or (limit and entry.deliveries >= limit):
            entry.state = _T[(ACQUIRED, "dead")]
            self.stats.dead_lettered += 1
            self._depth_delta(-1)
            self.broker.dead_letter(entry, "rejected" if not requeue else
                                    f"delivered {entry.deliveries} times (maximum {limit})")
            self._drop(entry)
            return
        entry.state = _T[(ACQUIRED, "release")]
        delay = self.config.delay_for(entry.deliveries) if failed else 0
        if delay > 0:
            entry.state = _T[(READY, "delay")]
            self.scheduled += 1
            self.broker.schedule_at_ms(self.broker.now_ms() + delay, self._make_due, entry)
            return
        self._push_ready(entry)
        if dispatch:
            self.dispatch()

    def _expire(self, entry: Entry) -> None:
        entry.state = _T[(entry.state, "expire")]
        self.stats.expired += 1
        self._depth_delta(-1)
        self.broker.on_expired(entry)
        self._drop(entry)

    def _drop(self, entry: Entry) -> None:
        message = entry.message
        message.refs -= 1
        if entry.stored:
            entry.stored = False
            self.broker.store.release(message, self.name)
        if not message.refs:
            self.broker.message_gone(message)

    def remove_ready(self, entries: list) -> None:
        """Complete ready entries without delivering them (cumulative ack up to a sequence number)."""
        now = self.broker.clock()
        for entry in entries:
            self.ready.remove(entry)
            if entry.message.group_id is not None:
                self.grouped_ready -= 1
            entry.state = _T[(READY, "purge")]
            self.stats.removed += 1
            self._drop(entry)
        if entries:
            depth = self.depth
            self.stats.depth_changed(depth + len(entries), depth, now)

    def purge(self) -> int:
        entries = self.ready.clear()
        self.grouped_ready = 0
        for entry in entries:
            entry.state = _T[(READY, "purge")]
            self._drop(entry)
        if entries:
            self.stats.removed += len(entries)
            self.stats.depth_changed(self.depth + len(entries), self.depth, self.broker.clock())
        return len(entries)

    def expire_ready(self, now_ms: int) -> int:
        """Housekeeping: remove ready entries whose time has passed (never delivered).  Reads only the
        entries due, from a heap: no scan of the queue."""
        heap = self._expiring
        gone = 0
        while heap and heap[0][0] <= now_ms:
            _, _, entry = heapq.heappop(heap)
            if entry.state is READY:
                self.ready.remove(entry)
                if entry.message.group_id is not None:
                    self.grouped_ready -= 1
                self._expire(entry)
                gone += 1
            elif entry.state is SCHEDULED:
                entry.state = _T[(SCHEDULED, "expire")]
                self.scheduled -= 1
                self.stats.expired += 1
                self._depth_delta(-1)
                self.broker.on_expired(entry)
                self._drop(entry)
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
        oldest = min(self.ready, key=lambda e: e.message.seq, default=None)
        if oldest is None:
            return
        self.ready.remove(oldest)
        if oldest.message.group_id is not None:
            self.grouped_ready -= 1
        oldest.state = _T[(READY, "purge")]
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
                self.broker.runtime.call_later(0, session.resume_input, "queue-full:" + self.name)

    def browse(self, accept: Callable[[Entry], bool] | None = None) -> list[Entry]:
        """Ready entries in delivery order, without acquiring them."""
        now_ms = self.broker.now_ms()
        return [e for e in self.ready if not e.message.expired(now_ms) and (accept is None or accept(e))]

    def __repr__(self) -> str:
        return f"<MessageQueue {self.name} depth={self.depth} consumers={len(self.consumers)}>"
