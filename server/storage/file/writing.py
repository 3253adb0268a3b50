"""The file device's write path: messages, references, delivery counts and catalog records in, and
``flush`` handing them to the OS (spec/storage.md §3).

A write reserves everything it needs first (pages inside ``max_bytes``, disk space for pages and log),
so a refusal changes nothing and the device stays in service; only a failing system call after that puts
the device in fault.  Persistent changes are logged (PUT, REMOVE, ADDREF, META, DELIVERED frames);
non-persistent messages only fill non-persistent pages, which ``flush`` writes out once sealed.
"""
from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterable, Sequence

from pymq.errors import StorageError

from ..device import Allocation, StoredMessage
from ..page_alloc import NON_PERSISTENT, PERSISTENT
from . import format as fmt
from .crc import crc32c
from .fileio import is_no_space
from .state import _HDR, _SLOT, DeviceState, _describe, _Entry, _Page, log

_AUTO_FLUSH_BYTES = 1 << 20
#: log space a message's write reserves beyond its own frames, for the removals and catalog records that
#: follow it (they are never refused: a consumer must always be able to acknowledge)
_LOG_HEADROOM = 64 * 1024
#: log bytes a PUT frame adds besides the message bytes (frame header, slot, NAME/REFSET frames) at most
_PUT_OVERHEAD = 4096


def _crc_of(data: bytes, parts: tuple[bytes, ...] | None) -> int:
    """The crc32c of the message: of ``data``, or of ``parts`` one after the other (the checksum chains)."""
    if parts is None:
        return crc32c(data)
    crc = 0
    for part in parts:
        crc = crc32c(part, crc)
    return crc


def _page_images(parts: tuple[bytes, ...], page_size: int, count: int) -> list[memoryview]:
    """The bytes of ``count`` continuation pages holding ``parts`` back to back: a page inside one part (or
    the rest of the last part) is a view of it (nothing copied); a page that spans parts is copied
    together.  The last one may be shorter than a page (the checkpoint writes the rest as zeros)."""
    images: list[memoryview] = []
    views = [memoryview(p) for p in parts if len(p)]
    index, at = 0, 0                 # the part the next page starts in, and where in it
    for _ in range(count):
        if not views:
            break
        view = views[index]
        if len(view) - at >= page_size or index == len(views) - 1:
            images.append(view[at:at + page_size])
            at = min(at + page_size, len(view))
        else:
            image = bytearray()
            while len(image) < page_size and index < len(views):
                view = views[index]
                take = view[at:at + page_size - len(image)]
                image += take
                at += len(take)
                if at == len(views[index]):
                    index, at = index + 1, 0
            images.append(memoryview(image))
            continue
        if at == len(view):
            index, at = index + 1, 0
    return images


class WritePath(DeviceState):
    """Writes, removals, references, delivery counts, catalog records and ``flush``."""

    checkpoint_bytes: int
    max_bytes: int | None
    _sync_lock: threading.Lock
    _checkpoint_locked: Callable[..., None]

    def _ensure_room(self, pages: int, log_bytes: int = 0) -> None:
        """Refuse (StorageError, a device error) unless ``pages`` more pages fit ``max_bytes`` and the
        disk holds them and ``log_bytes`` more log: the space is reserved now, so writing it later
        cannot fail for lack of space."""
        alloc = self._alloc
        if self.max_bytes is not None:
            used = alloc.page_count - alloc.free_count
            if (used + pages) * self.page_size > self.max_bytes:
                self._refused()
                raise StorageError(f"file device {self.name!r} is full ({self.max_bytes} bytes)",
                                   device=self.name, limit=self.max_bytes)
        try:
            if pages > alloc.free_count:
                self.pf.reserve(alloc.page_count + pages - alloc.free_count)
            if log_bytes:
                self.wal.reserve(log_bytes + _LOG_HEADROOM)
        except OSError as exc:
            self._refused()
            if is_no_space(exc):
                raise StorageError(f"file device {self.name!r} is full: the disk under {self.directory} has "
                                   f"no room ({_describe(exc)})", device=self.name) from None
            raise self._fail(exc, "reserving disk space") from exc

    def allocate(self, size: int, persistent: bool) -> Allocation:
        """Refuse now (StorageError) what ``write`` would refuse for lack of room or a fault; for a
        persistent message the log space of its PUT is reserved too (the holding store writes it
        behind, spec/storage.md §9)."""
        if persistent:
            self.check_room(size)
        else:
            with self._lock:
                self._check_accepting()
                pages = 1 + (self._continuation_count(size) if size > self._inline_max() else 0)
                self._ensure_room(pages, 0)
        return Allocation(self.name, size, persistent)

    def check_room(self, size: int) -> None:
        """``allocate`` for a persistent message of ``size`` bytes without the Allocation: the holding
        store asks this for every persistent message it writes behind (spec/storage.md §9).

        When everything is already reserved — the log segment holds room for this PUT and the headroom
        past what was appended, a free page or a reserved one at the end of the page file, ``max_bytes``
        not reached, no fault — the answer is yes without a system call or a reservation: the same
        conditions ``_ensure_room`` tests, read in one place. Otherwise the full check runs (and
        reserves, or refuses with StorageError, changing nothing)."""
        with self._lock:
            wal, pf, alloc = self._wal, self._pf, self._alloc
            if self._open and self._fault is None and not self.read_only and wal is not None and \
                    pf is not None and size <= (self.page_size - _HDR - _SLOT) >> 2:
                log_reserved, pages_reserved = wal.reserved, pf.reserved
                if log_reserved is not None and pages_reserved is not None and \
                        wal.size + size + _PUT_OVERHEAD + _LOG_HEADROOM <= log_reserved:
                    free = alloc.free_count
                    used_after = alloc.page_count - free + 1
                    if (free or used_after * self.page_size <= pages_reserved) and \
                            (self.max_bytes is None or used_after * self.page_size <= self.max_bytes):
                        return
            self._check_accepting()
            pages = 1 + (self._continuation_count(size) if size > self._inline_max() else 0)
            self._ensure_room(pages, size + _PUT_OVERHEAD)

    def write(self, message: StoredMessage, queues: Sequence[str],
              allocation: Allocation | None = None, parts: tuple[bytes, ...] | None = None) -> None:
        """Store ``message`` with a reference for each of ``queues``.  ``parts``: the message bytes as
        pieces whose concatenation they are (``message.data`` is then not read): a large message is kept
        and logged from them, never joined (the holding store hands a bulk SEND's stored form over this
        way: its header block, the SEND's own body, the NUL); a small one is joined."""
        with self._lock:
            if not self._open or self.read_only or self._fault is not None:
                self._check_accepting()
            key = message.key
            if key in self._index:
                raise StorageError(f"message {key} is already held", key=key)
            if not queues:
                raise StorageError(f"message {key} written without a queue", key=key)
            persistent = bool(message.persistent)
            kind = PERSISTENT if persistent else NON_PERSISTENT
            data = message.data if parts is None else b""
            length = len(data) if parts is None else sum(len(p) for p in parts)
            refs = tuple(queues)
            # room first (pages, disk space, log space), so a refusal changes nothing
            tail = self._tail[kind]
            large = length > (self.page_size - _HDR - _SLOT) >> 2 and (tail is None or tail.room() < length)
            if parts is not None and not large:
                data, parts = b"".join(parts), None
            elif large and parts is None and type(data) is bytes:
                parts = (data,)
            cont_pages: list[_Page] = []
            if large:
                count = self._continuation_count(length)
                if 4 * count > self.page_size - _HDR - _SLOT:
                    raise StorageError(f"message {key} of {length} bytes exceeds the largest message "
                                       f"pages of {self.page_size} bytes can hold", key=key)
                record = struct.pack(f"<{count}I", *range(count))   # sized now, filled below
            else:
                record = data
            needs_page = tail is None or tail.room() < len(record)
            self._ensure_room((count if large else 0) + (1 if needs_page else 0),
                              length + _PUT_OVERHEAD if persistent else 0)
            try:
                # interned and already logged (the usual case): no call; else the interning methods
                dest_id = self._name_ids.get(message.destination)
                if dest_id is None or (persistent and dest_id not in self._durable_names):
                    dest_id = self._name_id(message.destination, persistent)
                refset_id = self._refset_ids.get(refs)
                if refset_id is None or (persistent and refset_id not in self._durable_refsets):
                    refset_id = self._refset_id(refs, persistent)
                if large:
                    ps = self.page_size
                    if parts is not None and persistent:
                        # a persistent message's pages are views of its own bytes (immutable: nothing
                        # copied, no fresh memory), but for a page that spans two parts; the checkpoint
                        # writes them from there and then drops them
                        for image in _page_images(parts, ps, count):
                            cont_pages.append(self._new_page(kind, cont=True, buf=image))
                    else:
                        whole = data if parts is None else b"".join(parts)
                        for i in range(count):
                            page = self._new_page(kind, cont=True)
                            chunk = whole[i * ps:(i + 1) * ps]
                            self._resident(page)[:len(chunk)] = chunk
                            cont_pages.append(page)
                            if kind == NON_PERSISTENT:
                                self._np_unwritten[page.number] = page
                    record = struct.pack(f"<{count}I", *(p.number for p in cont_pages))
                if needs_page or tail is None:
                    if tail is not None:
                        self._tail[kind] = None
                        self._seal(tail)
                    tail = self._new_page(kind)
                    self._tail[kind] = tail
                flags = (fmt.FLAG_PERSISTENT if persistent else 0) | (fmt.FLAG_LARGE if large else 0)
                slot_index, slot_body = self._put_record(tail, key, message.seq, record, length, dest_id,
                                                         refset_id, flags, _crc_of(data, parts))
                if persistent:
                    self._dirty.add(tail.number)
                    if parts is not None:
                        # logged from the message's own bytes: the frame's pieces, never joined
                        self._log_pieces(fmt.F_PUT, (fmt.encode_put_head(tail.number, slot_index, slot_body,
                                                                         [p.number for p in cont_pages]),
                                                     *parts), True)
                    else:
                        self._log(fmt.F_PUT, fmt.encode_put(tail.number, slot_index, slot_body,
                                                            [p.number for p in cont_pages], data), True)
            except OSError as exc:
                raise self._fail(exc) from exc
            # the interned refset tuple, not a copy per message: most messages keep theirs until they go
            entry = _Entry(message.seq, tail.number, slot_index, self._refsets[refset_id], refset_id, persistent,
                           length, large)
            self._add_entry(key, entry)
            self._bytes_used += length
            # bounded memory: log frames, and sealed non-persistent pages (paging: those are written out
            # so that they leave memory), go to the OS once about a MiB of them waits
            if self.wal.buffered > _AUTO_FLUSH_BYTES or \
                    len(self._np_unwritten) * self.page_size > _AUTO_FLUSH_BYTES:
                try:
                    self._flush_locked()
                except StorageError:
                    pass     # the message is held; the device is in fault now and its barrier says so

    def write_parts(self, message: StoredMessage, parts: tuple[bytes, ...], queues: Sequence[str]) -> None:
        self.write(message, queues, parts=parts)

    def remove(self, key: int, queue: str) -> None:
        with self._lock:
            if not self._open or self.read_only:
                self._check_writable()
            entry = self._index.get(key)
            if entry is None:
                raise KeyError(key)
            refs = entry.refs
            if len(refs) == 1 and refs[0] == queue:
                remaining: tuple = ()        # the usual case: the last reference
            else:
                left = list(refs)
                try:
                    left.remove(queue)
                except ValueError:
                    raise KeyError(f"message {key} has no reference for {queue!r}") from None
                remaining = tuple(left)
            if entry.persistent:
                self._log(fmt.F_REMOVE, fmt.KEY_NAME.pack(key, self._name_ids[queue]), True)
            self._drop_reference(key, entry, remaining, queue)

    def add_reference(self, key: int, queue: str) -> None:
        with self._lock:
            self._check_writable()
            entry = self._index.get(key)
            if entry is None:
                raise KeyError(key)
            if entry.persistent:
                qid = self._name_id(queue, True)
                self._log(fmt.F_ADDREF, fmt.KEY_NAME.pack(key, qid), True)
            else:
                self._name_id(queue, False)
            self._add_reference(key, entry, queue)

    def record_delivery(self, key: int, queue: str, count: int) -> None:
        """Message ``key`` went to a consumer of ``queue`` for the ``count``-th time (persistent ones
        count).  Noted only — this runs for every such delivery — and taken by the next flush or
        checkpoint, which keeps the counts of messages still held and logs them in one DELIVERED frame;
        a message acknowledged before then costs nothing more (its note goes with its reference)."""
        with self._lock:
            self._unlogged_deliveries[(key, queue)] = count

    def _take_deliveries(self) -> dict[tuple[int, str], int]:
        """The counts noted since the last flush, for persistent messages still owed to that queue, moved
        into the table checkpoints keep."""
        pending, self._unlogged_deliveries = self._unlogged_deliveries, {}
        index, table = self._index, self._deliveries
        kept = {}
        for (key, queue), count in pending.items():
            entry = index.get(key)
            if entry is not None and entry.persistent and queue in entry.refs:
                table.setdefault(key, {})[queue] = count
                kept[(key, queue)] = count
        return kept

    def _log_deliveries(self) -> None:
        kept = self._take_deliveries()
        if kept and self._logging and not self.read_only:
            pack, ids = fmt.DELIVERED.pack, self._name_ids
            self._log(fmt.F_DELIVERED, b"".join([pack(key, ids[queue], count)
                                                 for (key, queue), count in kept.items()]), True)

    def deliveries(self, key: int) -> dict[str, int]:
        """Queue -> how many times message ``key`` was delivered from it, as recovered or taken by a
        flush (the broker asks after a restart, and for messages it reads back from disk)."""
        with self._lock:
            return dict(self._deliveries.get(key, ()))

    def put_meta(self, key: str, value: bytes | None) -> None:
        with self._lock:
            self._check_writable()
            self._log(fmt.F_META, fmt.encode_meta_record(key, value), True)
            if value is None:
                self._catalog.pop(key, None)
            else:
                self._catalog[key] = bytes(value)

    def iter_meta(self) -> Iterable[tuple[str, bytes]]:
        with self._lock:
            self._check_open()
            return sorted(self._catalog.items())

    def flush(self) -> None:
        """Hand buffered log frames and sealed non-persistent pages to the OS.  In fault: nothing (the
        repair's checkpoint records the state); a failure here puts the device in fault and raises."""
        with self._lock:
            self._check_open()
            if self.read_only or self._fault is not None:
                return
            self._flush_locked()
        if self._log_bytes > 4 * self.checkpoint_bytes and self._sync_lock.acquire(blocking=False):
            # nobody syncs (policy "never"): bound the log here rather than let it grow forever
            try:
                self._checkpoint_locked()
            except StorageError as exc:
                log.error("checkpoint of file device %r failed, retried later: %s", self.name, exc.message)
            finally:
                self._sync_lock.release()

    def _flush_locked(self) -> None:
        if self._unlogged_deliveries:
            self._log_deliveries()
        try:
            self.wal.flush()
            if self._np_unwritten:
                ps = self.page_size
                for number, page in list(self._np_unwritten.items()):
                    if not page.cont and not page.on_disk:
                        self._write_page_header(page)
                    self.pf.write_at(number * ps, self._resident(page))
                    page.on_disk = True
                    page.buf = None
                    del self._np_unwritten[number]
        except OSError as exc:
            raise self._fail(exc, "writing to disk") from exc
