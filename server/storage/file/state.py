"""The open store: everything an open file store is, in one explicit object (LMDB's environment struct).

:class:`OpenStore` exists from ``FileDevice.open`` to ``close``; the device's parts — the write path
(``writing.py``), the checkpointer (``checkpointing.py``) and recovery (``recovery.py``) — are objects that
receive it and act on it, over its four members with a job of their own:

* ``pages``  (``pages.py``)   the page objects, the page allocator, the tails, what the page file lacks;
* ``index``  (``index.py``)   which messages are held, where, and which queues still owe each one;
* ``names``  (``names.py``)   interned destination/queue names and reference sets;
* ``log``    (``walwriter.py``) the write-ahead log's segments and what was logged since the checkpoint.

Besides them it holds the files (the page file, the lock), the catalog, the checkpoint generation, the
figures the status reports, and the **status** (``status.py``: open or fault; a closed device has no open
store).  Every write to the disk goes through one gate (``fileio.WriteGate``, ``io`` here).

Threading: ``lock`` guards the in-memory state (the broker thread and one worker thread touch it, each
briefly); ``sync_lock`` serialises syncs and checkpoints so a log segment is never closed under an fsync.
The members' methods expect the caller to hold ``lock``.
"""
from __future__ import annotations

import errno
import logging
import os
import threading

from pymq.errors import StorageError

from . import format as fmt
from .fileio import FileIO, WriteGate, is_no_space
from .headroom import Headroom
from .index import HOT_LIMIT, MessageIndex
from .names import Names
from .pagefile import PageFile
from .pages import PageStore
from .status import StoreStatus, move
from .walwriter import LogWriter

log = logging.getLogger("pymq.storage")


def describe(exc: BaseException) -> str:
    """An OS error as an operator reads it: ``No space left on device (ENOSPC)``."""
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        return f"{exc.strerror or os.strerror(exc.errno)} ({name})"
    if isinstance(exc, StorageError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"


class Figures:
    """What the store counts for its status (the storage monitor and the admin read them)."""

    __slots__ = ("errors", "refusals", "checkpoint_error", "latency", "syncs", "checkpoints", "recovery")

    def __init__(self) -> None:
        self.errors = 0
        self.refusals = 0
        self.checkpoint_error = ""
        self.latency = 0.0                  # moving average of a log fsync, seconds
        self.syncs = 0
        self.checkpoints = 0
        self.recovery: dict[str, float | int] = {}


class OpenStore:
    """The state of one open file store (see the module docstring)."""

    def __init__(self, name: str, directory: str, page_size: int, *, io: FileIO, fsync: bool,
                 read_only: bool, max_bytes: int | None, headroom_bytes: int | None = 0,
                 index_hot: int = HOT_LIMIT) -> None:
        self.name = name
        self.directory = directory
        self.page_size = page_size
        self.fsync = fsync
        self.read_only = read_only
        self.max_bytes = max_bytes
        self.io = WriteGate(io)
        self.lock = threading.Lock()
        self.sync_lock = threading.Lock()
        self.status = StoreStatus.CLOSED
        #: why the store is in fault (None while open and in service)
        self.fault: str | None = None
        self.figures = Figures()
        self.pf: PageFile | None = None
        self.lock_fd = -1
        self.catalog: dict[str, bytes] = {}
        self.generation = 0
        self.headroom = Headroom(self, headroom_bytes)
        #: a write was refused (or failed) for lack of space since the last checkpoint: the disk is short
        self.space_refused = False
        self.log = LogWriter(self)
        self.pages = PageStore(self)
        self.names = Names(self)
        self.index = MessageIndex(self, index_hot)

    # -- files ------------------------------------------------------------------------------------------
    @property
    def page_file(self) -> PageFile:
        pf = self.pf
        if pf is None:
            raise StorageError(f"file device {self.name!r} is not open", device=self.name)
        return pf

    def sync_dir(self) -> None:
        """fsync the directory (a new or removed file's entry)."""
        if not self.fsync:
            return
        io = self.io
        fd = io.open(self.directory, os.O_RDONLY)
        try:
            io.fsync(fd)
        finally:
            io.close(fd)

    def release_files(self) -> None:
        self.log.close()
        if self.pf is not None:
            self.pf.close()
            self.pf = None
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1

    # -- status -----------------------------------------------------------------------------------------
    def move(self, wanted: StoreStatus) -> None:
        self.status = move(self.status, wanted)

    def check_open(self) -> None:
        if self.status is StoreStatus.CLOSED:
            raise StorageError(f"file device {self.name!r} is not open", device=self.name)

    def check_writable(self) -> None:
        """Changes to what the store holds (removals, references, catalog) are allowed in fault too."""
        self.check_open()
        if self.read_only:
            raise StorageError(f"file device {self.name!r} is open read-only", device=self.name)

    def check_accepting(self) -> None:
        """New messages: refused in fault (a refusal counts as a device error)."""
        self.check_writable()
        if self.fault is not None:
            self.refused()
            raise StorageError(f"file device {self.name!r} refuses new messages: {self.fault}; it is "
                               f"retried and takes messages again once it recovers", device=self.name)

    def refused(self) -> None:
        self.figures.errors += 1
        self.figures.refusals += 1

    def fail(self, exc: BaseException, during: str = "writing") -> StorageError:
        """A write or fsync failed: enter fault (spec/storage.md §8) and say why.  Logging stops (the log's
        tail can no longer be trusted until a repair's checkpoint starts a new chain)."""
        self.figures.errors += 1
        if is_no_space(exc):
            self.space_refused = True
        reason = f"{during} failed: {describe(exc)}"
        if self.fault is None:
            log.error("file device %r in fault, refusing new messages until it recovers: %s", self.name, reason)
        if self.status is StoreStatus.OPEN:
            self.move(StoreStatus.FAULT)
        self.fault = reason
        self.log.stop()
        return StorageError(f"file device {self.name!r}: {reason}", device=self.name)

    def repaired(self) -> str | None:
        """A repair's checkpoint is durable: back in service; returns why the store was in fault."""
        reason, self.fault = self.fault, None
        if self.status is StoreStatus.FAULT:
            self.move(StoreStatus.OPEN)
        return reason

    # -- sizes ------------------------------------------------------------------------------------------
    def inline_max(self) -> int:
        """The largest record a slotted page takes inline; larger messages may go to continuation pages."""
        return (self.page_size - fmt.PAGE_HEADER_SIZE - fmt.SLOT_SIZE) >> 2

    def continuation_count(self, length: int) -> int:
        return -(-length // self.page_size)
