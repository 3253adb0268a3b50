"""The message index of an open file store: which messages it holds, where, and which queues still owe
each one.

The changes a write and a log replay both make live here once — indexing a message, dropping a reference
(the last one frees its slot and, when empty, its page), adding one — so recovery rebuilds exactly what
writing built. Delivery counts of persistent messages (frame DELIVERED) are kept per message; those noted
since the last flush wait in ``unlogged`` until the flush logs them in one frame.

Two tiers keep the heap a message costs small however many are held (issue 24: a paged backlog cost about
290 bytes of heap per message, all of it here):

* **hot** — the most recent messages (at most ``hot_limit``, and every message whose references changed):
  an :class:`Entry` object each in a dict, as fast as a dict is;
* **cold** — older messages whose references are still the ones they were written with: 32 bytes each in
  parallel arrays sorted by key (:class:`ColdRun`), found by bisection. Their queues are their slot's
  reference set, by id. A cold message whose references change (one added, or one dropped while others
  stay) comes back to the hot tier first (``take``); one whose last reference goes dies where it is
  (``remove``), so draining a paged backlog builds no ``Entry`` and takes no hot slot.

Keys increase as messages are placed and are written in that order, so the oldest hot entries fold onto
the end of the cold arrays; one that arrives out of order (a queue's paged batch, written under the key of
its first message) stays hot until it goes.
"""
from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator
from operator import attrgetter
from typing import TYPE_CHECKING

from ..device import StoredMessage

if TYPE_CHECKING:
    from .pages import Page
    from .state import OpenStore

#: hot entries kept before the oldest fold into the cold arrays (FileDevice's ``index_hot``)
HOT_LIMIT = 65536
#: a cold run rebuilds its arrays without dead slots once they are more than half of it (and this many)
COMPACT_AT = 4096

_PAGE = 0xFFFFFFFF
_SLOT_SHIFT = 32
_SLOT = 0x3FFFFFFF
_PERSISTENT = 1 << 62
_LARGE = 1 << 63


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


def pack_place(page: int, slot: int, persistent: bool, large: bool) -> int:
    """Where a message is, in the 64 bits a cold run keeps: page, slot, and the two flags."""
    return page | slot << _SLOT_SHIFT | (_PERSISTENT if persistent else 0) | (_LARGE if large else 0)


def unpack_place(place: int) -> tuple[int, int, bool, bool]:
    """``pack_place``'s (page, slot, persistent, large) back."""
    return place & _PAGE, (place >> _SLOT_SHIFT) & _SLOT, bool(place & _PERSISTENT), bool(place & _LARGE)


_page, _slot, _persistent, _large = (attrgetter(a) for a in ("page", "slot", "persistent", "large"))
_refset, _length, _seq = (attrgetter(a) for a in ("refset", "length", "seq"))


class ColdRun:
    """Messages by key in parallel arrays (key, place, refset, length, seq): 32 bytes each. A place of 0 is a
    dead slot (page numbers start at 3: a live place is never 0)."""

    __slots__ = ("keys", "places", "refsets", "lengths", "seqs", "dead")

    def __init__(self) -> None:
        self.keys = array("Q")
        self.places = array("Q")
        self.refsets = array("I")
        self.lengths = array("I")
        self.seqs = array("Q")
        self.dead = 0

    def __len__(self) -> int:
        return len(self.keys) - self.dead

    @property
    def last(self) -> int:
        keys = self.keys
        return keys[-1] if keys else -1

    def find(self, key: int) -> int:
        """The index of live ``key``, or -1."""
        keys = self.keys
        if not keys or key > keys[-1]:
            return -1
        # keys are placed in increasing order, mostly one after another: where ``key`` would be if the run
        # had no gaps is tried first (one comparison), the bisection only when that misses
        i = key - keys[0]
        if i < 0 or i >= len(keys) or keys[i] != key:
            i = bisect.bisect_left(keys, key)
            if i >= len(keys) or keys[i] != key:
                return -1
        return i if self.places[i] else -1

    def extend(self, keys: list[int], entries: list[Entry]) -> None:
        """Append ``entries`` under ``keys``, increasing and above every key held (``last``). Each array is
        extended once, its values read in C (``attrgetter``): a fold moves thousands at a time, and only
        ``pack_place`` runs per entry."""
        self.keys.extend(keys)
        self.places.extend(map(pack_place, map(_page, entries), map(_slot, entries), map(_persistent, entries),
                               map(_large, entries)))
        self.refsets.extend(map(_refset, entries))
        self.lengths.extend(map(_length, entries))
        self.seqs.extend(map(_seq, entries))

    def entry(self, i: int, refs: tuple[str, ...]) -> Entry:
        page, slot, persistent, large = unpack_place(self.places[i])
        return Entry(self.seqs[i], page, slot, refs, self.refsets[i], persistent, self.lengths[i], large)

    def kill(self, i: int) -> None:
        self.places[i] = 0
        self.dead += 1
        if self.dead >= COMPACT_AT and self.dead * 2 > len(self.keys):
            self.compact()

    def compact(self) -> None:
        """Drop the dead slots (O(n), once at least half of the run died since the last time)."""
        places = self.places
        live = [i for i in range(len(places)) if places[i]]
        self.keys = array("Q", [self.keys[i] for i in live])
        self.places = array("Q", [places[i] for i in live])
        self.refsets = array("I", [self.refsets[i] for i in live])
        self.lengths = array("I", [self.lengths[i] for i in live])
        self.seqs = array("Q", [self.seqs[i] for i in live])
        self.dead = 0

    def live(self) -> Iterator[int]:
        places = self.places
        return (i for i in range(len(places)) if places[i])

    def load(self, keys: array, places: array, refsets: array, lengths: array, seqs: array) -> None:
        """Take arrays built in any key order (recovery reads pages in their order): sorted here."""
        if any(keys[i] >= keys[i + 1] for i in range(len(keys) - 1)):
            order = sorted(range(len(keys)), key=keys.__getitem__)
            keys = array("Q", [keys[i] for i in order])
            places = array("Q", [places[i] for i in order])
            refsets = array("I", [refsets[i] for i in order])
            lengths = array("I", [lengths[i] for i in order])
            seqs = array("Q", [seqs[i] for i in order])
        self.keys, self.places, self.refsets, self.lengths, self.seqs = keys, places, refsets, lengths, seqs
        self.dead = 0


class MessageIndex:
    __slots__ = ("store", "pages", "hot", "cold", "changed", "deliveries", "unlogged", "bytes_used", "hot_limit",
                 "_fold_at")

    def __init__(self, store: OpenStore, hot_limit: int = HOT_LIMIT) -> None:
        self.store = store
        self.pages = store.pages
        self.hot: dict[int, Entry] = {}
        self.cold = ColdRun()
        #: persistent keys whose references differ from their slot's refset (the checkpoint's REFS section);
        #: always hot
        self.changed: set[int] = set()
        #: delivery counts of live persistent messages: key -> queue -> count (frame DELIVERED)
        self.deliveries: dict[int, dict[str, int]] = {}
        #: counts noted since the last flush, logged by it in one DELIVERED frame: (key, queue) -> count
        self.unlogged: dict[tuple[int, str], int] = {}
        self.bytes_used = 0
        self.hot_limit = max(1, hot_limit)
        self._fold_at = self.hot_limit

    def __len__(self) -> int:
        return len(self.hot) + len(self.cold)

    def __contains__(self, key: int) -> bool:
        if key in self.hot:
            return True
        # a new message's key is above every cold one (keys increase as messages are placed): a write's
        # check that it is not held yet needs no search of the cold arrays
        keys = self.cold.keys
        return bool(keys) and key <= keys[-1] and self.cold.find(key) >= 0

    def get(self, key: int) -> Entry | None:
        """The entry of ``key`` to read (a cold one is a copy: change it through ``take``). A caller that
        needs only where the message is (``read``) or who owes it (``owed``) asks those: they build no
        copy."""
        entry = self.hot.get(key)
        if entry is not None:
            return entry
        cold = self.cold
        i = cold.find(key)
        if i < 0:
            return None
        return cold.entry(i, self.store.names.refsets[cold.refsets[i]])

    def owed(self, key: int) -> tuple[bool, tuple[str, ...]] | None:
        """(persistent, the queues that still owe it) of ``key``, or None if not held: one look-up, no
        ``Entry`` built for a cold one."""
        entry = self.hot.get(key)
        if entry is not None:
            return entry.persistent, entry.refs
        cold = self.cold
        i = cold.find(key)
        if i < 0:
            return None
        return bool(cold.places[i] & _PERSISTENT), self.store.names.refsets[cold.refsets[i]]

    def take(self, key: int) -> Entry | None:
        """The entry of ``key`` to change: a cold one comes back to the hot tier first."""
        entry = self.hot.get(key)
        if entry is not None:
            return entry
        i = self.cold.find(key)
        return None if i < 0 else self._promote(key, i)

    def _promote(self, key: int, i: int) -> Entry:
        """Cold message ``key`` (at ``i``) comes back to the hot tier: its references are about to change."""
        cold = self.cold
        entry = cold.entry(i, self.store.names.refsets[cold.refsets[i]])
        cold.kill(i)
        self.hot[key] = entry
        return entry

    # -- the changes writes and replay share ----------------------------------------------------------
    def add(self, key: int, entry: Entry) -> None:
        hot = self.hot
        hot[key] = entry
        self.bytes_used += entry.length
        if len(hot) >= self._fold_at:
            self.fold()

    def fold(self) -> int:
        """Move the oldest hot entries whose references never changed onto the cold arrays, leaving half of
        ``hot_limit`` hot; returns how many moved. Entries that cannot move (changed, out of key order) stay,
        and the next fold waits until as many more were added."""
        hot, changed, cold = self.hot, self.changed, self.cold
        refsets = self.store.names.refsets
        excess = len(hot) - self.hot_limit // 2
        last = cold.last
        moving: list[int] = []
        for key, entry in hot.items():
            if len(moving) >= excess:
                break
            # a cold message's queues are its refset: one whose queues changed (persistent ones are in
            # ``changed``; a non-persistent one is not logged, so only its refs say so) stays hot
            if key > last and key not in changed and entry.refs == refsets[entry.refset]:
                moving.append(key)
                last = key
        if moving:
            pop = hot.pop
            cold.extend(moving, [pop(key) for key in moving])
        self._fold_at = len(hot) + max(1, self.hot_limit // 2)
        return len(moving)

    def load_cold(self, keys: array, places: array, refsets: array, lengths: array, seqs: array) -> None:
        """Recovery: the messages of the checkpoint's pages whose references never changed, at once."""
        self.cold.load(keys, places, refsets, lengths, seqs)
        self.bytes_used += sum(lengths)

    def remove(self, key: int, queue: str) -> bool:
        """``queue`` no longer owes message ``key`` (KeyError if it is not held or not owed to ``queue``:
        nothing changed); the last reference frees its slot and, when empty, its page. Returns whether the
        message is persistent (the write path logs the REMOVE then). One look-up: the last reference of a
        cold message goes straight from the cold arrays (no ``Entry``, no hot slot); a cold message that keeps
        other references comes hot first (its references change)."""
        entry = self.hot.get(key)
        if entry is not None:
            refs = entry.refs
            if len(refs) != 1 or refs[0] != queue:
                return self._drop_one(key, entry, queue)
            # the last reference (the usual case): the slot dies, and its page when no live slot is left
            pages = self.pages
            page = pages.pages[entry.page]
            slot = entry.slot
            continuation = self._continuation(page, slot) if entry.large else ()
            del self.hot[key]
            self.changed.discard(key)
            pages.free_slot(page, slot, continuation)
            self.bytes_used -= entry.length
            if self.unlogged or self.deliveries:
                self._owed_no_more(key, queue)
            return entry.persistent
        cold = self.cold
        i = cold.find(key)
        if i < 0:
            raise KeyError(key)
        refs = self.store.names.refsets[cold.refsets[i]]
        if len(refs) != 1 or refs[0] != queue:
            if queue not in refs:
                raise KeyError(f"message {key} has no reference for {queue!r}")     # and it stays cold
            return self._drop_one(key, self._promote(key, i), queue)
        # the last reference of a cold message: it dies where it is, as a hot one does above (its place
        # unpacked here, as ``unpack_place`` does: once a message)
        place = cold.places[i]
        slot = (place >> _SLOT_SHIFT) & _SLOT
        pages = self.pages
        page = pages.pages[place & _PAGE]
        continuation = self._continuation(page, slot) if place & _LARGE else ()
        self.bytes_used -= cold.lengths[i]
        cold.kill(i)
        pages.free_slot(page, slot, continuation)
        if self.unlogged or self.deliveries:
            self._owed_no_more(key, queue)
        return bool(place & _PERSISTENT)

    def _continuation(self, page: Page, slot: int) -> tuple[int, ...]:
        """A large message's continuation pages, read from its slot before anything is freed (a damaged slot
        raises with nothing changed)."""
        return self.pages.continuation_pages(page, self.pages.slot_fields(page, slot))

    def _drop_one(self, key: int, entry: Entry, queue: str) -> bool:
        """``remove`` of one reference of a hot message that has others (or ``queue`` twice)."""
        left = list(entry.refs)
        try:
            left.remove(queue)
        except ValueError:
            raise KeyError(f"message {key} has no reference for {queue!r}") from None
        remaining = entry.refs = tuple(left)          # not empty: ``refs`` held another
        if queue not in remaining and (self.unlogged or self.deliveries):
            self._owed_no_more(key, queue)
        if entry.persistent:
            if remaining == self.store.names.refsets[entry.refset]:
                self.changed.discard(key)
            else:
                self.changed.add(key)
        return entry.persistent

    def _owed_no_more(self, key: int, queue: str) -> None:
        """``queue``'s delivery count of message ``key`` goes with its reference (callers ask only while a
        count is noted or kept)."""
        self.unlogged.pop((key, queue), None)
        deliveries = self.deliveries
        counts = deliveries.get(key)
        if counts is not None:
            counts.pop(queue, None)
            if not counts:
                del deliveries[key]

    def add_reference(self, key: int, entry: Entry, queue: str) -> None:
        """One more queue owes message ``key`` (a hot entry: ``take``)."""
        entry.refs = entry.refs + (queue,)
        if entry.persistent:
            self.changed.add(key)

    # -- reading ----------------------------------------------------------------------------------------
    def read(self, key: int) -> StoredMessage:
        """Message ``key`` (KeyError if not held); StorageError when its bytes or slot are damaged,
        OSError when the page file cannot be read."""
        # one look-up, and no Entry copied out of the cold arrays: a message read for delivery is read once
        entry = self.hot.get(key)
        if entry is not None:
            number, slot, seq, persistent = entry.page, entry.slot, entry.seq, entry.persistent
        else:
            cold = self.cold
            i = cold.find(key)
            if i < 0:
                raise KeyError(key)
            place = cold.places[i]          # (``unpack_place``'s fields, unpacked here: once a message)
            number, slot, persistent = place & _PAGE, (place >> _SLOT_SHIFT) & _SLOT, bool(place & _PERSISTENT)
            seq = cold.seqs[i]
        pages = self.pages
        fields, data = pages.message(pages.pages[number], slot)
        return StoredMessage(key, self.store.names.names[fields[5]], seq, persistent, data)

    def entries(self) -> Iterator[tuple[int, int, bool, tuple[str, ...]]]:
        """(key, seq, persistent, queues) of every message held, hot and cold (inspection: O(n))."""
        for key, entry in self.hot.items():
            yield key, entry.seq, entry.persistent, entry.refs
        cold, refsets = self.cold, self.store.names.refsets
        for i in cold.live():
            yield cold.keys[i], cold.seqs[i], bool(cold.places[i] & _PERSISTENT), refsets[cold.refsets[i]]

    def queue_order(self, queue: str) -> list[tuple[int, int]]:
        """A queue's (seq, key) pairs in seed 002's removal order, both kinds merged (O(n): inspection)."""
        return sorted((seq, key) for key, seq, _, refs in self.entries() if queue in refs)

    def queue_depth(self, queue: str) -> int:
        return sum(1 for _, _, _, refs in self.entries() if queue in refs)

    def persistent_order(self) -> list[tuple[int, int]]:
        """Every persistent message as (seq, key), in that order (what ``recover`` yields)."""
        return sorted((seq, key) for key, seq, persistent, _ in self.entries() if persistent)

    def changed_refs(self) -> dict[int, tuple[str, ...]]:
        hot = self.hot
        return {key: hot[key].refs for key in self.changed}

    # -- delivery counts ----------------------------------------------------------------------------------
    def note_delivery(self, key: int, queue: str, count: int) -> None:
        self.unlogged[(key, queue)] = count

    def take_deliveries(self) -> dict[tuple[int, str], int]:
        """The counts noted since the last flush, for persistent messages still owed to that queue, moved
        into the table checkpoints keep."""
        pending, self.unlogged = self.unlogged, {}
        table = self.deliveries
        kept = {}
        hot, cold, refsets = self.hot, self.cold, self.store.names.refsets
        for (key, queue), count in pending.items():
            # ``owed``, written out: one look-up a note, no call of its own
            entry = hot.get(key)
            if entry is not None:
                if not entry.persistent or queue not in entry.refs:
                    continue
            else:
                i = cold.find(key)
                if i < 0 or not cold.places[i] & _PERSISTENT or queue not in refsets[cold.refsets[i]]:
                    continue
            table.setdefault(key, {})[queue] = count
            kept[(key, queue)] = count
        return kept

    def delivery_counts(self, key: int) -> dict[str, int]:
        return dict(self.deliveries.get(key, ()))

    def replay_delivery(self, key: int, queue: str, count: int) -> None:
        held = self.owed(key)
        if held is not None and queue in held[1]:
            self.deliveries.setdefault(key, {})[queue] = count
