"""What a candidate concludes from what it reads (spec/ha.md §1.4–§1.5, §1.7), sans-IO.

The candidate reads the lease record every ``poll_ms`` and tries the OS lock.  :class:`LeaseWatch` turns
those observations into one of three answers: wait, take the store now (the holder is gone), or let the
OS lock go again (its holder did not hold it).  The lease of a file store ends when the record's write
sequence has not changed for ``lease_ms`` of the watcher's own monotonic clock: no clock is compared
across machines, only the passing of time (a disk heartbeat).  A PostgreSQL lease is judged by the
database's clock instead (``expired`` is then given by the medium).
"""
from __future__ import annotations

import enum

from .record import LeaseRecord


class Verdict(enum.Enum):
    WAIT = "wait"
    TAKE = "take"                   # the holder is gone: take the store (1.7)
    RELEASE_OS_LOCK = "release"     # got the OS lock, but its holder never held it: give it back, wait


class LeaseWatch:
    """One candidate's view of the lease."""

    __slots__ = ("lease_s", "_seen", "_since", "reason")

    def __init__(self, lease_ms: int) -> None:
        self.lease_s = lease_ms / 1000.0
        self._seen: tuple[int, int] | None = None      # (epoch, seq) last read
        self._since = 0.0                              # when it was first read (monotonic)
        #: why the last TAKE was given (logs, the admin's "last takeover")
        self.reason = ""

    def observe(self, record: LeaseRecord | None, now: float, os_lock: bool,
                expired: bool | None = None) -> Verdict:
        """``record`` as read now (None: no record, a new store); ``os_lock``: the candidate holds the OS
        lock now; ``expired``: the medium's own judgement of the lease (PostgreSQL), None to judge by the
        record's changes."""
        if record is None:
            if os_lock:
                self.reason = "a new store"
                return Verdict.TAKE
            return Verdict.WAIT
        if os_lock and record.os_locked:
            self.reason = f"the holder of epoch {record.epoch} ended (its OS lock was released)"
            return Verdict.TAKE
        if expired is None:
            expired = self._note(record, now) >= self.lease_s
        if expired:
            self.reason = f"the lease of epoch {record.epoch} ended ({self.lease_s * 1000:.0f} ms without a renewal)"
            return Verdict.TAKE
        # got the OS lock, but its holder took over by lease expiry while a stopped former live held it
        return Verdict.RELEASE_OS_LOCK if os_lock else Verdict.WAIT

    def _note(self, record: LeaseRecord, now: float) -> float:
        """How long the record has been unchanged (0 the first time a state is read)."""
        state = (record.epoch, record.seq)
        if state != self._seen:
            self._seen = state
            self._since = now
        return now - self._since

    def reset(self) -> None:
        """Forget what was seen (a takeover attempt found the record renewed meanwhile)."""
        self._seen = None
