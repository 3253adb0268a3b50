"""What holds a lease: the interface the arbiter drives (``arbiter.py``), which is also the fence the
devices ask (``fence.py``).  Two media implement it: a shared directory (``filelease.py``) and a
PostgreSQL database (``pglease.py``).

The medium knows the record this process wrote last (``mine``) and whether the process is fenced.  Every
check that finds the record naming another epoch or instance calls :meth:`LeaseMedium.fenced`, once: the
arbiter hears it (``on_fenced``) from whichever thread found it, and from then on ``check()`` refuses
every write at once.
"""
from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable

from .fence import Fence, Fenced
from .record import LeaseRecord

log = logging.getLogger("pymq.ha")


class LeaseMedium(Fence, abc.ABC):
    kind = ""
    active = True

    def __init__(self, node: str) -> None:
        self.node = node
        #: this process start's instance id (set by the arbiter; named in the SQL device's sessions)
        self.instance = bytes(16)
        #: the record this process wrote last (None: it holds no epoch)
        self.mine: LeaseRecord | None = None
        self.fenced_reason: str | None = None
        self.on_fenced: Callable[[str], None] | None = None
        #: the arbiter's "is the lease fresh (confirming it if need be)?" for ``check_write``
        self.fresh: Callable[[], bool] | None = None
        self._fence_lock = threading.Lock()

    @property
    def epoch(self) -> int:          # type: ignore[override]
        mine = self.mine
        return 0 if mine is None else mine.epoch

    # -- the arbiter's side ---------------------------------------------------------------------------
    @abc.abstractmethod
    def open(self) -> None:
        """Make what the medium needs (files, the table) and open its handles."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything, the OS lock last."""

    @abc.abstractmethod
    def read(self) -> LeaseRecord | None:
        """The record as it is now (None: none written yet)."""

    def expired(self, record: LeaseRecord) -> bool | None:
        """The medium's own judgement of whether ``record``'s lease ended (PostgreSQL: the database's
        clock); None: let the watch judge by the record's changes (a file)."""
        return None

    def reset(self) -> None:
        """A backup's call after any of the calls above failed (a dropped database session, an I/O error): let
        go of the candidate and OS locks as far as this process can and start afresh, so the next try sees
        the truth (a lock whose session died is not held, whatever this object remembered)."""
        for release in (self.release_candidate, self.release_os_lock):
            try:
                release()
            except Exception:  # noqa: BLE001 - best effort: the session may be the thing that failed
                pass

    @abc.abstractmethod
    def try_candidate(self) -> bool:
        """Take the candidate lock if free (1.6)."""

    @abc.abstractmethod
    def release_candidate(self) -> None: ...

    @abc.abstractmethod
    def try_os_lock(self) -> bool:
        """Take the OS lock if free (1.5); True also when this process holds it already."""

    @abc.abstractmethod
    def release_os_lock(self) -> None: ...

    @property
    @abc.abstractmethod
    def holds_os_lock(self) -> bool: ...

    @abc.abstractmethod
    def os_lock_intact(self) -> bool:
        """Whether the OS lock this process holds is still its own (a lost NFS lock, a dropped session)."""

    @abc.abstractmethod
    def take(self, seen: LeaseRecord | None, wanted: LeaseRecord, holder_dead: bool) -> bool:
        """Write ``wanted`` (the next epoch) if the record is still ``seen`` (1.7), holding whatever keeps
        every fenced write of the old epoch out (2.2); True when written and durable."""

    @abc.abstractmethod
    def renew(self, os_locked: bool, wait: bool = True) -> LeaseRecord | None:
        """A conditional renewal of ``mine`` (1.4): the record written, or None when this process is
        fenced (``fenced`` has been called).  ``wait`` False: give up (raise TimeoutError) rather than wait
        long for a lock another process holds (the serving check runs on the event loop)."""

    # -- fencing --------------------------------------------------------------------------------------------
    def fenced(self, current: LeaseRecord | None) -> Fenced:
        """This process's epoch is stale: note it once, tell the arbiter; the exception to raise."""
        mine = self.mine
        if current is None:
            reason = "the lease record is gone"
        else:
            reason = (f"epoch {mine.epoch if mine else 0} was taken over: the store is at epoch {current.epoch}, "
                      f"held by {current.host or '?'} pid {current.pid}")
        with self._fence_lock:
            first = self.fenced_reason is None
            if first:
                self.fenced_reason = reason
        if first:
            log.error("fenced: %s; this process writes and sends nothing more", reason)
            callback = self.on_fenced
            if callback is not None:
                callback(reason)
        return Fenced(self.fenced_reason or reason)

    def is_mine(self, current: LeaseRecord | None) -> bool:
        mine = self.mine
        return (mine is not None and current is not None and current.epoch == mine.epoch
                and current.instance == mine.instance)

    def check(self) -> None:
        reason = self.fenced_reason
        if reason is not None:
            raise Fenced(reason)

    def check_write(self) -> None:
        self.check()
        fresh = self.fresh
        if fresh is not None and not fresh():
            raise Fenced(self.fenced_reason or "the lease could not be confirmed")
