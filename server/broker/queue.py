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

import heapq
from typing import TYPE_CHECKING, Any

from pymq_server.broker.backlog import Backlog
from pymq_server.broker.consumer import AUTO, QueueReader
from pymq_server.broker.dispatch import Dispatcher
from pymq_server.broker.entry import Entry, QueueHost
from pymq_server.broker.lastvalue import LastValues
from pymq_server.broker.ready import ReadyIndex
from pymq_server.broker.states import ACQUIRED, COMPLETED, READY, SCHEDULED, Event, transition
from pymq_server.broker.stats import QueueStats
from pymq_server.broker.upkeep import NOT_TIMED, QueueUpkeep

if TYPE_CHECKING:
    from pymq_server.schema import MessageSchema
    from pymq_server.config import QueueConfig

__all__ = ["Entry", "MessageQueue", "QueueHost", "ReadyIndex"]

# acquire and ack, the two changes every message makes, read the table once here and keep its guard as an
# identity test (any other state goes through transition() and raises): 19 ns instead of 260 ns, 4 % of a message.
_ACQUIRED = transition(READY, Event.ACQUIRE)
_COMPLETED = transition(ACQUIRED, Event.ACK)
_PASSED = transition(READY, Event.PASS)

#: kinds of queue that page (internal ones, the cluster's outboxes, are read by the node as they are)
PAGED_KINDS = frozenset({"queue", "subscription", "temp"})
#: a queue with a backlog reads back from disk to about this many entries ready, ahead of its consumers
READY_TARGET = 1024


class MessageQueue:
    """A queue or subscription: its entries' life, from enqueue to an outcome. Composed of the ready index
    (ready.py), the backlog (backlog.py), the dispatcher that chooses consumers (dispatch.py), the
    last-value index (lastvalue.py) and housekeeping (upkeep.py)."""

    # no __dict__: a broker holds a queue per queue, subscription and temporary destination (thousands)
    __slots__ = ("host", "flow", "name", "destination", "kind", "config", "durable", "ready", "acquired", "timed",
                 "grouped_ready", "dispatcher", "consumers", "upkeep", "stats", "owner", "schema", "last_values",
                 "backlog")

    def __init__(self, host: QueueHost, name: str, destination: str, *, kind: str = "queue",
                 config: QueueConfig, durable: bool = True) -> None:
        self.host = host
        self.flow = host.flow           # the memory accounting: its entries count here (entry.Entry, _drop)
        self.name = name                  # storage / admin name, e.g. "orders" or "sub:cid:name"
        self.destination = destination   # what MESSAGE frames say, e.g. "/queue/orders"
        self.kind = kind                  # "queue" | "subscription" | "temp"
        self.config = config
        self.durable = durable            # keeps storage references for persistent messages
        self.ready = ReadyIndex()
        self.acquired = 0
        # entries waiting for their time (SCHEDULED), in the order they were parked: purge reaches them here
        # (their timers find them completed and do nothing); NOT_TIMED until the first (_park)
        self.timed: dict[Entry, None] = NOT_TIMED
        self.grouped_ready = 0            # ready entries that belong to a group (0: dispatch fast path)
        self.dispatcher = Dispatcher(self)
        self.consumers = self.dispatcher.consumers    # in subscription order (read by the layers and admin)
        self.upkeep = QueueUpkeep(self)
        now = host.clock()
        self.stats = QueueStats(now)
        self.owner: Any = None            # the Client (session) of a temporary queue
        self.schema: MessageSchema | None = None   # declared properties (set by the destinations layer)
        self.last_values = LastValues(self, config.last_value_key) if config.last_value_key else None
        # waiting behind the ready index, on disk (backlog.py); a last-value queue replaces what waits, so
        # it keeps everything in memory
        pageable = kind in PAGED_KINDS and not config.last_value_key
        self.backlog = Backlog(host.pager if pageable else None)

    # -- depth ----------------------------------------------------------------------------------
    @property
    def scheduled(self) -> int:
        """Entries waiting for their delivery time."""
        return len(self.timed)

    @property
    def depth(self) -> int:
        """Messages in the queue that are not completed: ready, paged, scheduled and in flight."""
        return self.ready.count + self.backlog.count + self.acquired + len(self.timed)

    def _depth_delta(self, delta: int, now: float | None = None, arriving: int = 0) -> None:
        # ``arriving``: counted in the depth although not in any of its places yet (a new entry on its
        # way straight to a consumer: Dispatcher.offer)
        depth = self.ready.count + self.backlog.count + self.acquired + len(self.timed) + arriving
        # the time-weighted depth and the peak (QueueStats), here: this runs twice per message
        stats = self.stats
        if now is None:
            now = self.host.clock()
        stats._depth_area += (depth - delta) * (now - stats._depth_since)
        stats._depth_since = now
        if depth > stats.peak_depth:
            stats.peak_depth = depth

    # -- entry points ---------------------------------------------------------------------------
    def enqueue(self, message, stored: bool = False, now: float | None = None, deliveries: int = 0,
                sole: bool = False) -> Entry:
        """A new message for this queue; ``stored``: a device holds a reference for this queue that
        must be removed when the entry completes (set before dispatch, which may complete it at once).
        ``deliveries``: how often it went to consumers before a restart (recovery); ``sole``: no other
        queue, log or outbox holds the message (so paging it out frees its memory)."""
        now = self.host.clock() if now is None else now
        entry = Entry(message, self, now, stored, deliveries)
        message.refs += 1
        self.stats.added += 1
        if deliveries and self._dead_on_arrival(entry):
            return entry
        if self.last_values is not None and not self.last_values.admit(entry):
            return entry
        if message.deliver_at and message.deliver_at > self.host.now_ms():
            entry.state = transition(entry.state, Event.DELAY)     # new entries start READY
            self._park(entry)
            self._depth_delta(1)
            self.host.schedule_at_ms(message.deliver_at, self._make_due, entry)
        elif (sole or self.backlog.count) and self.backlog.takes(entry, sole):     # (Backlog.takes: when asked)
            self._depth_delta(1, now)          # behind the ready index, on disk or behind paged messages
            return entry
        elif self.consumers and not self.ready.count and not self.dispatcher.running and \
                self.dispatcher.offer(entry, now):
            pass                               # nothing else ready: to the consumer dispatch would choose
        else:
            self._push_ready(entry)
            self._depth_delta(1, now)
            if self.consumers:
                self.dispatch()
        if message.expires and entry.state is not COMPLETED:      # (one passed through is done already)
            heapq.heappush(self.upkeep.expiring, (message.expires, message.seq, entry))
        return entry

    def enqueue_block(self, block, now: float | None = None) -> None:
        """A bulk SEND's rows as one unit (blocks.py), in the backlog; a queue without one takes them all."""
        if self.backlog.pager is None:
            for message, deliveries in block.take(block.waiting):
                self.enqueue(message, now=now, deliveries=deliveries)    # the block's record: not theirs
            return
        n = self.backlog.take_block(block)
        self.stats.added += n
        self._depth_delta(n, now)
        if self.consumers:
            self.dispatch()

    def _dead_on_arrival(self, entry: Entry) -> bool:
        """A recovered message that was out for its last allowed delivery when the broker stopped: that
        delivery failed, so it is dead now rather than given a fresh budget (issue 11: poison messages)."""
        limit = self.config.max_deliveries
        if not limit or entry.deliveries < limit:
            return False
        entry.state = transition(entry.state, Event.DEAD)
        self.stats.dead_lettered += 1
        self.host.dead_letter(entry, f"delivered {entry.deliveries} times (maximum {limit}), the last before "
                                     f"a restart")
        self._drop(entry)
        return True

    def _admit(self, entries: list) -> None:
        """Entries back from the backlog become ready (they count in the depth already)."""
        expiring = self.upkeep.expiring
        for entry in entries:
            if entry.deliveries and self._dead_on_arrival(entry):
                self._depth_delta(-1)
                continue
            self._push_ready(entry)
            if entry.message.expires:
                heapq.heappush(expiring, (entry.message.expires, entry.message.seq, entry))

    def _page_in(self) -> None:
        """Read the backlog's head back while few entries are ready and memory has room; one run at least
        when nothing is ready, so consumers always get something."""
        backlog, ready = self.backlog, self.ready
        assert backlog.pager is not None     # a backlog with entries has a pager
        room = backlog.pager.flow.room
        while backlog.count and ready.count < READY_TARGET and (not ready.count or room()):
            self._admit(backlog.take(self))

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

    def _push_ready(self, entry: Entry) -> None:
        self.ready.push(entry)
        if entry.message.group_id is not None:
            self.grouped_ready += 1

    def _park(self, entry: Entry) -> None:
        """``entry`` waits for its time (SCHEDULED): the queue's own dict of them is made with the first."""
        timed = self.timed
        if timed is NOT_TIMED:
            timed = self.timed = {}
        timed[entry] = None

    def _make_due(self, entry: Entry) -> None:
        if entry.state is not SCHEDULED:
            return
        entry.state = transition(entry.state, Event.DUE)
        del self.timed[entry]
        self._push_ready(entry)
        self.dispatch()

    def add_consumer(self, consumer: QueueReader) -> None:
        self.dispatcher.add(consumer)
        self.dispatcher.dispatch()

    def remove_consumer(self, consumer: QueueReader) -> None:
        self.dispatcher.remove(consumer)

    def dispatch(self) -> None:
        """Hand ready entries to consumers (dispatch.py)."""
        self.dispatcher.dispatch()

    @property
    def group_owners(self) -> dict[str, QueueReader]:
        groups = self.dispatcher.groups
        return {} if groups is None else groups.owners

    def _acquire(self, entry: Entry, consumer: QueueReader, now: float | None = None) -> None:
        entry.state = _ACQUIRED if entry.state is READY else transition(entry.state, Event.ACQUIRE)
        if self.last_values is not None:
            self.last_values.gone(entry)
        entry.consumer = consumer
        if now is None:
            now = self.host.clock()
        entry.acquired_at = now
        self.acquired += 1
        self._count_delivery(entry, now)
        timeout = self.config.delivery_timeout_ms
        if timeout:
            heapq.heappush(self.upkeep.timeouts, (now + timeout / 1000.0, entry.message.seq, entry.deliveries, entry))
        if consumer.ack_mode != AUTO and (entry.stored or entry.message.bulk is not None):
            # the count (and so the redelivered flag) must survive a restart (a bulk row's: in its block's
            # record); an auto-ack delivery completes the entry at once, so there is nothing to remember
            self.host.delivered(entry.message, self.name, entry.deliveries)
        consumer.deliver(entry)

    def _count_delivery(self, entry: Entry, now: float) -> None:
        """One more delivery of ``entry`` at ``now`` (:meth:`_acquire` and :meth:`_pass` alike): its count, the
        queue's delivered figure and, for its first delivery, the waiting-time figures (QueueStats)."""
        entry.deliveries += 1
        stats = self.stats
        stats.delivered += 1
        if entry.deliveries == 1:
            waited = now - entry.enqueued_at
            stats.wait_total += waited
            stats.wait_count += 1
            if waited > stats.wait_max:
                stats.wait_max = waited

    def _pass(self, entry: Entry, consumer: QueueReader, now: float) -> None:
        """The pass-through: ``consumer`` acknowledges what it is given as it is written (``passes``: a client's
        auto-ack consumer) and takes the new ``entry`` as it arrives (Dispatcher.offer, which counted it in
        the depth figures): :meth:`_acquire` and :meth:`complete` in one step (READY -pass-> COMPLETED), less
        what only an entry that stays acquired needs (its place among the acquired, a delivery deadline, a
        count kept across restarts; acquired and acknowledged at the same instant, the depth figures do not
        move). The MESSAGE is written, then the entry dropped as :meth:`complete` drops it."""
        entry.state = _PASSED if entry.state is READY else transition(entry.state, Event.PASS)
        self._count_delivery(entry, now)
        consumer.deliver(entry)          # FrameOutlet.deliver: the MESSAGE (the entry is completed already)
        stats = self.stats
        stats.removed += 1
        stats.acknowledged += 1
        self._drop(entry)
        if self.upkeep.blocked:
            self.upkeep.maybe_unblock()

    # -- outcomes -------------------------------------------------------------------------------
    def complete(self, entry: Entry, now: float | None = None) -> None:
        """The consumer acknowledged: the entry is done and its storage reference goes. ``now``: when (an
        auto-ack delivery is acknowledged the instant it was acquired: FrameOutlet.deliver passes that; the
        ACKs of one read the instant the session read the clock for the first: session._acknowledge). A
        ``now`` before the last depth change (a figure moved since then) means the clock's time instead."""
        entry.state = _COMPLETED if entry.state is ACQUIRED else transition(entry.state, Event.ACK)
        self.acquired -= 1
        stats = self.stats
        stats.removed += 1
        stats.acknowledged += 1
        if now is None or now < stats._depth_since:
            self._depth_delta(-1)
        elif now != stats._depth_since:
            self._depth_delta(-1, now)
        # else: acknowledged at the instant of the last depth change (an auto-ack delivery, nothing else moved
        # the depth since it was acquired; the second and later ACKs of one read): no time passed at the old
        # depth and the peak saw it, so the depth figures stay as they are
        self._drop(entry)
        if self.upkeep.blocked:
            self.upkeep.maybe_unblock()

    def release(self, entry: Entry, *, failed: bool = True, requeue: bool = True, dispatch: bool = True) -> None:
        """Back to ready after a NACK or a lost consumer, or to the dead-letter queue at the maximum.

        Releasing several entries at once (a cumulative NACK, a consumer that left) passes
        ``dispatch=False`` and dispatches once after the last: every released entry is back in the
        ready index before any is handed out again, so they go out first and in their original order."""
        message = entry.message
        limit = self.config.max_deliveries
        if message.expires and message.expires <= self.host.now_ms():
            event = Event.EXPIRE            # an expired message coming back is not redelivered
        elif not requeue or (limit and entry.deliveries >= limit):
            event = Event.DEAD
        else:
            event = Event.RELEASE
        entry.state = transition(entry.state, event)      # raises before anything changed
        self.acquired -= 1
        entry.consumer = None
        entry.token = None
        entry.first_in_group = False
        stats = self.stats
        if failed:
            stats.failed += 1
        if event is Event.EXPIRE:
            stats.expired += 1
            self._depth_delta(-1)
            self.host.on_expired(entry)
            self._drop(entry)
        elif event is Event.DEAD:
            stats.dead_lettered += 1
            self._depth_delta(-1)
            self.host.dead_letter(entry, "rejected" if not requeue else
                                  f"delivered {entry.deliveries} times (maximum {limit})")
            self._drop(entry)
        elif self.last_values is not None and not self.last_values.admit(entry, returned=True):
            pass                        # a newer message of its key waits: it gave way (replaced)
        elif failed and (delay := self.config.delay_for(entry.deliveries)) > 0:
            entry.state = transition(entry.state, Event.DELAY)
            self._park(entry)
            self.host.schedule_at_ms(self.host.now_ms() + delay, self._make_due, entry)
        else:
            self._push_ready(entry)
            if dispatch:
                self.dispatch()

    def _expire(self, entry: Entry) -> None:
        entry.state = transition(entry.state, Event.EXPIRE)
        self.stats.expired += 1
        self._depth_delta(-1)
        self.host.on_expired(entry)
        self._drop(entry)

    def _drop(self, entry: Entry) -> None:
        message = entry.message
        message.refs -= 1
        if self.last_values is not None:
            self.last_values.gone(entry)
        if entry.stored:
            entry.stored = False
            self.host.release_reference(message, self.name)
        # the entry is uncounted (flow.ENTRY_OVERHEAD each), and the message goes with its last entry
        flow = self.flow
        flow.entries -= 1
        if not message.refs:
            self.host.message_gone(message)
        elif flow.high:
            flow.entry_freed()

    # -- altered settings ---------------------------------------------------------------------
    def alter(self, config: QueueConfig) -> None:
        """New settings (admin ``alter-queue``): each applies from the next event that reads it; what
        reaches waiting messages now is spec/admin.md "Altering a queue"."""
        old, self.config = self.config, config
        if config.last_value_key != old.last_value_key:
            # indexed by the new key, only the newest per key kept; None: a plain queue again
            self.last_values = LastValues(self, config.last_value_key) if config.last_value_key else None
            if self.last_values is not None:
                self.last_values.rebuild(list(self.ready))
        if not config.delivery_timeout_ms:
            self.upkeep.timeouts.clear()    # 0 = never: deliveries made under the old timeout are kept
        if self.upkeep.blocked:
            self.upkeep.maybe_unblock()
        self.dispatch()

    # -- housekeeping, overflow and removals (upkeep.py) -------------------------------------------
    def expire_ready(self, now_ms: int) -> int:
        return self.upkeep.expire_ready(now_ms)

    def reclaim_timed_out(self, now: float) -> int:
        return self.upkeep.reclaim_timed_out(now)

    def purge(self) -> int:
        return self.upkeep.purge()

    def remove_below(self, upto: int) -> None:
        self.upkeep.remove_below(upto)

    def remove_ready(self, entries: list) -> None:
        self.upkeep.remove_ready(entries)

    def drop_oldest(self) -> None:
        self.upkeep.drop_oldest()

    def block_producer(self, session: Any) -> None:
        self.upkeep.block_producer(session)

    def __repr__(self) -> str:
        return f"<MessageQueue {self.name} depth={self.depth} consumers={len(self.consumers)}>"
