"""Retained logs: destinations kept in sequence order for replay (spec/stomp.md §9).

A :class:`RetainedLog` holds one reference to each message its destination receives, in sequence
order, until retention drops it (age or count, applied by housekeeping).  Readers take ranges by
sequence number without removing anything; consumers of the destination are unaffected.  Persistent
messages keep a storage reference named ``log:<destination>`` so the log survives a restart.
"""
from __future__ import annotations

import bisect
import fnmatch
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from pymq_server.broker.message import BrokerMessage
    from pymq_server.broker.queue import QueueHost


class RetainedLog:
    def __init__(self, host: QueueHost, destination: str, retention_ms: int = 0, retention_messages: int = 0) -> None:
        self.host = host
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

    def append(self, message: BrokerMessage, stored: bool) -> None:
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
            self.host.release_reference(message, self.name)
        if not message.refs:
            self.host.message_gone(message)

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


class RetainedLogs:
    """Which destinations keep a log (the broker's ``retention`` setting: names or glob patterns, the first
    match wins), and their logs. A destination is matched once; the answer is remembered."""

    def __init__(self, retention: dict, host: QueueHost) -> None:
        self.retention = retention
        self.host = host
        self.logs: dict[str, RetainedLog] = {}
        self._checked: dict[str, RetainedLog | None] = {}

    def get(self, destination: str) -> RetainedLog | None:
        """The log ``destination`` keeps, or None (created on first use when retention names it)."""
        try:
            return self._checked[destination]
        except KeyError:
            pass
        found = None
        for pattern, settings in self.retention.items():
            if pattern == destination or fnmatch.fnmatchcase(destination, pattern):
                settings = settings or {}
                found = RetainedLog(self.host, destination, int(settings.get("ms", 0) or 0),
                                    int(settings.get("messages", 0) or 0))
                self.logs[destination] = found
                break
        self._checked[destination] = found
        return found

    def restore(self, destination: str) -> RetainedLog:
        """The log a recovered reference ``log:<destination>`` names, even if retention no longer does
        (what was kept stays readable until trimmed)."""
        found = self.get(destination)
        if found is None:
            found = self.logs[destination] = self._checked[destination] = RetainedLog(self.host, destination)
        return found

    def trim(self, now_ms: int) -> None:
        for retained in list(self.logs.values()):
            retained.trim(now_ms)

    def __iter__(self) -> Iterator[str]:
        """The destinations that keep a log."""
        return iter(self.logs)

    def __len__(self) -> int:
        return len(self.logs)
