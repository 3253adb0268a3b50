"""Durability of an open file store: ``sync`` (the log's fsync), checkpoints, and the repair of a fault.

A checkpoint writes the new regions of persistent pages, the checkpoint payload (page table, live
bitmaps, names, catalog) and then the alternate meta page; the log restarts in a new segment.  Pages
freed before a checkpoint become reusable only once it is durable, so the last durable checkpoint never
points at overwritten bytes.  Trailing free pages are cut from the end of the file (spec/storage.md §4).
A repair is a checkpoint that starts a new log chain (§8).

Under space pressure — a write refused for lack of space since the last checkpoint, or less free disk than a
checkpoint would give back — a checkpoint is due as soon as it gives back ``PRESSURE_BYTES`` (the log since
the last one, and the pages freed since), whatever ``checkpoint_bytes`` says: consuming gives the space back
without a restart. A checkpoint that meets a full disk uses the store's headroom (``headroom.py``) and
tries once more.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable

from pymq.errors import StorageError

from ..page_alloc import PENDING, PERSISTENT, SYSTEM
from . import checkpoint as ckpt
from . import format as fmt
from .crc import crc32c
from .fileio import is_no_space
from .pagefile import Meta
from .state import OpenStore, describe, log
from .status import StoreStatus
from .writing import WritePath


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim         # glibc only
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()

#: under space pressure a checkpoint is due once it would give back this many bytes (log and freed pages)
PRESSURE_BYTES = 64 * 1024


def return_freed_memory() -> None:
    """Hand free heap pages back to the OS.  A checkpoint has just dropped up to ``checkpoint_bytes`` of
    page buffers and its copies of them (made in a worker thread, in another malloc arena); glibc keeps
    such memory resident when live blocks sit between the freed ones, which is what paging a large backlog
    produces (measured: 128 MiB of RSS growth for 80,000 persistent 1 KiB messages, 56 MiB after a
    trim).  A few milliseconds once per checkpoint; nothing where the C library has no ``malloc_trim``."""
    if _TRIM is not None:
        _TRIM(0)


class Checkpointer:
    """``sync``, ``checkpoint`` and ``repair`` of an open store."""

    __slots__ = ("store", "writes", "checkpoint_bytes", "checkpoint_in_sync", "hook")

    def __init__(self, store: OpenStore, writes: WritePath, checkpoint_bytes: int, checkpoint_in_sync: bool,
                 hook: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.writes = writes
        self.checkpoint_bytes = checkpoint_bytes
        self.checkpoint_in_sync = checkpoint_in_sync
        #: test hook, called with a phase name inside checkpoints ("switched", "before-meta", "after-meta")
        self.hook = hook

    @property
    def due(self) -> bool:
        """A checkpoint should run: ``checkpoint_bytes`` of log since the last one, or space pressure and a
        checkpoint would give back at least ``PRESSURE_BYTES`` (see the module docstring)."""
        store = self.store
        if store.fault is not None or store.status is not StoreStatus.OPEN or store.read_only:
            return False
        if store.log.since_checkpoint >= self.checkpoint_bytes:
            return True
        freed = self._reclaimable()
        return freed >= PRESSURE_BYTES and self._short(freed)

    def _reclaimable(self) -> int:
        """What a checkpoint would give back to the disk: the log's segment (the space it holds, reserved
        ahead or written), the pages freed since the last one and the tails left empty, the free pages it can
        cut from the end of the file, or else the free pages it can punch."""
        store = self.store
        seg = store.log.segment
        alloc = store.pages.alloc
        logged = store.log.since_checkpoint
        held = max(logged, seg.reserved or seg.size) if seg is not None else logged
        empty_tails = sum(1 for page in store.pages.tail.values() if page is not None and not page.live_count)
        freed = held + (alloc.count(PENDING) + empty_tails) * store.page_size
        if self._shrinkable():
            return freed + alloc.free_count * store.page_size
        return freed + (alloc.free_count - len(store.pages.punched)) * store.page_size

    def _short(self, freed: int) -> bool:
        """Space pressure: a write was refused for lack of space since the last checkpoint, the headroom is
        not held, or the disk has less free space than a checkpoint would give back."""
        store = self.store
        if store.space_refused or not store.headroom.available():
            return True
        disk = store.io.free_space(store.directory)
        return disk is not None and disk < freed

    @property
    def pressure(self) -> bool:
        """The disk was short of space since the last checkpoint (the status reports it)."""
        return self.store.space_refused

    @property
    def overdue(self) -> bool:
        """Nobody checkpoints (sync policy "never"): the log is four times past due."""
        return self.store.log.since_checkpoint > 4 * self.checkpoint_bytes

    def sync(self) -> None:
        """Make everything flushed durable; in fault StorageError (nothing since the fault is durable,
        and nothing will be until the repair's checkpoint)."""
        store = self.store
        with store.sync_lock:
            with store.lock:
                store.check_open()
                if store.read_only:
                    return
                if store.fault is not None:
                    raise StorageError(f"file device {store.name!r} cannot make writes durable: {store.fault}",
                                       device=store.name)
                segments = store.log.segments()
            started = time.perf_counter()
            try:
                for seg in segments:
                    seg.sync()
            except OSError as exc:
                # after a failed fsync the kernel may have dropped the dirty pages: never trust this log
                # again (retrying the fsync could "succeed" without the data); the repair rewrites it all
                with store.lock:
                    raise store.fail(exc, "fsync of the log") from exc
            try:
                # high availability (spec/ha.md §2.3): what this sync made durable was durable before any newer
                # epoch was written only if the epoch is still this process's now; else no barrier completes
                store.io.fence.verify()
            except OSError as exc:
                with store.lock:
                    raise store.fail(exc, "a sync's epoch check") from exc
            elapsed = time.perf_counter() - started
            with store.lock:
                figures = store.figures
                figures.syncs += 1
                figures.latency = elapsed if figures.syncs == 1 else 0.9 * figures.latency + 0.1 * elapsed
            if self.checkpoint_in_sync and self.due:
                try:
                    self.checkpoint_locked()
                except StorageError as exc:
                    log.error("checkpoint of file device %r failed, retried later: %s", store.name, exc.message)

    def checkpoint(self) -> None:
        """Write a checkpoint now (the log restarts empty); may run in the worker thread.  StorageError
        when it fails; a failed checkpoint changes nothing durable (unless it met a failing log, which
        puts the device in fault)."""
        store = self.store
        with store.sync_lock:
            with store.lock:
                store.check_writable()
                if store.fault is not None:
                    raise StorageError(f"file device {store.name!r} is in fault ({store.fault}); its repair "
                                       f"writes the next checkpoint", device=store.name)
            self.checkpoint_locked()

    def checkpoint_if_overdue(self) -> None:
        """``flush``'s bound on the log when nothing syncs: a checkpoint unless one runs already."""
        store = self.store
        if not store.sync_lock.acquire(blocking=False):
            return
        try:
            self.checkpoint_locked()
        except StorageError as exc:
            log.error("checkpoint of file device %r failed, retried later: %s", store.name, exc.message)
        finally:
            store.sync_lock.release()

    def repair(self) -> bool:
        """Leave fault by writing a checkpoint that starts a new log chain; True when back in service.
        May run in a worker thread (the store calls it with a back-off)."""
        store = self.store
        with store.sync_lock:
            with store.lock:
                if store.status is StoreStatus.CLOSED or store.read_only:
                    return False
                if store.fault is None:
                    return True
            try:
                self.checkpoint_locked(new_chain=True)
            except StorageError as exc:
                log.info("file device %r still in fault: %s", store.name, exc.message)
                return False
            with store.lock:
                reason = store.repaired()
            log.warning("file device %r is back in service (it was in fault: %s)", store.name, reason)
            return True

    def checkpoint_locked(self, new_chain: bool = False) -> None:
        """Write a checkpoint (caller holds ``sync_lock``); on a full disk give up the headroom and try once
        more, then hold the headroom again (``headroom.py``). Under space pressure, when the checkpoint's own
        pages end up the last of the file above free ones, write one more: it takes lower pages and the file
        shrinks (a drained store gives its pages back at once, not at some later checkpoint)."""
        store = self.store
        headroom = store.headroom
        in_fault = store.fault is not None
        pressure = self._short(self._reclaimable())
        try:
            self._write(new_chain)
        except StorageError as exc:
            cause = exc.__cause__
            if cause is None or not is_no_space(cause) or not headroom.held or \
                    (store.fault is not None and not in_fault and not new_chain):
                raise
            log.warning("file device %r: the disk is full; its checkpoint uses the headroom held for it (%d "
                        "bytes) to give consumed space back", store.name, headroom.size)
            with store.lock:
                headroom.release()              # new messages needing new space are refused meanwhile
            try:
                self._write(new_chain)
            finally:
                self._hold_headroom()           # before new messages may take what the checkpoint freed
            pressure = True
        else:
            self._hold_headroom()
        if pressure:
            if self._shrinkable():
                try:
                    self._write()
                except StorageError as exc:      # the checkpoint above is durable: this one only shrinks
                    log.info("file device %r: the checkpoint that would shrink the page file failed: %s",
                             store.name, exc.message)
            self._punch()

    def _punch(self) -> None:
        """Under space pressure, free pages inside the file give their blocks back (``pages.punch_free``)."""
        store = self.store
        try:
            with store.lock:
                store.pages.punch_free()
        except OSError as exc:
            log.warning("file device %r could not give free pages' space back: %s", store.name, describe(exc))

    def _shrinkable(self) -> bool:
        """The last checkpoint's pages are the end of the file and free pages lie below them: one more
        checkpoint takes free pages below, and the file can be cut."""
        pages = self.store.pages
        ckpt, alloc = pages.ckpt_pages, pages.alloc
        return bool(ckpt) and max(ckpt) == alloc.page_count - 1 and alloc.free_count >= len(ckpt)

    def _hold_headroom(self) -> None:
        store = self.store
        with store.lock:
            store.headroom.hold()

    def _write(self, new_chain: bool = False) -> None:
        """Snapshot under ``lock``, write without it, publish under it.  Caller holds ``sync_lock``.

        ``new_chain`` (the repair of a fault): the current segment is abandoned unflushed and the new one
        starts a new chain, so a crash before this checkpoint is durable replays the old log only up to
        what it validly holds, and never continues into frames written after the fault.  A failure
        before the meta page is written changes nothing durable; every in-memory mark made for the
        checkpoint is undone and the next one retries."""
        store = self.store
        hook = self.hook
        pages, wal = store.pages, store.log
        alloc = pages.alloc
        with store.lock:
            if wal.unit_depth:
                # a unit is open (spec/ha.md §3.4): a snapshot now would hold part of it.  Put off: the next
                # sync, maintenance round or repair starts the checkpoint again
                if new_chain:
                    raise StorageError(f"file device {store.name!r}: repair put off while a unit is open",
                                       device=store.name)
                return
            if new_chain:
                if wal.segment is not None:
                    wal.segment.discard()
            else:
                self.writes.flush_locked()     # raises (and enters fault) when the log cannot be written
            old = wal.segment
            try:
                if new_chain or old is None:
                    seg = wal.start(0, 0)
                else:
                    seg = wal.start(old.salt, old.checksum)
            except OSError as exc:
                store.figures.errors += 1
                store.figures.checkpoint_error = describe(exc)
                raise StorageError(f"file device {store.name!r}: checkpoint could not start a log segment: "
                                   f"{describe(exc)}", device=store.name) from exc
            if old is not None:
                wal.old_segments.append(old)
            generation = store.generation + 1
            pages.drop_empty_tails()
            marks = [(page, page.on_disk, page.disk_slots, page.disk_data_start)
                     for page in (pages.pages[n] for n in pages.dirty)]
            writes = pages.dirty_regions()
            if not pages.ckpt_freed:
                for number in pages.ckpt_pages:
                    alloc.free(number)
                pages.ckpt_freed = True
            alloc.begin_checkpoint()
            payload, ckpt_pages = self._encode(generation)
            # names and refsets in the payload count as durable only once the checkpoint is
            snapshot_names, snapshot_refsets = set(store.names.names), set(store.names.refsets)
            log_bytes, wal.since_checkpoint = wal.since_checkpoint, 0
            space_refused, store.space_refused = store.space_refused, False
            if new_chain:
                wal.logging = True          # later changes go to the new chain, after the snapshot
            meta = Meta(generation, seg.number, seg.salt, alloc.page_count, ckpt_pages[0], len(ckpt_pages),
                        len(payload), crc32c(payload))
        pf = store.page_file
        try:
            with store.lock:
                pf.reserve(meta.page_count)
            if hook:
                hook("switched")
            store.sync_dir()
            for offset, data in writes:
                pf.write_at(offset, data)
            pf.write_checkpoint(ckpt_pages, generation, payload)
            pf.sync()
            if hook:
                hook("before-meta")
            pf.write_meta(meta)
            pf.sync()
            if hook:
                hook("after-meta")
        except BaseException as exc:
            with store.lock:
                alloc.end_checkpoint(durable=False)
                for number in ckpt_pages:
                    alloc.unallocate(number)        # never named by a durable checkpoint: free at once
                for page, on_disk, disk_slots, disk_data_start in marks:
                    if pages.pages.get(page.number) is page:     # not freed meanwhile
                        page.on_disk, page.disk_slots, page.disk_data_start = on_disk, disk_slots, disk_data_start
                        pages.dirty.add(page.number)
                wal.since_checkpoint += log_bytes
                store.space_refused = store.space_refused or space_refused or is_no_space(exc)
                store.figures.errors += 1
                store.figures.checkpoint_error = describe(exc)
                if new_chain:
                    wal.logging = False
                    seg.discard()
            if not isinstance(exc, Exception):
                raise
            raise StorageError(f"file device {store.name!r}: checkpoint failed: {describe(exc)}",
                               device=store.name) from exc
        with store.lock:
            alloc.end_checkpoint(durable=True)
            store.names.durable_names |= snapshot_names
            store.names.durable_refsets |= snapshot_refsets
            store.generation = generation
            pages.ckpt_pages = ckpt_pages
            pages.ckpt_freed = False
            store.figures.checkpoints += 1
            store.figures.checkpoint_error = ""
            try:
                end = alloc.trim()
                if pf.size() > end * store.page_size:
                    pf.truncate(end)
                pages.trimmed(end)
            except OSError as exc:
                store.figures.errors += 1      # a longer file than needed: the next checkpoint trims again
                log.warning("file device %r could not trim its page file: %s", store.name, describe(exc))
            pages.drop_checkpointed()
        writes.clear()                          # the copies of the page regions this checkpoint wrote
        return_freed_memory()
        wal.drop_older_than(meta.wal_segment)

    def _encode(self, generation: int) -> tuple[bytes, list[int]]:
        """The checkpoint payload and the SYSTEM pages that will carry it."""
        store = self.store
        pages, index, names = store.pages, store.index, store.names
        state = ckpt.CheckpointState()
        for page in pages.pages.values():
            if page.kind == PERSISTENT and not page.cont:
                state.pages.append((page.number, page.slots, page.data_start,
                                    bytes(page.live[:(page.slots + 7) // 8])))
        state.names = dict(names.names)
        ids = names.ids
        state.refsets = {rid: tuple(ids[q] for q in refs) for rid, refs in names.refsets.items()}
        state.refs = {key: tuple(ids[q] for q in refs) for key, refs in index.changed_refs().items()}
        state.catalog = dict(store.catalog)
        if index.unlogged:       # a repair's checkpoint comes without a flush
            index.take_deliveries()
        state.deliveries = {(key, ids[queue]): count for key, counts in index.deliveries.items()
                            for queue, count in counts.items()}
        tail = pages.tail[PERSISTENT]
        state.tail = tail.number if tail is not None else 0
        state.next_name, state.next_refset = names.next_name, names.next_refset
        body = ckpt.encode_body(state)
        cap = store.page_file.checkpoint_capacity()
        alloc = pages.alloc
        taken: list[int] = []
        while True:
            size = len(body) + fmt.SECTION.size + alloc.page_count
            if len(taken) * cap >= size:
                break
            taken.append(alloc.allocate(SYSTEM))
            pages.punched.discard(taken[-1])         # a hole or not, its payload is written whole below
        payload = ckpt.encode(alloc.table(), body)
        assert len(payload) <= len(taken) * cap
        return payload, taken
