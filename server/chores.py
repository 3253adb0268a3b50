"""A running broker's periodic work on its event loop.

:class:`Chores` owns three timers of one :class:`~pymq_server.app.BrokerServer` run: the broker's
housekeeping every second (expiry, delivery timeouts, scheduled messages, idle destinations), storage
maintenance (devices in fault repaired and devices that did not open at start-up opened, spec/storage.md
§8, each with its own back-off) and the storage monitor's refresh when storage-selection rules are in use
(seed 000).  A failure in one round is logged and the next round runs; a stop or a fencing cancels all.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from pymq_server.broker.broker import Broker
from pymq_server.net.runtime import AsyncioRuntime
from pymq_server.storage.store import HoldingStore

log = logging.getLogger("pymq.server")

HOUSEKEEPING_PERIOD_S = 1.0
#: how often the store is asked to bring back devices out of service (each has its own back-off)
STORAGE_MAINTENANCE_PERIOD_S = 0.25


class Chores:
    def __init__(self, broker: Broker, store: HoldingStore, runtime: AsyncioRuntime) -> None:
        self.broker = broker
        self.store = store
        self.runtime = runtime
        self._housekeeping: asyncio.TimerHandle | None = None
        self._maintenance: asyncio.TimerHandle | None = None
        self._selection: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._schedule_housekeeping()
        self._schedule_maintenance()

    def cancel(self) -> None:
        for timer in (self._housekeeping, self._maintenance, self._selection):
            if timer is not None:
                timer.cancel()

    def use_selection(self, selection: Any) -> None:
        """The adaptive layer of seed 000: rules from YAML (inline mapping or a file path), refreshed from
        now on."""
        from pymq_server.broker.stored_form import rule_context_of
        from pymq_server.config import read_selection
        from pymq_server.storage.selection import AdaptiveSelection
        store = self.store
        layer = AdaptiveSelection.from_yaml(read_selection(selection), list(store.devices.values()))
        store.use_selection(layer, rule_context_of)
        self.refresh_selection()

    def refresh_selection(self) -> None:
        """The storage monitor's figures refreshed, and the next refresh scheduled when it asks."""
        runtime = self.runtime
        layer = self.store.selection
        if layer is None:
            return
        now = runtime.time()
        try:
            layer.refresh(now)
        except Exception:  # a monitor bug must not stop the broker; the next refresh retries
            log.exception("storage monitor refresh failed")
        delay = max(0.01, layer.next_refresh() - runtime.time())
        self._selection = asyncio.get_running_loop().call_later(delay, self.refresh_selection)

    def _schedule_housekeeping(self) -> None:
        loop = asyncio.get_running_loop()
        self._housekeeping = loop.call_later(HOUSEKEEPING_PERIOD_S, self._run_housekeeping)

    def _run_housekeeping(self) -> None:
        try:
            self.broker.housekeeping()
        finally:
            self._schedule_housekeeping()

    def _schedule_maintenance(self) -> None:
        loop = asyncio.get_running_loop()
        self._maintenance = loop.call_later(STORAGE_MAINTENANCE_PERIOD_S, self._run_maintenance)

    def _run_maintenance(self) -> None:
        """Devices in fault are repaired, devices that did not open at start-up opened (spec/storage.md
        §8), each with its own back-off; the work runs in worker threads."""
        try:
            self.store.maintain(self.runtime.time())
        except Exception:  # a bug here must not stop the broker; the next round retries
            log.exception("storage maintenance failed")
        finally:
            self._schedule_maintenance()
