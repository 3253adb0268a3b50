"""The lease of a file store on a shared directory (spec/ha.md §1.3–§1.7, §2.2–§2.3).

Four files in ``<data_dir>/ha/``, each locked with ``flock`` (which Linux's NFSv4 client, CephFS,
GPFS and local file systems honour across machines; NFSv3's and SMB's locks are not enough,
docs/operations.md):

* ``live.lock``       held exclusively by the process holding the store, for as long as it lives: the OS
                      drops it when the process ends, so a dead holder is known at once (1.5);
* ``candidate.lock``  held by the one backup that watches the lease (1.6);
* ``epoch.lock``      held *shared* around every write of the store that could corrupt a newer epoch's
                      (page file writes, log segment creation, file removal), and *exclusively* while a
                      new epoch is written (2.2);
* ``lease``           the record (``record.py``): read lock-free with a fresh ``open`` each time (NFS's
                      close-to-open consistency: an ``open`` revalidates the cache), written under an
                      exclusive ``flock`` of the file itself (an unlock flushes to the server).

Why four files rather than byte ranges of one: ``flock`` locks whole files and belongs to an open file
description, so closing some other descriptor of the file never drops it (POSIX ``fcntl`` locks are
dropped by any ``close`` of the file in the process), and Linux's NFS client maps it to a whole-file
lock the server arbitrates.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator

from . import record as rec
from .medium import LeaseMedium, log
from .record import LeaseRecord

#: how long the event loop's own confirmation waits for the lease file's lock before it gives up
CONFIRM_WAIT_S = 0.05


class FileLease(LeaseMedium):
    kind = "file"

    def __init__(self, directory: str, node: str) -> None:
        super().__init__(node)
        self.directory = directory
        self._fds: dict[str, int] = {}
        self._holds_live = False
        self._candidate = False
        self._renewing = threading.Lock()     # one renewal at a time (the renewal thread, the loop's confirm)
        # fenced write sections: one thread at a time holds the shared epoch lock through this process's one
        # descriptor (a second flock/unlock of the same open file would release another thread's)
        self._writing = threading.RLock()
        self._depth = 0

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def open(self) -> None:
        created = not os.path.isdir(self.directory)
        os.makedirs(self.directory, exist_ok=True)
        for name in ("live.lock", "candidate.lock", "epoch.lock", "lease"):
            if name not in self._fds:
                self._fds[name] = os.open(self._path(name), os.O_RDWR | os.O_CREAT, 0o644)
        if created:
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        """Every descriptor closed, ``live.lock``'s last (its lock goes with it: 1.9)."""
        live = self._fds.pop("live.lock", None)
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._candidate = False
        if live is not None:
            os.close(live)
        self._holds_live = False

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            raise OSError(f"the lease of {self.directory} is not open")
        return fd

    # -- reading --------------------------------------------------------------------------------------------
    def read(self) -> LeaseRecord | None:
        try:
            fd = os.open(self._path("lease"), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            image = os.pread(fd, rec.FILE_SIZE, 0)
        finally:
            os.close(fd)
        return rec.newest(image)[0]

    def _read_locked(self) -> tuple[LeaseRecord | None, int]:
        """The record and where the next write goes, through the lease file's own descriptor (its lock
        held by the caller)."""
        return rec.newest(os.pread(self._fd("lease"), rec.FILE_SIZE, 0))

    # -- locks ----------------------------------------------------------------------------------------------
    @staticmethod
    def _try(fd: int, mode: int) -> bool:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def try_candidate(self) -> bool:
        if not self._candidate:
            self._candidate = self._try(self._fd("candidate.lock"), fcntl.LOCK_EX)
        return self._candidate

    def release_candidate(self) -> None:
        if self._candidate:
            fcntl.flock(self._fd("candidate.lock"), fcntl.LOCK_UN)
            self._candidate = False

    def try_os_lock(self) -> bool:
        if not self._holds_live:
            self._holds_live = self._try(self._fd("live.lock"), fcntl.LOCK_EX)
        return self._holds_live

    def release_os_lock(self) -> None:
        if self._holds_live:
            fcntl.flock(self._fd("live.lock"), fcntl.LOCK_UN)
            self._holds_live = False

    @property
    def holds_os_lock(self) -> bool:
        return self._holds_live

    def os_lock_intact(self) -> bool:
        """A second descriptor's non-blocking lock must fail while this process's lock holds (Artemis's
        lock monitor does the same check its own way)."""
        if not self._holds_live:
            return False
        probe = os.open(self._path("live.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if self._try(probe, fcntl.LOCK_EX):
                fcntl.flock(probe, fcntl.LOCK_UN)
                log.error("the OS lock %s is no longer held by this process (a lost NFS lock?)",
                          self._path("live.lock"))
                self._holds_live = False
                return False
            return True
        finally:
            os.close(probe)

    # -- writing the record ---------------------------------------------------------------------------------
    def take(self, seen: LeaseRecord | None, wanted: LeaseRecord, holder_dead: bool) -> bool:
        epoch_fd, lease_fd = self._fd("epoch.lock"), self._fd("lease")
        # exclusive: every fenced write of the old epoch in flight finishes first, none starts after (2.2)
        fcntl.flock(epoch_fd, fcntl.LOCK_EX)
        try:
            fcntl.flock(lease_fd, fcntl.LOCK_EX)
            try:
                current, at = self._read_locked()
                same = (current is None and seen is None) or (
                    current is not None and seen is not None
                    and (current.epoch, current.seq) == (seen.epoch, seen.seq))
                if not same:
                    return False
                data = rec.encode(wanted)
                if os.pwrite(lease_fd, data, at) != len(data):
                    raise OSError(f"short write to {self._path('lease')}")
                os.fsync(lease_fd)          # the new epoch is durable before anything of the store is touched
                self.mine = wanted
                self.fenced_reason = None
                return True
            finally:
                fcntl.flock(lease_fd, fcntl.LOCK_UN)
        finally:
            fcntl.flock(epoch_fd, fcntl.LOCK_UN)

    def renew(self, os_locked: bool, wait: bool = True) -> LeaseRecord | None:
        if not self._renewing.acquire(timeout=-1 if wait else CONFIRM_WAIT_S):
            raise TimeoutError("a renewal is in progress")
        try:
            lease_fd = self._fd("lease")
            self._lock_lease(lease_fd, wait)
            try:
                current, at = self._read_locked()
                if not self.is_mine(current):
                    self.fenced(current)
                    return None
                assert current is not None
                new = current.renewed(os_locked)
                data = rec.encode(new)
                if os.pwrite(lease_fd, data, at) != len(data):
                    raise OSError(f"short write to {self._path('lease')}")
                self.mine = new
                return new
            finally:
                fcntl.flock(lease_fd, fcntl.LOCK_UN)
        finally:
            self._renewing.release()

    @classmethod
    def _lock_lease(cls, fd: int, wait: bool) -> None:
        if wait:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return
        deadline = time.monotonic() + CONFIRM_WAIT_S
        while not cls._try(fd, fcntl.LOCK_EX):
            if time.monotonic() > deadline:
                raise TimeoutError("the lease file is locked by another process")
            time.sleep(0.002)

    # -- the fence ------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        self.check()
        with self._writing:
            epoch_fd = self._fd("epoch.lock")
            self._depth += 1
            try:
                if self._depth == 1:
                    fcntl.flock(epoch_fd, fcntl.LOCK_SH)
                    current = self.read()
                    if not self.is_mine(current):
                        raise self.fenced(current)
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(epoch_fd, fcntl.LOCK_UN)

    def verify(self) -> None:
        self.check()
        current = self.read()
        if not self.is_mine(current):
            raise self.fenced(current)
