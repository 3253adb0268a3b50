"""Who gets a queue's messages: the one consumer choice, reached two ways.

The rule (:meth:`Dispatcher._receivers` and :meth:`Dispatcher._accepts`): the queue's consumers in
subscription order, taken round-robin among those with credit — or only the first exclusive one when a
consumer asked to be the queue's only receiver, or the queue is exclusive (spec/stomp.md §4); a consumer
takes a message its selector matches, and no message of a group another live consumer owns (groups.py).

* :meth:`Dispatcher.dispatch` hands ready entries out, in the ready index's order, while some consumer
  has credit; it runs when an entry becomes ready, a consumer arrives, gains credit or becomes writable.
* :meth:`Dispatcher.offer` is the same choice for a new entry that finds nothing else ready: exactly what
  dispatch would do with a ready index holding that entry alone, without the entry passing through the
  index (the consumer of a busy queue waits for each message as it arrives, so this is most deliveries).
  It is not a second rule: both walk the receivers with :meth:`_accepts` and hand over with :meth:`_give`.
  tests/broker/test_hand_new.py plays random runs with and without it and expects the same deliveries.
"""
from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Callable

from pymq_server.broker.consumer import QueueReader, exclusive_owner
from pymq_server.broker.groups import MessageGroups

if TYPE_CHECKING:
    from pymq_server.broker.entry import Entry
    from pymq_server.broker.queue import MessageQueue

#: a queue with a backlog keeps about this many entries ready (read back from disk ahead of its consumers)
READY_LOW = 256


class Dispatcher:
    """One queue's consumers and the choice among them (module docstring)."""

    __slots__ = ("queue", "consumers", "groups", "exclusive", "running", "_rr", "_last_exclusive")

    def __init__(self, queue: MessageQueue) -> None:
        self.queue = queue
        self.consumers: list[QueueReader] = []      # in subscription order
        self.groups: MessageGroups | None = None     # made by the first grouped message it hands out (_give)
        self.exclusive = 0                       # consumers that asked to be the only receiver
        self.running = False                     # a dispatch is under way (a delivery may call back in)
        self._rr = 0                             # where the next round-robin turn starts
        self._last_exclusive: QueueReader | None = None   # delivered to last as the only receiver

    # -- consumers --------------------------------------------------------------------------------
    def add(self, consumer: QueueReader) -> None:
        self.consumers.append(consumer)
        self.exclusive += consumer.exclusive

    def remove(self, consumer: QueueReader) -> None:
        try:
            self.consumers.remove(consumer)
            self.exclusive -= consumer.exclusive
        except ValueError:
            pass
        if self.groups is not None:
            self.groups.leave(consumer)
        else:
            self.queue.ready.epoch += 1      # (what leave does besides: selective scans start over)

    # -- the rule ---------------------------------------------------------------------------------
    def _receivers(self) -> tuple[list[QueueReader], QueueReader | None]:
        """Who may receive now, in turn order, and the one exclusive receiver if there is one."""
        consumers = self.consumers
        everyone = self.queue.config.exclusive
        if self.exclusive or everyone:
            owner = exclusive_owner(consumers, everyone)
            if owner is not None:
                return [owner], owner
        return consumers, None

    def _accepts(self, consumer: QueueReader, entry: Entry) -> bool:
        """Whether ``consumer`` may take ``entry``: its group's owner, and its selector."""
        message = entry.message
        group = message.group_id
        if group is not None and self.groups is not None and not self.groups.allows(consumer, group):
            return False
        selector = consumer.selector
        return selector is None or selector.matches(message.selector_values())

    def _acceptor(self, consumer: QueueReader) -> Callable[[Entry], bool]:
        def accepts(entry: Entry) -> bool:
            return self._accepts(consumer, entry)
        return accepts

    def _give(self, entry: Entry, consumer: QueueReader, owner: QueueReader | None, now: float | None = None) -> None:
        """``consumer`` takes ``entry``: the group, or the exclusive receiver's hand-over flag, then delivery."""
        if entry.message.group_id is not None:
            groups = self.groups
            if groups is None:
                groups = self.groups = MessageGroups(self.queue.ready)
            groups.assign(entry, consumer)
        elif owner is not None:
            entry.first_in_group = owner is not self._last_exclusive     # a hand-over is flagged
            self._last_exclusive = owner
        self.queue._acquire(entry, consumer, now)

    # -- reached two ways ---------------------------------------------------------------------------
    def offer(self, entry: Entry, now: float) -> bool:
        """A new entry while nothing else is ready: to the consumer :meth:`dispatch` would choose for it,
        without the ready index; False when none takes it now (it waits, and dispatch decides as ever: an
        expired message too, which dispatch expires).

        The common case (no exclusive receiver, no group) is the rule with nothing to decide but the turn
        and the selector: round-robin among consumers with credit, :meth:`_accepts` asked only of a
        consumer with a selector, and :meth:`_give` reduced to the acquire — or, for a consumer that
        acknowledges as it is written (``passes``: a client's auto-ack consumer), to the pass-through
        (MessageQueue._pass: acquired and acknowledged in one step); an exclusive receiver or a grouped
        message takes :meth:`_offer_ruled`, the walk with the whole rule."""
        message = entry.message
        queue = self.queue
        if message.expires and message.expires <= queue.host.now_ms():
            return False
        if self.exclusive or message.group_id is not None or queue.config.exclusive:
            return self._offer_ruled(entry, now)
        consumers = self.consumers
        n = len(consumers)
        i = self._rr
        for _ in range(n):
            consumer = consumers[i % n]
            i += 1
            if consumer.can_take() and (consumer.selector is None or self._accepts(consumer, entry)):
                self._rr = i % n
                queue._depth_delta(1, now, arriving=1)
                self.running = True
                try:
                    if consumer.passes:
                        queue._pass(entry, consumer, now)    # acquired and acknowledged as it is written
                    else:
                        queue._acquire(entry, consumer, now)     # acquired the moment it arrived
                finally:
                    self.running = False
                return True
        return False

    def _offer_ruled(self, entry: Entry, now: float) -> bool:
        """:meth:`offer` for a grouped message or a queue with an exclusive receiver: the receivers of
        :meth:`_receivers`, each asked :meth:`_accepts`, the taker given the entry by :meth:`_give`."""
        consumers, owner = self._receivers()
        n = len(consumers)
        i = self._rr if owner is None else 0
        for _ in range(n):
            consumer = consumers[i % n]
            i += 1
            if not consumer.can_take() or not self._accepts(consumer, entry):
                continue
            if owner is None:
                self._rr = i % n
            self.queue._depth_delta(1, now, arriving=1)
            self.running = True
            try:
                self._give(entry, consumer, owner, now)
            finally:
                self.running = False
            return True
        return False

    def dispatch(self) -> None:
        """Hand ready entries to consumers in turn, while some consumer has credit."""
        if self.running:
            return
        queue = self.queue
        ready = queue.ready
        backlog = queue.backlog
        if not self.consumers or not (ready.count or backlog.count):
            return
        consumers, owner = self._receivers()
        self.running = True
        try:
            n = len(consumers)
            i = self._rr
            idle = 0
            now_ms = 0
            entry: Entry | None
            while idle < n:
                if ready.count < READY_LOW and backlog.count:
                    queue._page_in()
                if not ready.count:
                    break
                if n != len(consumers):
                    n = len(consumers)
                    if not n:
                        break
                consumer = consumers[i % n]
                i += 1
                if not consumer.can_take():
                    idle += 1
                    continue
                if consumer.selector is None and not queue.grouped_ready:
                    entry = ready.pop()          # the rule, reached sooner: it accepts anything ready
                else:
                    entry = ready.take_first(self._acceptor(consumer), consumer.scan)
                    if entry is None:
                        if backlog.count and queue._page_more():
                            i -= 1           # more rows in memory for this consumer to look at
                        else:
                            idle += 1
                        continue
                    if entry.message.group_id is not None:
                        queue.grouped_ready -= 1
                expires = entry.message.expires
                if expires:
                    if not now_ms:
                        now_ms = queue.host.now_ms()
                    if expires <= now_ms:
                        queue._expire(entry)
                        i -= 1
                        continue
                idle = 0
                self._give(entry, consumer, owner)
            if owner is None:
                self._rr = i % n if n else 0
        finally:
            self.running = False
