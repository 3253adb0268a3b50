"""Every system call the file device makes that can fail because of the disk, in one place.

Why a seam: a full disk (ENOSPC) or a failing one (EIO) must be answered and survived (spec/storage.md
§8), and the only way to test every path that meets one is to make the calls fail on demand.  The
device, its log segments and its page file call this object instead of ``os``; tests hand the device a
subclass that raises (``tests/storage/faults.py``), the broker uses :data:`OS_IO`.

Space is *reserved* before it is needed (``reserve``: Linux ``fallocate`` with ``FALLOC_FL_KEEP_SIZE``,
which allocates blocks past the end of a file without changing its size), so a write that the disk cannot
hold is refused when the device accepts the message — before any receipt or queue depends on it — and
appends into reserved blocks cannot fail for lack of space.  Where ``fallocate`` is missing (macOS, some
file systems) ``reserve`` returns False and a full disk is met at ``write``/``fsync`` instead, which the
device survives too, only later.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys

from ..ha.fence import NO_FENCE, Fence

#: fdatasync where the OS has it (Linux), else fsync (macOS)
_datasync = getattr(os, "fdatasync", os.fsync)
_FALLOC_FL_KEEP_SIZE = 1
_FALLOC_FL_PUNCH_HOLE = 2


def _load_fallocate():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fallocate = libc.fallocate
    except (OSError, AttributeError):
        return None
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fallocate.restype = ctypes.c_int
    return fallocate


_fallocate = _load_fallocate()


class FileIO:
    """The operating system, as the file device uses it."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def write(self, fd: int, data: memoryview) -> int:
        return os.write(fd, data)

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def datasync(self, fd: int) -> None:
        _datasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def reserve(self, fd: int, offset: int, length: int) -> bool:
        """Allocate ``length`` bytes from ``offset`` without changing the file's size.  True when the
        space is now held for the file, False when the platform cannot reserve (nothing promised);
        raises OSError (ENOSPC) when the disk cannot give it."""
        if _fallocate is None or length <= 0:
            return False
        if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
            return True
        err = ctypes.get_errno()
        if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return False
        raise OSError(err, os.strerror(err))

    def punch(self, fd: int, offset: int, length: int) -> bool:
        """Give the disk blocks of ``length`` bytes from ``offset`` back to the file system (the bytes read as
        zeros, the size stays): True when done, False where the platform cannot (nothing changed)."""
        if _fallocate is None or length <= 0:
            return False
        if _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
            return True
        err = ctypes.get_errno()
        if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return False
        raise OSError(err, os.strerror(err))

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def free_space(self, path: str) -> int | None:
        """Bytes an unprivileged writer may still use on the file system holding ``path``."""
        try:
            st = os.statvfs(path)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize


#: the real thing
OS_IO = FileIO()


class WriteGate(FileIO):
    """The one door every write of an open store goes through (spec/storage.md §8).

    The open store hands this object, not the operating system, to its page file and its log segments, so
    every call that changes the disk (``open`` for writing, ``write``, ``pwrite``, ``reserve``, ``truncate``,
    ``datasync``, ``fsync``, ``unlink``) passes :meth:`check` first.  While ``closed_for`` is set, each such
    call raises :class:`StoreClosedForWrites` before touching the disk; reads go through unchanged.  The
    store's own close closes it, and so does high availability's fence when a newer live broker took the
    files over (``fence`` raises ``Fenced``, spec/ha.md §2), here in one place: no later write of any
    component can reach the disk.  ``inner`` is the operating system (tests put a fault layer
    there, also on an open store: ``FileDevice.set_io``)."""

    __slots__ = ("_inner", "closed_for", "fence", "pread")

    def __init__(self, inner: FileIO, fence: Fence = NO_FENCE) -> None:
        self.inner = inner
        #: why writes are refused (None: open)
        self.closed_for: str | None = None
        #: high availability (spec/ha.md §2.2): a write that could corrupt a newer epoch's store (the page
        #: file, a log segment's creation, a removal) is made inside ``fence.exclusive()``; every other
        #: write asks ``fence.check()``.  NO_FENCE without ``ha:``.
        self.fence = fence

    @property
    def inner(self) -> FileIO:
        return self._inner

    @inner.setter
    def inner(self, inner: FileIO) -> None:
        self._inner = inner
        # reads go through unchanged: the gate's ``pread`` is the inner layer's own (a read of a page that
        # left memory, once or twice per delivered paged message, makes no call of ours in between)
        self.pread = inner.pread           # type: ignore[method-assign]

    def check(self) -> None:
        if self.closed_for is not None:
            raise StoreClosedForWrites(self.closed_for)
        self.fence.check()

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if flags & (os.O_CREAT | os.O_TRUNC):
            self.check()
            with self.fence.exclusive():       # creating a log segment truncates it: never a newer epoch's
                return self.inner.open(path, flags, mode)
        if flags & (os.O_WRONLY | os.O_RDWR):
            self.check()
        return self.inner.open(path, flags, mode)

    def close(self, fd: int) -> None:
        self.inner.close(fd)

    def write(self, fd: int, data: memoryview) -> int:
        self.check()
        self.fence.check_write()               # log appends: under a fresh lease (spec/ha.md §2.3)
        return self.inner.write(fd, data)

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        self.check()
        with self.fence.exclusive():           # the page file: never over a newer epoch's pages
            return self.inner.pwrite(fd, data, offset)

    def datasync(self, fd: int) -> None:
        self.check()
        self.inner.datasync(fd)

    def fsync(self, fd: int) -> None:
        self.check()
        self.inner.fsync(fd)

    def truncate(self, fd: int, length: int) -> None:
        self.check()
        with self.fence.exclusive():
            self.inner.truncate(fd, length)

    def reserve(self, fd: int, offset: int, length: int) -> bool:
        self.check()
        return self.inner.reserve(fd, offset, length)

    def punch(self, fd: int, offset: int, length: int) -> bool:
        self.check()
        return self.inner.punch(fd, offset, length)

    def unlink(self, path: str) -> None:
        self.check()
        with self.fence.exclusive():
            self.inner.unlink(path)

    def free_space(self, path: str) -> int | None:
        return self.inner.free_space(path)


class StoreClosedForWrites(OSError):
    """A write reached a store whose gate is closed (an OSError, so every write path already treats it as
    a failed system call: the store goes to fault and refuses, nothing is half-written)."""

    def __init__(self, reason: str) -> None:
        super().__init__(errno.EROFS, f"the store takes no more writes: {reason}")
        self.reason = reason

#: errors that mean "the disk cannot hold more" rather than "the disk is failing"
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in NO_SPACE
