"""One process's part in a high-availability group (spec/ha.md §1): waiting as a backup, taking the store,
renewing the lease, the serving check, and what it reports.

:class:`HaArbiter` drives a lease medium (``filelease.py``, ``pglease.py``) from two threads of its own —
the backup's watch (:meth:`HaArbiter.wait_until_taken`, run off the event loop) and, once the store is
taken, the renewals — so the lease does not depend on how busy the event loop is; but a ``live`` process
renews only while its event loop shows it runs (:meth:`HaArbiter.loop_tick`), so a live whose loop hangs
loses the store like one that is stopped.  The event loop itself asks :meth:`HaArbiter.may_send` before
bytes leave for a client (2.1).  Roles change only through ``roles.move``.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from pymq.errors import ConfigError

from . import record as rec
from .medium import LeaseMedium
from .roles import Role, move
from .watch import LeaseWatch, Verdict

log = logging.getLogger("pymq.ha")

#: a live serves while its last confirmed renewal is younger than this share of the lease (2.1): the rest
#: is margin for the time between the check and the bytes leaving, and for clocks that run at other rates
SERVE_SHARE = 0.8


class HaArbiter:
    def __init__(self, medium: LeaseMedium, *, node: str, lease_ms: int, renew_ms: int, poll_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.medium = medium
        self.node = node
        self.lease_s = lease_ms / 1000.0
        self.renew_s = renew_ms / 1000.0
        self.poll_s = poll_ms / 1000.0
        self.clock = clock
        self.instance = os.urandom(16)
        medium.instance = self.instance
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self.role = Role.BACKUP
        self.since = time.time()
        self.candidate = False
        #: the record last read or written (what the admin shows as the holder)
        self.seen: rec.LeaseRecord | None = None
        self.takeovers = 0
        self.renewals = 0
        self.last_takeover_s: float | None = None        # from taking the store to listening
        self.take_reason = ""
        self._taken_at = 0.0
        self._confirmed = 0.0
        self._serve_until = 0.0
        self._loop_seen = clock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._fenced_hooks: list[Callable[[str], None]] = []
        medium.on_fenced = self._on_fenced
        medium.fresh = self.fresh

    # -- the role ---------------------------------------------------------------------------------------
    def _move(self, wanted: Role) -> None:
        with self._lock:
            self.role = move(self.role, wanted)
            self.since = time.time()
        log.info("high availability: this process is now %s (epoch %d)", wanted.value, self.medium.epoch)

    def on_fenced(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(reason)`` (from any thread) when this process finds itself fenced."""
        self._fenced_hooks.append(hook)

    def _on_fenced(self, reason: str) -> None:
        with self._lock:
            if self.role in (Role.ACTIVATING, Role.LIVE):
                self.role = move(self.role, Role.FENCED)
                self.since = time.time()
        self._serve_until = 0.0
        self._stop.set()
        for hook in list(self._fenced_hooks):
            try:
                hook(reason)
            except Exception:  # noqa: BLE001 - a hook's bug must not stop the others
                log.exception("a fenced hook failed")

    # -- backup ------------------------------------------------------------------------------------------
    def look(self) -> None:
        """Read the lease for the status only (what the admin shows as the holder, and its epoch); blocking.
        A failed read leaves the last one: the candidate reads for real."""
        try:
            self.seen = self.medium.read()
        except Exception:  # noqa: BLE001 - only for the status
            pass

    def wait_until_taken(self, stop: threading.Event) -> bool:
        """Be a backup until this process takes the store (True) or ``stop`` is set (False).  Blocking: run
        it off the event loop.  Raises ConfigError when the store belongs to another node id."""
        medium, watch = self.medium, LeaseWatch(int(self.lease_s * 1000))
        while not stop.is_set():
            try:
                if self._watch_once(medium, watch, stop):
                    return True
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - a backup that stops watching is no backup at all
                # a dropped database session, a failing shared disk: log, start afresh after a poll (the
                # locks this process believed it held may have gone with the session)
                log.warning("backup: the lease could not be watched (%s: %s); starting over",
                            type(exc).__name__, exc)
                self.candidate = False
                watch.reset()
                try:
                    medium.reset()
                except Exception as again:  # noqa: BLE001 - tried again after the next poll
                    log.warning("backup: the lease medium could not start afresh: %s", again)
                stop.wait(self.poll_s)
        return False

    def _watch_once(self, medium: LeaseMedium, watch: LeaseWatch, stop: threading.Event) -> bool:
        """Watch until this process takes the store (True) or a stop (False); a medium's failure raises."""
        logged_wait = False
        while not stop.is_set():
            if not medium.try_candidate():
                if not logged_wait:
                    log.info("backup: another backup watches the store; waiting to be the candidate")
                    logged_wait = True
                self.look()
                stop.wait(self.poll_s)
                continue
            self.candidate = True
            try:
                record = medium.read()
            except OSError as exc:
                log.warning("backup: cannot read the lease: %s", exc)
                stop.wait(self.poll_s)
                continue
            if record is not None and record.node != self.node:
                raise ConfigError(f"the store belongs to node {record.node!r}; this process is node "
                                  f"{self.node!r} (every process of a group has the same node_id)")
            self.seen = record
            os_lock = medium.try_os_lock()
            verdict = watch.observe(record, self.clock(), os_lock,
                                    medium.expired(record) if record is not None else None)
            if verdict is Verdict.RELEASE_OS_LOCK:
                medium.release_os_lock()
            if verdict is not Verdict.TAKE:
                stop.wait(self.poll_s)
                continue
            wanted = (rec.first(self.node, self.instance, self.host, self.pid, os_lock) if record is None
                      else record.taken(self.instance, self.host, self.pid, os_lock))
            self._taken_at = self.clock()
            if not medium.take(record, wanted, holder_dead=os_lock):
                log.info("backup: the lease was renewed while taking over: its holder is slow, not gone")
                watch.reset()
                continue
            self.seen = wanted
            self.take_reason = watch.reason
            self._confirmed = self._taken_at
            self._serve_until = self._taken_at + SERVE_SHARE * self.lease_s
            self.takeovers += 1
            self._move(Role.ACTIVATING)
            log.warning("took the store at epoch %d: %s", wanted.epoch, watch.reason)
            self.candidate = False
            self._start_renewing()
            try:
                medium.release_candidate()          # the next backup watches the new live (1.6)
            except Exception as exc:  # noqa: BLE001 - the store is taken: a lock left behind goes with its session
                log.warning("could not let the candidate lock go: %s", exc)
            return True
        return False

    # -- live ----------------------------------------------------------------------------------------------
    def activated(self) -> None:
        """Recovery is done and the listeners are open: ``live``."""
        self.last_takeover_s = self.clock() - self._taken_at
        self.loop_tick()
        self._move(Role.LIVE)

    def loop_tick(self) -> None:
        """The event loop ran (called from a timer on it every ``renew_ms``)."""
        self._loop_seen = self.clock()

    def _start_renewing(self) -> None:
        self._stop.clear()
        thread = self._renewer = threading.Thread(target=self._renewing, name="pymq-ha-lease", daemon=True)
        thread.start()

    def _renewing(self) -> None:
        medium = self.medium
        quiet = False
        while not self._stop.wait(self.renew_s):
            if self.role is Role.LIVE and self.clock() - self._loop_seen > self.lease_s:
                if not quiet:
                    log.error("the event loop has not run for %.1f s: not renewing the lease (a backup may "
                              "take the store)", self.clock() - self._loop_seen)
                    quiet = True
                self._look()
                continue
            quiet = False
            if not self._renew(wait=True):
                if medium.fenced_reason is not None:
                    return

    def _look(self) -> None:
        """Read the record without renewing (the loop hangs): a takeover meanwhile fences this process now,
        so the loop's first write after it wakes is refused at once."""
        medium = self.medium
        try:
            current = medium.read()
        except Exception:  # noqa: BLE001 - only a look; the renewal decides
            return
        if current is not None and not medium.is_mine(current):
            medium.fenced(current)

    def _renew(self, wait: bool) -> bool | None:
        """One renewal; True when confirmed, False when fenced, None when it could not be made now."""
        medium = self.medium
        try:
            os_locked = (medium.os_lock_intact() if medium.holds_os_lock else medium.try_os_lock())
            started = self.clock()
            new = medium.renew(os_locked, wait=wait)
        except (OSError, TimeoutError) as exc:
            if wait:
                log.warning("lease renewal failed: %s", exc)
            return None
        except Exception as exc:  # noqa: BLE001 - a database error of any kind: not renewed, retried
            log.warning("lease renewal failed: %s", exc)
            return None
        if new is None:
            return False
        with self._lock:
            self.renewals += 1
            self.seen = new
            if started > self._confirmed:
                self._confirmed = started
                self._serve_until = started + SERVE_SHARE * self.lease_s
        return True

    def may_send(self) -> bool | None:
        """The serving check (2.1), on the event loop before bytes leave for a client: True (send), False
        (fenced: send nothing, ever), None (the lease could not be confirmed just now: send later)."""
        if self.clock() < self._serve_until:
            return True
        if self.medium.fenced_reason is not None:
            return False
        return self._renew(wait=False)

    def fresh(self) -> bool:
        """Writes not made under the epoch lock go only under a fresh lease (spec/ha.md §2.3): confirmed now
        by a renewal (waiting for the lease file's lock: a candidate holds it only while it writes) if need be."""
        if self.clock() < self._serve_until:
            return True
        if self.medium.fenced_reason is not None:
            return False
        return bool(self._renew(wait=True))

    @property
    def serve_until(self) -> float:
        return self._serve_until

    def stop(self) -> None:
        """A clean stop, after storage is closed: no more renewals, every lock released (the OS lock last,
        so the candidate takes over at once: 1.9)."""
        self._stop.set()
        renewer = self._renewer
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join(timeout=max(1.0, 2 * self.renew_s))
        with self._lock:
            if self.role is not Role.STOPPED:
                self.role = move(self.role, Role.STOPPED)
        self.medium.close()

    def abandon(self) -> None:
        """A fenced process: no more renewals, every lock released (nothing is written)."""
        self._stop.set()
        self.medium.close()

    # -- what it reports ----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        seen = self.seen
        with self._lock:
            role = self.role
        return {
            "role": role.value,
            "store": self.medium.kind,
            "epoch": seen.epoch if seen is not None else 0,
            "my_epoch": self.medium.epoch,
            "node": self.node,
            "lease_ms": int(self.lease_s * 1000),
            "candidate": self.candidate,
            "holder": seen.holder() if seen is not None else None,
            "me": {"instance": self.instance.hex(), "host": self.host, "pid": self.pid},
            "since_ms": int(self.since * 1000),
            "takeovers": self.takeovers,
            "renewals": self.renewals,
            "last_takeover_s": self.last_takeover_s,
            "take_reason": self.take_reason,
            "fenced": self.medium.fenced_reason,
        }
