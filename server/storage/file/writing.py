"""The write path of an open file store: messages, references, delivery counts and catalog records in,
and ``flush`` handing them to the OS (spec/storage.md §3).

A write reserves everything it needs first (pages inside ``max_bytes``, disk space for pages and log),
so a refusal changes nothing and the device stays in service; only a failing system call after that puts
the device in fault.  Persistent changes are logged (PUT, REMOVE, ADDREF, META, DELIVERED frames);
non-persistent messages only fill non-persistent pages, which ``flush`` writes out once sealed.
"""
from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from pymq.errors import StorageError

from ..device import Allocation, StoredMessage
from ..page_alloc import NON_PERSISTENT, PERSISTENT
from . import format as fmt
from .crc import crc32c
from .fileio import is_no_space
from .index import Entry
from .pages import HDR, SLOT, Page
from .state import OpenStore, describe
from .status import StoreStatus

_OPEN = StoreStatus.OPEN
_CLOSED = StoreStatus.CLOSED

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


class WritePath:
    """Writes, removals, references, delivery counts, catalog records and ``flush`` of an open store."""

    __slots__ = ("store", "pages", "index", "names", "log")

    def __init__(self, store: OpenStore) -> None:
        self.store = store
        self.pages = store.pages
        self.index = store.index
        self.names = store.names
        self.log = store.log

    def _ensure_room(self, pages: int, log_bytes: int = 0) -> None:
        """Refuse (StorageError, a device error) unless ``pages`` more pages fit ``max_bytes`` and the
        disk holds them and ``log_bytes`` more log: the space is reserved now, so writing it later
        cannot fail for lack of space."""
        store = self.store
        alloc = self.pages.alloc
        if not store.headroom.held and self._needs_new_space(pages, log_bytes) and \
                not store.headroom.available():
            # new disk space only while the headroom a checkpoint needs is held (headroom.py)
            store.refused()
            store.space_refused = True
            raise StorageError(f"file device {store.name!r} is full: the disk under {store.directory} has no room "
                               f"beyond the headroom its checkpoints need", device=store.name)
        if store.max_bytes is not None:
            used = alloc.page_count - alloc.free_count
            if (used + pages) * store.page_size > store.max_bytes:
                store.refused()
                store.space_refused = True
                raise StorageError(f"file device {store.name!r} is full ({store.max_bytes} bytes)",
                                   device=store.name, limit=store.max_bytes)
        try:
            if self.pages.punched:
                self.pages.fill_for(pages)
            if pages > alloc.free_count:
                store.page_file.reserve(alloc.page_count + pages - alloc.free_count)
            if log_bytes:
                log = self.log
                (log.segment or log.current).reserve(log_bytes + _LOG_HEADROOM)    # (``current``: not open)
        except OSError as exc:
            store.refused()
            if is_no_space(exc):
                store.space_refused = True
                raise StorageError(f"file device {store.name!r} is full: the disk under {store.directory} has "
                                   f"no room ({describe(exc)})", device=store.name) from None
            raise store.fail(exc, "reserving disk space") from exc

    def _needs_new_space(self, pages: int, log_bytes: int) -> bool:
        """Whether ``pages`` more pages and ``log_bytes`` more log need disk space not yet reserved."""
        alloc, pf, seg = self.pages.alloc, self.store.pf, self.log.segment
        if self.pages.punched_among(pages):
            return True
        if pages > alloc.free_count and (pf is None or pf.reserved is None or
                                         (alloc.page_count + pages - alloc.free_count) * self.store.page_size
                                         > pf.reserved):
            return True
        return bool(log_bytes) and (seg is None or seg.reserved is None or
                                    seg.size + log_bytes + _LOG_HEADROOM > seg.reserved)

    def allocate(self, name: str, size: int, persistent: bool) -> Allocation:
        """Refuse now (StorageError) what ``write`` would refuse for lack of room or a fault; for a
        persistent message the log space of its PUT is reserved too (the holding store writes it
        behind, spec/storage.md §9)."""
        if persistent:
            self.check_room(size)
        else:
            store = self.store
            with store.lock:
                store.check_accepting()
                pages = 1 + (store.continuation_count(size) if size > store.inline_max() else 0)
                self._ensure_room(pages, 0)
        return Allocation(name, size, persistent)

    def check_room(self, size: int) -> None:
        """``allocate`` for a persistent message of ``size`` bytes without the Allocation: the holding
        store asks this for every persistent message it writes behind (spec/storage.md §9).

        When everything is already reserved — the log segment holds room for this PUT and the headroom
        past what was appended, a free page or a reserved one at the end of the page file, ``max_bytes``
        not reached, no fault — the answer is yes without a system call or a reservation: the same
        conditions ``_ensure_room`` tests, read in one place. Otherwise the full check runs (and
        reserves, or refuses with StorageError, changing nothing)."""
        store = self.store
        with store.lock:
            wal, pf, alloc = self.log.segment, store.pf, self.pages.alloc
            ps = store.page_size
            if store.status is _OPEN and not store.read_only and wal is not None and \
                    pf is not None and size <= (ps - HDR - SLOT) >> 2 and not self.pages.punched:
                log_reserved, pages_reserved = wal.reserved, pf.reserved
                if log_reserved is not None and pages_reserved is not None and \
                        wal.size + size + _PUT_OVERHEAD + _LOG_HEADROOM <= log_reserved:
                    free = alloc.free_count
                    used_after = alloc.page_count - free + 1
                    if (free or used_after * ps <= pages_reserved) and \
                            (store.max_bytes is None or used_after * ps <= store.max_bytes):
                        return
            store.check_accepting()
            pages = 1 + (store.continuation_count(size) if size > store.inline_max() else 0)
            self._ensure_room(pages, size + _PUT_OVERHEAD)

    def write(self, message: StoredMessage, queues: Sequence[str], parts: tuple[bytes, ...] | None = None) -> None:
        """Store ``message`` with a reference for each of ``queues``.  ``parts``: the message bytes as
        pieces whose concatenation they are (``message.data`` is then not read): a large message is kept
        and logged from them, never joined (the holding store hands a bulk SEND's stored form over this
        way: its header block, the SEND's own body, the NUL); a small one is joined."""
        store = self.store
        with store.lock:
            if store.status is not _OPEN or store.read_only:
                store.check_accepting()
            key = message.key
            index = self.index
            if key in index:
                raise StorageError(f"message {key} is already held", key=key)
            if not queues:
                raise StorageError(f"message {key} written without a queue", key=key)
            pages, names = self.pages, self.names
            ps = store.page_size
            persistent = bool(message.persistent)
            kind = PERSISTENT if persistent else NON_PERSISTENT
            data = message.data if parts is None else b""
            length = len(data) if parts is None else sum(len(p) for p in parts)
            refs = tuple(queues)
            # room first (pages, disk space, log space), so a refusal changes nothing
            tail = pages.tail[kind]
            large = length > (ps - HDR - SLOT) >> 2 and (tail is None or tail.room() < length)
            if parts is not None and not large:
                data, parts = b"".join(parts), None
            elif large and parts is None and type(data) is bytes:
                parts = (data,)
            cont_pages: list[Page] = []
            if large:
                count = store.continuation_count(length)
                if 4 * count > ps - HDR - SLOT:
                    raise StorageError(f"message {key} of {length} bytes exceeds the largest message "
                                       f"pages of {ps} bytes can hold", key=key)
                record = struct.pack(f"<{count}I", *range(count))   # sized now, filled below
            else:
                record = data
            needs_page = tail is None or tail.room() < len(record)
            self._ensure_room((count if large else 0) + (1 if needs_page else 0),
                              length + _PUT_OVERHEAD if persistent else 0)
            try:
                # interned and already logged (the usual case): no call; else the interning methods
                dest_id = names.ids.get(message.destination)
                if dest_id is None or (persistent and dest_id not in names.durable_names):
                    dest_id = names.name_id(message.destination, persistent)
                refset_id = names.refset_ids.get(refs)
                if refset_id is None or (persistent and refset_id not in names.durable_refsets):
                    refset_id = names.refset_id(refs, persistent)
                if large:
                    if parts is not None and persistent:
                        # a persistent message's pages are views of its own bytes (immutable: nothing
                        # copied, no fresh memory), but for a page that spans two parts; the checkpoint
                        # writes them from there and then drops them
                        for image in _page_images(parts, ps, count):
                            cont_pages.append(pages.new_page(kind, cont=True, buf=image))
                    else:
                        whole = data if parts is None else b"".join(parts)
                        for i in range(count):
                            page = pages.new_page(kind, cont=True)
                            chunk = whole[i * ps:(i + 1) * ps]
                            pages.resident(page)[:len(chunk)] = chunk
                            cont_pages.append(page)
                            if kind == NON_PERSISTENT:
                                pages.np_unwritten[page.number] = page
                    record = struct.pack(f"<{count}I", *(p.number for p in cont_pages))
                if needs_page or tail is None:
                    if tail is not None:
                        pages.tail[kind] = None
                        pages.seal(tail)
                    tail = pages.new_page(kind)
                    pages.tail[kind] = tail
                flags = (fmt.FLAG_PERSISTENT if persistent else 0) | (fmt.FLAG_LARGE if large else 0)
                slot_index, slot_body = pages.put_record(tail, key, message.seq, record, length, dest_id,
                                                         refset_id, flags, _crc_of(data, parts))
                if persistent:
                    pages.dirty.add(tail.number)
                    if parts is not None:
                        # logged from the message's own bytes: the frame's pieces, never joined
                        self.log.append_pieces(fmt.F_PUT, (fmt.encode_put_head(tail.number, slot_index, slot_body,
                                                                               [p.number for p in cont_pages]),
                                                           *parts), True)
                    else:
                        self.log.append(fmt.F_PUT, fmt.encode_put(tail.number, slot_index, slot_body,
                                                                  [p.number for p in cont_pages], data), True)
            except OSError as exc:
                raise store.fail(exc) from exc
            # the interned refset tuple, not a copy per message: most messages keep theirs until they go
            index.add(key, Entry(message.seq, tail.number, slot_index, names.refsets[refset_id], refset_id,
                                 persistent, length, large))
            # bounded memory: log frames, and sealed non-persistent pages (paging: those are written out
            # so that they leave memory), go to the OS once about a MiB of them waits (an open store has a
            # segment: its status was checked above)
            seg = self.log.segment
            if seg is not None and seg.buffered > _AUTO_FLUSH_BYTES or \
                    len(pages.np_unwritten) * ps > _AUTO_FLUSH_BYTES:
                try:
                    self.flush_locked()
                except StorageError:
                    pass     # the message is held; the device is in fault now and its barrier says so

    def remove(self, key: int, queue: str) -> None:
        store = self.store
        with store.lock:
            if store.status is _CLOSED or store.read_only:
                store.check_writable()
            # the index changes first (KeyError, nothing changed, if not owed): appending the REMOVE frame
            # only buffers it, so the two happen together under the lock
            if self.index.remove(key, queue):
                self.log.append(fmt.F_REMOVE, fmt.KEY_NAME.pack(key, self.names.ids[queue]), True)

    def add_reference(self, key: int, queue: str) -> None:
        store = self.store
        with store.lock:
            store.check_writable()
            entry = self.index.take(key)
            if entry is None:
                raise KeyError(key)
            if entry.persistent:
                qid = self.names.name_id(queue, True)
                self.log.append(fmt.F_ADDREF, fmt.KEY_NAME.pack(key, qid), True)
            else:
                self.names.name_id(queue, False)
            self.index.add_reference(key, entry, queue)

    def record_delivery(self, key: int, queue: str, count: int) -> None:
        """Message ``key`` went to a consumer of ``queue`` for the ``count``-th time (persistent ones
        count).  Noted only — this runs for every such delivery — and taken by the next flush or
        checkpoint, which keeps the counts of messages still held and logs them in one DELIVERED frame;
        a message acknowledged before then costs nothing more (its note goes with its reference)."""
        with self.store.lock:
            self.index.unlogged[(key, queue)] = count        # (index.note_delivery, without the call)

    def log_deliveries(self) -> None:
        kept = self.index.take_deliveries()
        if kept and self.log.logging and not self.store.read_only:
            pack, ids = fmt.DELIVERED.pack, self.names.ids
            self.log.append(fmt.F_DELIVERED, b"".join([pack(key, ids[queue], count)
                                                       for (key, queue), count in kept.items()]), True)

    def deliveries(self, key: int) -> dict[str, int]:
        """Queue -> how many times message ``key`` was delivered from it, as recovered or taken by a
        flush (the broker asks after a restart, and for messages it reads back from disk)."""
        with self.store.lock:
            return dict(self.index.deliveries.get(key, ()))  # (index.delivery_counts, without the call)

    def put_meta(self, key: str, value: bytes | None) -> None:
        store = self.store
        with store.lock:
            store.check_writable()
            self.log.append(fmt.F_META, fmt.encode_meta_record(key, value), True)
            if value is None:
                store.catalog.pop(key, None)
            else:
                store.catalog[key] = bytes(value)

    def iter_meta(self) -> Iterable[tuple[str, bytes]]:
        store = self.store
        with store.lock:
            store.check_open()
            return sorted(store.catalog.items())

    def flush(self) -> None:
        """Hand buffered log frames and sealed non-persistent pages to the OS.  In fault: nothing (the
        repair's checkpoint records the state); a failure here puts the device in fault and raises."""
        store = self.store
        with store.lock:
            store.check_open()
            if store.read_only or store.fault is not None:
                return
            self.flush_locked()

    def flush_locked(self) -> None:
        if self.index.unlogged:
            self.log_deliveries()
        try:
            self.log.current.flush()
            if self.pages.np_unwritten:
                self.pages.write_out_non_persistent()
        except OSError as exc:
            raise self.store.fail(exc, "writing to disk") from exc
