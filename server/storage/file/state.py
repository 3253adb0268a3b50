"""The file device's in-memory state, and the changes every part of it makes (see ``device.py``).

:class:`DeviceState` is what the write path (``writing.py``), checkpoints (``checkpointing.py``) and
recovery (``recovery.py``) share: the page objects, the message index (key -> page and slot, the queues
that still owe it), each queue's two lists (persistent, non-persistent; seed 002), the interned names and
refsets, the catalog and the delivery counts.  The changes that both a write and a log replay make live
here once: appending a slot to a page, indexing a message, dropping a reference (the last one frees the
slot and, when empty, the page), so recovery rebuilds exactly what writing built.

Invariants: a page holds one kind only (persistent or non-persistent); only the page allocator moves the
free list or the end of the file; ``_lock`` guards all of this (the broker thread and one worker thread
touch it), and every method here expects the caller to hold it.
"""
from __future__ import annotations

import errno
import logging
import os
import struct
import threading

from pymq.errors import StorageError

from ..device import StoredMessage
from ..page_alloc import NON_PERSISTENT, PERSISTENT, PageAllocator
from . import format as fmt
from .crc import crc32c
from .fileio import FileIO
from .pagefile import PageFile
from .wal import Segment

log = logging.getLogger("pymq.storage")

_HDR = fmt.PAGE_HEADER_SIZE
_SLOT = fmt.SLOT_SIZE


def _describe(exc: BaseException) -> str:
    """An OS error as an operator reads it: ``No space left on device (ENOSPC)``."""
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        return f"{exc.strerror or os.strerror(exc.errno)} ({name})"
    if isinstance(exc, StorageError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"


class _Page:
    """A slotted page or a continuation page, as the device tracks it in memory."""

    __slots__ = ("number", "kind", "cont", "buf", "slots", "data_start", "live", "live_count",
                 "disk_slots", "disk_data_start", "on_disk", "generation")

    def __init__(self, number: int, kind: int, page_size: int, generation: int, cont: bool = False,
                 buf: bytearray | memoryview | None = None) -> None:
        self.number = number
        self.kind = kind
        self.cont = cont
        #: the page's bytes while in memory; a persistent continuation page written from a message's own
        #: (immutable) bytes is a view of them, maybe shorter than a page (writing.py, checkpointing.py)
        self.buf = buf
        self.slots = 0
        self.data_start = page_size
        self.live = bytearray()
        self.live_count = 0
        self.disk_slots = 0           # slots already handed to the page file
        self.disk_data_start = page_size
        self.on_disk = False          # header (or, for a continuation page, all of it) written
        self.generation = generation

    def room(self) -> int:
        return self.data_start - (_HDR + _SLOT * (self.slots + 1))


class _Entry:
    """One held message: where it lives, which queues still owe it, and its length (its slot holds it
    too; kept here so that dropping the last reference reads nothing back: the page of a message
    written before the last checkpoint is on disk only). ``large``: the record lists continuation pages."""

    __slots__ = ("seq", "page", "slot", "refs", "refset", "persistent", "length", "large")

    def __init__(self, seq: int, page: int, slot: int, refs: tuple, refset: int, persistent: bool,
                 length: int, large: bool) -> None:
        self.seq = seq
        self.page = page
        self.slot = slot
        self.refs = refs
        self.refset = refset
        self.persistent = persistent
        self.length = length
        self.large = large


class _QueueLists:
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

class DeviceState:
    """The state and shared changes of a :class:`~pymq_server.storage.file.device.FileDevice`."""

    name: str
    directory: str
    page_size: int
    read_only: bool
    io: FileIO
    _lock: threading.Lock
    _open: bool
    _fault: str | None
    _logging: bool

    @property
    def pf(self) -> PageFile:
        """The page file, while the device is open."""
        pf = self._pf
        if pf is None:
            raise StorageError(f"file device {self.name!r} is not open", device=self.name)
        return pf

    @property
    def wal(self) -> Segment:
        """The log segment being written, while the device is open."""
        wal = self._wal
        if wal is None:
            raise StorageError(f"file device {self.name!r} is not open", device=self.name)
        return wal

    def _reset_state(self) -> None:
        self._alloc = PageAllocator(fmt.RESERVED_PAGES)
        self._pf: PageFile | None = None
        self._lock_fd = -1
        self._wal: Segment | None = None
        self._old_segments: list[Segment] = []
        self._next_segment = 1
        self._pages: dict[int, _Page] = {}
        self._index: dict[int, _Entry] = {}
        self._queues: dict[str, _QueueLists] = {}
        self._name_ids: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self._next_name = 1
        self._refset_ids: dict[tuple, int] = {}
        self._refsets: dict[int, tuple] = {}
        self._next_refset = 1
        self._durable_names: set[int] = set()
        self._durable_refsets: set[int] = set()
        self._changed_refs: set[int] = set()   # persistent keys whose refs differ from their refset
        self._catalog: dict[str, bytes] = {}
        #: delivery counts of live persistent messages: key -> queue -> count (frame DELIVERED)
        self._deliveries: dict[int, dict[str, int]] = {}
        #: counts recorded since the last flush, logged by it in one DELIVERED frame: (key, queue) -> count
        self._unlogged_deliveries: dict[tuple[int, str], int] = {}
        self._tail: dict[int, _Page | None] = {PERSISTENT: None, NON_PERSISTENT: None}
        self._dirty: set[int] = set()          # persistent pages with regions the page file lacks
        self._np_unwritten: dict[int, _Page] = {}
        self._generation = 0
        self._ckpt_pages: list[int] = []
        self._ckpt_freed = False               # _ckpt_pages already freed by a checkpoint that failed
        self._log_bytes = 0                    # bytes logged since the last checkpoint snapshot
        self._bytes_used = 0
        self._messages = 0
        self._errors = 0
        self._refusals = 0
        self._checkpoint_error = ""
        self._latency = 0.0
        self._syncs = 0
        self._checkpoints = 0
        self._last_recovery: dict[str, float | int] = {}

    def _check_open(self) -> None:
        if not self._open:
            raise StorageError(f"file device {self.name!r} is not open")

    def _check_writable(self) -> None:
        """Changes to what the device holds (removals, references, catalog) are allowed in fault too."""
        self._check_open()
        if self.read_only:
            raise StorageError(f"file device {self.name!r} is open read-only")

    def _check_accepting(self) -> None:
        """New messages: refused in fault (a refusal counts as a device error)."""
        self._check_writable()
        if self._fault is not None:
            self._refused()
            raise StorageError(f"file device {self.name!r} refuses new messages: {self._fault}; it is "
                               f"retried and takes messages again once it recovers", device=self.name)

    def _refused(self) -> None:
        self._errors += 1
        self._refusals += 1

    def _fail(self, exc: BaseException, during: str = "writing") -> StorageError:
        """A write or fsync failed: enter fault (see the module docstring) and say why."""
        self._errors += 1
        reason = f"{during} failed: {_describe(exc)}"
        if self._fault is None:
            log.error("file device %r in fault, refusing new messages until it recovers: %s", self.name, reason)
        self._fault = reason
        self._logging = False
        if self._wal is not None:
            self._wal.discard()
        return StorageError(f"file device {self.name!r}: {reason}", device=self.name)

    def _name_id(self, name: str, log: bool) -> int:
        name_id = self._name_ids.get(name)
        if name_id is None:
            name_id = self._next_name
            self._next_name += 1
            self._name_ids[name] = name_id
            self._names[name_id] = name
        if log and self._logging and name_id not in self._durable_names:
            self._log(fmt.F_NAME, fmt.encode_name(name_id, name), commit=False)
            self._durable_names.add(name_id)
        return name_id

    def _refset_id(self, refs: tuple, log: bool) -> int:
        refset_id = self._refset_ids.get(refs)
        if refset_id is None:
            for queue in refs:          # a checkpoint stores refsets as name ids
                self._name_id(queue, False)
            refset_id = self._next_refset
            self._next_refset += 1
            self._refset_ids[refs] = refset_id
            self._refsets[refset_id] = refs
        if log and self._logging and refset_id not in self._durable_refsets:
            ids = tuple(self._name_id(q, True) for q in refs)
            self._log(fmt.F_REFSET, fmt.encode_refset(refset_id, ids), commit=False)
            self._durable_refsets.add(refset_id)
        return refset_id

    def _log(self, ftype: int, payload: bytes, commit: bool) -> None:
        if not self._logging:
            return          # in fault: the next checkpoint records the state instead
        wal = self.wal
        end_before = wal.size
        wal.append(ftype, payload, commit)
        self._log_bytes += wal.size - end_before

    def _log_pieces(self, ftype: int, pieces: tuple[bytes, ...], commit: bool) -> None:
        """``_log`` of a payload given as pieces (a large message's PUT: logged from its own bytes)."""
        if not self._logging:
            return
        wal = self.wal
        end_before = wal.size
        wal.append_pieces(ftype, pieces, commit)
        self._log_bytes += wal.size - end_before

    def _new_page(self, kind: int, cont: bool = False, buf: memoryview | None = None) -> _Page:
        """A page from the allocator, its bytes zero in memory (or ``buf``: a continuation page's view of
        the message bytes it holds)."""
        number = self._alloc.allocate(kind)
        page = _Page(number, kind, self.page_size, self._generation, cont,
                     bytearray(self.page_size) if buf is None else buf)
        self._pages[number] = page
        if kind == PERSISTENT:
            self._dirty.add(number)
        return page

    def _claim_page(self, number: int, kind: int, cont: bool = False) -> _Page:
        self._alloc.claim(number, kind)
        page = _Page(number, kind, self.page_size, self._generation, cont, bytearray(self.page_size))
        self._pages[number] = page
        if kind == PERSISTENT:
            self._dirty.add(number)
        return page

    def _resident(self, page: _Page) -> bytearray | memoryview:
        buf = page.buf
        if buf is None:
            buf = page.buf = self.pf.read_page(page.number)
        return buf

    def _seal(self, page: _Page) -> None:
        """The page stops being a tail: free it if empty, else queue a non-persistent one for write-out."""
        if page.live_count == 0:
            self._free_page(page)
        elif page.kind == NON_PERSISTENT:
            self._np_unwritten[page.number] = page

    def _free_page(self, page: _Page) -> None:
        self._alloc.free(page.number)
        del self._pages[page.number]
        self._dirty.discard(page.number)
        self._np_unwritten.pop(page.number, None)
        if self._tail.get(page.kind) is page:
            self._tail[page.kind] = None

    def _inline_max(self) -> int:
        return (self.page_size - _HDR - _SLOT) // 4

    def _continuation_count(self, length: int) -> int:
        return -(-length // self.page_size)

    def _write_page_header(self, page: _Page) -> None:
        self._resident(page)[:_HDR] = fmt.encode_page_header(page.kind, page.number, page.generation)

    def _put_record(self, page: _Page, key: int, seq: int, record: bytes, length: int, dest_id: int,
                    refset_id: int, flags: int, data_crc: int) -> tuple[int, bytes]:
        """Append one slot and its record to ``page`` (in memory); returns the slot and its 44 bytes."""
        buf = self._resident(page)     # a tail inherited from a checkpoint starts on disk only
        rlen = len(record)
        offset = page.data_start - rlen
        slot = page.slots
        buf[offset:offset + rlen] = record
        body = fmt.SLOT_BODY.pack(key, seq, offset, rlen, length, dest_id, refset_id, flags, data_crc)
        at = _HDR + _SLOT * slot
        buf[at:at + _SLOT] = fmt.sealed(body)
        page.slots = slot + 1
        page.data_start = offset
        if slot // 8 >= len(page.live):
            page.live.append(0)
        page.live[slot // 8] |= 1 << (slot % 8)
        page.live_count += 1
        return slot, body

    def _add_entry(self, key: int, entry: _Entry) -> None:
        self._index[key] = entry
        self._messages += 1
        which = 0 if entry.persistent else 1
        refs = entry.refs
        for queue in (refs if len(refs) == 1 else set(refs)):
            lists = self._queues.get(queue)
            if lists is None:
                lists = self._queues[queue] = _QueueLists()
            lists.add(which, key, entry.seq)

    def _drop_reference(self, key: int, entry: _Entry, refs: tuple, queue: str) -> None:
        entry.refs = refs
        if queue not in refs:
            lists = self._queues.get(queue)
            if lists is not None:
                lists.lists[0 if entry.persistent else 1].pop(key, None)
                if not len(lists):
                    del self._queues[queue]
            if self._unlogged_deliveries:
                self._unlogged_deliveries.pop((key, queue), None)
            counts = self._deliveries.get(key)
            if counts is not None:
                counts.pop(queue, None)
                if not counts:
                    del self._deliveries[key]
        if refs:
            if entry.persistent:
                if refs == self._refsets[entry.refset]:
                    self._changed_refs.discard(key)
                else:
                    self._changed_refs.add(key)
            return
        self._kill(key, entry)

    def _kill(self, key: int, entry: _Entry) -> None:
        """The last reference went: the slot dies; pages left without a live slot are freed."""
        del self._index[key]
        self._changed_refs.discard(key)
        self._messages -= 1
        page = self._pages[entry.page]
        self._bytes_used -= entry.length
        if entry.large:
            for number in self._continuation_pages(page, self._slot_fields(page, entry.slot)):
                self._free_page(self._pages[number])
        page.live[entry.slot // 8] &= ~(1 << (entry.slot % 8)) & 0xFF
        page.live_count -= 1
        if page.live_count == 0 and self._tail.get(page.kind) is not page:
            self._free_page(page)

    def _add_reference(self, key: int, entry: _Entry, queue: str) -> None:
        first = queue not in entry.refs
        entry.refs = entry.refs + (queue,)
        if entry.persistent:
            self._changed_refs.add(key)
        if first:
            lists = self._queues.get(queue)
            if lists is None:
                lists = self._queues[queue] = _QueueLists()
            lists.add(0 if entry.persistent else 1, key, entry.seq)

    def _slot_fields(self, page: _Page, slot: int) -> tuple:
        at = _HDR + _SLOT * slot
        raw: bytes | bytearray | memoryview
        if page.buf is not None:
            raw = page.buf[at:at + _SLOT]
        else:
            raw = self.pf.read_at(page.number * self.page_size + at, _SLOT)
        fields = fmt.SLOT.unpack(raw)
        if fields[9] != crc32c(raw[:fmt.SLOT_BODY.size]):
            self._errors += 1
            raise StorageError(f"page {page.number} slot {slot}: directory entry is corrupt",
                               page=page.number, slot=slot)
        return fields

    def _record(self, page: _Page, fields: tuple) -> bytes:
        offset, rlen = fields[2], fields[3]
        if page.buf is not None:
            return bytes(page.buf[offset:offset + rlen])
        return self.pf.read_at(page.number * self.page_size + offset, rlen)

    def _continuation_pages(self, page: _Page, fields: tuple) -> tuple[int, ...]:
        record = self._record(page, fields)
        return struct.unpack(f"<{len(record) // 4}I", record)

    def _message_bytes(self, page: _Page, fields: tuple) -> bytes:
        if fields[7] & fmt.FLAG_LARGE:
            chunks = []
            for number in self._continuation_pages(page, fields):
                cont = self._pages[number]
                chunks.append(bytes(cont.buf) if cont.buf is not None else self.pf.read_page(number))
            data = b"".join(chunks)[:fields[4]]
        else:
            data = self._record(page, fields)
        if crc32c(data) != fields[8]:
            self._errors += 1
            raise StorageError(f"message {fields[0]}: bytes on page {page.number} are corrupt",
                               key=fields[0], page=page.number)
        return data

    def _read_locked(self, key: int) -> StoredMessage:
        entry = self._index[key]
        page = self._pages[entry.page]
        fields = self._slot_fields(page, entry.slot)
        data = self._message_bytes(page, fields)
        return StoredMessage(key, self._names[fields[5]], entry.seq, entry.persistent, data)
