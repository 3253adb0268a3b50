"""The page store of an open file store: the pages as the store tracks them in memory, and the only code
that takes or gives back a page (through the page allocator, which owns the free list and the end of the
file: LMDB's ``mdb_page_alloc``).

A page holds one kind only (persistent or non-persistent; seed 002).  Each kind has a *tail*, the page
new messages are appended to; a sealed page is freed when empty, and a sealed non-persistent one waits in
``np_unwritten`` until ``flush`` writes it out and drops its bytes from memory.  Persistent pages reach
the page file only at checkpoints, and only their new regions (``dirty_regions``): bytes below a page's
checkpointed watermark are never rewritten while it is allocated (spec/storage.md §3).  The slot layout is
``format.py``'s.
"""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from pymq.errors import StorageError

from ..page_alloc import FREE, NON_PERSISTENT, PERSISTENT, PageAllocator
from . import format as fmt
from .crc import crc32c

if TYPE_CHECKING:
    from .state import OpenStore

HDR = fmt.PAGE_HEADER_SIZE
SLOT = fmt.SLOT_SIZE


class Page:
    """A slotted page or a continuation page, as the store tracks it in memory."""

    __slots__ = ("number", "kind", "cont", "buf", "slots", "data_start", "live", "live_count",
                 "disk_slots", "disk_data_start", "on_disk", "generation")

    def __init__(self, number: int, kind: int, page_size: int, generation: int, cont: bool = False,
                 buf: bytearray | memoryview | None = None) -> None:
        self.number = number
        self.kind = kind
        self.cont = cont
        #: the page's bytes while in memory; a persistent continuation page written from a message's own
        #: (immutable) bytes is a view of them, maybe shorter than a page (writing.py, checkpointing.py)
        self.buf = buf
        self.slots = 0
        self.data_start = page_size
        self.live = bytearray()
        self.live_count = 0
        self.disk_slots = 0           # slots already handed to the page file
        self.disk_data_start = page_size
        self.on_disk = False          # header (or, for a continuation page, all of it) written
        self.generation = generation

    def room(self) -> int:
        return self.data_start - (HDR + SLOT * (self.slots + 1))


class PageStore:
    __slots__ = ("store", "alloc", "pages", "tail", "dirty", "np_unwritten", "ckpt_pages", "ckpt_freed", "punched",
                 "reading", "reading_bytes")

    def __init__(self, store: OpenStore) -> None:
        self.store = store
        self.alloc = PageAllocator(fmt.RESERVED_PAGES)
        self.pages: dict[int, Page] = {}
        self.tail: dict[int, Page | None] = {PERSISTENT: None, NON_PERSISTENT: None}
        #: persistent pages with regions the page file lacks
        self.dirty: set[int] = set()
        #: sealed non-persistent pages waiting to be written out (and dropped from memory)
        self.np_unwritten: dict[int, Page] = {}
        #: the pages carrying the last durable checkpoint (freed by the next one)
        self.ckpt_pages: list[int] = []
        self.ckpt_freed = False           # ckpt_pages already freed by a checkpoint that failed
        #: free pages whose disk blocks were given back (holes): filled again before they take bytes
        self.punched: set[int] = set()
        #: the last page read back from the page file while out of memory, and its bytes (``image``): a paged
        #: backlog is read in key order, so its messages come a page at a time; one page of memory at most
        self.reading: Page | None = None
        self.reading_bytes = b""

    # -- taking and giving back pages -----------------------------------------------------------------
    def new_page(self, kind: int, cont: bool = False, buf: memoryview | None = None) -> Page:
        """A page from the allocator, its bytes zero in memory (or ``buf``: a continuation page's view of
        the message bytes it holds)."""
        number = self.alloc.allocate(kind)
        if number in self.punched:
            self._fill(number)
        ps = self.store.page_size
        page = Page(number, kind, ps, self.store.generation, cont, bytearray(ps) if buf is None else buf)
        self.pages[number] = page
        if kind == PERSISTENT:
            self.dirty.add(number)
        return page

    def claim_page(self, number: int, kind: int, cont: bool = False) -> Page:
        """Page ``number`` (recovery replaying a PUT that took it)."""
        self.alloc.claim(number, kind)
        self.punched.discard(number)
        ps = self.store.page_size
        page = Page(number, kind, ps, self.store.generation, cont, bytearray(ps))
        self.pages[number] = page
        if kind == PERSISTENT:
            self.dirty.add(number)
        return page

    def seal(self, page: Page) -> None:
        """The page stops being a tail: free it if empty, else queue a non-persistent one for write-out."""
        if page.live_count == 0:
            self.free_page(page)
        elif page.kind == NON_PERSISTENT:
            self.np_unwritten[page.number] = page

    def free_page(self, page: Page) -> None:
        if page is self.reading:
            self.forget_reading()
        self.alloc.free(page.number)
        del self.pages[page.number]
        self.dirty.discard(page.number)
        self.np_unwritten.pop(page.number, None)
        if self.tail.get(page.kind) is page:
            self.tail[page.kind] = None

    def free_slot(self, page: Page, slot: int, continuation: tuple[int, ...]) -> None:
        """A message's last reference went: its slot dies, its continuation pages are freed, and its page
        too when no live slot is left on it (unless it is a tail)."""
        for number in continuation:
            self.free_page(self.pages[number])
        page.live[slot // 8] &= ~(1 << (slot % 8)) & 0xFF
        page.live_count -= 1
        if page.live_count == 0 and self.tail.get(page.kind) is not page:
            self.free_page(page)

    def drop_empty_tails(self) -> None:
        """A tail with no live slot left is freed (a checkpoint snapshot does this): kept, it would pin its page,
        often the last of the file, and the file could not shrink when everything was consumed. The next
        message takes the lowest free page as its new tail."""
        for kind, page in list(self.tail.items()):
            if page is not None and page.live_count == 0:
                self.tail[kind] = None
                self.free_page(page)

    # -- holes: free pages that give their disk blocks back (spec/storage.md §8) ----------------------------
    def punch_free(self) -> int:
        """Give the disk blocks of every free page back (the disk is short: a free page inside the file
        would otherwise keep them while new log or pages need space). Returns how many were punched now;
        none where the file system has no holes."""
        pf = self.store.page_file
        punched = self.punched
        done = 0
        for number in self.alloc.pages_of(FREE):
            if number in punched:
                continue
            if not pf.punch(number):
                break
            punched.add(number)
            done += 1
        return done

    def fill_for(self, count: int) -> None:
        """Allocate the disk blocks of the punched pages among the next ``count`` pages ``new_page`` hands
        out (OSError, ENOSPC, when the disk has none: nothing taken then)."""
        if not self.punched:
            return
        for number in self.alloc.lowest_free(count):
            if number in self.punched:
                self.store.page_file.fill(number)
                self.punched.discard(number)

    def punched_among(self, count: int) -> bool:
        return bool(self.punched) and any(n in self.punched for n in self.alloc.lowest_free(count))

    def _fill(self, number: int) -> None:
        """A page taken for bytes was punched: its blocks again (what ``fill_for`` did not reach, e.g. a
        checkpoint's own page). A disk with none left leaves it a hole: the write that meets it later fails as
        a full disk does there (a checkpoint retries; spec/storage.md §8)."""
        try:
            self.store.page_file.fill(number)
        except OSError:
            return
        self.punched.discard(number)

    def trimmed(self, end: int) -> None:
        """The page file was cut to ``end`` pages: holes past it are gone with it."""
        if self.punched:
            self.punched = {n for n in self.punched if n < end}

    # -- page bytes -----------------------------------------------------------------------------------
    def resident(self, page: Page) -> bytearray | memoryview:
        buf = page.buf
        if buf is None:
            if page is self.reading:
                self.forget_reading()
            buf = page.buf = self.store.page_file.read_page(page.number)
        return buf

    def image(self, page: Page) -> bytes | bytearray | memoryview:
        """The bytes of slotted ``page`` to read from: its buffer while in memory, else the page read back
        from the page file — once for all the reads of it in a row (the page being read is kept, one at a
        time, until another is read, it is freed or it comes back to memory). A page out of memory does not
        change on disk while it is allocated: every byte of it was written before its buffer went (a
        checkpoint's, or a sealed non-persistent page's write-out), and a write to it makes it resident
        first (``resident``); a freed page's number comes back as a new ``Page``. OSError when the read
        fails (nothing kept then)."""
        buf = page.buf
        if buf is not None:
            return buf
        if page is self.reading:
            return self.reading_bytes
        ps = self.store.page_size
        data = self.store.page_file.read_at(page.number * ps, ps)
        self.reading, self.reading_bytes = page, data
        return data

    def forget_reading(self) -> None:
        self.reading, self.reading_bytes = None, b""

    def write_header(self, page: Page) -> None:
        self.resident(page)[:HDR] = fmt.encode_page_header(page.kind, page.number, page.generation)

    def put_record(self, page: Page, key: int, seq: int, record: bytes, length: int, dest_id: int,
                   refset_id: int, flags: int, data_crc: int) -> tuple[int, bytes]:
        """Append one slot and its record to ``page`` (in memory); returns the slot and its 44 bytes."""
        buf = page.buf
        if buf is None:
            buf = self.resident(page)     # a tail inherited from a checkpoint starts on disk only
        rlen = len(record)
        offset = page.data_start - rlen
        slot = page.slots
        buf[offset:offset + rlen] = record
        body = fmt.SLOT_BODY.pack(key, seq, offset, rlen, length, dest_id, refset_id, flags, data_crc)
        at = HDR + SLOT * slot
        buf[at:at + SLOT] = fmt.sealed(body)
        page.slots = slot + 1
        page.data_start = offset
        if slot // 8 >= len(page.live):
            page.live.append(0)
        page.live[slot // 8] |= 1 << (slot % 8)
        page.live_count += 1
        return slot, body

    def slot_fields(self, page: Page, slot: int, image: bytes | bytearray | memoryview | None = None) -> tuple:
        """The fields of ``slot`` of ``page`` (read from ``image``, the page's bytes, when the caller has them),
        checked against its crc."""
        at = HDR + SLOT * slot
        raw = (self.image(page) if image is None else image)[at:at + SLOT]
        fields = fmt.SLOT.unpack(raw)
        if fields[9] != crc32c(raw[:fmt.SLOT_BODY.size]):
            self.store.figures.errors += 1
            raise StorageError(f"page {page.number} slot {slot}: directory entry is corrupt",
                               page=page.number, slot=slot)
        return fields

    def record(self, page: Page, fields: tuple, image: bytes | bytearray | memoryview | None = None) -> bytes:
        offset = fields[2]
        return bytes((self.image(page) if image is None else image)[offset:offset + fields[3]])

    def continuation_pages(self, page: Page, fields: tuple,
                           image: bytes | bytearray | memoryview | None = None) -> tuple[int, ...]:
        record = self.record(page, fields, image)
        return struct.unpack(f"<{len(record) // 4}I", record)

    def message(self, page: Page, slot: int) -> tuple[tuple, bytes]:
        """The fields of ``slot`` and the message bytes it points at, both checked against their crcs; the
        page's bytes resolved once for both (``image``: read back at most once when out of memory)."""
        image = self.image(page)
        fields = self.slot_fields(page, slot, image)
        if fields[7] & fmt.FLAG_LARGE:
            chunks = []
            for number in self.continuation_pages(page, fields, image):
                cont = self.pages[number]
                chunks.append(bytes(cont.buf) if cont.buf is not None else self.store.page_file.read_page(number))
            data = b"".join(chunks)[:fields[4]]
        else:
            offset = fields[2]
            data = bytes(image[offset:offset + fields[3]])
        if crc32c(data) != fields[8]:
            self.store.figures.errors += 1
            raise StorageError(f"message {fields[0]}: bytes on page {page.number} are corrupt",
                               key=fields[0], page=page.number)
        return fields, data

    # -- to disk ----------------------------------------------------------------------------------------
    def write_out_non_persistent(self) -> None:
        """Sealed non-persistent pages go to the page file and leave memory (paging); OSError on failure."""
        pf = self.store.page_file
        ps = self.store.page_size
        unwritten = self.np_unwritten
        for number, page in list(unwritten.items()):
            if not page.cont and not page.on_disk:
                self.write_header(page)
            pf.write_at(number * ps, self.resident(page))
            page.on_disk = True
            page.buf = None
            del unwritten[number]

    def dirty_regions(self) -> list[tuple[int, memoryview]]:
        """Every persistent byte range the page file lacks, as views of the pages' own bytes (no copy: a
        checkpoint would otherwise hold every dirty page twice, a quarter of ``max_memory`` more at its peak
        with the default ``checkpoint_bytes``); marks them written.  The views may be written after the
        lock is let go, while the broker thread goes on appending to the same pages: the ranges are final
        (a page's header is written once, its slots and records are appended below ``data_start`` and
        above ``slots``, never rewritten; a removal changes ``live``, not the page's bytes; a page's
        buffer is never resized, and one dropped or freed meanwhile stays alive in its view). A
        continuation page that is a view of a message's own bytes (writing.py) is handed over as it is;
        the part of the page past them is written as zeros."""
        ps = self.store.page_size
        writes: list[tuple[int, memoryview]] = []
        zeros: bytes | None = None
        for number in self.dirty:
            page = self.pages[number]
            base = number * ps
            buf = self.resident(page)
            view = buf if isinstance(buf, memoryview) else memoryview(buf)
            if page.cont:
                writes.append((base, view))
                if len(view) < ps:
                    zeros = zeros if zeros is not None else bytes(ps)
                    writes.append((base + len(view), memoryview(zeros)[len(view):]))
                page.on_disk = True
                continue
            if not page.on_disk:
                self.write_header(page)
                writes.append((base, view[:HDR]))
                page.on_disk = True
            if page.slots > page.disk_slots:
                lo, hi = HDR + SLOT * page.disk_slots, HDR + SLOT * page.slots
                writes.append((base + lo, view[lo:hi]))
                page.disk_slots = page.slots
            if page.data_start < page.disk_data_start:
                writes.append((base + page.data_start, view[page.data_start:page.disk_data_start]))
                page.disk_data_start = page.data_start
        self.dirty.clear()
        return writes

    def drop_checkpointed(self) -> None:
        """Persistent pages a durable checkpoint holds need not stay in memory (all but the tail)."""
        tail = self.tail[PERSISTENT]
        dirty = self.dirty
        for page in self.pages.values():
            if page.kind == PERSISTENT and page.number not in dirty and page is not tail:
                page.buf = None
