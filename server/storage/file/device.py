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

How it is put together: ``open`` makes an :class:`~.state.OpenStore` (the explicit state of the open
store, with its status: open or fault; closed is no open store) and three parts that act on it — the write
path (``writing.py``), the checkpointer (``checkpointing.py``: sync, checkpoints, repair) and recovery
(``recovery.py``); this class is the holding-device interface over them: lifecycle, reads and status.  The
bytes are ``format.py``'s; every write to the disk passes the open store's one gate (``fileio.WriteGate``).

Threading (see ``..device``): the broker thread calls everything but ``sync``/``checkpoint``, which
may run in one worker thread; the open store's ``lock`` and ``sync_lock`` say how they share it.
"""
from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

from pymq.errors import StorageError

from ..device import Allocation, DeviceStatus, HoldingDevice, StoredMessage
from ..page_alloc import NON_PERSISTENT, PERSISTENT, SYSTEM
from . import format as fmt
from .checkpointing import Checkpointer
from ..ha.fence import NO_FENCE, Fence
from .fileio import OS_IO, FileIO
from .index import HOT_LIMIT
from .recovery import Recovery
from .state import OpenStore
from .status import StoreStatus
from .writing import WritePath

log = logging.getLogger("pymq.storage")

DEFAULT_PAGE_SIZE = 64 * 1024
DEFAULT_CHECKPOINT_BYTES = 32 * 1024 * 1024


class Location(NamedTuple):
    """Where a held message is (inspection and tests)."""

    page: int
    slot: int
    persistent: bool


class FileDevice(HoldingDevice):
    """Paged file store with a write-ahead log; the broker's embedded default device."""

    kind = "file"
    #: the holding store may keep a persistent message back a moment before writing it here
    #: (spec/storage.md §9): each write costs a log frame and a slot the message's quick release saves
    writes_behind = True
    #: keeps non-persistent messages in pages of their own, never logged: the place queues page out to
    pages_out = True

    def __init__(self, name: str, directory: str | os.PathLike, page_size: int = DEFAULT_PAGE_SIZE, *,
                 checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES, max_bytes: int | None = None,
                 fsync: bool = True, read_only: bool = False, checkpoint_in_sync: bool = True,
                 io: FileIO | None = None, headroom_bytes: int | None = None, index_hot: int = HOT_LIMIT,
                 fence: Fence = NO_FENCE) -> None:
        """``fsync=False`` skips every fsync (tests, throwaway stores); ``read_only`` opens without
        changing a byte (inspection); ``max_bytes`` bounds the page file (``allocate`` raises when full);
        ``headroom_bytes`` is the disk space held back so a checkpoint can always run (``headroom.py``;
        None: four pages and 64 KiB, 0: none); ``index_hot`` how many of the newest messages the index keeps
        as objects (the rest cost 32 bytes each; ``index.py``);
        ``checkpoint_in_sync=False`` leaves due checkpoints to the caller (``checkpoint_due`` /
        ``checkpoint()``, as the commit driver does) so a sync never waits for one; ``io`` replaces the
        system calls (tests inject faults with it); ``fence`` is high availability's (spec/ha.md §2: every
        write passes it, every sync re-reads the epoch).  An existing store keeps the page size it was
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
        self.headroom_bytes = headroom_bytes
        self.index_hot = index_hot
        self.io: FileIO = io or OS_IO
        self.fence = fence
        self._hook: Callable[[str], None] | None = None
        self._store: OpenStore | None = None
        self._writes: WritePath | None = None
        self._checkpointer: Checkpointer | None = None
        self._recovery: Recovery | None = None

    @property
    def checkpoint_hook(self) -> Callable[[str], None] | None:
        """Test hook, called with a phase name inside checkpoints ("switched", "before-meta", "after-meta")."""
        return self._hook

    @checkpoint_hook.setter
    def checkpoint_hook(self, hook: Callable[[str], None] | None) -> None:
        self._hook = hook
        if self._checkpointer is not None:
            self._checkpointer.hook = hook

    # -- lifecycle ----------------------------------------------------------------------------------------
    @property
    def store_status(self) -> StoreStatus:
        """Closed, open or fault (``status.py``)."""
        store = self._store
        return StoreStatus.CLOSED if store is None else store.status

    @property
    def store(self) -> OpenStore:
        """The open store (StorageError when closed): its state, for inspection and tests."""
        store = self._store
        if store is None:
            raise StorageError(f"file device {self.name!r} is not open", device=self.name)
        return store

    def open(self) -> None:
        if self._store is not None:
            raise StorageError(f"file device {self.name!r} is already open")
        started = time.perf_counter()
        os.makedirs(self.directory, exist_ok=True)
        store = OpenStore(self.name, self.directory, self.page_size, io=self.io, fsync=self._fsync,
                          read_only=self.read_only, max_bytes=self.max_bytes, headroom_bytes=self.headroom_bytes,
                          index_hot=self.index_hot)
        store.io.fence = self.fence
        store.lock_fd = os.open(os.path.join(self.directory, "LOCK"),
                                os.O_RDONLY | os.O_CREAT if self.read_only else os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(store.lock_fd, (fcntl.LOCK_SH if self.read_only else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            if not self.fence.active:
                os.close(store.lock_fd)
                raise StorageError(f"store {self.directory} is in use by another process",
                                   path=self.directory) from exc
            # high availability: this process took the store by lease from a live that is stopped, not gone,
            # and still holds this lock; the epoch fences it (spec/ha.md §2), the lock would only keep us out
            log.warning("file device %r: the former live still holds %s; its writes are fenced by the epoch",
                        self.name, os.path.join(self.directory, "LOCK"))
        writes = WritePath(store)
        checkpointer = Checkpointer(store, writes, self.checkpoint_bytes, self.checkpoint_in_sync, self._hook)
        recovery = Recovery(store, checkpointer)
        path = os.path.join(self.directory, "pages")
        try:
            if not os.path.exists(path):
                if self.read_only:
                    raise StorageError(f"no store in {self.directory}", path=self.directory)
                recovery.create(path)
            else:
                recovery.open_existing(path)
        except BaseException:
            store.release_files()
            raise
        self.page_size = store.page_size          # an existing store keeps its own
        self._store, self._writes, self._checkpointer, self._recovery = store, writes, checkpointer, recovery
        # while open, the calls made once or more per message go straight to the part that does them (the
        # methods below answer "not open" once these are gone)
        self.check_room = writes.check_room           # type: ignore[method-assign]
        self.remove = writes.remove                   # type: ignore[method-assign]
        self.record_delivery = writes.record_delivery  # type: ignore[method-assign]
        self.deliveries = writes.deliveries            # type: ignore[method-assign]
        store.figures.recovery["open_s"] = time.perf_counter() - started

    def close(self) -> None:
        """Checkpoint and release the files.  A device in fault tries one repair (its removals since
        the fault are otherwise lost, so those messages would come back after the restart); if that
        fails too the files are released anyway and StorageError says what was not saved."""
        store = self._store
        if store is None:
            return
        try:
            if self.read_only:
                return
            if store.fault is not None:
                if not self._parts()[1].repair():
                    raise StorageError(f"file device {self.name!r} closed in fault ({store.fault}): changes "
                                       f"since the fault were not saved; everything acknowledged was",
                                       device=self.name)
                return
            self.flush()
            self._parts()[1].checkpoint()
        finally:
            self._drop()

    def _drop(self) -> None:
        store = self._store
        if store is not None:
            store.release_files()
            store.move(StoreStatus.CLOSED)
            store.io.closed_for = "the store is closed"
        self._store = self._writes = self._checkpointer = self._recovery = None
        for name in ("check_room", "remove", "record_delivery", "deliveries"):
            self.__dict__.pop(name, None)

    def abandon(self) -> None:
        """Release the files, writing nothing (the gate is closed first: a write in flight in a worker
        thread is refused)."""
        store = self._store
        if store is not None:
            store.io.closed_for = "abandoned: another process holds the store"
        self._drop()

    def _simulate_crash(self) -> None:
        """Drop every unflushed byte and release the files, as ``kill -9`` would (tests only)."""
        self._drop()

    def begin_unit(self) -> None:
        store = self._store
        if store is not None:
            with store.lock:
                store.log.begin_unit()

    def end_unit(self) -> None:
        store = self._store
        if store is not None:
            with store.lock:
                store.log.end_unit()

    def set_io(self, io: FileIO) -> None:
        """Route every later system call through ``io`` (tests: inject faults into an open device)."""
        self.io = io
        store = self._store
        if store is not None:
            with store.lock:
                store.io.inner = io

    def _parts(self) -> tuple[WritePath, Checkpointer, Recovery]:
        writes, checkpointer, recovery = self._writes, self._checkpointer, self._recovery
        if writes is None or checkpointer is None or recovery is None:
            raise StorageError(f"file device {self.name!r} is not open", device=self.name)
        return writes, checkpointer, recovery

    # -- faults -------------------------------------------------------------------------------------------
    @property
    def fault(self) -> str | None:
        """Why the device refuses new messages (None: in service)."""
        store = self._store
        return None if store is None else store.fault

    @property
    def needs_repair(self) -> bool:
        store = self._store
        return store is not None and store.fault is not None and not self.read_only

    def repair(self) -> bool:
        checkpointer = self._checkpointer
        return checkpointer.repair() if checkpointer is not None else False

    # -- the write path -------------------------------------------------------------------------------------
    def allocate(self, size: int, persistent: bool) -> Allocation:
        return self._parts()[0].allocate(self.name, size, persistent)

    def check_room(self, size: int) -> None:
        writes = self._writes
        if writes is None:
            raise StorageError(f"file device {self.name!r} is not open", device=self.name)
        writes.check_room(size)

    def write(self, message: StoredMessage, queues: Sequence[str], allocation: Allocation | None = None) -> None:
        writes = self._writes
        if writes is None:
            raise StorageError(f"file device {self.name!r} is not open", device=self.name)
        writes.write(message, queues)

    def write_parts(self, message: StoredMessage, parts: tuple[bytes, ...], queues: Sequence[str]) -> None:
        self._parts()[0].write(message, queues, parts)

    def remove(self, key: int, queue: str) -> None:
        writes = self._writes
        if writes is None:
            raise StorageError(f"file device {self.name!r} is not open", device=self.name)
        writes.remove(key, queue)

    def add_reference(self, key: int, queue: str) -> None:
        self._parts()[0].add_reference(key, queue)

    def record_delivery(self, key: int, queue: str, count: int) -> None:
        writes = self._writes
        if writes is not None:
            writes.record_delivery(key, queue, count)

    def deliveries(self, key: int) -> dict[str, int]:
        return self._parts()[0].deliveries(key)

    def put_meta(self, key: str, value: bytes | None) -> None:
        self._parts()[0].put_meta(key, value)

    def iter_meta(self) -> Iterable[tuple[str, bytes]]:
        return self._parts()[0].iter_meta()

    def flush(self) -> None:
        writes, checkpointer, _ = self._parts()
        writes.flush()
        if checkpointer.overdue:
            # nobody syncs (policy "never"): bound the log here rather than let it grow forever
            checkpointer.checkpoint_if_overdue()

    # -- durability -----------------------------------------------------------------------------------------
    def sync(self) -> None:
        self._parts()[1].sync()

    def checkpoint(self) -> None:
        self._parts()[1].checkpoint()

    @property
    def checkpoint_due(self) -> bool:
        checkpointer = self._checkpointer
        return checkpointer is not None and checkpointer.due

    # -- reads ----------------------------------------------------------------------------------------------
    def read(self, key: int) -> StoredMessage:
        store = self._store
        if store is None:
            raise StorageError(f"file device {self.name!r} is not open", device=self.name)
        with store.lock:
            try:
                return store.index.read(key)         # KeyError if not held: one look-up
            except OSError as exc:
                store.figures.errors += 1
                raise StorageError(f"file device {self.name!r}: {exc}", device=self.name) from exc

    def references(self, key: int) -> list[str]:
        """The queues that still owe message ``key`` (KeyError if not held)."""
        store = self.store
        with store.lock:
            held = store.index.owed(key)
            if held is None:
                raise KeyError(key)
            return list(held[1])

    def where(self, key: int) -> Location:
        """Where message ``key`` is held (KeyError if not held)."""
        store = self.store
        with store.lock:
            entry = store.index.get(key)
            if entry is None:
                raise KeyError(key)
            return Location(entry.page, entry.slot, entry.persistent)

    def holds(self, key: int) -> bool:
        store = self._store
        return store is not None and key in store.index

    def __contains__(self, key: int) -> bool:
        return self.holds(key)

    def iterate(self, queue: str) -> Iterator[StoredMessage]:
        """A queue's messages in time-sequence order, merging its persistent and non-persistent lists.

        Seed 002's removal order: (seq, key) ascending across both page kinds.  A message removed
        while the iterator runs is skipped.
        """
        store = self.store
        with store.lock:
            store.check_open()
            order = store.index.queue_order(queue)
        for _seq, key in order:
            with store.lock:
                held = store.index.owed(key)
                if held is None or queue not in held[1]:
                    continue
                message = store.index.read(key)
            yield message

    def queue_depth(self, queue: str) -> int:
        store = self._store
        return 0 if store is None else store.index.queue_depth(queue)

    def recover(self) -> Iterator[tuple[StoredMessage, list[str]]]:
        return self._parts()[2].recover()

    # -- status ---------------------------------------------------------------------------------------------
    def status(self) -> DeviceStatus:
        """Figures for the storage monitor.  ``bytes_free`` is what a message may still use: free pages
        inside the file plus what the disk still has (and, with ``max_bytes``, never more than the
        bound leaves); the monitor makes the device unavailable for messages larger than that."""
        store = self._store
        if store is None:
            return DeviceStatus(name=self.name, kind=self.kind, capacity=self.max_bytes, online=False,
                                extra={"status": StoreStatus.CLOSED.value})
        disk = store.io.free_space(self.directory)
        with store.lock:
            alloc = store.pages.alloc
            ps = store.page_size
            file_bytes = alloc.page_count * ps
            in_file = alloc.free_count * ps
            tail = store.pages.tail.get(PERSISTENT)
            if tail is not None and tail.buf is not None:
                in_file += max(0, tail.room())
            free = None
            if disk is not None:
                reserved = store.pf.reserved if store.pf is not None else None
                if reserved is not None:
                    disk += max(0, reserved - file_bytes)     # held for the file already
                free = in_file + disk
            if self.max_bytes is not None:
                bounded = max(0, self.max_bytes - (alloc.page_count - alloc.free_count) * ps)
                free = bounded if free is None else min(free, bounded)
            seg = store.log.segment
            figures = store.figures
            extra = {
                "status": store.status.value,
                "page_size": ps, "pages": alloc.page_count, "file_bytes": file_bytes,
                "pages_persistent": alloc.count(PERSISTENT),
                "pages_non_persistent": alloc.count(NON_PERSISTENT),
                "pages_free": alloc.free_count, "pages_system": alloc.count(SYSTEM),
                "log_bytes": store.log.since_checkpoint, "log_segment": seg.number if seg else 0,
                "generation": store.generation, "checkpoints": figures.checkpoints,
                "syncs": figures.syncs, "recovery": dict(figures.recovery),
                "disk_free": disk, "refusals": figures.refusals,
                "headroom": store.headroom.size if store.headroom.held else 0,
                "space_pressure": store.space_refused,
            }
            if store.fault is not None:
                extra["fault"] = store.fault
            if figures.checkpoint_error:
                extra["checkpoint_error"] = figures.checkpoint_error
            return DeviceStatus(
                name=self.name, kind=self.kind, messages=len(store.index), bytes_used=store.index.bytes_used,
                bytes_free=free, capacity=self.max_bytes, errors=figures.errors,
                write_latency_s=figures.latency, online=store.fault is None,
                extra=extra)
