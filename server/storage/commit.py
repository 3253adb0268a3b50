"""Group commit: when to fsync, and which waiting commits a finished sync makes durable (sans-IO).

A commit (a persistent SEND, an ACK, a catalog change) is written and flushed to a device, then
registers a waiter with :meth:`GroupCommit.on_commit`; its receipt goes out when the waiter fires.
The driver (the holding store, ``store.py``, on the broker's runtime; or a test) asks
:meth:`next_sync_at` when to start a sync, calls :meth:`sync_started` just before calling ``device.sync()``
and :meth:`sync_done` (or :meth:`sync_failed`) after.  Invariants:

* a waiter fires only after a sync that *started after it registered* finished (its writes were
  flushed before it registered, so that sync covered them); with policy ``never`` it fires at once,
  durable meaning "handed to the OS";
* at most one sync is in flight; waiters arriving meanwhile wait for the next one;
* ``always`` starts a sync as soon as one is needed (no added delay; commits that arrive during a
  sync share the next one), ``grouped`` starts at most one sync every ``interval_ms`` so that many
  commits share one fsync.

No clock and no I/O here: times are passed in (any monotonic seconds), callbacks are plain callables
taking ``None`` (durable) or the exception that made the sync fail.
"""
from __future__ import annotations

from collections.abc import Callable

from pymq import enums

Waiter = Callable[[BaseException | None], None]


class CommitPolicy(enums.StrEnum):
    ALWAYS = "always"
    GROUPED = "grouped"
    NEVER = "never"


class GroupCommit:
    """The commit-to-sync bookkeeping for one device."""

    def __init__(self, policy: CommitPolicy | str = CommitPolicy.GROUPED, interval_ms: float = 5.0) -> None:
        self.policy = CommitPolicy(policy)
        if interval_ms < 0:
            raise ValueError("interval_ms must be >= 0")
        self.interval = interval_ms / 1000.0
        self._pending: list[Waiter] = []     # registered since the last sync started
        self._covered: list[Waiter] = []     # covered by the sync in flight
        self._in_flight = False
        self._last_start: float | None = None
        self.commits = 0
        self.syncs = 0

    # -- the broker side ----------------------------------------------------------------------------------
    def on_commit(self, callback: Waiter) -> None:
        """Register a commit whose writes were flushed; ``callback`` fires once they are durable."""
        self.commits += 1
        if self.policy is CommitPolicy.NEVER:
            callback(None)
            return
        self._pending.append(callback)

    def join(self, callback: Waiter) -> None:
        """Wait for the last sync already asked for, without asking for one more: the next sync when
        commits wait for it, else the one in flight; at once when there is none. For a caller that
        flushed nothing since its last commit (a barrier with no new writes): whatever it depends on was
        registered by an earlier commit, which that sync covers."""
        if self._pending:
            self._pending.append(callback)
        elif self._in_flight:
            self._covered.append(callback)
        else:
            callback(None)

    @property
    def pending(self) -> int:
        """Waiters not yet durable (registered or covered by the sync in flight)."""
        return len(self._pending) + len(self._covered)

    @property
    def in_flight(self) -> bool:
        return self._in_flight

    # -- the driver side ----------------------------------------------------------------------------------
    def next_sync_at(self, now: float) -> float | None:
        """When to start the next sync (``<= now``: start it now); None when none is needed yet."""
        if self._in_flight or not self._pending or self.policy is CommitPolicy.NEVER:
            return None
        if self.policy is CommitPolicy.ALWAYS or self._last_start is None:
            return now
        return max(now, self._last_start + self.interval)

    def sync_started(self, now: float) -> int:
        """A sync starts now: it covers every waiter registered so far; returns how many."""
        if self._in_flight:
            raise RuntimeError("a sync is already in flight")
        self._in_flight = True
        self._last_start = now
        self._covered, self._pending = self._pending, []
        return len(self._covered)

    def sync_done(self) -> int:
        """The sync finished: fire the waiters it covered; returns how many fired."""
        return self._finish(None)

    def sync_failed(self, error: BaseException) -> int:
        """The sync failed: the covered waiters learn why (their receipts become errors)."""
        return self._finish(error)

    def _finish(self, error: BaseException | None) -> int:
        if not self._in_flight:
            raise RuntimeError("no sync in flight")
        self._in_flight = False
        self.syncs += 1
        covered, self._covered = self._covered, []
        for callback in covered:
            callback(error)
        return len(covered)
