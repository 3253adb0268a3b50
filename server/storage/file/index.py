"""The message index of an open file store: which messages it holds, where, and which queues still owe
each one.

The changes a write and a log replay both make live here once — indexing a message, dropping a reference
(the last one frees its slot and, when empty, its page), adding one — so recovery rebuilds exactly what
writing built.  A queue's messages are kept in two lists, persistent and non-persistent (seed 002), each
in (seq, key) order.  Delivery counts of persistent messages (frame DELIVERED) are kept per message; those
noted since the last flush wait in ``unlogged`` until the flush logs them in one frame.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..device import StoredMessage

if TYPE_CHECKING:
    from .state import OpenStore


class Entry:
    """One held message: where it lives, which queues still owe it, and its length (its slot holds it
    too; kept here so that dropping the last reference reads nothing back: the page of a message
    written before the last checkpoint is on disk only). ``large``: the record lists continuation pages."""

    __slots__ = ("seq", "page", "slot", "refs", "refset", "persistent", "length", "large")

    def __init__(self, seq: int, page: int, slot: int, refs: tuple[str, ...], refset: int, persistent: bool,
                 length: int, large: bool) -> None:
        self.seq = seq
        self.page = page
        self.slot = slot
        self.refs = refs
        self.refset = refset
        self.persistent = persistent
        self.length = length
        self.large = large


class QueueLists:
    """A queue's two lists (persistent, non-persistent), each key -> seq in (seq, key) order."""

    __slots__ = ("lists", "last", "ordered")

    def __init__(self) -> None:
        self.lists: tuple[dict[int, int], dict[int, int]] = ({}, {})
        self.last: list[tuple[int, int] | None] = [None, None]
        self.ordered = [True, True]

    def add(self, which: int, key: int, seq: int) -> None:
        self.lists[which][key] = seq
        pos = (seq, key)
        last = self.last[which]
        if last is not None and pos < last:
            self.ordered[which] = False
        else:
            self.last[which] = pos

    def ordered_list(self, which: int) -> list[tuple[int, int]]:
        items = self.lists[which]
        if not self.ordered[which]:
            ordered = sorted((seq, key) for key, seq in items.items())
            items.clear()
            items.update((key, seq) for seq, key in ordered)
            self.ordered[which] = True
            self.last[which] = ordered[-1] if ordered else None
            return ordered
        return [(seq, key) for key, seq in items.items()]

    def __len__(self) -> int:
        return len(self.lists[0]) + len(self.lists[1])


class MessageIndex:
    __slots__ = ("store", "pages", "entries", "queues", "changed", "deliveries", "unlogged", "bytes_used")

    def __init__(self, store: OpenStore) -> None:
        self.store = store
        self.pages = store.pages
        self.entries: dict[int, Entry] = {}
        self.queues: dict[str, QueueLists] = {}
        #: persistent keys whose references differ from their slot's refset (the checkpoint's REFS section)
        self.changed: set[int] = set()
        #: delivery counts of live persistent messages: key -> queue -> count (frame DELIVERED)
        self.deliveries: dict[int, dict[str, int]] = {}
        #: counts noted since the last flush, logged by it in one DELIVERED frame: (key, queue) -> count
        self.unlogged: dict[tuple[int, str], int] = {}
        self.bytes_used = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: int) -> bool:
        return key in self.entries

    def get(self, key: int) -> Entry | None:
        return self.entries.get(key)

    # -- the changes writes and replay share ----------------------------------------------------------
    def add(self, key: int, entry: Entry) -> None:
        self.entries[key] = entry
        self.bytes_used += entry.length
        which = 0 if entry.persistent else 1
        refs = entry.refs
        for queue in (refs if len(refs) == 1 else set(refs)):
            lists = self.queues.get(queue)
            if lists is None:
                lists = self.queues[queue] = QueueLists()
            lists.add(which, key, entry.seq)

    def drop_reference(self, key: int, entry: Entry, refs: tuple[str, ...], queue: str) -> None:
        """``queue`` no longer owes message ``key``; ``refs`` are the references left (none: it goes)."""
        entry.refs = refs
        if queue not in refs:
            lists = self.queues.get(queue)
            if lists is not None:
                lists.lists[0 if entry.persistent else 1].pop(key, None)
                if not len(lists):
                    del self.queues[queue]
            if self.unlogged:
                self.unlogged.pop((key, queue), None)
            counts = self.deliveries.get(key)
            if counts is not None:
                counts.pop(queue, None)
                if not counts:
                    del self.deliveries[key]
        if refs:
            if entry.persistent:
                if refs == self.store.names.refsets[entry.refset]:
                    self.changed.discard(key)
                else:
                    self.changed.add(key)
            return
        self._kill(key, entry)

    def _kill(self, key: int, entry: Entry) -> None:
        """The last reference went: the slot dies; pages left without a live slot are freed."""
        del self.entries[key]
        self.changed.discard(key)
        self.bytes_used -= entry.length
        pages = self.pages
        page = pages.pages[entry.page]
        continuation = pages.continuation_pages(page, pages.slot_fields(page, entry.slot)) if entry.large else ()
        pages.free_slot(page, entry.slot, continuation)

    def add_reference(self, key: int, entry: Entry, queue: str) -> None:
        first = queue not in entry.refs
        entry.refs = entry.refs + (queue,)
        if entry.persistent:
            self.changed.add(key)
        if first:
            lists = self.queues.get(queue)
            if lists is None:
                lists = self.queues[queue] = QueueLists()
            lists.add(0 if entry.persistent else 1, key, entry.seq)

    # -- reading ----------------------------------------------------------------------------------------
    def read(self, key: int) -> StoredMessage:
        """Message ``key`` (KeyError if not held); StorageError when its bytes or slot are damaged,
        OSError when the page file cannot be read."""
        entry = self.entries[key]
        pages = self.pages
        page = pages.pages[entry.page]
        fields = pages.slot_fields(page, entry.slot)
        data = pages.message_bytes(page, fields)
        return StoredMessage(key, self.store.names.names[fields[5]], entry.seq, entry.persistent, data)

    def queue_order(self, queue: str) -> list[tuple[int, int]]:
        """A queue's (seq, key) pairs in seed 002's removal order, both kinds merged."""
        lists = self.queues.get(queue)
        if lists is None:
            return []
        return list(heapq.merge(lists.ordered_list(0), lists.ordered_list(1)))

    def queue_depth(self, queue: str) -> int:
        lists = self.queues.get(queue)
        return len(lists) if lists is not None else 0

    def persistent_order(self) -> list[tuple[int, int]]:
        """Every persistent message as (seq, key), in that order (what ``recover`` yields)."""
        return sorted((entry.seq, key) for key, entry in self.entries.items() if entry.persistent)

    # -- delivery counts ----------------------------------------------------------------------------------
    def note_delivery(self, key: int, queue: str, count: int) -> None:
        self.unlogged[(key, queue)] = count

    def take_deliveries(self) -> dict[tuple[int, str], int]:
        """The counts noted since the last flush, for persistent messages still owed to that queue, moved
        into the table checkpoints keep."""
        pending, self.unlogged = self.unlogged, {}
        entries, table = self.entries, self.deliveries
        kept = {}
        for (key, queue), count in pending.items():
            entry = entries.get(key)
            if entry is not None and entry.persistent and queue in entry.refs:
                table.setdefault(key, {})[queue] = count
                kept[(key, queue)] = count
        return kept

    def delivery_counts(self, key: int) -> dict[str, int]:
        return dict(self.deliveries.get(key, ()))

    def replay_delivery(self, key: int, queue: str, count: int) -> None:
        entry = self.entries.get(key)
        if entry is not None and queue in entry.refs:
            self.deliveries.setdefault(key, {})[queue] = count

    def items(self) -> Iterator[tuple[int, Entry]]:
        return iter(self.entries.items())
