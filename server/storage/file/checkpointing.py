"""The file device's durability: ``sync`` (fsync of the log), checkpoints and the repair of a fault
(spec/storage.md §4 and §8).

A checkpoint snapshots under ``_lock`` (new log segment, copies of the dirty page regions, the payload
of ``checkpoint.py``), writes without it (page regions, checkpoint pages, fsync, then the alternate meta
page, fsync), and publishes under it (pages freed before the snapshot become reusable, the file end is
trimmed, older segments deleted).  A crash before the meta page is durable leaves the previous
generation whole; a checkpoint that fails undoes every in-memory mark it made.  ``_sync_lock`` keeps syncs
and checkpoints apart, so a segment is never closed under an fsync.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from collections.abc import Callable

from pymq.errors import StorageError

from ..page_alloc import PERSISTENT, SYSTEM
from . import checkpoint as ckpt
from . import format as fmt
from .crc import crc32c
from .pagefile import Meta
from .wal import Segment, list_segments, new_salt, segment_path
from .state import _HDR, _SLOT, DeviceState, _describe, log


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim         # glibc only
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def return_freed_memory() -> None:
    """Hand free heap pages back to the OS.  A checkpoint has just dropped up to ``checkpoint_bytes`` of
    page buffers and its copies of them (made in a worker thread, in another malloc arena); glibc keeps
    such memory resident when live blocks sit between the freed ones, which is what paging a large backlog
    produces (measured: 128 MiB of RSS growth for 80,000 persistent 1 KiB messages, 56 MiB after a
    trim).  A few milliseconds once per checkpoint; nothing where the C library has no ``malloc_trim``."""
    if _TRIM is not None:
        _TRIM(0)


class Checkpointing(DeviceState):
    """``sync``, ``checkpoint`` and ``repair``."""

    checkpoint_bytes: int
    checkpoint_in_sync: bool
    checkpoint_hook: Callable[[str], None] | None
    _fsync: bool
    _sync_lock: threading.Lock
    _flush_locked: Callable[[], None]
    _take_deliveries: Callable[[], dict]

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
                segments = [*self._old_segments, self.wal]
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
        pf = self.pf
        try:
            with self._lock:
                pf.reserve(meta.page_count)
            if hook:
                hook("switched")
            self._sync_dir()
            for offset, data in writes:
                pf.write_at(offset, data)
            pf.write_checkpoint(pages, generation, payload)
            pf.sync()
            if hook:
                hook("before-meta")
            pf.write_meta(meta)
            pf.sync()
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
                if pf.size() > end * ps:
                    pf.truncate(end)
            except OSError as exc:
                self._errors += 1      # a longer file than needed: the next checkpoint trims again
                log.warning("file device %r could not trim its page file: %s", self.name, _describe(exc))
            stale, self._old_segments = self._old_segments, []
            for page in self._pages.values():   # checkpointed pages need not stay in memory
                if page.kind == PERSISTENT and page.number not in self._dirty \
                        and self._tail[PERSISTENT] is not page:
                    page.buf = None
        writes.clear()                          # the copies of the page regions this checkpoint wrote
        return_freed_memory()
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
        seg = Segment(self.directory, self._next_segment, self.page_size, self.pf.file_id,
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

    def _dirty_regions(self) -> list[tuple[int, bytes | memoryview]]:
        """Copies of every persistent byte range the page file lacks; marks them written.  A continuation
        page that is a view of a message's own bytes (writing.py) is handed over as it is, not copied:
        those bytes never change; the part of the page past them is written as zeros."""
        ps = self.page_size
        writes: list[tuple[int, bytes | memoryview]] = []
        zeros: bytes | None = None
        for number in self._dirty:
            page = self._pages[number]
            base = number * ps
            buf = self._resident(page)
            if page.cont:
                if isinstance(buf, memoryview):
                    writes.append((base, buf))
                    if len(buf) < ps:
                        zeros = zeros if zeros is not None else bytes(ps)
                        writes.append((base + len(buf), memoryview(zeros)[len(buf):]))
                else:
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
        if self._unlogged_deliveries:       # a repair's checkpoint comes without a flush
            self._take_deliveries()
        state.deliveries = {(key, ids[queue]): count for key, counts in self._deliveries.items()
                            for queue, count in counts.items()}
        tail = self._tail[PERSISTENT]
        state.tail = tail.number if tail is not None else 0
        state.next_name, state.next_refset = self._next_name, self._next_refset
        body = ckpt.encode_body(state)
        cap = self.pf.checkpoint_capacity()
        pages: list[int] = []
        while True:
            size = len(body) + fmt.SECTION.size + self._alloc.page_count
            if len(pages) * cap >= size:
                break
            pages.append(self._alloc.allocate(SYSTEM))
        payload = ckpt.encode(self._alloc.table(), body)
        assert len(payload) <= len(pages) * cap
        return payload, pages
