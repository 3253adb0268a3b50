"""The ready index: a queue's waiting entries in delivery order — priority (9 first), then sequence number.

Per priority, fresh entries append to a list read from a moving head (O(1) at both ends, and sorted by
sequence, so a position is a binary search away); an entry that comes back out of sequence order
(redelivered, delayed) goes to a small heap beside it, which every scan reads whole.

Selective takes (selectors, groups) resume where the consumer's last scan stopped: an entry a consumer
rejected stays rejected — selectors and messages do not change — unless a group is released, which bumps
``epoch`` and resets every cursor. Draining a backlog with selective consumers is then linear, not
quadratic. What makes that safe: an entry below the highest sequence number a level's list ever held
goes to the heap, never to the list (a cursor may already be past it).
"""
from __future__ import annotations

import bisect
import heapq
import itertools
from typing import TYPE_CHECKING, Any, Final
from collections.abc import Callable, Iterator

if TYPE_CHECKING:
    from pymq_server.broker.queue import Entry

#: a level without a list reads as this one (never written: nothing is taken from an empty list)
_NO_ENTRIES: Final[list[Any]] = []


class ReadyIndex:
    """Entries by priority (9 first), then sequence number (see the module's docstring)."""

    __slots__ = ("_fifo", "_head", "_heap", "_tail", "_top", "count", "epoch")

    def __init__(self) -> None:
        # a level's list holds entries from its head on; slots before the head hold None until trimmed
        self._fifo: list[list[Any] | None] = [None] * 10
        self._head = [0] * 10
        self._heap: list[list[tuple[int, int, Entry]] | None] = [None] * 10
        # per priority, the highest sequence number its list ever held: a consumer's cursor may have
        # passed anything below it, so an entry coming back below it must go to the heap (always
        # scanned), even when the list is empty at that moment
        self._tail = [-1] * 10
        # no level above this one holds an entry (only push adds, and raises it): pop starts here
        # instead of looking at the empty levels above the default priority 4 for every message
        self._top = -1
        self.count = 0
        self.epoch = 0

    def __len__(self) -> int:
        return self.count

    def push(self, entry: Entry) -> None:
        p = entry.message.priority
        if p > self._top:
            self._top = p
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

    def _pop_fifo(self, p: int, fifo: list[Any]) -> Entry:
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

    def pop(self) -> Entry:
        """The first entry in delivery order, removed (IndexError when empty, as list.pop)."""
        if not self.count:
            raise IndexError("pop from an empty ready index")
        for p in range(self._top, -1, -1):
            fifo = self._fifo[p] or _NO_ENTRIES
            heap = self._heap[p]
            has_fifo = len(fifo) > self._head[p]
            if heap or has_fifo:
                self._top = p
            if heap:
                self.count -= 1
                if has_fifo and fifo[self._head[p]].message.seq < heap[0][0]:
                    return self._pop_fifo(p, fifo)
                return heapq.heappop(heap)[2]
            if has_fifo:
                self.count -= 1
                return self._pop_fifo(p, fifo)
        raise AssertionError("count says an entry is ready but no level holds one")

    def _level(self, p: int, start: int) -> Iterator[tuple[Entry, int]]:
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

    def _index(self, p: int, fifo: list[Any], entry: Entry) -> int:
        i = bisect.bisect_left(fifo, entry.message.seq, lo=self._head[p], key=_entry_seq)
        return i if i < len(fifo) and fifo[i] is entry else -1

    def remove(self, entry: Entry) -> None:
        p = entry.message.priority
        fifo = self._fifo[p]
        if fifo is not None:
            i = self._index(p, fifo, entry)
            if i >= 0:
                if i == self._head[p]:
                    self._pop_fifo(p, fifo)
                else:
                    del fifo[i]
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

    def take_first(self, accept: Callable[[Entry], bool], cursor: list[Any] | None = None) -> Entry | None:
        """The first entry in delivery order that ``accept`` takes.  ``cursor`` ([epoch, seq per
        priority]) belongs to one consumer: its scan resumes after the entries it rejected before."""
        if cursor is not None and cursor[0] != self.epoch:
            cursor[0] = self.epoch
            cursor[1] = [-1] * 10
        for p in range(self._top, -1, -1):
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

    def by_seq(self, lo: int = 0, hi: int | None = None) -> Iterator[Entry]:
        """Ready entries with ``lo <= seq < hi`` in sequence order, lazily (range reads, spec/stomp.md §9):
        each priority level is already in sequence order (its list from a binary search, its small heap
        sorted), so this merges ten sorted runs instead of sorting the queue.  Valid until the queue
        changes: a reader that pauses walks it again from where it stopped."""
        runs: list[Iterator[Entry]] = []
        for p in range(10):
            fifo = self._fifo[p]
            heap = self._heap[p]
            if fifo:
                start = bisect.bisect_left(fifo, lo, lo=self._head[p], key=_entry_seq)
                if start < len(fifo):
                    runs.append(itertools.islice(fifo, start, None))
            if heap:
                runs.append(iter([item[2] for item in sorted(heap, key=lambda item: (item[0], item[1]))
                                  if item[0] >= lo]))
        for entry in heapq.merge(*runs, key=_entry_seq):
            if hi is not None and entry.message.seq >= hi:
                return
            yield entry

    def oldest(self) -> Entry | None:
        """The ready entry with the lowest sequence number, from each level's first entry (no walk)."""
        best = None
        for p in range(10):
            fifo = self._fifo[p]
            if fifo and len(fifo) > self._head[p]:
                entry = fifo[self._head[p]]
                if best is None or entry.message.seq < best.message.seq:
                    best = entry
            heap = self._heap[p]
            if heap and (best is None or heap[0][0] < best.message.seq):
                best = heap[0][2]
        return best

    def min_seq(self) -> int | None:
        """The lowest sequence number ready (a range's earliest), or None when nothing is."""
        oldest = self.oldest()
        return None if oldest is None else oldest.message.seq

    def clear(self) -> list[Entry]:
        out = list(self)
        self._fifo = [None] * 10
        self._head = [0] * 10
        self._heap = [None] * 10
        self.count = 0
        return out


def _entry_seq(entry: Entry) -> int:
    return entry.message.seq
