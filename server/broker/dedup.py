"""Duplicate detection: ids seen per destination within a window (spec/stomp.md §9).

A SEND with ``pymq-dedup-id`` (or Artemis's ``_AMQ_DUPL_ID``) is dropped when a message with the same id
reached the same destination within ``dedup_window_ms``; at most ``dedup_max_ids`` ids are remembered per
destination, the oldest forgotten first. Looking an id up and remembering it are two steps: placement
remembers an id only once the message is accepted, so a SEND refused for another reason (a full queue,
a schema) can be retried with the same id. The window is rebuilt at start from the stored messages.
"""
from __future__ import annotations

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

    def remember(self, destination: str, dedup_id: str) -> None:
        window = self._ids.get(destination)
        if window is None:
            window = self._ids[destination] = OrderedDict()
        else:
            self._prune(window)
        window[dedup_id] = self.now_ms() + self.window_ms

    def _prune(self, window: OrderedDict[str, int]) -> None:
        """Forget ids older than the window, and the oldest beyond the per-destination maximum."""
        now = self.now_ms()
        while window:
            first = next(iter(window.values()))
            if first > now and len(window) <= self.max_ids:
                break
            window.popitem(last=False)
