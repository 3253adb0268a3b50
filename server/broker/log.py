"""Retained logs: destinations kept in sequence order for replay (spec/stomp.md §9).

A :class:`RetainedLog` holds one reference to each message its destination receives, in sequence
order, until retention drops it (age or count, applied by housekeeping).  Readers take ranges by
sequence number without removing anything; consumers of the destination are unaffected.  Persistent
messages keep a storage reference named ``log:<destination>`` so the log survives a restart.
"""
from __future__ import annotations

import bisect
from collections import deque


class RetainedLog:
    def __init__(self, broker, destination: str, retention_ms: int = 0, retention_messages: int = 0) -> None:
        self.broker = broker
        self.destination = destination
        self.name = "log:" + destination
        self.retention_ms = retention_ms
        self.retention_messages = retention_messages
        self.messages: deque = deque()
        self._stored: dict[int, bool] = {}       # key -> holds a storage reference
        self.trimmed = 0

    def __len__(self) -> int:
        return len(self.messages)

    def append(self, message, stored: bool) -> None:
        messages = self.messages
        message.refs += 1
        if messages and messages[-1].seq > message.seq:
            # recovery may hand messages over out of order: keep the deque sorted
            keys = [m.seq for m in messages]
            messages.insert(bisect.bisect_right(keys, message.seq), message)
        else:
            messages.append(message)
        if stored:
            self._stored[message.key] = True

    @property
    def earliest(self) -> int | None:
        return self.messages[0].seq if self.messages else None

    def trim(self, now_ms: int) -> int:
        messages = self.messages
        dropped = 0
        while messages:
            head = messages[0]
            too_many = self.retention_messages and len(messages) > self.retention_messages
            too_old = self.retention_ms and head.timestamp + self.retention_ms <= now_ms
            expired = head.expires and head.expires <= now_ms
            if not (too_many or too_old or expired):
                break
            messages.popleft()
            self._drop(head)
            dropped += 1
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
        caller must finish with it before the broker's loop runs anything else (browses do)."""
        messages = self.messages
        lo, hi = 0, len(messages)
        while lo < hi:                      # deque has no bisect: binary search by index
            mid = (lo + hi) // 2
            if messages[mid].seq < from_seq:
                lo = mid + 1
            else:
                hi = mid
        for i in range(lo, len(messages)):
            message = messages[i]
            if to_seq is not None and message.seq >= to_seq:
                return
            yield message

    def clear(self) -> int:
        n = len(self.messages)
        while self.messages:
            self._drop(self.messages.popleft())
        return n
