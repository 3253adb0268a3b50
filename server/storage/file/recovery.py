"""Recovery of a file store (spec/storage.md §2): the store as the last checkpoint and the log's committed
prefix left it.

Reads the newest valid meta page and its checkpoint, then only the header and slot directory of each
persistent page (live slots per the checkpoint's bitmap), never the message bytes; non-persistent pages
become free unread (seed 002); then replays the log's committed units through the same state changes
the write path makes (``index.py``).  ``recover`` then yields the persistent messages in (seq, key)
order, reading each page image once or so.
"""
from __future__ import annotations

import gc
import struct
import time
from array import array
from collections.abc import Iterator

from pymq.errors import StorageError

from ..device import StoredMessage
from ..page_alloc import FREE, PERSISTENT, PageAllocator
from . import checkpoint as ckpt
from . import format as fmt
from .checkpointing import Checkpointer
from .crc import crc32c
from .index import Entry, pack_place
from .pagefile import Meta, PageFile
from .pages import HDR, SLOT, Page
from .state import OpenStore, log
from .status import StoreStatus
from .wal import list_segments, read_frames, segment_path


class Recovery:
    """Creating a store, opening an existing one, and ``recover``."""

    __slots__ = ("store", "checkpointer")

    def __init__(self, store: OpenStore, checkpointer: Checkpointer) -> None:
        self.store = store
        self.checkpointer = checkpointer

    def create(self, path: str) -> None:
        """A new store: the page file, the first log segment and the first checkpoint."""
        store = self.store
        store.pf = PageFile(path, store.page_size, fsync=store.fsync, io=store.io)
        store.pf.create()
        store.pages.alloc = PageAllocator(fmt.RESERVED_PAGES)
        store.log.start(0, 0)
        store.sync_dir()
        store.move(StoreStatus.OPEN)
        self.checkpointer.checkpoint_locked()

    def open_existing(self, path: str) -> None:
        # rebuilding the index creates a million objects and no cycles: the cyclic GC only slows it
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._open_existing(path)
        finally:
            if collecting:
                gc.enable()

    def _open_existing(self, path: str) -> None:
        store = self.store
        t0 = time.perf_counter()
        store.pf = pf = PageFile(path, store.page_size, fsync=store.fsync, read_only=store.read_only, io=store.io)
        pf.open()
        store.page_size = pf.page_size
        meta = pf.read_meta()
        if meta is None:
            if pf.never_checkpointed() and not store.read_only:
                # created, then killed before its first checkpoint: nothing was ever acknowledged
                pf.close()
                store.io.unlink(path)
                for number in list_segments(store.directory):
                    store.io.unlink(segment_path(store.directory, number))
                self.create(path)
                return
            raise StorageError(f"{path}: no valid meta page", path=path)
        payload, store.pages.ckpt_pages = pf.read_checkpoint(meta)
        state = ckpt.decode(payload)
        store.generation = meta.generation
        store.pages.alloc = PageAllocator.from_table(state.table, fmt.RESERVED_PAGES)
        names = store.names
        names.load(state.names, state.refsets, state.next_name, state.next_refset)
        store.catalog = dict(state.catalog)
        index = store.index
        for (key, name_id), count in state.deliveries.items():
            index.deliveries.setdefault(key, {})[names.names[name_id]] = count
        changed = {key: tuple(names.names[i] for i in ids) for key, ids in state.refs.items()}
        t1 = time.perf_counter()
        self._load_directories(state, changed)
        t2 = time.perf_counter()
        store.pages.tail[PERSISTENT] = store.pages.pages.get(state.tail)
        frames = self._replay(meta)
        t3 = time.perf_counter()
        self._sweep_unreferenced()
        store.figures.recovery = {"checkpoint_s": t1 - t0, "directories_s": t2 - t1, "replay_s": t3 - t2,
                                  "frames_replayed": frames, "pages_read": len(state.pages)}
        existing = list_segments(store.directory)
        store.log.next_number = max([meta.wal_segment, *existing]) + 1
        if pf.allocated() + store.page_size <= pf.size() and not store.read_only:
            # the file has holes (free pages punched by the last run, under space pressure): punch every free
            # page, so that each one is known to be a hole (filled again before it is taken)
            try:
                store.pages.punch_free()
            except OSError:
                store.pages.punched = set(store.pages.alloc.pages_of(FREE))    # holes or not: filled first
        store.move(StoreStatus.OPEN)
        if not store.read_only:
            store.headroom.find()
            try:
                # the log restarts clean, in a chain of its own; pages freed by the replay are durable free
                self.checkpointer.checkpoint_locked(new_chain=True)
            except (OSError, StorageError) as exc:
                # a full (or failing) disk: what was recovered is served, nothing new is taken until a
                # repair's checkpoint succeeds (the store retries it)
                store.fail(exc, "writing after recovery")
                log.warning("file device %r recovered %d messages READ-ONLY: %s; it serves them and refuses "
                            "new messages until the disk can be written again", store.name, len(index),
                            store.fault)
        store.figures.recovery["total_s"] = time.perf_counter() - t0

    def _load_directories(self, state: ckpt.CheckpointState, changed: dict[int, tuple[str, ...]]) -> None:
        """Rebuild the index from each persistent page's header and live slots (no message bytes): the
        messages whose references never changed straight into the index's cold arrays, the others hot."""
        store = self.store
        ps = store.page_size
        pages, index = store.pages, store.index
        refsets = store.names.refsets
        read_at = store.page_file.read_at
        slot_struct = fmt.SLOT
        body_size = fmt.SLOT_BODY.size
        keys, places, refset_ids, lengths, seqs = array("Q"), array("Q"), array("I"), array("I"), array("Q")
        hot: list[tuple[int, Entry]] = []
        for number, slots, data_start, bitmap in state.pages:
            raw = read_at(number * ps, HDR + SLOT * slots)
            head = fmt.check_sealed(raw, fmt.PAGE_HEADER.size)
            if head is None:
                raise StorageError(f"page {number}: header is corrupt", page=number)
            magic, kind, page_no, generation = fmt.PAGE_HEADER.unpack(head)
            if magic != fmt.PAGE_MAGIC or kind != PERSISTENT or page_no != number:
                raise StorageError(f"page {number}: not the persistent page the checkpoint names", page=number)
            page = Page(number, PERSISTENT, ps, generation)
            page.slots = page.disk_slots = slots
            page.data_start = page.disk_data_start = data_start
            page.live = bytearray(bitmap)
            page.on_disk = True
            pages.pages[number] = page
            live = 0
            for slot in range(slots):
                if not bitmap[slot >> 3] & (1 << (slot & 7)):
                    continue
                at = HDR + SLOT * slot
                fields = slot_struct.unpack_from(raw, at)
                if fields[9] != crc32c(raw[at:at + body_size]):
                    raise StorageError(f"page {number} slot {slot}: directory entry is corrupt",
                                       page=number, slot=slot)
                key, seq, refset_id, flags = fields[0], fields[1], fields[6], fields[7]
                large = bool(flags & fmt.FLAG_LARGE)
                if key in changed:
                    hot.append((key, Entry(seq, number, slot, changed[key], refset_id, True, fields[4], large)))
                else:
                    keys.append(key)
                    places.append(pack_place(number, slot, True, large))
                    refset_ids.append(refset_id)
                    lengths.append(fields[4])
                    seqs.append(seq)
                    if refset_id not in refsets:
                        raise StorageError(f"page {number} slot {slot}: unknown reference set {refset_id}",
                                           page=number, slot=slot)
                if flags & fmt.FLAG_LARGE:
                    for cont in pages.continuation_pages(page, fields):
                        cpage = Page(cont, PERSISTENT, ps, generation, cont=True)
                        cpage.on_disk = True
                        pages.pages[cont] = cpage
                live += 1
            page.live_count = live
        index.load_cold(keys, places, refset_ids, lengths, seqs)
        for key, entry in hot:
            index.changed.add(key)          # first: a changed entry never folds into the cold arrays
            index.add(key, entry)

    def _replay(self, meta: Meta) -> int:
        """Apply the log's committed prefix; returns the number of frames applied."""
        store = self.store
        unit: list = []
        applied = 0
        for frame in read_frames(store.directory, meta.wal_segment, meta.wal_salt, store.page_size,
                                 store.page_file.file_id):
            unit.append(frame)
            if frame.commit:
                for item in unit:
                    self._apply(item.ftype, item.payload)
                applied += len(unit)
                unit = []
        return applied

    def _apply(self, ftype: int, payload: bytes) -> None:
        store = self.store
        index, names = store.index, store.names
        if ftype == fmt.F_PUT:
            self._apply_put(payload)
        elif ftype == fmt.F_REMOVE:
            key, qid = fmt.KEY_NAME.unpack(payload)
            queue = names.names.get(qid)
            try:
                if queue is None:
                    raise KeyError(qid)
                index.remove(key, queue)      # what the write path did: the same call, hot or cold
            except KeyError:
                raise StorageError(f"log removes message {key} for name {qid}, which recovery does not "
                                   f"hold") from None
        elif ftype == fmt.F_ADDREF:
            key, qid = fmt.KEY_NAME.unpack(payload)
            entry = index.take(key)
            queue = names.names.get(qid)
            if entry is None or queue is None:
                raise StorageError(f"log names message {key} or name {qid} that recovery does not hold")
            index.add_reference(key, entry, queue)
        elif ftype == fmt.F_NAME:
            names.replay_name(fmt.U32.unpack_from(payload, 0)[0], payload[4:].decode())
        elif ftype == fmt.F_REFSET:
            names.replay_refset(*fmt.decode_refset(payload))
        elif ftype == fmt.F_DELIVERED:
            for key, qid, count in fmt.DELIVERED.iter_unpack(payload):
                queue = names.names.get(qid)
                if queue is not None:
                    index.replay_delivery(key, queue, count)
        elif ftype == fmt.F_UNIT_END:
            pass                              # its COMMIT flag applied the unit's frames; nothing of its own
        elif ftype == fmt.F_META:
            key, value = fmt.decode_meta_record(payload)
            if value is None:
                store.catalog.pop(key, None)
            else:
                store.catalog[key] = value
        else:
            raise StorageError(f"log frame of unknown type {ftype}")

    def _apply_put(self, payload: bytes) -> None:
        store = self.store
        pages = store.pages
        number, slot, fields, cont, data = fmt.decode_put(payload)
        key, seq, offset, rlen, length, dest_id, refset_id, flags, data_crc = fields
        if crc32c(data) != data_crc or len(data) != length:
            raise StorageError(f"log record of message {key} does not match its checksum")
        page = pages.pages.get(number)
        if page is None:
            page = pages.claim_page(number, PERSISTENT)
        else:
            pages.resident(page)
            pages.dirty.add(number)
        tail = pages.tail[PERSISTENT]
        if tail is not page:
            pages.tail[PERSISTENT] = page
            if tail is not None:
                pages.seal(tail)
        ps = store.page_size
        for i, cnum in enumerate(cont):
            cpage = pages.claim_page(cnum, PERSISTENT, cont=True)
            chunk = data[i * ps:(i + 1) * ps]
            pages.resident(cpage)[:len(chunk)] = chunk
        record = struct.pack(f"<{len(cont)}I", *cont) if flags & fmt.FLAG_LARGE else data
        if slot != page.slots or offset != page.data_start - len(record) or rlen != len(record):
            raise StorageError(f"log places message {key} at page {number} slot {slot}, "
                               f"which does not follow the page's state")
        pages.put_record(page, key, seq, record, length, dest_id, refset_id, flags, data_crc)
        store.index.add(key, Entry(seq, number, slot, store.names.refsets[refset_id], refset_id, True, length,
                                   bool(flags & fmt.FLAG_LARGE)))

    def _sweep_unreferenced(self) -> None:
        """Persistent pages that nothing references (a crash between freeing steps) become free."""
        pages = self.store.pages
        referenced = set(pages.pages) | set(pages.ckpt_pages)
        for number in pages.alloc.pages_of(PERSISTENT):
            if number not in referenced:
                pages.alloc.free(number)
        tail = pages.tail[PERSISTENT]
        for page in list(pages.pages.values()):
            if not page.cont and page.live_count == 0 and tail is not page:
                pages.free_page(page)

    def recover(self) -> Iterator[tuple[StoredMessage, list[str]]]:
        store = self.store
        with store.lock:
            store.check_open()
            order = store.index.persistent_order()
        # (seq, key) order visits a page's messages close together: read each page whole, once or so
        images: dict[int, bytes] = {}
        index, pages = store.index, store.pages
        ps = store.page_size
        for _seq, key in order:
            with store.lock:
                entry = index.get(key)
                if entry is None:
                    continue
                page = pages.pages[entry.page]
                if page.buf is None:
                    image = images.get(page.number)
                    if image is None:
                        if len(images) >= 64:
                            images.pop(next(iter(images)))
                        image = images[page.number] = store.page_file.read_at(page.number * ps, ps)
                    message = self._read_image(key, entry, image)
                else:
                    message = index.read(key)
                refs = list(entry.refs)
            yield message, refs

    def _read_image(self, key: int, entry: Entry, image: bytes) -> StoredMessage:
        at = HDR + SLOT * entry.slot
        fields = fmt.SLOT.unpack_from(image, at)
        if fields[9] != crc32c(image[at:at + fmt.SLOT_BODY.size]) or fields[7] & fmt.FLAG_LARGE:
            return self.store.index.read(key)          # the slow path reports damage / joins pages
        data = image[fields[2]:fields[2] + fields[3]]
        if crc32c(data) != fields[8]:
            return self.store.index.read(key)
        return StoredMessage(key, self.store.names.names[fields[5]], entry.seq, True, data)
