"""The holding store: the one object the broker core calls to keep messages, whatever the device.

It chooses a device per message (a ``choose`` function: the adaptive rule layer of seed 000, or the
simple default "persistent → the persistent device, otherwise memory"), writes the message there with
one reference per queue, removes references as entries complete, and tells the broker when everything
written so far is durable (``barrier``), which is when receipts for persistent SENDs may go out.

Group commit: writes are flushed at once and synced under a per-device :class:`GroupCommit` policy —
``always`` (every receipt waits for a sync that started after it; commits arriving while a sync runs
share the next one, so a busy broker still batches), ``grouped`` (additionally at most one sync per
``window_ms``) or ``never`` (durable = handed to the OS).  Syncs run in a worker thread through the injected
``run_in_thread`` so the broker's loop keeps serving; this module imports no event loop.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Iterable

from pymq.errors import StorageError
from pymq_server.storage.commit import GroupCommit
from pymq_server.storage.device import HoldingDevice, StoredMessage
from pymq_server.storage.memory import MemoryDevice

log = logging.getLogger("pymq.storage")

SYNC_POLICIES = ("always", "grouped", "never")


class HoldingStore:
    def __init__(self, devices: Iterable[HoldingDevice], *, persistent_device: str | None = None,
                 catalog_device: str | None = None, sync_policy: str = "always",
                 sync_window_ms: float = 2.0,
                 call_later: Callable | None = None,
                 run_in_thread: Callable | None = None) -> None:
        self.devices: dict[str, HoldingDevice] = {}
        for device in devices:
            if device.name in self.devices:
                raise StorageError(f"two holding devices are named {device.name!r}")
            self.devices[device.name] = device
        if "memory" not in self.devices:
            self.devices["memory"] = MemoryDevice("memory")
        self.memory: MemoryDevice = self.devices["memory"]  # type: ignore[assignment]
        self.persistent_device = self.devices[persistent_device or "memory"]
        self.catalog = self.devices[catalog_device] if catalog_device else self.persistent_device
        if sync_policy not in SYNC_POLICIES:
            raise StorageError(f"sync policy must be one of {', '.join(SYNC_POLICIES)}, got {sync_policy!r}")
        self.sync_policy = sync_policy
        self.sync_window_ms = sync_window_ms
        self._call_later = call_later
        self._run_in_thread = run_in_thread
        #: message -> device; replaced by the adaptive layer's decision function
        self.choose: Callable = self._default_choice
        self.selection = None          # the adaptive layer (seed 000) when configured
        self._placed: dict[tuple[str, str | None], list[int]] = {}
        self._dirty: set[HoldingDevice] = set()
        self._commits: dict[str, GroupCommit] = {}
        self._timers: set[str] = set()
        self._checkpointing: set[str] = set()
        self._clock = time.monotonic
        self.syncs = 0
        self.encode: Callable = None  # set by the broker: BrokerMessage -> bytes

    # -- lifecycle ------------------------------------------------------------------------------
    def open(self) -> None:
        for device in self.devices.values():
            device.open()

    def close(self) -> None:
        errors = []
        for device in self.devices.values():
            try:
                device.close()
            except Exception as exc:  # keep closing the others; report all
                errors.append(f"{device.name}: {exc}")
        if errors:
            raise StorageError("closing devices failed: " + "; ".join(errors))

    # -- placement ------------------------------------------------------------------------------
    def _default_choice(self, message):
        return (self.persistent_device if message.persistent else self.memory), None

    def use_selection(self, layer, context: Callable) -> None:
        """Let the adaptive layer of seed 000 choose each message's device.

        ``context(message)`` builds the rule context (spec/storage_rules.md §2) for a message."""
        self.selection = layer
        devices = self.devices

        def choose(message):
            decision = layer.select(context(message))
            return devices[decision.device], decision.rule_id or decision.fallback

        self.choose = choose

    def placements(self) -> list[dict]:
        """Messages and bytes held per device and per deciding rule (the admin view)."""
        return [{"device": device, "rule": rule, "messages": n, "bytes": size}
                for (device, rule), (n, size) in sorted(self._placed.items(), key=lambda kv: str(kv[0]))
                if n]

    def hold(self, message, queues: list[str]) -> bool:
        """Place ``message`` with references for ``queues``; True when a device stores it (so the
        entries must release their references later).  ``queues`` are the queues whose references
        must survive a restart (empty for a topic message with no durable subscriber)."""
        device, rule = self.choose(message)
        message.rule = rule
        placed = self._placed.get((device.name, rule))
        if placed is None:
            placed = self._placed[(device.name, rule)] = [0, 0]
        placed[0] += 1
        placed[1] += message.size
        message.chosen = device.name
        if device is self.memory or not queues or (not message.persistent and device.kind != "file"):
            # the heap holds it: the memory device itself, a message no durable queue needs, or a
            # non-persistent message for a device that keeps only persistent ones (only the paged
            # store has non-logged pages for them)
            message.device = self.memory
            self.memory.account(message.size, 1)
            return False
        stored = StoredMessage(message.key, message.destination, message.seq, message.persistent,
                               self.encode(message))
        try:
            device.write(stored, queues)
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"device {device.name!r} failed to write message "
                               f"{message.message_id}: {exc}") from exc
        message.device = device
        self._dirty.add(device)
        return True

    def adopt(self, message) -> None:
        """Account for a message a device wrote by itself (claimed from an application's transaction)."""
        placed = self._placed.get((message.chosen, message.rule))
        if placed is None:
            placed = self._placed[(message.chosen, message.rule)] = [0, 0]
        placed[0] += 1
        placed[1] += message.size

    def forget(self, message) -> None:
        """The last entry of a message is gone; heap-held messages leave the memory figures."""
        device = message.device
        if device is self.memory:
            self.memory.account(message.size, -1)
        if device is not None:
            placed = self._placed.get((self._chosen_name(message), message.rule))
            if placed is not None:
                placed[0] -= 1
                placed[1] -= message.size
        message.device = None

    def _chosen_name(self, message) -> str:
        # a message placed on a device that does not keep it (heap-held) is still counted under the
        # device its rule chose
        return getattr(message, "chosen", None) or message.device.name

    def add_reference(self, message, queue: str) -> bool:
        """One more queue owes an already-held message (moved to a peer's outbox, re-routed): True when
        a device stores the reference, False when the message is heap-held."""
        device = message.device
        if device is None or device is self.memory:
            return False
        device.add_reference(message.key, queue)
        self._dirty.add(device)
        return True

    def release(self, message, queue: str) -> None:
        device = message.device
        if device is None or device is self.memory:
            return
        device.remove(message.key, queue)
        self._dirty.add(device)

    # -- durability -----------------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        return bool(self._dirty)

    def _commit_for(self, device: HoldingDevice) -> GroupCommit:
        gc = self._commits.get(device.name)
        if gc is None:
            gc = self._commits[device.name] = GroupCommit(self.sync_policy, self.sync_window_ms)
        return gc

    def barrier(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once everything written so far is durable under the sync policy.

        Each dirty device gets the commit through its own :class:`GroupCommit`; ``callback`` runs
        when the last of them is durable.  A failed sync is retried (receipts must never claim a
        durability that did not happen); the storage monitor sees the device's errors meanwhile.
        """
        devices = list(self._dirty)
        self._dirty.clear()
        if not devices:
            if not self._in_flight_devices():
                callback()
            else:
                # writes made before this barrier may be covered by a sync still running
                devices = [d for d in self.devices.values() if self._commit_for(d).pending]
        remaining = [len(devices)]

        def one_done(error: BaseException | None, device=None) -> None:
            remaining[0] -= 1
            if remaining[0] == 0:
                callback()

        for device in devices:
            device.flush()
            gc = self._commit_for(device)
            gc.on_commit(lambda error, d=device: self._committed(d, error, one_done))
            self._drive(device)

    def _committed(self, device: HoldingDevice, error: BaseException | None, done: Callable) -> None:
        if error is None:
            done(None)
            return
        log.error("sync of device %s failed (%s); retrying", device.name, error)
        gc = self._commit_for(device)
        gc.on_commit(lambda err: self._committed(device, err, done))
        self._call_later(0.05, self._drive, device)

    def _in_flight_devices(self) -> bool:
        return any(gc.pending for gc in self._commits.values())

    def _drive(self, device: HoldingDevice) -> None:
        """Start the device's next sync when its policy says so (on a worker thread)."""
        gc = self._commit_for(device)
        now = self._clock()
        when = gc.next_sync_at(now)
        if when is None:
            return
        if when > now:
            if device.name not in self._timers:
                self._timers.add(device.name)

                def fire() -> None:
                    self._timers.discard(device.name)
                    self._drive(device)

                self._call_later(when - now, fire)
            return
        gc.sync_started(now)
        if self._run_in_thread is None:
            try:
                device.sync()
            except Exception as exc:
                gc.sync_failed(exc)
                return
            self.syncs += 1
            gc.sync_done()
            return

        def done(result, error: BaseException | None) -> None:
            self.syncs += 1
            if error is None:
                gc.sync_done()
                self._maybe_checkpoint(device)
            else:
                gc.sync_failed(error)
            self._drive(device)

        self._run_in_thread(device.sync, done)

    def _maybe_checkpoint(self, device: HoldingDevice) -> None:
        """Checkpoints (the file device's log trimming) run in a worker after a sync, never inside one,
        so no receipt waits for a checkpoint."""
        if not getattr(device, "checkpoint_due", False) or device.name in self._checkpointing:
            return
        self._checkpointing.add(device.name)

        def done(result, error: BaseException | None) -> None:
            self._checkpointing.discard(device.name)
            if error is not None:
                log.error("checkpoint of device %s failed: %s", device.name, error)

        self._run_in_thread(device.checkpoint, done)

    def flush_all(self) -> None:
        for device in self.devices.values():
            device.flush()
            device.sync()
        self._dirty.clear()

    # -- recovery and catalog -------------------------------------------------------------------
    def recover(self):
        """(device, StoredMessage, queues) for every persistent message still referenced."""
        for device in self.devices.values():
            if device is self.memory:
                continue
            for stored, queues in device.recover():
                yield device, stored, queues

    def put_meta(self, key: str, value: bytes | None) -> None:
        self.catalog.put_meta(key, value)
        self._dirty.add(self.catalog)

    def iter_meta(self):
        return self.catalog.iter_meta()

    def status(self) -> list:
        return [device.status() for device in self.devices.values()]
