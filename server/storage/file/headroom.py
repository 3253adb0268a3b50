"""Headroom: disk space an open store holds back so that a checkpoint can always run (spec/storage.md §8).

A checkpoint is what gives consumed space back: it deletes the log (which holds every message written and
every removal since the last one), frees the pages of consumed messages and cuts free pages off the end of
the page file. But a checkpoint needs a little new space of its own — a new log segment, the pages that
carry its payload — and on a full disk it had none, so a disk that filled up stayed full however much was
consumed (issue 24). The store therefore keeps a file named ``headroom`` in its directory, with
``size`` bytes allocated to it, that nothing else may use: when a checkpoint meets a full disk the store
deletes the file (the space is free again), runs the checkpoint, and allocates the file again afterwards.

The rule that makes it hold: **a message that needs new disk space is taken only while the headroom is
held** (the write path tries to allocate a missing headroom first, and refuses the message — a refusal,
as on a full disk — when it cannot). So the headroom is missing only while a checkpoint uses it, or when
the disk has too little left for it, and then new messages cannot take the space a checkpoint needs;
messages that fit space the store already holds (free pages, reserved log) are still taken.

The file is not part of the format: recovery never reads it, a backup need not copy it, and a store
without one (made by an older pymq, or on a disk that had no room for it) works as before and makes it
at its next checkpoint.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import OpenStore

NAME = "headroom"

log = logging.getLogger("pymq.storage")


def default_size(page_size: int) -> int:
    """What a checkpoint of a store that has been full needs at most, with room to spare: its new log
    segment's first block and its payload pages (a few, with the page table, names and catalog)."""
    return 4 * page_size + 64 * 1024


class Headroom:
    __slots__ = ("store", "configured", "path", "held", "told", "in_use")

    def __init__(self, store: OpenStore, size: int | None) -> None:
        self.store = store
        #: bytes held back (None: ``default_size`` of the store's page size; 0: no headroom)
        self.configured = size
        self.path = os.path.join(store.directory, NAME)
        #: the file holds ``size`` bytes of the disk now
        self.held = False
        #: given up to a checkpoint running now (the write path must not take it back meanwhile)
        self.in_use = False
        self.told = False           # the operator was told that it could not be held

    @property
    def size(self) -> int:
        return default_size(self.store.page_size) if self.configured is None else self.configured

    def find(self) -> bool:
        """At open: a headroom left by the last run is held already."""
        try:
            self.held = self.size > 0 and os.stat(self.path).st_blocks * 512 >= self.size
        except OSError:
            self.held = False
        return self.held

    def available(self) -> bool:
        """Whether new disk space may be taken: the headroom is held (allocated now if it was missing), or
        there is none to hold. False while a checkpoint uses it, or the disk has no room for it."""
        if self.held or self.size <= 0:
            return True
        return not self.in_use and self.hold()

    def hold(self) -> bool:
        """Allocate the headroom if it is not held; True when it is held now. A disk that has no room for it
        leaves it not held (tried again by the next message that needs new space, and after checkpoints)."""
        self.in_use = False
        if self.held or self.size <= 0 or self.store.read_only:
            return self.held
        io = self.store.io
        size = self.size
        try:
            fd = io.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return self._missing()
        try:
            if os.fstat(fd).st_blocks * 512 < size and not io.reserve(fd, 0, size):
                # no fallocate here: zeros allocate the blocks
                view = memoryview(bytes(min(size, 1 << 20)))
                at = 0
                while at < size:
                    at += io.pwrite(fd, view[:size - at], at)
            self.held = True
        except OSError:
            try:
                io.unlink(self.path)
            except OSError:
                pass
        finally:
            io.close(fd)
        if not self.held:
            return self._missing()
        if self.told:
            self.told = False
            log.warning("file device %r holds its headroom again (%d bytes)", self.store.name, size)
        return True

    def _missing(self) -> bool:
        if not self.told:
            self.told = True
            log.warning("file device %r has no room for its headroom (%d bytes): it takes no message that needs "
                        "new disk space until a checkpoint gives space back or space is added",
                        self.store.name, self.size)
        return False

    def release(self) -> bool:
        """Give the headroom's space back to the disk (a checkpoint needs it); True when it was held."""
        if not self.held:
            return False
        self.held = False
        self.in_use = True
        try:
            self.store.io.unlink(self.path)
        except FileNotFoundError:
            pass
        return True
