"""The commit driver: which devices have changes a barrier must make durable, each device's group commit
(``commit.py``, sans-IO) driven on the broker's runtime, and the checkpoints that follow syncs.

Group commit: writes are flushed at once and synced under a per-device :class:`GroupCommit` policy —
``always`` (every receipt waits for a sync that started after it; commits arriving while a sync runs
share the next one, so a busy broker still batches), ``grouped`` (additionally at most one sync per
``window_ms``) or ``never`` (durable = handed to the OS). Syncs run in a worker thread through the injected
``run_in_thread`` so the broker's loop keeps serving; this module imports no event loop. A barrier over
nothing written since the last one joins the sync already asked for (``GroupCommit.join``).

Checkpoints (a device's log trimming) run in a worker after a sync, never inside one, so no receipt waits
for a checkpoint.
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from pymq.errors import StorageError

from .commit import GroupCommit
from .device import HoldingDevice

log = logging.getLogger("pymq.storage")

SYNC_POLICIES = ("always", "grouped", "never")

#: what a barrier's caller is told: once, None (durable) or the StorageError that kept it from being so
BarrierCallback = Callable[[StorageError | None], None]
#: the runtime's worker threads: run_in_thread(work, done(result, error))
RunInThread = Callable[[Callable[[], Any], Callable[[Any, BaseException | None], None]], None]


def run_work(run_in_thread: RunInThread | None, work: Callable[[], Any],
             done: Callable[[Any, BaseException | None], None]) -> None:
    """``work`` in a worker thread when there is a runtime, else at once; ``done`` is told either way."""
    if run_in_thread is not None:
        run_in_thread(work, done)
        return
    try:
        result = work()
    except Exception as exc:  # noqa: BLE001 - handed to done, as a worker thread's failure is
        done(None, exc)
        return
    done(result, None)


class CommitDriver:
    def __init__(self, devices: Iterable[HoldingDevice], sync_policy: str = "always", sync_window_ms: float = 2.0,
                 call_later: Callable[..., object] | None = None, run_in_thread: RunInThread | None = None) -> None:
        if sync_policy not in SYNC_POLICIES:
            raise StorageError(f"sync policy must be one of {', '.join(SYNC_POLICIES)}, got {sync_policy!r}")
        self.devices = list(devices)
        self.sync_policy = sync_policy
        self.sync_window_ms = sync_window_ms
        self.call_later = call_later
        self.run_in_thread = run_in_thread
        #: devices written since the last barrier (the next one flushes and commits them): cleared, never
        #: replaced, so ``mark_dirty`` can be its own ``add``
        self.dirty: set[HoldingDevice] = set()
        #: a device has changes the next barrier must make durable (every write and removal says so: the
        #: set's ``add`` itself, no call of ours in between)
        self.mark_dirty: Callable[[HoldingDevice], None] = self.dirty.add
        self._commits: dict[str, GroupCommit] = {}
        self._timers: set[str] = set()
        self._checkpointing: set[str] = set()
        self.clock = time.monotonic
        self.syncs = 0

    def _commit_for(self, device: HoldingDevice) -> GroupCommit:
        gc = self._commits.get(device.name)
        if gc is None:
            gc = self._commits[device.name] = GroupCommit(self.sync_policy, self.sync_window_ms)
        return gc

    def barrier(self, callback: BarrierCallback) -> None:
        """``callback(None)`` once everything written so far is durable under the sync policy, or
        ``callback(error)`` when a device could not make it durable (a failed flush or sync).

        Each dirty device gets the commit through its own :class:`GroupCommit`; ``callback`` runs once,
        when the last of them has answered, with the first error any of them met."""
        devices = list(self.dirty)
        self.dirty.clear()
        joining = not devices
        if joining:
            if not any(gc.pending for gc in self._commits.values()):
                callback(None)
                return
            # nothing written since the last barrier, whose commit a sync still to finish covers: wait for
            # that sync (GroupCommit.join), not for one more of this barrier's own
            devices = [d for d in self.devices if self._commit_for(d).pending]
        state: list[Any] = [len(devices), None]     # devices still to answer, first error

        def one_done(error: BaseException | None) -> None:
            if error is not None and state[1] is None:
                state[1] = error if isinstance(error, StorageError) else \
                    StorageError(f"storage failed: {type(error).__name__}: {error}")
            state[0] -= 1
            if state[0] == 0:
                callback(state[1])

        for device in devices:
            if joining:
                self._commit_for(device).join(functools.partial(self._committed, device, done=one_done))
                continue
            try:
                device.flush()
            except StorageError as exc:
                log.error("flush of device %s failed: %s", device.name, exc.message)
                one_done(exc)
                continue
            self._commit_for(device).on_commit(functools.partial(self._committed, device, done=one_done))
            self._drive(device)

    def _committed(self, device: HoldingDevice, error: BaseException | None, done: Callable) -> None:
        if error is not None:
            log.error("sync of device %s failed: %s", device.name, getattr(error, "message", error))
        done(error)

    def _drive(self, device: HoldingDevice) -> None:
        """Start the device's next sync when its policy says so (on a worker thread)."""
        gc = self._commit_for(device)
        now = self.clock()
        when = gc.next_sync_at(now)
        if when is None:
            return
        if when > now:
            if device.name not in self._timers:
                self._timers.add(device.name)

                def fire() -> None:
                    self._timers.discard(device.name)
                    self._drive(device)

                if self.call_later is None:
                    raise RuntimeError(f"sync policy {self.sync_policy!r} waits: the store needs call_later")
                self.call_later(when - now, fire)
            return
        gc.sync_started(now)
        if self.run_in_thread is None:
            try:
                device.sync()
            except Exception as exc:  # noqa: BLE001 - any failure is the commit's answer (receipts get ERROR)
                gc.sync_failed(exc)
                return
            self.syncs += 1
            gc.sync_done()
            return

        def done(result: Any, error: BaseException | None) -> None:
            self.syncs += 1
            if error is None:
                gc.sync_done()
                self.checkpoint_if_due(device)
            else:
                gc.sync_failed(error)
            self._drive(device)

        self.run_in_thread(device.sync, done)

    def checkpoint_if_due(self, device: HoldingDevice) -> None:
        """Start ``device``'s checkpoint in a worker when it says one is due and none runs."""
        if not device.checkpoint_due or device.name in self._checkpointing:
            return
        self._checkpointing.add(device.name)

        def done(result: Any, error: BaseException | None) -> None:
            self._checkpointing.discard(device.name)
            if error is not None:
                log.error("checkpoint of device %s failed: %s", device.name, error)

        run_work(self.run_in_thread, device.checkpoint, done)

    def flush_all(self, skip: Iterable[str] = ()) -> list[str]:
        """Flush and sync every device (a clean stop); returns what failed, per device, instead of
        stopping at the first (a device in fault cannot sync; the others still must)."""
        skipped = set(skip)
        failed = []
        for device in self.devices:
            if device.name in skipped:
                continue
            try:
                device.flush()
                device.sync()
            except Exception as exc:  # noqa: BLE001 - keep going: every other device must still be synced
                failed.append(f"{device.name}: {getattr(exc, 'message', exc)}")
        self.dirty.clear()
        return failed
