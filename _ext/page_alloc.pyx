# cython: language_level=3
"""Compiled twin of server/storage/_page_alloc_py.py (the reference semantics; read its docstring).

Same states, same lowest-free-first policy, same errors; the suite in tests/storage/test_file_alloc.py
runs against both.  The table is a bytearray so the durable view and ``find`` stay C-speed in both.
"""
from libc.string cimport memchr

FREE = 0
PERSISTENT = 1
NON_PERSISTENT = 2
SYSTEM = 3
PENDING = 4
RELEASING = 5

KIND_NAMES = {FREE: "free", PERSISTENT: "persistent", NON_PERSISTENT: "non-persistent", SYSTEM: "system",
              PENDING: "pending-free", RELEASING: "releasing"}

_TABLE_VIEW = bytes([FREE, PERSISTENT, NON_PERSISTENT, SYSTEM, FREE, FREE]) + bytes(250)


class AllocatorError(ValueError):
    """Misuse of the allocator (double free, claiming a page in use, unknown kind)."""


cdef class PageAllocator:
    cdef public Py_ssize_t reserved
    cdef bytearray _table
    cdef Py_ssize_t _counts[6]
    cdef Py_ssize_t _hint
    cdef list _pending
    cdef list _releasing
    cdef bint _in_checkpoint

    def __init__(self, Py_ssize_t reserved=3, Py_ssize_t page_count=0):
        cdef Py_ssize_t count, page
        if reserved < 0:
            raise AllocatorError("reserved must be >= 0")
        count = max(reserved, page_count)
        self.reserved = reserved
        self._table = bytearray(count)
        for page in range(reserved):
            self._table[page] = SYSTEM
        for page in range(6):
            self._counts[page] = 0
        self._counts[FREE] = count - reserved
        self._counts[SYSTEM] = reserved
        self._hint = reserved
        self._pending = []
        self._releasing = []
        self._in_checkpoint = False

    @classmethod
    def from_table(cls, table, Py_ssize_t reserved=3):
        cdef PageAllocator alloc = cls(reserved, len(table))
        cdef const unsigned char[:] view = bytes(table)
        cdef Py_ssize_t page
        cdef unsigned char kind
        for page in range(reserved, view.shape[0]):
            kind = view[page]
            if kind == NON_PERSISTENT or kind == FREE:
                continue
            if kind != PERSISTENT and kind != SYSTEM:
                raise AllocatorError(f"page {page}: kind {kind} cannot appear in a durable table")
            alloc._table[page] = kind
            alloc._counts[FREE] -= 1
            alloc._counts[kind] += 1
        return alloc

    @property
    def page_count(self):
        return len(self._table)

    def kind(self, Py_ssize_t page):
        if page < 0 or page >= len(self._table):
            return FREE
        return self._table[page]

    def count(self, int kind):
        if kind < 0 or kind > RELEASING:
            raise IndexError(kind)
        return self._counts[kind]

    @property
    def free_count(self):
        return self._counts[FREE]

    @property
    def in_checkpoint(self):
        return self._in_checkpoint

    def table(self):
        return bytes(self._table).translate(_TABLE_VIEW)

    def pages_of(self, int kind):
        cdef const unsigned char* data = self._table
        cdef Py_ssize_t page, n = len(self._table)
        return [page for page in range(n) if data[page] == kind]

    cpdef Py_ssize_t allocate(self, int kind) except -1:
        cdef Py_ssize_t page = -1, n = len(self._table)
        cdef const unsigned char* data
        cdef const void* hit
        if kind != PERSISTENT and kind != NON_PERSISTENT and kind != SYSTEM:
            raise AllocatorError(f"cannot allocate a page of kind {kind}")
        if self._counts[FREE] and self._hint < n:
            data = self._table
            hit = memchr(data + self._hint, FREE, n - self._hint)
            if hit != NULL:
                page = <const unsigned char*>hit - data
        if page < 0:
            page = n
            self._table.append(kind)
        else:
            self._counts[FREE] -= 1
            self._table[page] = kind
        self._hint = page + 1
        self._counts[kind] += 1
        return page

    def claim(self, Py_ssize_t page, int kind):
        cdef Py_ssize_t grow, n = len(self._table)
        if kind != PERSISTENT and kind != NON_PERSISTENT and kind != SYSTEM:
            raise AllocatorError(f"cannot claim a page of kind {kind}")
        if page < self.reserved:
            raise AllocatorError(f"page {page} is reserved")
        if page >= n:
            # as Python ints: ``page + 1`` wraps for a page number near PY_SSIZE_T_MAX (read from a
            # damaged file); the twin's arithmetic never wraps, so neither may this one
            self._table.extend(bytes(<object>page - n + 1))
            grow = page - n + 1                  # it fitted in memory, so it fits in Py_ssize_t
            self._counts[FREE] += grow
        elif self._table[page] != FREE:
            raise AllocatorError(f"page {page} is {KIND_NAMES[self._table[page]]}, not free")
        self._table[page] = kind
        self._counts[FREE] -= 1
        self._counts[kind] += 1

    cpdef free(self, Py_ssize_t page):
        cdef int kind
        if page < self.reserved or page >= len(self._table):
            raise AllocatorError(f"page {page} is not an allocated page")
        kind = self._table[page]
        if kind == NON_PERSISTENT:
            self._table[page] = FREE
            self._counts[FREE] += 1
            if page < self._hint:
                self._hint = page
        elif kind == PERSISTENT or kind == SYSTEM:
            self._table[page] = PENDING
            self._counts[PENDING] += 1
            self._pending.append(page)
        else:
            raise AllocatorError(f"page {page} is {KIND_NAMES[kind]}: double free")
        self._counts[kind] -= 1

    def lowest_free(self, Py_ssize_t count):
        cdef const unsigned char* data = self._table
        cdef Py_ssize_t n = len(self._table), at = self._hint
        cdef const void* hit
        found = []
        while len(found) < count and at < n:
            hit = memchr(data + at, FREE, n - at)
            if hit == NULL:
                break
            at = <const unsigned char*>hit - data
            found.append(at)
            at += 1
        return found

    cpdef unallocate(self, Py_ssize_t page):
        cdef int kind
        if page < self.reserved or page >= len(self._table):
            raise AllocatorError(f"page {page} is not an allocated page")
        kind = self._table[page]
        if kind != PERSISTENT and kind != NON_PERSISTENT and kind != SYSTEM:
            raise AllocatorError(f"page {page} is {KIND_NAMES[kind]}: double free")
        self._table[page] = FREE
        self._counts[kind] -= 1
        self._counts[FREE] += 1
        if page < self._hint:
            self._hint = page

    def begin_checkpoint(self):
        cdef Py_ssize_t page
        if self._in_checkpoint:
            raise AllocatorError("a checkpoint is already in flight")
        for page in self._pending:
            self._table[page] = RELEASING
        self._counts[RELEASING] += len(self._pending)
        self._counts[PENDING] -= len(self._pending)
        self._releasing, self._pending = self._pending, []
        self._in_checkpoint = True
        return self.table()

    def end_checkpoint(self, bint durable=True):
        cdef Py_ssize_t page
        cdef list released
        if not self._in_checkpoint:
            raise AllocatorError("no checkpoint in flight")
        released = self._releasing
        self._releasing = []
        self._in_checkpoint = False
        self._counts[RELEASING] -= len(released)
        if durable:
            for page in released:
                self._table[page] = FREE
                if page < self._hint:
                    self._hint = page
            self._counts[FREE] += len(released)
        else:
            for page in released:
                self._table[page] = PENDING
            self._pending.extend(released)
            self._counts[PENDING] += len(released)

    def trim(self):
        cdef Py_ssize_t end = len(self._table), dropped
        while end > self.reserved and self._table[end - 1] == FREE:
            end -= 1
        dropped = len(self._table) - end
        if dropped:
            del self._table[end:]
            self._counts[FREE] -= dropped
            if self._hint > end:
                self._hint = end
        return end

    def check(self):
        cdef Py_ssize_t page, n = len(self._table)
        counts = [0] * 6
        for kind in self._table:
            if kind > RELEASING:
                raise AllocatorError(f"unknown kind {kind} in table")
            counts[kind] += 1
        if counts != [self._counts[i] for i in range(6)]:
            raise AllocatorError(f"counters {[self._counts[i] for i in range(6)]} do not match table {counts}")
        for page in range(min(self.reserved, n)):
            if self._table[page] != SYSTEM:
                raise AllocatorError(f"reserved page {page} is not SYSTEM")
        if FREE in self._table[:self._hint]:
            raise AllocatorError("a FREE page lies below the search hint")
        if sorted(self._pending) != [p for p in range(n) if self._table[p] == PENDING]:
            raise AllocatorError("pending list does not match the table")
        if sorted(self._releasing) != [p for p in range(n) if self._table[p] == RELEASING]:
            raise AllocatorError("releasing list does not match the table")
