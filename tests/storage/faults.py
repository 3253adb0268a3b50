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

BLOCK = 4096

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
        #: with ``disk_full(budget=...)``: bytes of new space the full disk still has; files deleted, cut or
        #: punched give theirs back to it (a disk that breathes); None: every call needing space fails
        self._budget: int | None = None
        self._reserved: dict[int, int] = {}      # fd -> end of the space reserved for it
        self._paths: dict[int, str] = {}         # fd -> path (the budget's files)
        self._extent: dict[str, int] = {}        # path -> blocks held from 0, less its holes (the budget's)
        self._holes: dict[str, set[int]] = {}

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

    def disk_full(self, budget: int | None = None) -> "FaultyIO":
        """Every call that needs new blocks fails with ENOSPC; with ``budget``, once that many bytes are used
        up, and what ``unlink``, ``truncate`` and ``punch`` free is added back (the disk's free space)."""
        with self._lock:
            self._full = True
            self._budget = budget
            # what the files hold now counts as held
            for fd, path in self._paths.items():
                try:
                    size = max(os.fstat(fd).st_size, self._reserved.get(fd, 0))
                except OSError:
                    continue
                self._extent[path] = max(self._extent.get(path, 0), -(-size // BLOCK))
        return self

    @property
    def budget(self) -> int | None:
        with self._lock:
            return self._budget

    def heal(self) -> "FaultyIO":
        with self._lock:
            self._failing.clear()
            self._after.clear()
            self._full = False
            self._budget = None
        return self

    def _need_space(self, call: str, fd: int | None = None, end: int | None = None) -> None:
        """ENOSPC while the disk is full, unless the bytes up to ``end`` of ``fd`` are held already."""
        with self._lock:
            if not self._full or self._budget is not None:
                return
            if fd is not None and end is not None:
                held = max(self._reserved.get(fd, 0), os.fstat(fd).st_size)
                if end <= held:
                    return
            self.failures[call] += 1
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    # -- the budget: a logical disk (per file: the blocks it holds, as an extent with holes) ----------------
    def _take(self, call: str, fd: int, start: int, end: int) -> None:
        """Blocks ``start..end`` of ``fd`` are needed: charged to the budget unless the file holds them."""
        with self._lock:
            path = self._paths.get(fd)
            if path is None or end <= start:
                return
            extent = self._extent.setdefault(path, 0)
            holes = self._holes.setdefault(path, set())
            first, last = start // BLOCK, -(-end // BLOCK)
            need = [b for b in range(first, last) if b >= extent or b in holes]
            if self._budget is not None:
                if len(need) * BLOCK > self._budget:
                    self.failures[call] += 1
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self._budget -= len(need) * BLOCK
            holes.difference_update(need)
            self._extent[path] = max(extent, last)

    def _give(self, blocks: int) -> None:
        with self._lock:
            if self._budget is not None:
                self._budget += blocks * BLOCK

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
            if not os.path.exists(path) and self.budget is None:
                self._need_space("open")
        existed = os.path.exists(path)
        fd = super().open(path, flags, mode)
        with self._lock:
            self._reserved.pop(fd, None)
            self._paths[fd] = path
            if not existed or flags & os.O_TRUNC:
                self._extent[path] = 0
                self._holes.pop(path, None)
            elif path not in self._extent:
                self._extent[path] = -(-os.fstat(fd).st_size // BLOCK)
        return fd

    def close(self, fd):
        with self._lock:
            self._paths.pop(fd, None)
        super().close(fd)

    def write(self, fd, data):
        self._check("write")
        size = os.fstat(fd).st_size
        self._need_space("write", fd, size + len(data))
        self._take("write", fd, size, size + len(data))
        return super().write(fd, data)

    def pwrite(self, fd, data, offset):
        self._check("pwrite")
        self._need_space("pwrite", fd, offset + len(data))
        self._take("pwrite", fd, offset, offset + len(data))
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
        with self._lock:
            path = self._paths.get(fd)
            if path is None or path not in self._extent:
                return
            keep = -(-length // BLOCK)
            holes = self._holes.get(path, set())
            gone = max(0, self._extent[path] - keep) - sum(1 for b in holes if b >= keep)
            self._holes[path] = {b for b in holes if b < keep}
            self._extent[path] = min(self._extent[path], keep)
        self._give(gone)

    def punch(self, fd, offset, length):
        done = super().punch(fd, offset, length)
        with self._lock:
            path = self._paths.get(fd)
            if not done or path is None or path not in self._extent:
                return done
            holes = self._holes.setdefault(path, set())
            blocks = {b for b in range(-(-offset // BLOCK), (offset + length) // BLOCK)
                      if b < self._extent[path] and b not in holes}
            holes |= blocks
        self._give(len(blocks))
        return done

    def unlink(self, path):
        super().unlink(path)
        with self._lock:
            blocks = self._extent.pop(path, 0) - len(self._holes.pop(path, set()))
        self._give(blocks)

    def reserve(self, fd, offset, length):
        self._check("reserve")
        with self._lock:
            held = self._reserved.get(fd, 0)
        if offset + length > held and self.budget is None:
            self._need_space("reserve")
        self._take("reserve", fd, offset, offset + length)
        done = super().reserve(fd, offset, length)
        with self._lock:
            self._reserved[fd] = max(held, offset + length)
        return done
