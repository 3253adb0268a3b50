"""Page allocator of the file device: the one owner of the page table, the free list and the end of file.

Reference semantics (pure Python); ``_ext/page_alloc.pyx`` is the compiled twin and the suite in
``tests/storage/test_file_alloc.py`` runs against both.

The page table holds one kind per page (seed 002): FREE, PERSISTENT, NON_PERSISTENT or SYSTEM (the file
header, the two meta pages and checkpoint pages).  Two more states exist only in memory, for pages that
were freed but may still be referenced by the last durable checkpoint (LMDB's rule: a page is reusable
only once no durable state points at it):

* PENDING   freed since the last checkpoint snapshot; reusable after the *next* checkpoint is durable.
* RELEASING freed before the snapshot of the checkpoint in flight; reusable when that one is durable.

A non-persistent page is never referenced by durable state (recovery frees them all), so freeing one
makes it FREE at once.  Invariants, checked by :meth:`check`:

* every page below ``page_count`` is in exactly one state; pages at or above it do not exist;
* ``allocate`` hands out the lowest FREE page, else grows the file by one page; a page is never handed
  out twice without a ``free`` in between;
* the per-kind counters match the table; ``table()`` renders PENDING/RELEASING as FREE, because a
  checkpoint taken now no longer needs those pages.
"""
from __future__ import annotations

FREE = 0
PERSISTENT = 1
NON_PERSISTENT = 2
SYSTEM = 3
PENDING = 4
RELEASING = 5

KIND_NAMES = {FREE: "free", PERSISTENT: "persistent", NON_PERSISTENT: "non-persistent", SYSTEM: "system",
              PENDING: "pending-free", RELEASING: "releasing"}

#: how states render in a durable page table (a checkpoint taken now does not need freed pages)
_TABLE_VIEW = bytes([FREE, PERSISTENT, NON_PERSISTENT, SYSTEM, FREE, FREE]) + bytes(250)


class AllocatorError(ValueError):
    """Misuse of the allocator (double free, claiming a page in use, unknown kind)."""


class PageAllocator:
    """Owns the page table; ``reserved`` leading pages are SYSTEM (file header and meta pages)."""

    def __init__(self, reserved: int = 3, page_count: int = 0) -> None:
        if reserved < 0:
            raise AllocatorError("reserved must be >= 0")
        count = max(reserved, page_count)
        self.reserved = reserved
        self._table = bytearray(count)
        for page in range(reserved):
            self._table[page] = SYSTEM
        self._counts = [count - reserved, 0, 0, reserved, 0, 0]
        self._hint = reserved          # no FREE page below this index
        self._pending: list[int] = []
        self._releasing: list[int] = []
        self._in_checkpoint = False

    @classmethod
    def from_table(cls, table: bytes, reserved: int = 3) -> PageAllocator:
        """Rebuild from a durable page table; NON_PERSISTENT pages become FREE (seed 002 recovery)."""
        alloc = cls(reserved, len(table))
        for page in range(reserved, len(table)):
            kind = table[page]
            if kind == NON_PERSISTENT or kind == FREE:
                continue
            if kind not in (PERSISTENT, SYSTEM):
                raise AllocatorError(f"page {page}: kind {kind} cannot appear in a durable table")
            alloc._table[page] = kind
            alloc._counts[FREE] -= 1
            alloc._counts[kind] += 1
        return alloc

    # -- queries --------------------------------------------------------------------------------------
    @property
    def page_count(self) -> int:
        """The end of file, in pages."""
        return len(self._table)

    def kind(self, page: int) -> int:
        if page < 0 or page >= len(self._table):
            return FREE
        return self._table[page]

    def count(self, kind: int) -> int:
        return self._counts[kind]

    @property
    def free_count(self) -> int:
        return self._counts[FREE]

    @property
    def in_checkpoint(self) -> bool:
        return self._in_checkpoint

    def table(self) -> bytes:
        """The durable view: one byte per page, PENDING/RELEASING shown as FREE."""
        return bytes(self._table).translate(_TABLE_VIEW)

    def pages_of(self, kind: int) -> list[int]:
        table = self._table
        return [page for page in range(len(table)) if table[page] == kind]

    # -- moves ----------------------------------------------------------------------------------------
    def allocate(self, kind: int) -> int:
        """Hand out the lowest FREE page for ``kind`` (growing the file when none is free)."""
        if kind not in (PERSISTENT, NON_PERSISTENT, SYSTEM):
            raise AllocatorError(f"cannot allocate a page of kind {kind}")
        table = self._table
        if self._counts[FREE]:
            page = table.find(FREE, self._hint)
        else:
            page = -1
        if page < 0:
            page = len(table)
            table.append(kind)
        else:
            self._counts[FREE] -= 1
            table[page] = kind
        self._hint = page + 1
        self._counts[kind] += 1
        return page

    def claim(self, page: int, kind: int) -> None:
        """Take a named FREE page (log replay places messages where they were); grows the file if needed."""
        if kind not in (PERSISTENT, NON_PERSISTENT, SYSTEM):
            raise AllocatorError(f"cannot claim a page of kind {kind}")
        if page < self.reserved:
            raise AllocatorError(f"page {page} is reserved")
        table = self._table
        if page >= len(table):
            grow = page + 1 - len(table)
            table.extend(bytes(grow))
            self._counts[FREE] += grow
        elif table[page] != FREE:
            raise AllocatorError(f"page {page} is {KIND_NAMES[table[page]]}, not free")
        table[page] = kind
        self._counts[FREE] -= 1
        self._counts[kind] += 1

    def free(self, page: int) -> None:
        """Give a page back: NON_PERSISTENT at once, others once the next checkpoint is durable."""
        table = self._table
        if page < self.reserved or page >= len(table):
            raise AllocatorError(f"page {page} is not an allocated page")
        kind = table[page]
        if kind == NON_PERSISTENT:
            table[page] = FREE
            self._counts[FREE] += 1
            if page < self._hint:
                self._hint = page
        elif kind == PERSISTENT or kind == SYSTEM:
            table[page] = PENDING
            self._counts[PENDING] += 1
            self._pending.append(page)
        else:
            raise AllocatorError(f"page {page} is {KIND_NAMES[kind]}: double free")
        self._counts[kind] -= 1

    def lowest_free(self, count: int) -> list[int]:
        """The FREE pages the next ``count`` calls of ``allocate`` would hand out, lowest first (fewer when
        the file has fewer: the rest would grow it)."""
        table = self._table
        found: list[int] = []
        at = self._hint
        while len(found) < count:
            at = table.find(FREE, at)
            if at < 0:
                break
            found.append(at)
            at += 1
        return found

    def unallocate(self, page: int) -> None:
        """Give back at once a page no durable state has ever named (a failed checkpoint's own pages): FREE
        now, whatever its kind, instead of waiting for the next checkpoint as ``free`` makes it."""
        table = self._table
        if page < self.reserved or page >= len(table):
            raise AllocatorError(f"page {page} is not an allocated page")
        kind = table[page]
        if kind not in (PERSISTENT, NON_PERSISTENT, SYSTEM):
            raise AllocatorError(f"page {page} is {KIND_NAMES[kind]}: double free")
        table[page] = FREE
        self._counts[kind] -= 1
        self._counts[FREE] += 1
        if page < self._hint:
            self._hint = page

    def begin_checkpoint(self) -> bytes:
        """Snapshot for a checkpoint: pages freed so far wait for it; returns the durable table."""
        if self._in_checkpoint:
            raise AllocatorError("a checkpoint is already in flight")
        table = self._table
        for page in self._pending:
            table[page] = RELEASING
        self._counts[RELEASING] += len(self._pending)
        self._counts[PENDING] -= len(self._pending)
        self._releasing, self._pending = self._pending, []
        self._in_checkpoint = True
        return self.table()

    def end_checkpoint(self, durable: bool = True) -> None:
        """The checkpoint is durable (pages freed before it become FREE) or failed (they wait again)."""
        if not self._in_checkpoint:
            raise AllocatorError("no checkpoint in flight")
        table = self._table
        released = self._releasing
        self._releasing = []
        self._in_checkpoint = False
        self._counts[RELEASING] -= len(released)
        if durable:
            for page in released:
                table[page] = FREE
                if page < self._hint:
                    self._hint = page
            self._counts[FREE] += len(released)
        else:
            for page in released:
                table[page] = PENDING
            self._pending.extend(released)
            self._counts[PENDING] += len(released)

    def trim(self) -> int:
        """Drop trailing FREE pages from the end of file; returns the new page count."""
        table = self._table
        end = len(table)
        while end > self.reserved and table[end - 1] == FREE:
            end -= 1
        dropped = len(table) - end
        if dropped:
            del table[end:]
            self._counts[FREE] -= dropped
            if self._hint > end:
                self._hint = end
        return end

    def check(self) -> None:
        """Raise AllocatorError if an invariant is broken (used by tests and debug builds)."""
        table = self._table
        counts = [0] * 6
        for kind in table:
            if kind > RELEASING:
                raise AllocatorError(f"unknown kind {kind} in table")
            counts[kind] += 1
        if counts != list(self._counts):
            raise AllocatorError(f"counters {self._counts} do not match table {counts}")
        for page in range(min(self.reserved, len(table))):
            if table[page] != SYSTEM:
                raise AllocatorError(f"reserved page {page} is not SYSTEM")
        if FREE in table[:self._hint]:
            raise AllocatorError("a FREE page lies below the search hint")
        if sorted(self._pending) != [p for p in range(len(table)) if table[p] == PENDING]:
            raise AllocatorError("pending list does not match the table")
        if sorted(self._releasing) != [p for p in range(len(table)) if table[p] == RELEASING]:
            raise AllocatorError("releasing list does not match the table")
