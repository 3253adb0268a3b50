"""A server process's part in a high-availability group (spec/ha.md §1–§2): what it runs as a backup, when it
takes the store, and when it finds itself fenced.

:class:`HaRole` belongs to one :class:`~pymq_server.app.BrokerServer` run: it builds the lease medium the
configuration names (a shared directory, or the PostgreSQL database of the SQL devices), waits off the event
loop until the store is taken (:meth:`HaRole.wait_until_live`), gives the devices their fence and the
listeners their serving check, ticks the event loop's liveness into the arbiter, and, when any check finds
the epoch stale, has the server abandon everything without writing a byte (``BrokerServer.abandon``).  The
command line then ends the process or starts a new server as a backup (``ha.after_fenced``).
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pymq_server.config import BrokerConfig
from pymq_server.storage.ha.arbiter import HaArbiter
from pymq_server.storage.ha.medium import LeaseMedium
from pymq_server.storage.ha.roles import Role



class Served(Protocol):
    """What the role needs of its server (``pymq_server.app.BrokerServer``, one level up)."""

    config: BrokerConfig

    def abandon(self, reason: str) -> Awaitable[None]: ...

log = logging.getLogger("pymq.ha")


def lease_medium(config: BrokerConfig) -> LeaseMedium:
    """The medium the configuration's store needs (spec/ha.md §1.3)."""
    kind, where = config.ha_store()
    if kind == "file":
        from pymq_server.storage.ha.filelease import FileLease
        return FileLease(os.path.join(where, "ha"), config.node_id)
    from pymq_server.storage.ha.pglease import PgLease
    assert config.ha is not None
    devices = config.storage.devices or {}
    prefix = next((getattr(d, "table_prefix", "pymq_") for d in devices.values() if d.kind == "sql"), "pymq_")
    return PgLease(where, config.node_id, table_prefix=prefix, lease_ms=config.ha.lease_ms)


class HaRole:
    def __init__(self, server: Served) -> None:
        ha = server.config.ha
        if ha is None:
            raise ValueError("HaRole needs an ha: section")
        self.server = server
        self.config = ha
        self.arbiter = HaArbiter(lease_medium(server.config), node=server.config.node_id, lease_ms=ha.lease_ms,
                                 renew_ms=ha.renew_every_ms, poll_ms=ha.poll_ms)
        self.fenced = asyncio.Event()
        self.fenced_reason: str | None = None
        self._waiting = threading.Event()          # set: stop waiting as a backup
        self._tick: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def medium(self) -> LeaseMedium:
        return self.arbiter.medium

    @property
    def role(self) -> Role:
        return self.arbiter.role

    # -- backup ---------------------------------------------------------------------------------------------
    async def wait_until_live(self, waiting: Callable[[], None] | None = None) -> bool:
        """Wait as a backup until this process takes the store (True), or :meth:`stop_waiting` (False).
        ``waiting`` is called once the lease medium is open and the lease was read: from then on the
        status (admin, /readyz, metrics) shows the holder and its epoch, not a backup that knows nothing."""
        loop = self._loop = asyncio.get_running_loop()

        def fenced(reason: str) -> None:          # any thread: a renewal, a write, a barrier
            loop.call_soon_threadsafe(self._on_fenced, reason)

        self.arbiter.on_fenced(fenced)
        await asyncio.to_thread(self.medium.open)
        await asyncio.to_thread(self.arbiter.look)
        if waiting is not None:
            waiting()
        log.info("backup of node %s: waiting for the store (%s)", self.arbiter.node, self.medium.kind)
        return await asyncio.to_thread(self.arbiter.wait_until_taken, self._waiting)

    def stop_waiting(self) -> None:
        self._waiting.set()

    # -- live ------------------------------------------------------------------------------------------------
    def activated(self) -> None:
        """Recovery done, listeners open: live; the event loop's liveness ticks into the arbiter from now."""
        self.arbiter.activated()
        log.warning("live at epoch %d, %.2f s after taking the store", self.medium.epoch,
                    self.arbiter.last_takeover_s or 0.0)
        self._schedule_tick()

    def _schedule_tick(self) -> None:
        if self._loop is not None:
            self._tick = self._loop.call_later(self.arbiter.renew_s / 2, self._ticked)

    def _ticked(self) -> None:
        self.arbiter.loop_tick()
        self._schedule_tick()

    def _on_fenced(self, reason: str) -> None:
        if self.fenced_reason is not None:
            return
        self.fenced_reason = reason
        if self._tick is not None:
            self._tick.cancel()
        self.fenced.set()
        asyncio.ensure_future(self.server.abandon(reason))

    async def stop(self) -> None:
        """A clean stop (after storage closed): the OS lock released last."""
        self._waiting.set()
        if self._tick is not None:
            self._tick.cancel()
        await asyncio.to_thread(self.arbiter.stop)

    def status(self) -> dict[str, Any]:
        return self.arbiter.status()
