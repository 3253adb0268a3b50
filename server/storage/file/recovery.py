"""The file device's recovery (spec/storage.md §2): the store as the last checkpoint and the log's
committed prefix left it.

Reads the newest valid meta page and its checkpoint, then only the header and slot directory of each
persistent page (live slots per the checkpoint's bitmap), never the message bytes; non-persistent pages
become free unread (seed 002); then replays the log's committed units through the same state changes
the write path makes (``state.py``).  ``recover`` then yields the persistent messages in (seq, key)
order, reading each page image once or so.
"""
from __future__ import annotations

import gc
import os
import struct
import time
from collections.abc import Callable, Iterator

from pymq.errors import StorageError

from ..device import StoredMessage
from ..page_alloc import PERSISTENT, PageAllocator
from . import checkpoint as ckpt
from . import format as fmt
from .crc import crc32c
from .pagefile import Meta, PageFile
from .wal import Segment, list_segments, read_frames, segment_path
from .state import _HDR, _SLOT, DeviceState, _Entry, _Page, log


class Recovery(DeviceState):
    """Opening an existing store, and ``recover``."""

    _create: Callable[[str], None]
    _new_segment: Callable[[int, int], Segment]
    _sync_dir: Callable[[], None]
    _checkpoint_locked: Callable[..., None]
    _fsync: bool

    def _recover_from_disk(self, path: str) -> None:
        # rebuilding the index creates a million objects and no cycles: the cyclic GC only slows it
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._recover_from_disk_inner(path)
        finally:
            if collecting:
                gc.enable()

    def _recover_from_disk_inner(self, path: str) -> None:
        t0 = time.perf_counter()
        self._pf = PageFile(path, self.page_size, fsync=self._fsync, read_only=self.read_only, io=self.io)
        self._pf.open()
        self.page_size = ps = self._pf.page_size
        meta = self._pf.read_meta()
        if meta is None:
            if self._pf.never_checkpointed() and not self.read_only:
                # created, then killed before its first checkpoint: nothing was ever acknowledged
                self._pf.close()
                os.unlink(path)
                for number in list_segments(self.directory):
                    os.unlink(segment_path(self.directory, number))
                self._create(path)
                return
            raise StorageError(f"{path}: no valid meta page", path=path)
        payload, self._ckpt_pages = self._pf.read_checkpoint(meta)
        state = ckpt.decode(payload)
        self._generation = meta.generation
        self._alloc = PageAllocator.from_table(state.table, fmt.RESERVED_PAGES)
        self._names = dict(state.names)
        self._name_ids = {name: nid for nid, name in self._names.items()}
        self._next_name, self._next_refset = state.next_name, state.next_refset
        names = self._names
        self._refsets = {rid: tuple(names[i] for i in ids) for rid, ids in state.refsets.items()}
        self._refset_ids = {refs: rid for rid, refs in self._refsets.items()}
        self._durable_names, self._durable_refsets = set(self._names), set(self._refsets)
        self._catalog = dict(state.catalog)
        for (key, name_id), count in state.deliveries.items():
            self._deliveries.setdefault(key, {})[names[name_id]] = count
        changed = {key: tuple(names[i] for i in ids) for key, ids in state.refs.items()}
        t1 = time.perf_counter()
        self._load_directories(state, changed)
        t2 = time.perf_counter()
        self._tail[PERSISTENT] = self._pages.get(state.tail)
        frames = self._replay(meta)
        t3 = time.perf_counter()
        self._sweep_unreferenced()
        self._last_recovery = {"checkpoint_s": t1 - t0, "directories_s": t2 - t1, "replay_s": t3 - t2,
                               "frames_replayed": frames, "pages_read": len(state.pages)}
        existing = list_segments(self.directory)
        self._next_segment = max([meta.wal_segment, *existing]) + 1
        if not self.read_only:
            try:
                self._new_segment(0, 0)
                self._sync_dir()
                self._checkpoint_locked()   # the log restarts clean; freed non-persistent pages are durable
            except (OSError, StorageError) as exc:
                # a full (or failing) disk: what was recovered is served, nothing new is taken until a
                # repair's checkpoint succeeds (the store retries it)
                self._fail(exc, "writing after recovery")
                log.warning("file device %r recovered %d messages READ-ONLY: %s; it serves them and refuses "
                            "new messages until the disk can be written again", self.name, len(self._index),
                            self._fault)
        self._last_recovery["total_s"] = time.perf_counter() - t0
        del ps

    def _load_directories(self, state: ckpt.CheckpointState, changed: dict[int, tuple]) -> None:
        """Rebuild the index from each persistent page's header and live slots (no message bytes)."""
        ps = self.page_size
        refsets = self._refsets
        read_at = self.pf.read_at
        slot_struct = fmt.SLOT
        body_size = fmt.SLOT_BODY.size
        for number, slots, data_start, bitmap in state.pages:
            raw = read_at(number * ps, _HDR + _SLOT * slots)
            head = fmt.check_sealed(raw, fmt.PAGE_HEADER.size)
            if head is None:
                raise StorageError(f"page {number}: header is corrupt", page=number)
            magic, kind, page_no, generation = fmt.PAGE_HEADER.unpack(head)
            if magic != fmt.PAGE_MAGIC or kind != PERSISTENT or page_no != number:
                raise StorageError(f"page {number}: not the persistent page the checkpoint names", page=number)
            page = _Page(number, PERSISTENT, ps, generation)
            page.slots = page.disk_slots = slots
            page.data_start = page.disk_data_start = data_start
            page.live = bytearray(bitmap)
            page.on_disk = True
            self._pages[number] = page
            live = 0
            for slot in range(slots):
                if not bitmap[slot >> 3] & (1 << (slot & 7)):
                    continue
                at = _HDR + _SLOT * slot
                fields = slot_struct.unpack_from(raw, at)
                if fields[9] != crc32c(raw[at:at + body_size]):
                    raise StorageError(f"page {number} slot {slot}: directory entry is corrupt",
                                       page=number, slot=slot)
                key, seq, refset_id, flags = fields[0], fields[1], fields[6], fields[7]
                refs = changed.get(key) or refsets[refset_id]
                self._add_entry(key, _Entry(seq, number, slot, refs, refset_id, True, fields[4],
                                            bool(flags & fmt.FLAG_LARGE)))
                if key in changed:
                    self._changed_refs.add(key)
                self._bytes_used += fields[4]
                if flags & fmt.FLAG_LARGE:
                    for cont in self._continuation_pages(page, fields):
                        cpage = _Page(cont, PERSISTENT, ps, generation, cont=True)
                        cpage.on_disk = True
                        self._pages[cont] = cpage
                live += 1
            page.live_count = live

    def _replay(self, meta: Meta) -> int:
        """Apply the log's committed prefix; returns the number of frames applied."""
        unit: list = []
        applied = 0
        for frame in read_frames(self.directory, meta.wal_segment, meta.wal_salt, self.page_size,
                                 self.pf.file_id):
            unit.append(frame)
            if frame.commit:
                for item in unit:
                    self._apply(item.ftype, item.payload)
                applied += len(unit)
                unit = []
        return applied

    def _apply(self, ftype: int, payload: bytes) -> None:
        if ftype == fmt.F_PUT:
            self._apply_put(payload)
        elif ftype == fmt.F_REMOVE or ftype == fmt.F_ADDREF:
            key, qid = fmt.KEY_NAME.unpack(payload)
            entry = self._index.get(key)
            queue = self._names.get(qid)
            if entry is None or queue is None:
                raise StorageError(f"log names message {key} or name {qid} that recovery does not hold")
            if ftype == fmt.F_REMOVE:
                refs = list(entry.refs)
                refs.remove(queue)
                self._drop_reference(key, entry, tuple(refs), queue)
            else:
                self._add_reference(key, entry, queue)
        elif ftype == fmt.F_NAME:
            name_id = fmt.U32.unpack_from(payload, 0)[0]
            name = payload[4:].decode()
            self._names[name_id] = name
            self._name_ids[name] = name_id
            self._durable_names.add(name_id)
            self._next_name = max(self._next_name, name_id + 1)
        elif ftype == fmt.F_REFSET:
            refset_id, ids = fmt.decode_refset(payload)
            names = tuple(self._names[i] for i in ids)
            self._refsets[refset_id] = names
            self._refset_ids[names] = refset_id
            self._durable_refsets.add(refset_id)
            self._next_refset = max(self._next_refset, refset_id + 1)
        elif ftype == fmt.F_DELIVERED:
            for key, qid, count in fmt.DELIVERED.iter_unpack(payload):
                entry = self._index.get(key)
                queue = self._names.get(qid)
                if entry is not None and queue is not None and queue in entry.refs:
                    self._deliveries.setdefault(key, {})[queue] = count
        elif ftype == fmt.F_META:
            key, value = fmt.decode_meta_record(payload)
            if value is None:
                self._catalog.pop(key, None)
            else:
                self._catalog[key] = value
        else:
            raise StorageError(f"log frame of unknown type {ftype}")

    def _apply_put(self, payload: bytes) -> None:
        number, slot, fields, cont, data = fmt.decode_put(payload)
        key, seq, offset, rlen, length, dest_id, refset_id, flags, data_crc = fields
        if crc32c(data) != data_crc or len(data) != length:
            raise StorageError(f"log record of message {key} does not match its checksum")
        page = self._pages.get(number)
        if page is None:
            page = self._claim_page(number, PERSISTENT)
        else:
            self._resident(page)
            self._dirty.add(number)
        tail = self._tail[PERSISTENT]
        if tail is not page:
            self._tail[PERSISTENT] = page
            if tail is not None:
                self._seal(tail)
        cont_pages = []
        for i, cnum in enumerate(cont):
            cpage = self._claim_page(cnum, PERSISTENT, cont=True)
            chunk = data[i * self.page_size:(i + 1) * self.page_size]
            self._resident(cpage)[:len(chunk)] = chunk
            cont_pages.append(cpage)
        record = struct.pack(f"<{len(cont)}I", *cont) if flags & fmt.FLAG_LARGE else data
        if slot != page.slots or offset != page.data_start - len(record) or rlen != len(record):
            raise StorageError(f"log places message {key} at page {number} slot {slot}, "
                               f"which does not follow the page's state")
        self._put_record(page, key, seq, record, length, dest_id, refset_id, flags, data_crc)
        self._add_entry(key, _Entry(seq, number, slot, self._refsets[refset_id], refset_id, True, length,
                                    bool(flags & fmt.FLAG_LARGE)))
        self._bytes_used += length

    def _sweep_unreferenced(self) -> None:
        """Persistent pages that nothing references (a crash between freeing steps) become free."""
        referenced = set(self._pages) | set(self._ckpt_pages)
        for number in self._alloc.pages_of(PERSISTENT):
            if number not in referenced:
                self._alloc.free(number)
        for page in list(self._pages.values()):
            if not page.cont and page.live_count == 0 and self._tail[PERSISTENT] is not page:
                self._free_page(page)

    def recover(self) -> Iterator[tuple[StoredMessage, list[str]]]:
        with self._lock:
            self._check_open()
            order = sorted((entry.seq, key) for key, entry in self._index.items() if entry.persistent)
        # (seq, key) order visits a page's messages close together: read each page whole, once or so
        images: dict[int, bytes] = {}
        for _seq, key in order:
            with self._lock:
                entry = self._index.get(key)
                if entry is None:
                    continue
                page = self._pages[entry.page]
                if page.buf is None:
                    image = images.get(page.number)
                    if image is None:
                        if len(images) >= 64:
                            images.pop(next(iter(images)))
                        image = images[page.number] = self.pf.read_at(page.number * self.page_size,
                                                                       self.page_size)
                    message = self._read_image(key, entry, page, image)
                else:
                    message = self._read_locked(key)
                refs = list(entry.refs)
            yield message, refs

    def _read_image(self, key: int, entry: _Entry, page: _Page, image: bytes) -> StoredMessage:
        at = _HDR + _SLOT * entry.slot
        fields = fmt.SLOT.unpack_from(image, at)
        if fields[9] != crc32c(image[at:at + fmt.SLOT_BODY.size]) or fields[7] & fmt.FLAG_LARGE:
            return self._read_locked(key)          # the slow path reports damage / joins pages
        data = image[fields[2]:fields[2] + fields[3]]
        if crc32c(data) != fields[8]:
            return self._read_locked(key)
        return StoredMessage(key, self._names[fields[5]], entry.seq, True, data)
