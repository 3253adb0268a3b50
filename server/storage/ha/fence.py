"""The fence a durable device asks before and after it writes (spec/ha.md §2).

A device never decides whether its process still holds the store: it asks its :class:`Fence`, which the
lease medium implements (``filelease.py``, ``pglease.py``).  Without ``ha:`` every device gets
:data:`NO_FENCE`, whose answers cost nothing.  What each method promises:

* ``check()``        cheap (no system call): raises :class:`Fenced` once the process is known fenced;
* ``check_write()``  before a log append: the lease is fresh by the local clock, or a renewal confirms it;
* ``exclusive()``    a context in which a write cannot land after a new epoch is written (2.2): the epoch
                     lock held shared and the record's epoch read under it; raises when it is stale;
* ``verify()``       the record's epoch read again now (2.3: after a sync, before acknowledging);
* ``guard_sql(conn)`` inside a SQL write transaction: the lease row read ``FOR SHARE`` and compared (2.2);
* ``sql_connect_args(dialect)`` what the SQL device's connections need (their name, PostgreSQL's idle
                     transaction timeout) so a candidate can end a stopped former live's sessions.
"""
from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from typing import Any


class Fenced(OSError):
    """The store was taken over: this process's epoch is stale (an OSError, so the file device treats it
    as a failed system call: the write is refused before it touches the disk and the store goes to
    fault; the SQL device turns it into a StorageError)."""

    def __init__(self, reason: str) -> None:
        super().__init__(errno.EROFS, f"fenced: {reason}")
        self.reason = reason


class Fence:
    """No high availability: every write may go."""

    #: the epoch this process holds (0: no high availability)
    epoch = 0
    active = False

    def check(self) -> None:
        pass

    def check_write(self) -> None:
        """Before a write that is not made under the epoch lock (the file store's log appends): the lease is
        fresh, or a renewal confirms it first (spec/ha.md §2.3)."""

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        yield

    def verify(self) -> None:
        pass

    def guard_sql(self, conn: Any) -> None:
        pass

    def sql_connect_args(self, dialect: str) -> dict:
        return {}


NO_FENCE = Fence()
