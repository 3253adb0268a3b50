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

Where: this module opens, closes, reads and reports; the class is put together from the write path
(``writing.py``), durability (``checkpointing.py``: sync, checkpoints, repair) and recovery
(``recovery.py``), all over the shared in-memory state of ``state.py``.  The bytes are ``format.py``'s.

Threading (see ``..device``): the broker thread calls everything but ``sync``/``checkpoint``, which
may run in one worker thread.  ``_lock`` guards the in-memory state (held briefly by both threads);
``_sync_lock`` serialises syncs and checkpoints so a log segment is never closed under an fsync.
"""
from __future__ import annotations

import fcntl
import heapq
import os
import threading
import time
from collections.abc import Callable, Iterator

from pymq.errors import StorageError

from ..device import DeviceStatus, HoldingDevice, StoredMessage
from ..page_alloc import NON_PERSISTENT, PERSISTENT, SYSTEM, PageAllocator
from . import format as fmt
from .checkpointing import Checkpointing
from .fileio import OS_IO, FileIO
from .pagefile import PageFile
from .recovery import Recovery
from .writing import WritePath

DEFAULT_PAGE_SIZE = 64 * 1024
DEFAULT_CHECKPOINT_BYTES = 32 * 1024 * 1024


class FileDevice(Recovery, Checkpointing, WritePath, HoldingDevice):
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

    @property
    def fault(self) -> str | None:
        """Why the device refuses new messages (None: in service)."""
        return self._fault

    @property
    def needs_repair(self) -> bool:
        return self._open and self._fault is not None and not self.read_only

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
