"""Retained logs: destinations kept in sequence order for replay (spec/stomp.md §9).

A :class:`RetainedLog` holds one reference to each message its destination receives, in sequence
order, until retention drops it (age or count, applied by housekeeping).  Readers take ranges by
sequence number without removing anything; consumers of the destination are unaffected.  Persistent
messages keep a storage reference named ``log:<destination>`` so the log survives a restart.
"""
from __future__ import annotations

import bisect


class RetainedLog:
    def __init__(self, broker, destination: str, retention_ms: int = 0, retention_messages: int = 0) -> None:
        self.broker = broker
        self.destination = destination
        self.name = "log:" + destination
        self.retention_ms = retention_ms
        self.retention_messages = retention_messages
        # messages in sequence order from index _head on; trimming moves _head and compacts now and
        # then, so both ends and a binary search by sequence stay cheap (a deque indexes in O(n))
        self._items: list = []
        self._head = 0
        self._stored: dict[int, bool] = {}       # key -> holds a storage reference
        self.trimmed = 0

    def __len__(self) -> int:
        return len(self._items) - self._head

    def append(self, message, stored: bool) -> None:
        items = self._items
        message.refs += 1
        if len(items) > self._head and items[-1].seq > message.seq:
            # recovery may hand messages over out of order: keep the list sorted
            bisect.insort(items, message, lo=self._head, key=_seq)
        else:
            items.append(message)
        if stored:
            self._stored[message.key] = True

    @property
    def earliest(self) -> int | None:
        return self._items[self._head].seq if len(self) else None

    def trim(self, now_ms: int) -> int:
        items = self._items
        dropped = 0
        while self._head < len(items):
            head = items[self._head]
            too_many = self.retention_messages and len(self) > self.retention_messages
            too_old = self.retention_ms and head.timestamp + self.retention_ms <= now_ms
            expired = head.expires and head.expires <= now_ms
            if not (too_many or too_old or expired):
                break
            items[self._head] = None
            self._head += 1
            self._drop(head)
            dropped += 1
        if self._head > 1024 and self._head * 2 > len(items):
            del items[:self._head]
            self._head = 0
        self.trimmed += dropped
        return dropped

    def _drop(self, message) -> None:
        message.refs -= 1
        if self._stored.pop(message.key, False):
            self.broker.store.release(message, self.name)
        if not message.refs:
            self.broker.message_gone(message)

    def range(self, from_seq: int, to_seq: int | None):
        """Messages with from_seq <= seq < to_seq, in order, lazily: a reader that stops after a few
        messages (or none, to learn the bounds) costs a binary search, not a walk of the log.  The
        caller finishes with it before the broker's loop runs anything else (browses do)."""
        items = self._items
        i = bisect.bisect_left(items, from_seq, lo=self._head, key=_seq)
        n = len(items)
        while i < n:
            message = items[i]
            if to_seq is not None and message.seq >= to_seq:
                return
            yield message
            i += 1

    def clear(self) -> int:
        n = len(self)
        for i in range(self._head, len(self._items)):
            self._drop(self._items[i])
        self._items, self._head = [], 0
        return n


def _seq(message) -> int:
    return message.seq
