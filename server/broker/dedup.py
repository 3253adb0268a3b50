"""Duplicate detection: ids seen per destination within a window (spec/stomp.md §9).

A SEND with ``pymq-dedup-id`` (or Artemis's ``_AMQ_DUPL_ID``) is dropped when a message with the same id
reached the same destination within ``dedup_window_ms``; at most ``dedup_max_ids`` ids are remembered per
destination, the oldest forgotten first. Looking an id up and remembering it are two steps: placement
remembers an id only once the message is accepted, so a SEND refused for another reason (a full queue,
a schema) can be retried with the same id. The window is rebuilt at start from the stored messages and
from its journal (:class:`DedupJournal`: the ids of messages consumed meanwhile, spec/ha.md §3.1).
"""
from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable


class DuplicateWindow:
    __slots__ = ("window_ms", "max_ids", "now_ms", "_ids", "duplicates")

    def __init__(self, window_ms: int, max_ids: int, now_ms: Callable[[], int]) -> None:
        self.window_ms = window_ms
        self.max_ids = max_ids
        self.now_ms = now_ms
        self._ids: dict[str, OrderedDict[str, int]] = {}   # destination -> id -> forget after (ms)
        self.duplicates = 0

    def seen(self, destination: str, dedup_id: str) -> bool:
        """Whether ``dedup_id`` reached ``destination`` within the window (counted when it did)."""
        window = self._ids.get(destination)
        if window is None:
            return False
        self._prune(window)
        if dedup_id in window:
            self.duplicates += 1
            return True
        return False

    def remember(self, destination: str, dedup_id: str, until_ms: int | None = None) -> None:
        """``dedup_id`` reached ``destination`` now (or, recovered from the journal, stays until ``until_ms``)."""
        window = self._ids.get(destination)
        if window is None:
            window = self._ids[destination] = OrderedDict()
        else:
            self._prune(window)
        window[dedup_id] = self.now_ms() + self.window_ms if until_ms is None else until_ms

    def _prune(self, window: OrderedDict[str, int]) -> None:
        """Forget ids older than the window, and the oldest beyond the per-destination maximum."""
        now = self.now_ms()
        while window:
            first = next(iter(window.values()))
            if first > now and len(window) <= self.max_ids:
                break
            window.popitem(last=False)


#: catalog records of the persisted window (spec/ha.md §3.1)
JOURNAL_PREFIX = "dedup:"


class DedupJournal:
    """The duplicate window as the store keeps it, so it survives a restart or a takeover (spec/ha.md §3.1).

    Rebuilding the window from the messages still stored is not enough: a message consumed before the
    loss is gone, and its producer, failing over, sends it again with the same id.  So the id of every
    persistent message the broker stored is noted here with the wall-clock time it leaves the window, and
    the notes of a barrier go to the catalog as one record (``dedup:<n>``) before that barrier flushes
    (``HoldingStore.before_barrier``): durable no later than the message, so consumable no earlier.
    Recovery puts back the ids whose time has not passed; housekeeping deletes a record once all its ids
    have, and the oldest records once more than ``max_ids`` ids are kept (Artemis persists a cache bounded
    by count too, ``id-cache-size``): what a failing-over client re-sends is what it sent last, and a bound
    keeps each checkpoint, which carries the catalog, small.  Wall-clock time, because the next owner may
    be another process on another machine (clocks a few seconds apart shift the window's end by as much)."""

    __slots__ = ("store", "window_ms", "max_ids", "now_ms", "_pending", "_records", "_total", "_next")

    def __init__(self, store, window_ms: int, max_ids: int, now_ms: Callable[[], int]) -> None:
        self.store = store
        self.window_ms = window_ms
        self.max_ids = max_ids
        self.now_ms = now_ms
        self._pending: list[tuple[str, str, int]] = []
        # record key -> (when its last id leaves the window, how many ids), oldest first
        self._records: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._total = 0
        self._next = 0

    def note(self, destination: str, dedup_id: str) -> None:
        if self.window_ms and self.max_ids:
            self._pending.append((destination, dedup_id, self.now_ms() + self.window_ms))

    def write(self) -> None:
        """The notes since the last barrier as one catalog record (a barrier's first step)."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        key = f"{JOURNAL_PREFIX}{self._next:016x}"
        self._next += 1
        self.store.put_meta(key, json.dumps(pending, separators=(",", ":")).encode())
        self._add(key, max(until for _, _, until in pending), len(pending))
        records = self._records
        while self._total > self.max_ids and len(records) > 1:
            old, (_, count) = records.popitem(last=False)
            self._total -= count
            self.store.put_meta(old, None)

    def _add(self, key: str, until: int, count: int) -> None:
        self._records[key] = (until, count)
        self._total += count

    def restore(self, key: str, value: bytes) -> list[tuple[str, str, int]]:
        """A record read back at recovery (in key order): its ids still within the window (ValueError: a
        record this broker did not write)."""
        number = int(key[len(JOURNAL_PREFIX):], 16)
        entries = json.loads(value)
        if not isinstance(entries, list):
            raise ValueError("not a list")
        now = self.now_ms()
        alive = []
        last = 0
        for entry in entries:
            destination, dedup_id, until = entry
            if not (isinstance(destination, str) and isinstance(dedup_id, str) and isinstance(until, int)):
                raise ValueError("an entry is not [destination, id, time]")
            last = max(last, until)
            if until > now:
                alive.append((destination, dedup_id, until))
        self._add(key, last, len(entries))
        self._next = max(self._next, number + 1)
        return alive

    def expire(self) -> None:
        """Delete the records whose every id has left the window (housekeeping)."""
        now = self.now_ms()
        for key, (until, count) in list(self._records.items()):
            if until <= now:
                del self._records[key]
                self._total -= count
                self.store.put_meta(key, None)

    @property
    def records(self) -> int:
        return len(self._records)

    @property
    def ids(self) -> int:
        return self._total
