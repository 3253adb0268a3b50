"""The page file of the file device: file header, alternating meta pages, checkpoint chains, page I/O.

Layouts are in ``format.py``.  This module never decides *which* page to use (the page allocator owns
the free list and the end of file); it reads and writes the pages it is told to.  Writes below a
page's checkpointed watermark never happen (see format.py), so ``write_at`` is only ever given new
regions or pages that no durable state references.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

from pymq.errors import StorageError

from . import format as fmt
from .crc import crc32c
from .fileio import OS_IO, FileIO, is_no_space

#: pages reserved ahead of the end of the page file at a time (see fileio.py)
RESERVE_PAGES = 16


@dataclass(frozen=True, slots=True)
class Meta:
    generation: int
    wal_segment: int
    wal_salt: int
    page_count: int
    ckpt_first: int
    ckpt_pages: int
    ckpt_length: int
    ckpt_crc: int


class PageFile:
    """The ``pages`` file: fixed-size pages addressed by number."""

    def __init__(self, path: str, page_size: int, fsync: bool = True, read_only: bool = False,
                 io: FileIO = OS_IO) -> None:
        self.path = path
        self.page_size = page_size
        self._fsync = fsync
        self.read_only = read_only
        self.io = io
        self.file_id = b""
        self.fd = -1
        #: bytes from the start of the file held for it (None: the platform cannot reserve)
        self.reserved: int | None = 0

    # -- lifecycle ----------------------------------------------------------------------------------------
    def create(self) -> None:
        self.file_id = secrets.token_bytes(16)
        self.fd = self.io.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        header = fmt.encode_file_header(self.page_size, self.file_id)
        self.write_at(0, header + bytes(self.page_size * fmt.RESERVED_PAGES - len(header)))

    def open(self) -> None:
        self.fd = self.io.open(self.path, os.O_RDONLY if self.read_only else os.O_RDWR)
        raw = self.io.pread(self.fd, 64, 0)
        body = fmt.check_sealed(raw, fmt.FILE_HEADER.size)
        if body is None:
            raise StorageError(f"{self.path}: file header is missing or corrupt", path=self.path)
        magic, version, page_size, file_id, reserved = fmt.FILE_HEADER.unpack(body)
        if magic != fmt.FILE_MAGIC or version != fmt.VERSION or reserved != fmt.RESERVED_PAGES:
            raise StorageError(f"{self.path}: not a pymq page file of version {fmt.VERSION}", path=self.path)
        if page_size != self.page_size:
            # the file decides: a store keeps the page size it was created with
            self.page_size = page_size
        self.file_id = file_id

    def close(self) -> None:
        if self.fd >= 0:
            self.io.close(self.fd)
            self.fd = -1

    def reserve(self, pages: int) -> None:
        """Make sure the first ``pages`` pages can be written without needing new disk space;
        raises OSError (ENOSPC) when the disk cannot give it."""
        end = pages * self.page_size
        if self.reserved is None or end <= self.reserved:
            return
        start = max(self.reserved, 0)
        # pages ahead, but never more than a quarter of what the disk has left (the log needs room too)
        free = self.io.free_space(os.path.dirname(self.path) or ".")
        ahead = RESERVE_PAGES * self.page_size if free is None else min(RESERVE_PAGES * self.page_size, free // 4)
        length = max(end - start, ahead)
        try:
            done = self.io.reserve(self.fd, start, length)
        except OSError as exc:
            if not is_no_space(exc) or length == end - start:
                raise
            # a disk with less than RESERVE_PAGES left still takes what fits: exactly the pages asked for
            length = end - start
            done = self.io.reserve(self.fd, start, length)
        if done:
            self.reserved = start + length
        else:
            self.reserved = None

    def punch(self, page: int) -> bool:
        """Give a free page's disk blocks back (its bytes read as zeros); False where holes are not supported."""
        return self.io.punch(self.fd, page * self.page_size, self.page_size)

    def fill(self, page: int) -> None:
        """Allocate the disk blocks of a page punched before (OSError, ENOSPC, when the disk has none)."""
        self.io.reserve(self.fd, page * self.page_size, self.page_size)

    def allocated(self) -> int:
        """Bytes of disk the file holds (fewer than its size when it has holes)."""
        return os.fstat(self.fd).st_blocks * 512

    # -- raw I/O ----------------------------------------------------------------------------------------------
    def read_at(self, offset: int, size: int) -> bytes:
        data = self.io.pread(self.fd, size, offset)
        if len(data) < size:   # beyond the end of file reads as zeros (pages never written)
            data += bytes(size - len(data))
        return data

    def write_at(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            done = self.io.pwrite(self.fd, view, offset)
            view, offset = view[done:], offset + done

    def read_page(self, page: int) -> bytearray:
        return bytearray(self.read_at(page * self.page_size, self.page_size))

    def sync(self) -> None:
        if self._fsync:
            self.io.datasync(self.fd)

    def truncate(self, pages: int) -> None:
        self.io.truncate(self.fd, pages * self.page_size)
        if self.reserved is not None:
            # the blocks past the new end went with the truncation
            self.reserved = min(self.reserved, pages * self.page_size)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    # -- meta pages -----------------------------------------------------------------------------------------
    def read_meta(self) -> Meta | None:
        """The valid meta page with the highest generation, or None."""
        best = None
        for page in fmt.META_PAGES:
            raw = self.read_at(page * self.page_size, fmt.META.size + 4)
            body = fmt.check_sealed(raw, fmt.META.size)
            if body is None:
                continue
            (magic, version, page_size, file_id, generation, segment, salt, page_count, first, count,
             length, crc) = fmt.META.unpack(body)
            if magic != fmt.META_MAGIC or version != fmt.VERSION or file_id != self.file_id \
                    or page_size != self.page_size or fmt.META_PAGES[generation % 2] != page:
                continue
            meta = Meta(generation, segment, salt, page_count, first, count, length, crc)
            if best is None or meta.generation > best.generation:
                best = meta
        return best

    def never_checkpointed(self) -> bool:
        """Both meta pages are still all zero (the store died while being created)."""
        return all(not any(self.read_at(page * self.page_size, fmt.META.size + 4)) for page in fmt.META_PAGES)

    def write_meta(self, meta: Meta) -> None:
        raw = fmt.encode_meta(self.page_size, self.file_id, meta.generation, meta.wal_segment, meta.wal_salt,
                              meta.page_count, meta.ckpt_first, meta.ckpt_pages, meta.ckpt_length,
                              meta.ckpt_crc)
        self.write_at(fmt.META_PAGES[meta.generation % 2] * self.page_size, raw)

    # -- checkpoint chains ------------------------------------------------------------------------------
    def checkpoint_capacity(self) -> int:
        """Payload bytes one checkpoint page carries."""
        return self.page_size - fmt.CKPT_PAGE_SIZE

    def write_checkpoint(self, pages: list[int], generation: int, payload: bytes) -> None:
        cap = self.checkpoint_capacity()
        if len(pages) * cap < len(payload):
            raise StorageError("checkpoint payload does not fit the pages given to it")
        for index, page in enumerate(pages):
            chunk = payload[index * cap:(index + 1) * cap]
            nxt = pages[index + 1] if index + 1 < len(pages) else 0
            head = fmt.CKPT_PAGE.pack(fmt.CKPT_MAGIC, nxt, generation, len(chunk))
            crc = crc32c(chunk, crc32c(head))
            self.write_at(page * self.page_size, head + fmt.CRC.pack(crc) + chunk)

    def read_checkpoint(self, meta: Meta) -> tuple[bytes, list[int]]:
        """The checkpoint payload of ``meta`` and the pages carrying it; StorageError if damaged."""
        chunks: list[bytes] = []
        pages: list[int] = []
        page = meta.ckpt_first
        while page:
            if len(pages) >= meta.ckpt_pages or page in pages:
                raise StorageError(f"checkpoint {meta.generation}: page chain is broken")
            raw = self.read_at(page * self.page_size, self.page_size)
            magic, nxt, generation, used = fmt.CKPT_PAGE.unpack_from(raw, 0)
            chunk = raw[fmt.CKPT_PAGE_SIZE:fmt.CKPT_PAGE_SIZE + used]
            crc = fmt.CRC.unpack_from(raw, fmt.CKPT_PAGE.size)[0]
            if magic != fmt.CKPT_MAGIC or generation != meta.generation or \
                    crc != crc32c(chunk, crc32c(raw[:fmt.CKPT_PAGE.size])):
                raise StorageError(f"checkpoint {meta.generation}: page {page} is corrupt", page=page)
            chunks.append(chunk)
            pages.append(page)
            page = nxt
        payload = b"".join(chunks)
        if len(payload) != meta.ckpt_length or crc32c(payload) != meta.ckpt_crc or \
                len(pages) != meta.ckpt_pages:
            raise StorageError(f"checkpoint {meta.generation}: payload is corrupt")
        return payload, pages
