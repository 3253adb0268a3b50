"""Bringing devices back into service (spec/storage.md §8): devices in fault are repaired, devices that
could not be opened at start-up are opened, each in a worker thread with a back-off of its own.

``maintain`` runs on the broker's timer. A device opened late hands itself to ``on_device_opened`` (the
broker recovers its messages into the running broker). Nothing here decides what a fault means: each
device says whether it ``needs_repair`` and what ``repair`` does.
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from pymq.errors import StorageError

from .device import HoldingDevice
from .syncing import RunInThread, run_work

log = logging.getLogger("pymq.storage")

#: back-off between attempts to repair or open a device: from the first to the last, doubling
REPAIR_BACKOFF_S = (0.25, 5.0)


class DeviceRepairs:
    def __init__(self, devices: Iterable[HoldingDevice], run_in_thread: RunInThread | None = None) -> None:
        self.devices = list(devices)
        self.run_in_thread = run_in_thread
        #: devices that could not be opened at start-up (name -> why); ``maintain`` keeps trying
        self.unopened: dict[str, str] = {}
        #: called on the broker thread with a device opened late (its messages must be recovered)
        self.on_device_opened: Callable[[HoldingDevice], object] | None = None
        self._repairing: set[str] = set()
        self._next_attempt: dict[str, tuple[float, float]] = {}   # name -> (when, current back-off)
        self.clock = time.monotonic

    def open(self, required: Iterable[HoldingDevice]) -> None:
        """Open every device. The ``required`` ones must open (an error is raised); any other one that
        cannot is left out of service, refusing messages, and ``maintain`` opens it later."""
        must = {id(device) for device in required}
        for device in self.devices:
            try:
                device.open()
            except (StorageError, OSError) as exc:
                if id(device) in must:
                    raise
                reason = exc.message if isinstance(exc, StorageError) else str(exc)
                self.unopened[device.name] = reason
                log.error("holding device %s could not be opened, it is out of service and retried: %s",
                          device.name, reason)

    def maintain(self, now: float | None = None) -> None:
        """Try to bring back devices out of service: repair those in fault, open those that could not
        be opened; each in a worker thread, with a back-off per device (broker thread)."""
        now = self.clock() if now is None else now
        for device in self.devices:
            name = device.name
            if name in self._repairing:
                continue
            late = name in self.unopened
            if not late and not device.needs_repair:
                self._next_attempt.pop(name, None)
                continue
            when, backoff = self._next_attempt.get(name, (now, REPAIR_BACKOFF_S[0]))
            if when > now:
                continue
            self._next_attempt[name] = (now + backoff, min(backoff * 2, REPAIR_BACKOFF_S[1]))
            self._repairing.add(name)
            work = functools.partial(self._open_late, device) if late else device.repair
            run_work(self.run_in_thread, work, functools.partial(self._repaired, device, late))

    def _open_late(self, device: HoldingDevice) -> bool:
        device.open()
        return True

    def _repaired(self, device: HoldingDevice, late: bool, ok: Any, error: BaseException | None) -> None:
        self._repairing.discard(device.name)
        if error is not None or not ok:
            if late and error is not None:
                self.unopened[device.name] = getattr(error, "message", str(error))
            return
        self._next_attempt.pop(device.name, None)
        if late:
            del self.unopened[device.name]
            log.warning("holding device %s is open now and back in service", device.name)
            if self.on_device_opened is not None:
                self.on_device_opened(device)
