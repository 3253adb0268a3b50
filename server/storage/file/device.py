"""FileDevice: the embedded default holding store, a paged file plus a write-ahead log (seed 002).

Job: hold persistent and non-persistent messages on local disk; keep persistent ones across crashes.

* Pages are fixed-size (64 KiB by default).  A page holds only persistent or only non-persistent
  messages; the page table marks every page free, persistent, non-persistent (or system).  The page
  allocator (``page_alloc``) is the only code that moves the free list or the end of the file.
* Only persistent changes (and catalog records) are logged.  ``write``/``remove`` update pages in
  memory and buffer log frames; ``flush`` hands frames (and sealed non-persistent pages) to the OS;
  ``sync`` fsyncs the log.  Persistent pages reach the page file only at checkpoints.
* A checkpoint writes the new regions of persistent pages, the checkpoint payload (page table, live
  bitmaps, names, catalog) and then the alternate meta page; the log restarts in a new segment.  Pages
  freed before a checkpoint become reusable only once it is durable, so the last durable checkpoint
  never points at overwritten bytes.  Trailing free pages are cut from the end of the file.
* Recovery reads the newest valid meta page, the checkpoint, and for each persistent page only its
  header and slot directory (live slots per the checkpoint's bitmap), never the message bytes; every
  non-persistent page becomes free unread; then it replays the log's committed prefix.
* Messages larger than a quarter page that do not fit the current page are *large*: their bytes go to
  continuation pages of the same kind and the slot's record lists those pages.
* Faults (spec/storage.md §8): disk space is reserved when a message is accepted, so a full disk refuses
  the message at ``write`` (a refusal: nothing changed, the device stays in service).  Any other failed
  write or fsync puts the device in *fault*: it refuses new messages, stops logging (the log's tail can no
  longer be trusted), keeps serving reads, and applies removals in memory only, so consumers can drain
  what it holds.  ``repair`` (the store calls it with a back-off) leaves the fault by writing a checkpoint
  that starts a new log chain: the checkpoint alone holds the whole state, so nothing the untrusted tail
  held is needed.  A checkpoint that fails otherwise changes nothing durable and is simply retried.

Threading (see ``device.py``): the broker thread calls everything but ``sync``/``checkpoint``, which
may run in one worker thread.  ``_lock`` guards the in-memory state (held briefly by both threads);
``_sync_lock`` serialises syncs and checkpoints so a log segment is never closed under an fsync.
"""
from __future__ import annotations

import errno
import fcntl
import gc
import heapq
import logging
import os
import struct
import threading
import time
from typing import Callable, Iterable, Iterator, Sequence

from pymq.errors import StorageError

from ..device import Allocation, DeviceStatus, HoldingDevice, StoredMessage
from ..page_alloc import NON_PERSISTENT, PERSISTENT, SYSTEM, PageAllocator
from . import checkpoint as ckpt
from . import format as fmt
from .crc import crc32c
from .fileio import OS_IO, FileIO, is_no_space
from .pagefile import Meta, PageFile
from .wal import Segment, list_segments, new_salt, read_frames, segment_path

log = logging.getLogger("pymq.storage")

DEFAULT_PAGE_SIZE = 64 * 1024
DEFAULT_CHECKPOINT_BYTES = 32 * 1024 * 1024
_AUTO_FLUSH_BYTES = 1 << 20
#: log space a message's write reserves beyond its own frames, for the removals and catalog records that
#: follow it (they are never refused: a consumer must always be able to acknowledge)
_LOG_HEADROOM = 64 * 1024
#: log bytes a PUT frame adds besides the message bytes (frame header, slot, NAME/REFSET frames) at most
_PUT_OVERHEAD = 4096
_HDR = fmt.PAGE_HEADER_SIZE
_SLOT = fmt.SLOT_SIZE
_KIND_INDEX = {PERSISTENT: 0, NON_PERSISTENT: 1}


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
                 buf: bytearray | None = None) -> None:
        self.number = number
        self.kind = kind
        self.cont = cont
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
    """One held message: where it lives and which queues still owe it."""

    __slots__ = ("seq", "page", "slot", "refs", "refset", "persistent")

    def __init__(self, seq: int, page: int, slot: int, refs: tuple, refset: int, persistent: bool) -> None:
        self.seq = seq
        self.page = page
        self.slot = slot
        self.refs = refs
        self.refset = refset
        self.persistent = persistent


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


class FileDevice(HoldingDevice):
    """Paged file store with a write-ahead log; the broker's embedded default device."""

    kind = "file"

    def __init__(self, name: str, directory: str | os.PathLike, page_size: int = DEFAULT_PAGE_SIZE, *,
                 checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES, max_bytes: int | None = None,
                 fsync: bool = True, read_only: bool = False, checkpoint_in_sync: bool = True,
                 io: FileIO | None = None) -> None:
        """``fsync=False`` skips every fsync (tests, throwaway stores); ``read_only`` opens without
        changing a byte (inspection); ``max_bytes`` bounds the page file (``allocate`` raises when full);
        ``checkpoint_in_sync=False`` leaves due checkpoints to the caller (``checkpoint_due`` /
        ``checkpoint()``, as the commit driver does) so a sync never waits for one; ``io`` replaces the
        system calls (tests inject faults with it).  An existing store keeps the page size it was
        created with."""
        if page_size & (page_size - 1) or not fmt.MIN_PAGE_SIZE <= page_size <= fmt.MAX_PAGE_SIZE:
            raise StorageError(f"page size {page_size} is not a power of two in "
                               f"[{fmt.MIN_PAGE_SIZE}, {fmt.MAX_PAGE_SIZE}]")
        self.name = name
        self.directory = os.fspath(directory)
        self.page_size = page_size
        self.checkpoint_bytes = checkpoint_bytes
        self.max_bytes = max_bytes
        self.read_only = read_only
        self.checkpoint_in_sync = checkpoint_in_sync
        self._fsync = fsync
        self.io: FileIO = io or OS_IO
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._open = False
        #: why the device is in fault (refusing writes, not logging), or None while in service
        self._fault: str | None = None
        #: log frames are written (False in fault: the log's tail is not trusted until a checkpoint)
        self._logging = True
        #: test hook, called with a phase name inside checkpoints ("switched", "before-meta", "after-meta")
        self.checkpoint_hook: Callable[[str], None] | None = None
        self._reset_state()

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

    # =====================================================================================================
    # lifecycle
    # =====================================================================================================
    def open(self) -> None:
        if self._open:
            raise StorageError(f"file device {self.name!r} is already open")
        started = time.perf_counter()
        os.makedirs(self.directory, exist_ok=True)
        self._lock_fd = os.open(os.path.join(self.directory, "LOCK"),
                                os.O_RDONLY | os.O_CREAT if self.read_only else os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, (fcntl.LOCK_SH if self.read_only else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise StorageError(f"store {self.directory} is in use by another process", path=self.directory) \
                from exc
        path = os.path.join(self.directory, "pages")
        try:
            if not os.path.exists(path):
                if self.read_only:
                    raise StorageError(f"no store in {self.directory}", path=self.directory)
                self._create(path)
            else:
                self._recover_from_disk(path)
        except BaseException:
            self._release_files()
            self._reset_state()
            raise
        self._open = True
        self._last_recovery["open_s"] = time.perf_counter() - started

    def close(self) -> None:
        """Checkpoint and release the files.  A device in fault tries one repair (its removals since
        the fault are otherwise lost, so those messages would come back after the restart); if that
        fails too the files are released anyway and StorageError says what was not saved."""
        if not self._open:
            return
        try:
            if self.read_only:
                return
            if self._fault is not None:
                if not self.repair():
                    raise StorageError(f"file device {self.name!r} closed in fault ({self._fault}): changes "
                                       f"since the fault were not saved; everything acknowledged was",
                                       device=self.name)
                return
            self.flush()
            self.checkpoint()
        finally:
            self._release_files()
            self._open = False

    def set_io(self, io: FileIO) -> None:
        """Route every later system call through ``io`` (tests: inject faults into an open device)."""
        with self._lock:
            self.io = io
            if self._pf is not None:
                self._pf.io = io
            for seg in [*self._old_segments, self._wal]:
                if seg is not None:
                    seg.io = io

    def _release_files(self) -> None:
        for seg in self._old_segments:
            seg.close()
        if self._wal is not None:
            self._wal.close()
        if self._pf is not None:
            self._pf.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
        self._old_segments, self._wal, self._pf, self._lock_fd = [], None, None, -1

    def _simulate_crash(self) -> None:
        """Drop every unflushed byte and release the files, as ``kill -9`` would (tests only)."""
        self._release_files()
        self._open = False

    def _create(self, path: str) -> None:
        self._pf = PageFile(path, self.page_size, fsync=self._fsync, io=self.io)
        self._pf.create()
        self._alloc = PageAllocator(fmt.RESERVED_PAGES)
        self._wal = self._new_segment(0, 0)
        self._sync_dir()
        self._checkpoint_locked()

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

    @property
    def fault(self) -> str | None:
        """Why the device refuses new messages (None: in service)."""
        return self._fault

    @property
    def needs_repair(self) -> bool:
        return self._open and self._fault is not None and not self.read_only

    def repair(self) -> bool:
        """Leave fault by writing a checkpoint that starts a new log chain; True when back in service.
        May run in a worker thread (the store calls it with a back-off)."""
        with self._sync_lock:
            with self._lock:
                if not self._open or self.read_only:
                    return False
                if self._fault is None:
                    return True
            try:
                self._checkpoint_locked(new_chain=True)
            except StorageError as exc:
                log.info("file device %r still in fault: %s", self.name, exc.message)
                return False
            with self._lock:
                reason, self._fault = self._fault, None
            log.warning("file device %r is back in service (it was in fault: %s)", self.name, reason)
            return True

    # =====================================================================================================
    # names and refsets (interned; durable through NAME/REFSET frames or the checkpoint)
    # =====================================================================================================
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
        end_before = self._wal.size
        self._wal.append(ftype, payload, commit)
        self._log_bytes += self._wal.size - end_before

    # =====================================================================================================
    # pages
    # =====================================================================================================
    def _new_page(self, kind: int, cont: bool = False) -> _Page:
        number = self._alloc.allocate(kind)
        page = _Page(number, kind, self.page_size, self._generation, cont, bytearray(self.page_size))
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

    def _resident(self, page: _Page) -> bytearray:
        if page.buf is None:
            page.buf = self._pf.read_page(page.number)
        return page.buf

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

    def _ensure_room(self, pages: int, log_bytes: int = 0) -> None:
        """Refuse (StorageError, a device error) unless ``pages`` more pages fit ``max_bytes`` and the
        disk holds them and ``log_bytes`` more log: the space is reserved now, so writing it later
        cannot fail for lack of space."""
        alloc = self._alloc
        if self.max_bytes is not None:
            used = alloc.page_count - alloc.free_count
            if (used + pages) * self.page_size > self.max_bytes:
                self._refused()
                raise StorageError(f"file device {self.name!r} is full ({self.max_bytes} bytes)",
                                   device=self.name, limit=self.max_bytes)
        try:
            if pages > alloc.free_count:
                self._pf.reserve(alloc.page_count + pages - alloc.free_count)
            if log_bytes:
                self._wal.reserve(log_bytes + _LOG_HEADROOM)
        except OSError as exc:
            self._refused()
            if is_no_space(exc):
                raise StorageError(f"file device {self.name!r} is full: the disk under {self.directory} has "
                                   f"no room ({_describe(exc)})", device=self.name) from None
            raise self._fail(exc, "reserving disk space") from exc

    def _inline_max(self) -> int:
        return (self.page_size - _HDR - _SLOT) // 4

    def _continuation_count(self, length: int) -> int:
        return -(-length // self.page_size)

    # =====================================================================================================
    # the HoldingDevice interface: writes (broker thread)
    # =====================================================================================================
    def allocate(self, size: int, persistent: bool) -> Allocation:
        with self._lock:
            self._check_accepting()
            pages = 1 + (self._continuation_count(size) if size > self._inline_max() else 0)
            self._ensure_room(pages)
        return Allocation(self.name, size, persistent)

    def write(self, message: StoredMessage, queues: Sequence[str],
              allocation: Allocation | None = None) -> None:
        with self._lock:
            self._check_accepting()
            key = message.key
            if key in self._index:
                raise StorageError(f"message {key} is already held", key=key)
            if not queues:
                raise StorageError(f"message {key} written without a queue", key=key)
            persistent = bool(message.persistent)
            kind = PERSISTENT if persistent else NON_PERSISTENT
            data = message.data
            length = len(data)
            refs = tuple(queues)
            # room first (pages, disk space, log space), so a refusal changes nothing
            tail = self._tail[kind]
            large = length > self._inline_max() and (tail is None or tail.room() < length)
            cont_pages: list[_Page] = []
            if large:
                count = self._continuation_count(length)
                if 4 * count > self.page_size - _HDR - _SLOT:
                    raise StorageError(f"message {key} of {length} bytes exceeds the largest message "
                                       f"pages of {self.page_size} bytes can hold", key=key)
                record = struct.pack(f"<{count}I", *range(count))   # sized now, filled below
            else:
                record = data
            needs_page = tail is None or tail.room() < len(record)
            self._ensure_room((count if large else 0) + (1 if needs_page else 0),
                              length + _PUT_OVERHEAD if persistent else 0)
            try:
                dest_id = self._name_id(message.destination, persistent)
                refset_id = self._refset_id(refs, persistent)
                if large:
                    ps = self.page_size
                    for i in range(count):
                        page = self._new_page(kind, cont=True)
                        chunk = data[i * ps:(i + 1) * ps]
                        page.buf[:len(chunk)] = chunk
                        cont_pages.append(page)
                        if kind == NON_PERSISTENT:
                            self._np_unwritten[page.number] = page
                    record = struct.pack(f"<{count}I", *(p.number for p in cont_pages))
                if needs_page:
                    if tail is not None:
                        self._tail[kind] = None
                        self._seal(tail)
                    tail = self._new_page(kind)
                    self._tail[kind] = tail
                flags = (fmt.FLAG_PERSISTENT if persistent else 0) | (fmt.FLAG_LARGE if large else 0)
                slot_index, slot_body = self._put_record(tail, key, message.seq, record, length, dest_id,
                                                         refset_id, flags, crc32c(data))
                if persistent:
                    self._dirty.add(tail.number)
                    self._log(fmt.F_PUT, fmt.encode_put(tail.number, slot_index, slot_body,
                                                        tuple(p.number for p in cont_pages), data), True)
            except OSError as exc:
                raise self._fail(exc) from exc
            entry = _Entry(message.seq, tail.number, slot_index, refs, refset_id, persistent)
            self._add_entry(key, entry)
            self._bytes_used += length
            if self._wal.buffered > _AUTO_FLUSH_BYTES:
                try:
                    self._flush_locked()
                except StorageError:
                    pass     # the message is held; the device is in fault now and its barrier says so

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
        for queue in set(entry.refs):
            lists = self._queues.get(queue)
            if lists is None:
                lists = self._queues[queue] = _QueueLists()
            lists.add(which, key, entry.seq)

    def remove(self, key: int, queue: str) -> None:
        with self._lock:
            self._check_writable()
            entry = self._index.get(key)
            if entry is None:
                raise KeyError(key)
            refs = list(entry.refs)
            try:
                refs.remove(queue)
            except ValueError:
                raise KeyError(f"message {key} has no reference for {queue!r}") from None
            if entry.persistent:
                self._log(fmt.F_REMOVE, fmt.KEY_NAME.pack(key, self._name_ids[queue]), True)
            self._drop_reference(key, entry, tuple(refs), queue)

    def _drop_reference(self, key: int, entry: _Entry, refs: tuple, queue: str) -> None:
        entry.refs = refs
        if queue not in refs:
            lists = self._queues.get(queue)
            if lists is not None:
                lists.lists[0 if entry.persistent else 1].pop(key, None)
                if not len(lists):
                    del self._queues[queue]
            counts = self._deliveries.get(key)
            if counts is not None:
                counts.pop(queue, None)
                if not counts:
                    del self._deliveries[key]
                self._unlogged_deliveries.pop((key, queue), None)
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
        fields = self._slot_fields(page, entry.slot)
        self._bytes_used -= fields[4]
        if fields[7] & fmt.FLAG_LARGE:
            for number in self._continuation_pages(page, fields):
                self._free_page(self._pages[number])
        page.live[entry.slot // 8] &= ~(1 << (entry.slot % 8)) & 0xFF
        page.live_count -= 1
        if page.live_count == 0 and self._tail.get(page.kind) is not page:
            self._free_page(page)

    def add_reference(self, key: int, queue: str) -> None:
        with self._lock:
            self._check_writable()
            entry = self._index.get(key)
            if entry is None:
                raise KeyError(key)
            if entry.persistent:
                qid = self._name_id(queue, True)
                self._log(fmt.F_ADDREF, fmt.KEY_NAME.pack(key, qid), True)
            else:
                self._name_id(queue, False)
            self._add_reference(key, entry, queue)

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

    def record_delivery(self, key: int, queue: str, count: int) -> None:
        """Message ``key`` went to a consumer of ``queue`` for the ``count``-th time (persistent ones
        only).  Kept in memory and logged by the next flush, in one DELIVERED frame for every count
        recorded since the previous one; a message acknowledged before that flush costs no log bytes."""
        with self._lock:
            entry = self._index.get(key)
            if entry is None or not entry.persistent or queue not in entry.refs or not self._open:
                return
            counts = self._deliveries.get(key)
            if counts is None:
                counts = self._deliveries[key] = {}
            counts[queue] = count
            if self._logging and not self.read_only:
                self._unlogged_deliveries[(key, queue)] = count

    def _log_deliveries(self) -> None:
        pending, self._unlogged_deliveries = self._unlogged_deliveries, {}
        if not self._logging:
            return
        pack, ids = fmt.DELIVERED.pack, self._name_ids
        self._log(fmt.F_DELIVERED, b"".join([pack(key, ids[queue], count)
                                             for (key, queue), count in pending.items()]), True)

    def deliveries(self, key: int) -> dict[str, int]:
        """Queue -> how many times message ``key`` was delivered from it (recorded ones only)."""
        with self._lock:
            return dict(self._deliveries.get(key, ()))

    def put_meta(self, key: str, value: bytes | None) -> None:
        with self._lock:
            self._check_writable()
            self._log(fmt.F_META, fmt.encode_meta_record(key, value), True)
            if value is None:
                self._catalog.pop(key, None)
            else:
                self._catalog[key] = bytes(value)

    def iter_meta(self) -> Iterable[tuple[str, bytes]]:
        with self._lock:
            self._check_open()
            return sorted(self._catalog.items())

    # =====================================================================================================
    # reads
    # =====================================================================================================
    def _slot_fields(self, page: _Page, slot: int) -> tuple:
        at = _HDR + _SLOT * slot
        if page.buf is not None:
            raw = page.buf[at:at + _SLOT]
        else:
            raw = self._pf.read_at(page.number * self.page_size + at, _SLOT)
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
        return self._pf.read_at(page.number * self.page_size + offset, rlen)

    def _continuation_pages(self, page: _Page, fields: tuple) -> tuple[int, ...]:
        record = self._record(page, fields)
        return struct.unpack(f"<{len(record) // 4}I", record)

    def _message_bytes(self, page: _Page, fields: tuple) -> bytes:
        if fields[7] & fmt.FLAG_LARGE:
            chunks = []
            for number in self._continuation_pages(page, fields):
                cont = self._pages[number]
                chunks.append(bytes(cont.buf) if cont.buf is not None else self._pf.read_page(number))
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

    def read(self, key: int) -> StoredMessage:
        with self._lock:
            self._check_open()
            if key not in self._index:
                raise KeyError(key)
            try:
                return self._read_locked(key)
            except OSError as exc:
                self._errors += 1
                raise StorageError(f"file device {self.name!r}: {exc}", device=self.name) from exc

    def references(self, key: int) -> list[str]:
        """The queues that still owe message ``key`` (KeyError if not held)."""
        with self._lock:
            return list(self._index[key].refs)

    def holds(self, key: int) -> bool:
        return key in self._index

    def __contains__(self, key: int) -> bool:
        return key in self._index

    def iterate(self, queue: str) -> Iterator[StoredMessage]:
        """A queue's messages in time-sequence order, merging its persistent and non-persistent lists.

        Seed 002's removal order: (seq, key) ascending across both page kinds.  A message removed
        while the iterator runs is skipped.
        """
        with self._lock:
            self._check_open()
            lists = self._queues.get(queue)
            if lists is None:
                return
            merged = list(heapq.merge(lists.ordered_list(0), lists.ordered_list(1)))
        for _seq, key in merged:
            with self._lock:
                entry = self._index.get(key)
                if entry is None or queue not in entry.refs:
                    continue
                message = self._read_locked(key)
            yield message

    def queue_depth(self, queue: str) -> int:
        lists = self._queues.get(queue)
        return len(lists) if lists is not None else 0

    # =====================================================================================================
    # durability: flush (broker thread), sync and checkpoint (worker thread allowed)
    # =====================================================================================================
    def flush(self) -> None:
        """Hand buffered log frames and sealed non-persistent pages to the OS.  In fault: nothing (the
        repair's checkpoint records the state); a failure here puts the device in fault and raises."""
        with self._lock:
            self._check_open()
            if self.read_only or self._fault is not None:
                return
            self._flush_locked()
        if self._log_bytes > 4 * self.checkpoint_bytes and self._sync_lock.acquire(blocking=False):
            # nobody syncs (policy "never"): bound the log here rather than let it grow forever
            try:
                self._checkpoint_locked()
            except StorageError as exc:
                log.error("checkpoint of file device %r failed, retried later: %s", self.name, exc.message)
            finally:
                self._sync_lock.release()

    def _flush_locked(self) -> None:
        if self._unlogged_deliveries:
            self._log_deliveries()
        try:
            self._wal.flush()
            if self._np_unwritten:
                ps = self.page_size
                for number, page in list(self._np_unwritten.items()):
                    if not page.cont and not page.on_disk:
                        self._write_page_header(page)
                    self._pf.write_at(number * ps, page.buf)
                    page.on_disk = True
                    page.buf = None
                    del self._np_unwritten[number]
        except OSError as exc:
            raise self._fail(exc, "writing to disk") from exc

    def _write_page_header(self, page: _Page) -> None:
        page.buf[:_HDR] = fmt.encode_page_header(page.kind, page.number, page.generation)

    @property
    def checkpoint_due(self) -> bool:
        return self._log_bytes >= self.checkpoint_bytes and self._fault is None

    def sync(self) -> None:
        """Make everything flushed durable; in fault StorageError (nothing since the fault is durable,
        and nothing will be until the repair's checkpoint)."""
        with self._sync_lock:
            with self._lock:
                self._check_open()
                if self.read_only:
                    return
                if self._fault is not None:
                    raise StorageError(f"file device {self.name!r} cannot make writes durable: {self._fault}",
                                       device=self.name)
                segments = [*self._old_segments, self._wal]
            started = time.perf_counter()
            try:
                for seg in segments:
                    seg.sync()
            except OSError as exc:
                # after a failed fsync the kernel may have dropped the dirty pages: never trust this log
                # again (retrying the fsync could "succeed" without the data); the repair rewrites it all
                with self._lock:
                    raise self._fail(exc, "fsync of the log") from exc
            elapsed = time.perf_counter() - started
            with self._lock:
                self._syncs += 1
                self._latency = elapsed if self._syncs == 1 else 0.9 * self._latency + 0.1 * elapsed
            if self.checkpoint_in_sync and self.checkpoint_due:
                try:
                    self._checkpoint_locked()
                except StorageError as exc:
                    log.error("checkpoint of file device %r failed, retried later: %s", self.name, exc.message)

    def checkpoint(self) -> None:
        """Write a checkpoint now (the log restarts empty); may run in the worker thread.  StorageError
        when it fails; a failed checkpoint changes nothing durable (unless it met a failing log, which
        puts the device in fault)."""
        with self._sync_lock:
            with self._lock:
                self._check_writable()
                if self._fault is not None:
                    raise StorageError(f"file device {self.name!r} is in fault ({self._fault}); its repair "
                                       f"writes the next checkpoint", device=self.name)
            self._checkpoint_locked()

    def _checkpoint_locked(self, new_chain: bool = False) -> None:
        """Snapshot under ``_lock``, write without it, publish under it.  Caller holds ``_sync_lock``.

        ``new_chain`` (the repair of a fault): the current segment is abandoned unflushed and the new one
        starts a new chain, so a crash before this checkpoint is durable replays the old log only up to
        what it validly holds, and never continues into frames written after the fault.  A failure
        before the meta page is written changes nothing durable; every in-memory mark made for the
        checkpoint is undone and the next one retries."""
        hook = self.checkpoint_hook
        ps = self.page_size
        with self._lock:
            if new_chain:
                if self._wal is not None:
                    self._wal.discard()
            else:
                self._flush_locked()          # raises (and enters fault) when the log cannot be written
            old = self._wal
            try:
                if new_chain or old is None:
                    seg = self._new_segment(0, 0)
                else:
                    seg = self._new_segment(old.salt, old.checksum)
            except OSError as exc:
                self._errors += 1
                self._checkpoint_error = _describe(exc)
                raise StorageError(f"file device {self.name!r}: checkpoint could not start a log segment: "
                                   f"{_describe(exc)}", device=self.name) from exc
            if old is not None:
                self._old_segments.append(old)
            generation = self._generation + 1
            marks = [(page, page.on_disk, page.disk_slots, page.disk_data_start)
                     for page in (self._pages[n] for n in self._dirty)]
            writes = self._dirty_regions()
            if not self._ckpt_freed:
                for number in self._ckpt_pages:
                    self._alloc.free(number)
                self._ckpt_freed = True
            self._alloc.begin_checkpoint()
            payload, pages = self._encode_checkpoint(generation)
            # names and refsets in the payload count as durable only once the checkpoint is
            snapshot_names, snapshot_refsets = set(self._names), set(self._refsets)
            log_bytes, self._log_bytes = self._log_bytes, 0
            if new_chain:
                self._logging = True          # later changes go to the new chain, after the snapshot
            meta = Meta(generation, seg.number, seg.salt, self._alloc.page_count, pages[0], len(pages),
                        len(payload), crc32c(payload))
        try:
            with self._lock:
                self._pf.reserve(meta.page_count)
            if hook:
                hook("switched")
            self._sync_dir()
            for offset, data in writes:
                self._pf.write_at(offset, data)
            self._pf.write_checkpoint(pages, generation, payload)
            self._pf.sync()
            if hook:
                hook("before-meta")
            self._pf.write_meta(meta)
            self._pf.sync()
            if hook:
                hook("after-meta")
        except BaseException as exc:
            with self._lock:
                self._alloc.end_checkpoint(durable=False)
                for number in pages:
                    self._alloc.free(number)
                for page, on_disk, disk_slots, disk_data_start in marks:
                    if self._pages.get(page.number) is page:     # not freed meanwhile
                        page.on_disk, page.disk_slots, page.disk_data_start = on_disk, disk_slots, disk_data_start
                        self._dirty.add(page.number)
                self._log_bytes += log_bytes
                self._errors += 1
                self._checkpoint_error = _describe(exc)
                if new_chain:
                    self._logging = False
                    seg.discard()
            if not isinstance(exc, Exception):
                raise
            raise StorageError(f"file device {self.name!r}: checkpoint failed: {_describe(exc)}",
                               device=self.name) from exc
        with self._lock:
            self._alloc.end_checkpoint(durable=True)
            self._durable_names |= snapshot_names
            self._durable_refsets |= snapshot_refsets
            self._generation = generation
            self._ckpt_pages = pages
            self._ckpt_freed = False
            self._checkpoints += 1
            self._checkpoint_error = ""
            try:
                end = self._alloc.trim()
                if self._pf.size() > end * ps:
                    self._pf.truncate(end)
            except OSError as exc:
                self._errors += 1      # a longer file than needed: the next checkpoint trims again
                log.warning("file device %r could not trim its page file: %s", self.name, _describe(exc))
            stale, self._old_segments = self._old_segments, []
            for page in self._pages.values():   # checkpointed pages need not stay in memory
                if page.kind == PERSISTENT and page.number not in self._dirty \
                        and self._tail[PERSISTENT] is not page:
                    page.buf = None
        for old_seg in stale:
            old_seg.close()
            try:
                os.unlink(old_seg.path)
            except FileNotFoundError:
                pass
        for number in list_segments(self.directory):
            if number < meta.wal_segment:
                try:
                    os.unlink(segment_path(self.directory, number))
                except FileNotFoundError:
                    pass

    def _new_segment(self, prev_salt: int, prev_checksum: int) -> Segment:
        """Open the next log segment with its header on disk; nothing changes if that fails."""
        seg = Segment(self.directory, self._next_segment, self.page_size, self._pf.file_id,
                      new_salt(prev_salt), prev_checksum, fsync=self._fsync, io=self.io)
        try:
            seg.flush()
        except OSError:
            seg.close()
            try:
                os.unlink(seg.path)
            except OSError:
                pass
            raise
        self._next_segment += 1
        self._wal = seg
        return seg

    def _sync_dir(self) -> None:
        if not self._fsync:
            return
        io = self.io
        fd = io.open(self.directory, os.O_RDONLY)
        try:
            io.fsync(fd)
        finally:
            io.close(fd)

    def _dirty_regions(self) -> list[tuple[int, bytes]]:
        """Copies of every persistent byte range the page file lacks; marks them written."""
        ps = self.page_size
        writes = []
        for number in self._dirty:
            page = self._pages[number]
            base = number * ps
            buf = page.buf
            if page.cont:
                writes.append((base, bytes(buf)))
                page.on_disk = True
                continue
            if not page.on_disk:
                self._write_page_header(page)
                writes.append((base, bytes(buf[:_HDR])))
                page.on_disk = True
            if page.slots > page.disk_slots:
                lo, hi = _HDR + _SLOT * page.disk_slots, _HDR + _SLOT * page.slots
                writes.append((base + lo, bytes(buf[lo:hi])))
                page.disk_slots = page.slots
            if page.data_start < page.disk_data_start:
                writes.append((base + page.data_start, bytes(buf[page.data_start:page.disk_data_start])))
                page.disk_data_start = page.data_start
        self._dirty.clear()
        return writes

    def _encode_checkpoint(self, generation: int) -> tuple[bytes, list[int]]:
        state = ckpt.CheckpointState()
        for page in self._pages.values():
            if page.kind == PERSISTENT and not page.cont:
                state.pages.append((page.number, page.slots, page.data_start,
                                    bytes(page.live[:(page.slots + 7) // 8])))
        state.names = dict(self._names)
        ids = self._name_ids
        state.refsets = {rid: tuple(ids[q] for q in refs) for rid, refs in self._refsets.items()}
        index = self._index
        state.refs = {key: tuple(ids[q] for q in index[key].refs) for key in self._changed_refs}
        state.catalog = dict(self._catalog)
        state.deliveries = {(key, ids[queue]): count for key, counts in self._deliveries.items()
                            for queue, count in counts.items()}
        tail = self._tail[PERSISTENT]
        state.tail = tail.number if tail is not None else 0
        state.next_name, state.next_refset = self._next_name, self._next_refset
        body = ckpt.encode_body(state)
        cap = self._pf.checkpoint_capacity()
        pages: list[int] = []
        while True:
            size = len(body) + fmt.SECTION.size + self._alloc.page_count
            if len(pages) * cap >= size:
                break
            pages.append(self._alloc.allocate(SYSTEM))
        payload = ckpt.encode(self._alloc.table(), body)
        assert len(payload) <= len(pages) * cap
        return payload, pages

    # =====================================================================================================
    # recovery
    # =====================================================================================================
    def _recover_from_disk(self, path: str) -> None:
        # rebuilding the index creates a million objects and no cycles: the cyclic GC only slows it
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._recover_from_disk_inner(path)
        finally:
            if collecting:
                gc.enable()

    def _recover_from_disk_inner(self, path: str) -> None:
        t0 = time.perf_counter()
        self._pf = PageFile(path, self.page_size, fsync=self._fsync, read_only=self.read_only, io=self.io)
        self._pf.open()
        self.page_size = ps = self._pf.page_size
        meta = self._pf.read_meta()
        if meta is None:
            if self._pf.never_checkpointed() and not self.read_only:
                # created, then killed before its first checkpoint: nothing was ever acknowledged
                self._pf.close()
                os.unlink(path)
                for number in list_segments(self.directory):
                    os.unlink(segment_path(self.directory, number))
                self._create(path)
                return
            raise StorageError(f"{path}: no valid meta page", path=path)
        payload, self._ckpt_pages = self._pf.read_checkpoint(meta)
        state = ckpt.decode(payload)
        self._generation = meta.generation
        self._alloc = PageAllocator.from_table(state.table, fmt.RESERVED_PAGES)
        self._names = dict(state.names)
        self._name_ids = {name: nid for nid, name in self._names.items()}
        self._next_name, self._next_refset = state.next_name, state.next_refset
        names = self._names
        self._refsets = {rid: tuple(names[i] for i in ids) for rid, ids in state.refsets.items()}
        self._refset_ids = {refs: rid for rid, refs in self._refsets.items()}
        self._durable_names, self._durable_refsets = set(self._names), set(self._refsets)
        self._catalog = dict(state.catalog)
        for (key, name_id), count in state.deliveries.items():
            self._deliveries.setdefault(key, {})[names[name_id]] = count
        changed = {key: tuple(names[i] for i in ids) for key, ids in state.refs.items()}
        t1 = time.perf_counter()
        self._load_directories(state, changed)
        t2 = time.perf_counter()
        self._tail[PERSISTENT] = self._pages.get(state.tail)
        frames = self._replay(meta)
        t3 = time.perf_counter()
        self._sweep_unreferenced()
        self._last_recovery = {"checkpoint_s": t1 - t0, "directories_s": t2 - t1, "replay_s": t3 - t2,
                               "frames_replayed": frames, "pages_read": len(state.pages)}
        existing = list_segments(self.directory)
        self._next_segment = max([meta.wal_segment, *existing]) + 1
        if not self.read_only:
            try:
                self._new_segment(0, 0)
                self._sync_dir()
                self._checkpoint_locked()   # the log restarts clean; freed non-persistent pages are durable
            except (OSError, StorageError) as exc:
                # a full (or failing) disk: what was recovered is served, nothing new is taken until a
                # repair's checkpoint succeeds (the store retries it)
                self._fail(exc, "writing after recovery")
                log.warning("file device %r recovered %d messages READ-ONLY: %s; it serves them and refuses "
                            "new messages until the disk can be written again", self.name, len(self._index),
                            self._fault)
        self._last_recovery["total_s"] = time.perf_counter() - t0
        del ps

    def _load_directories(self, state: ckpt.CheckpointState, changed: dict[int, tuple]) -> None:
        """Rebuild the index from each persistent page's header and live slots (no message bytes)."""
        ps = self.page_size
        refsets = self._refsets
        read_at = self._pf.read_at
        slot_struct = fmt.SLOT
        body_size = fmt.SLOT_BODY.size
        for number, slots, data_start, bitmap in state.pages:
            raw = read_at(number * ps, _HDR + _SLOT * slots)
            head = fmt.check_sealed(raw, fmt.PAGE_HEADER.size)
            if head is None:
                raise StorageError(f"page {number}: header is corrupt", page=number)
            magic, kind, page_no, generation = fmt.PAGE_HEADER.unpack(head)
            if magic != fmt.PAGE_MAGIC or kind != PERSISTENT or page_no != number:
                raise StorageError(f"page {number}: not the persistent page the checkpoint names", page=number)
            page = _Page(number, PERSISTENT, ps, generation)
            page.slots = page.disk_slots = slots
            page.data_start = page.disk_data_start = data_start
            page.live = bytearray(bitmap)
            page.on_disk = True
            self._pages[number] = page
            live = 0
            for slot in range(slots):
                if not bitmap[slot >> 3] & (1 << (slot & 7)):
                    continue
                at = _HDR + _SLOT * slot
                fields = slot_struct.unpack_from(raw, at)
                if fields[9] != crc32c(raw[at:at + body_size]):
                    raise StorageError(f"page {number} slot {slot}: directory entry is corrupt",
                                       page=number, slot=slot)
                key, seq, refset_id, flags = fields[0], fields[1], fields[6], fields[7]
                refs = changed.get(key) or refsets[refset_id]
                self._add_entry(key, _Entry(seq, number, slot, refs, refset_id, True))
                if key in changed:
                    self._changed_refs.add(key)
                self._bytes_used += fields[4]
                if flags & fmt.FLAG_LARGE:
                    for cont in self._continuation_pages(page, fields):
                        cpage = _Page(cont, PERSISTENT, ps, generation, cont=True)
                        cpage.on_disk = True
                        self._pages[cont] = cpage
                live += 1
            page.live_count = live

    def _replay(self, meta: Meta) -> int:
        """Apply the log's committed prefix; returns the number of frames applied."""
        unit: list = []
        applied = 0
        for frame in read_frames(self.directory, meta.wal_segment, meta.wal_salt, self.page_size,
                                 self._pf.file_id):
            unit.append(frame)
            if frame.commit:
                for item in unit:
                    self._apply(item.ftype, item.payload)
                applied += len(unit)
                unit = []
        return applied

    def _apply(self, ftype: int, payload: bytes) -> None:
        if ftype == fmt.F_PUT:
            self._apply_put(payload)
        elif ftype == fmt.F_REMOVE or ftype == fmt.F_ADDREF:
            key, qid = fmt.KEY_NAME.unpack(payload)
            entry = self._index.get(key)
            queue = self._names.get(qid)
            if entry is None or queue is None:
                raise StorageError(f"log names message {key} or name {qid} that recovery does not hold")
            if ftype == fmt.F_REMOVE:
                refs = list(entry.refs)
                refs.remove(queue)
                self._drop_reference(key, entry, tuple(refs), queue)
            else:
                self._add_reference(key, entry, queue)
        elif ftype == fmt.F_NAME:
            name_id = fmt.U32.unpack_from(payload, 0)[0]
            name = payload[4:].decode()
            self._names[name_id] = name
            self._name_ids[name] = name_id
            self._durable_names.add(name_id)
            self._next_name = max(self._next_name, name_id + 1)
        elif ftype == fmt.F_REFSET:
            refset_id, ids = fmt.decode_refset(payload)
            refs = tuple(self._names[i] for i in ids)
            self._refsets[refset_id] = refs
            self._refset_ids[refs] = refset_id
            self._durable_refsets.add(refset_id)
            self._next_refset = max(self._next_refset, refset_id + 1)
        elif ftype == fmt.F_DELIVERED:
            for key, qid, count in fmt.DELIVERED.iter_unpack(payload):
                entry = self._index.get(key)
                queue = self._names.get(qid)
                if entry is not None and queue is not None and queue in entry.refs:
                    self._deliveries.setdefault(key, {})[queue] = count
        elif ftype == fmt.F_META:
            key, value = fmt.decode_meta_record(payload)
            if value is None:
                self._catalog.pop(key, None)
            else:
                self._catalog[key] = value
        else:
            raise StorageError(f"log frame of unknown type {ftype}")

    def _apply_put(self, payload: bytes) -> None:
        number, slot, fields, cont, data = fmt.decode_put(payload)
        key, seq, offset, rlen, length, dest_id, refset_id, flags, data_crc = fields
        if crc32c(data) != data_crc or len(data) != length:
            raise StorageError(f"log record of message {key} does not match its checksum")
        page = self._pages.get(number)
        if page is None:
            page = self._claim_page(number, PERSISTENT)
        else:
            self._resident(page)
            self._dirty.add(number)
        tail = self._tail[PERSISTENT]
        if tail is not page:
            self._tail[PERSISTENT] = page
            if tail is not None:
                self._seal(tail)
        cont_pages = []
        for i, cnum in enumerate(cont):
            cpage = self._claim_page(cnum, PERSISTENT, cont=True)
            chunk = data[i * self.page_size:(i + 1) * self.page_size]
            cpage.buf[:len(chunk)] = chunk
            cont_pages.append(cpage)
        record = struct.pack(f"<{len(cont)}I", *cont) if flags & fmt.FLAG_LARGE else data
        if slot != page.slots or offset != page.data_start - len(record) or rlen != len(record):
            raise StorageError(f"log places message {key} at page {number} slot {slot}, "
                               f"which does not follow the page's state")
        self._put_record(page, key, seq, record, length, dest_id, refset_id, flags, data_crc)
        self._add_entry(key, _Entry(seq, number, slot, self._refsets[refset_id], refset_id, True))
        self._bytes_used += length

    def _sweep_unreferenced(self) -> None:
        """Persistent pages that nothing references (a crash between freeing steps) become free."""
        referenced = set(self._pages) | set(self._ckpt_pages)
        for number in self._alloc.pages_of(PERSISTENT):
            if number not in referenced:
                self._alloc.free(number)
        for page in list(self._pages.values()):
            if not page.cont and page.live_count == 0 and self._tail[PERSISTENT] is not page:
                self._free_page(page)

    def recover(self) -> Iterator[tuple[StoredMessage, list[str]]]:
        with self._lock:
            self._check_open()
            order = sorted((entry.seq, key) for key, entry in self._index.items() if entry.persistent)
        # (seq, key) order visits a page's messages close together: read each page whole, once or so
        images: dict[int, bytes] = {}
        for _seq, key in order:
            with self._lock:
                entry = self._index.get(key)
                if entry is None:
                    continue
                page = self._pages[entry.page]
                if page.buf is None:
                    image = images.get(page.number)
                    if image is None:
                        if len(images) >= 64:
                            images.pop(next(iter(images)))
                        image = images[page.number] = self._pf.read_at(page.number * self.page_size,
                                                                       self.page_size)
                    message = self._read_image(key, entry, page, image)
                else:
                    message = self._read_locked(key)
                refs = list(entry.refs)
            yield message, refs

    def _read_image(self, key: int, entry: _Entry, page: _Page, image: bytes) -> StoredMessage:
        at = _HDR + _SLOT * entry.slot
        fields = fmt.SLOT.unpack_from(image, at)
        if fields[9] != crc32c(image[at:at + fmt.SLOT_BODY.size]) or fields[7] & fmt.FLAG_LARGE:
            return self._read_locked(key)          # the slow path reports damage / joins pages
        data = image[fields[2]:fields[2] + fields[3]]
        if crc32c(data) != fields[8]:
            return self._read_locked(key)
        return StoredMessage(key, self._names[fields[5]], entry.seq, True, data)

    # =====================================================================================================
    # status
    # =====================================================================================================
    def status(self) -> DeviceStatus:
        """Figures for the storage monitor.  ``bytes_free`` is what a message may still use: free pages
        inside the file plus what the disk still has (and, with ``max_bytes``, never more than the
        bound leaves); the monitor makes the device unavailable for messages larger than that."""
        disk = self.io.free_space(self.directory) if self._open else None
        with self._lock:
            alloc = self._alloc
            ps = self.page_size
            file_bytes = alloc.page_count * ps
            in_file = alloc.free_count * ps
            tail = self._tail.get(PERSISTENT)
            if tail is not None and tail.buf is not None:
                in_file += max(0, tail.room())
            free = None
            if disk is not None:
                reserved = self._pf.reserved if self._pf is not None else None
                if reserved is not None:
                    disk += max(0, reserved - file_bytes)     # held for the file already
                free = in_file + disk
            if self.max_bytes is not None:
                bounded = max(0, self.max_bytes - (alloc.page_count - alloc.free_count) * ps)
                free = bounded if free is None else min(free, bounded)
            seg = self._wal
            extra = {
                "page_size": ps, "pages": alloc.page_count, "file_bytes": file_bytes,
                "pages_persistent": alloc.count(PERSISTENT),
                "pages_non_persistent": alloc.count(NON_PERSISTENT),
                "pages_free": alloc.free_count, "pages_system": alloc.count(SYSTEM),
                "log_bytes": self._log_bytes, "log_segment": seg.number if seg else 0,
                "generation": self._generation, "checkpoints": self._checkpoints,
                "syncs": self._syncs, "recovery": dict(self._last_recovery),
                "disk_free": disk, "refusals": self._refusals,
            }
            if self._fault is not None:
                extra["fault"] = self._fault
            if self._checkpoint_error:
                extra["checkpoint_error"] = self._checkpoint_error
            return DeviceStatus(
                name=self.name, kind=self.kind, messages=self._messages, bytes_used=self._bytes_used,
                bytes_free=free, capacity=self.max_bytes, errors=self._errors,
                write_latency_s=self._latency, online=self._open and self._fault is None,
                extra=extra)
