"""A fault layer for the file device: its system calls fail on demand with ENOSPC, EIO or any errno.

:class:`FaultyIO` is the device's :class:`~pymq_server.storage.file.fileio.FileIO` with a switch per
call: ``io.fail("write", "datasync", err=errno.EIO)`` makes every later ``write`` and ``datasync`` of the
device raise ``OSError(EIO)`` until ``io.heal()``.  ``disk_full()`` is the shape of a full disk: every
call that needs new blocks (file creation, reservations, writes past what a file already has or had
reserved) raises ENOSPC, while writes into space already held succeed, as on a real disk.  Hand it to
a device at construction (``FileDevice(..., io=io)``) or to an open one (``device.set_io(io)``); the
broker's device is reached through ``server.store.devices["file"]``.

The tmpfs tests use a real small file system instead; both kinds exist because a real full disk shows
what the kernel does (partial writes, ``fallocate``), and the layer reaches paths a real disk rarely
does (an fsync that fails, a failure in the middle of a checkpoint).
"""
from __future__ import annotations

import errno
import os
import threading
from collections import Counter

from pymq_server.storage.file.fileio import FileIO

#: calls that need new disk space
SPACE_CALLS = ("open", "write", "pwrite", "reserve")
ALL_CALLS = ("open", "write", "pwrite", "pread", "datasync", "fsync", "truncate", "reserve")


class FaultyIO(FileIO):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failing: dict[str, int] = {}
        self._after: dict[str, int] = {}
        self.calls: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self._full = False
        self._reserved: dict[int, int] = {}      # fd -> end of the space reserved for it

    # -- the switch ------------------------------------------------------------------------------
    def fail(self, *calls: str, err: int = errno.EIO, after: int = 0) -> "FaultyIO":
        """Make ``calls`` fail with ``err`` from now on (after ``after`` more successful ones each)."""
        with self._lock:
            for call in calls:
                if call not in ALL_CALLS:
                    raise ValueError(f"unknown call {call!r}; one of {ALL_CALLS}")
                self._failing[call] = err
                self._after[call] = after
        return self

    def disk_full(self) -> "FaultyIO":
        with self._lock:
            self._full = True
        return self

    def heal(self) -> "FaultyIO":
        with self._lock:
            self._failing.clear()
            self._after.clear()
            self._full = False
        return self

    def _need_space(self, call: str, fd: int | None = None, end: int | None = None) -> None:
        """ENOSPC while the disk is full, unless the bytes up to ``end`` of ``fd`` are held already."""
        with self._lock:
            if not self._full:
                return
            if fd is not None and end is not None:
                held = max(self._reserved.get(fd, 0), os.fstat(fd).st_size)
                if end <= held:
                    return
            self.failures[call] += 1
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def _check(self, call: str) -> None:
        with self._lock:
            self.calls[call] += 1
            err = self._failing.get(call)
            if err is None:
                return
            if self._after.get(call, 0) > 0:
                self._after[call] -= 1
                return
            self.failures[call] += 1
        raise OSError(err, os.strerror(err))

    # -- FileIO ------------------------------------------------------------------------------------
    def open(self, path, flags, mode=0o644):
        if flags & os.O_CREAT:
            self._check("open")
            if not os.path.exists(path):
                self._need_space("open")
        fd = super().open(path, flags, mode)
        with self._lock:
            self._reserved.pop(fd, None)
        return fd

    def write(self, fd, data):
        self._check("write")
        self._need_space("write", fd, os.fstat(fd).st_size + len(data))
        return super().write(fd, data)

    def pwrite(self, fd, data, offset):
        self._check("pwrite")
        self._need_space("pwrite", fd, offset + len(data))
        return super().pwrite(fd, data, offset)

    def pread(self, fd, size, offset):
        self._check("pread")
        return super().pread(fd, size, offset)

    def datasync(self, fd):
        self._check("datasync")
        super().datasync(fd)

    def fsync(self, fd):
        self._check("fsync")
        super().fsync(fd)

    def truncate(self, fd, length):
        self._check("truncate")
        super().truncate(fd, length)

    def reserve(self, fd, offset, length):
        self._check("reserve")
        with self._lock:
            held = self._reserved.get(fd, 0)
        if offset + length > held:
            self._need_space("reserve")
        done = super().reserve(fd, offset, length)
        with self._lock:
            self._reserved[fd] = max(held, offset + length)
        return done
