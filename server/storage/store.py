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

Write-behind (spec/storage.md §9): a persistent message for the paged file device is checked for room at
once (``check_room``: a full disk still refuses the SEND) but written to the device only when something
needs it there: a barrier (a receipt, a commit), ``flush_all``, more than ``WRITE_BEHIND_BYTES`` or
``WRITE_BEHIND_MESSAGES`` waiting, or once it has waited half to all of ``WRITE_BEHIND_S`` (the timer's
ticks). A barrier over nothing written since the last sync needs no sync. A message whose
every reference is released before then (delivered with ``ack:auto``, or acknowledged, while it
waited) is never written, nor its removal logged: a queue whose consumers keep up costs no more
durable than not. Nothing that was promised changes: a message is durable at its receipt (the barrier
writes and syncs it first), as before, and the WAL already buffered frames without a receipt until a
flush. The device's own view (``status``, ``iterate``) sees a waiting message only once written.

Faults (spec/storage.md §8) are answered, never silent, and survived:

* a device that refuses a message (full, in fault, offline) makes ``hold`` ask the rules again without it
  (seed 000: the next device the adjusted rules rank); only when no device can take it does ``hold``
  raise :class:`StorageError`, which the broker turns into an ERROR for the frame that sent it;
* a flush or sync that fails completes the barrier with the error, so the receipts waiting on it become
  an ERROR instead of waiting forever;
* ``maintain`` (the broker's timer) repairs devices in fault and opens devices that could not be opened
  at start-up, each with a back-off, in a worker thread; a device opened late hands its messages to
  ``on_device_opened`` (the broker recovers them).
"""
from __future__ import annotations

import functools
import logging
import time
from typing import Any
from collections.abc import Callable, Iterable, Sequence

from pymq.errors import StorageError
from pymq_server.storage.commit import GroupCommit
from pymq_server.storage.device import HoldingDevice, StoredMessage
from pymq_server.storage.memory import MemoryDevice

log = logging.getLogger("pymq.storage")

_NONE_EXCLUDED: frozenset[str] = frozenset()

SYNC_POLICIES = ("always", "grouped", "never")

#: back-off between attempts to repair or open a device: from the first to the last, doubling
REPAIR_BACKOFF_S = (0.25, 5.0)

#: delivery records reach the OS with the next write of the device's log, or after this long at most
DELIVERY_FLUSH_S = 0.010

#: write-behind bounds: messages and stored bytes waiting, and how long a message may wait. The timer
#: ticks every half of WRITE_BEHIND_S while messages wait; each tick writes those held before the tick
#: before it (so they waited between a half and the whole of WRITE_BEHIND_S), not the ones just held:
#: a message its consumer takes within a tick or two is never written (spec/storage.md §9)
WRITE_BEHIND_MESSAGES = 4096
WRITE_BEHIND_BYTES = 1 << 20
WRITE_BEHIND_S = 0.05

#: what the broker hands to ``barrier``: called once, with None (durable) or the StorageError that
#: kept the writes from becoming durable
BarrierCallback = Callable[["StorageError | None"], None]


def block_state_key(record_key: int, queue: str) -> str:
    """The catalog record of a stored bulk block's settled rows (spec/storage.md §11)."""
    return f"rows:{record_key}:{queue}"


def _no_encoder(message: Any) -> bytes:
    raise RuntimeError("HoldingStore.encode is set by the broker before anything is stored")


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
        #: (message, devices to leave out) -> (device, deciding rule); the adaptive layer's when configured
        self.choose: Callable = self._default_choice
        self._default: Callable = self.choose       # the same bound method, to tell it from another choice
        self.selection = None          # the adaptive layer (seed 000) when configured
        self._placed: dict[tuple[str, str | None], list[int]] = {}
        #: devices that could not be opened at start-up (name -> why); ``maintain`` keeps trying
        self.unopened: dict[str, str] = {}
        #: called on the broker thread with a device opened late (its messages must be recovered)
        self.on_device_opened: Callable[[HoldingDevice], object] | None = None
        self._repairing: set[str] = set()
        self._delivery_flush: set[HoldingDevice] = set()   # devices with delivery records to hand out
        self._next_attempt: dict[str, tuple[float, float]] = {}   # name -> (when, current back-off)
        self._dirty: set[HoldingDevice] = set()
        self._commits: dict[str, GroupCommit] = {}
        self._timers: set[str] = set()
        self._checkpointing: set[str] = set()
        self._clock = time.monotonic
        self.syncs = 0
        self.encode: Callable[[Any], bytes] = _no_encoder  # set by the broker: BrokerMessage -> bytes
        #: the same bytes as pieces (a large body stays the message's own bytes: written behind with
        #: ``write_parts``, never joined); set by the broker
        self.encode_parts: Callable[[Any], tuple[bytes, ...]] = lambda message: (self.encode(message),)
        #: write-behind (module docstring): key -> [message, device, queues still referencing it,
        #: delivery counts recorded meanwhile or None, the timer's tick when it was held], in placement
        #: order; False turns it off (every message written at ``hold``)
        self.write_behind = True
        self._behind: dict[int, list] = {}
        self._behind_bytes = 0
        self._behind_timer = False
        self._behind_tick = 0
        #: the admin figures' entry of the device messages are written behind to by the default choice
        self._behind_counted: HoldingDevice | None = None
        self._behind_placed: list[int] = [0, 0]
        self._behind_error: StorageError | None = None
        #: stored bulk blocks (broker/blocks.py) whose catalog record of settled rows is behind
        self._blocks_changed: set = set()

    # -- lifecycle ------------------------------------------------------------------------------
    def open(self) -> None:
        """Open every device.  The catalog device must open (the broker cannot know its queues and
        numbering without it); any other one that cannot is left out of service, refusing messages, and
        ``maintain`` opens it later."""
        for device in self.devices.values():
            try:
                device.open()
            except (StorageError, OSError) as exc:
                if device is self.catalog or device is self.memory:
                    raise
                reason = exc.message if isinstance(exc, StorageError) else str(exc)
                self.unopened[device.name] = reason
                log.error("holding device %s could not be opened, it is out of service and retried: %s",
                          device.name, reason)

    def close(self) -> None:
        self.write_waiting()
        errors = []
        for device in self.devices.values():
            try:
                device.close()
            except Exception as exc:  # noqa: BLE001 - keep closing the others; report all
                errors.append(f"{device.name}: {exc}")
        if errors:
            raise StorageError("closing devices failed: " + "; ".join(errors))

    # -- placement ------------------------------------------------------------------------------
    def _default_choice(self, message, exclude: frozenset[str] = frozenset()):
        device = self.persistent_device if message.persistent else self.memory
        if device.name in exclude:
            raise StorageError(f"no other holding device is configured for "
                               f"{'persistent' if message.persistent else 'non-persistent'} messages")
        return device, None

    def use_selection(self, layer, context: Callable) -> None:
        """Let the adaptive layer of seed 000 choose each message's device.

        ``context(message)`` builds the rule context (spec/storage_rules.md §2) for a message."""
        self.selection = layer
        devices = self.devices

        def choose(message, exclude: frozenset[str] = frozenset()):
            decision = layer.select(context(message), exclude=exclude, size=message.size)
            return devices[decision.device], decision.rule_id or decision.fallback

        self.choose = choose

    def placements(self) -> list[dict]:
        """Messages and bytes held per device and per deciding rule (the admin view)."""
        return [{"device": device, "rule": rule, "messages": n, "bytes": size}
                for (device, rule), (n, size) in sorted(self._placed.items(), key=lambda kv: str(kv[0]))
                if n]

    def hold(self, message, queues: Sequence[str]) -> bool:
        """Place ``message`` with references for ``queues``; True when a device stores it (so the
        entries must release their references later).  ``queues`` are the queues whose references
        must survive a restart (empty for a topic message with no durable subscriber).

        A device that refuses the message is left out and the choice made again (seed 000: the next
        device the adjusted rules rank); StorageError, naming every refusal, when none can take it.
        Nothing is counted or changed for a message that was refused."""
        if not message.persistent and self.choose is self._default:
            # the common non-persistent case: the default choice is the heap, as the loop below would decide
            return self._hold_in_heap(message, self.memory, None)
        refused: list[str] = []
        exclude: frozenset[str] = _NONE_EXCLUDED
        if message.persistent and queues and self.write_behind and self.choose is self._default:
            # the common durable case, decided without the general loop: the default choice is the
            # persistent device, and a file device takes it behind once it has room (spec/storage.md §9)
            device = self.persistent_device
            if device.kind == "file":
                try:
                    device.check_room(message.size)   # room now: a full disk refuses the SEND itself
                except StorageError as exc:
                    refused.append(f"{device.name}: {exc.message}")
                    exclude = frozenset((device.name,))
                else:
                    self._hold_behind(message, device, queues)
                    return True
        # the general case: the rules choose, a device that refuses is left out
        stored = None
        while True:
            try:
                device, rule = self.choose(message, exclude)
            except StorageError as exc:
                if not refused:
                    raise
                raise StorageError(f"no holding device could take message {message.message_id}: "
                                   f"{'; '.join(refused)}; {exc.message}") from None
            if device is self.memory or not queues or (not message.persistent and device.kind != "file"):
                # the heap holds it: the memory device itself, a message no durable queue needs, or a
                # non-persistent message for a device that keeps only persistent ones (only the paged
                # store has non-logged pages for them)
                return self._hold_in_heap(message, device, rule)
            if self.write_behind and message.persistent and device.kind == "file" and self.selection is None:
                try:
                    device.check_room(message.size)    # room now: a full disk refuses the SEND itself
                except StorageError as exc:
                    refused.append(f"{device.name}: {exc.message}")
                    exclude = exclude | {device.name}
                    continue
                self._hold_behind(message, device, queues, rule)
                return True
            if stored is None:
                stored = StoredMessage(message.key, message.destination, message.seq, message.persistent,
                                       self.encode(message))
            try:
                device.write(stored, queues)
            except StorageError as exc:
                refused.append(f"{device.name}: {exc.message}")
            except Exception as exc:     # a device bug or an unexpected client error: still a refusal
                log.exception("holding device %s failed to write message %s", device.name, message.message_id)
                refused.append(f"{device.name}: {type(exc).__name__}: {exc}")
            else:
                self._count(message, device, rule)
                message.device = device
                self._dirty.add(device)
                if self.selection is not None:
                    self.selection.consumed(device.name, stored.size)
                return True
            if self.selection is not None:
                self.selection.refused(device.name, stored.size)
            exclude = exclude | {device.name}

    def _hold_in_heap(self, message, device: HoldingDevice, rule: str | None) -> bool:
        """The heap holds ``message`` (counted under ``device``, the one its rule chose); False: nothing
        stored (memory.account inlined: once per non-persistent message)."""
        self._count(message, device, rule)
        memory = self.memory
        message.device = memory
        memory.held_messages += 1
        memory.held_bytes += message.size
        return False

    def _hold_behind(self, message, device: HoldingDevice, queues: Sequence[str], rule: str | None = None) -> None:
        """``message`` waits to be written to ``device``, which has room for it. The device is not
        marked dirty: a message released before it is written needs no sync (``write_waiting`` marks
        the device when it writes)."""
        if rule is None and device is self._behind_counted:
            placed = self._behind_placed         # _count for the default choice, without the look-up
            message.rule = None
            message.chosen = device.name
            placed[0] += 1
            placed[1] += message.size
        else:
            self._count(message, device, rule)
            if rule is None:
                self._behind_counted, self._behind_placed = device, self._placed[(device.name, None)]
        message.device = device
        self._behind[message.key] = [message, device, list(queues), None, self._behind_tick]
        self._behind_bytes += message.size
        if len(self._behind) >= WRITE_BEHIND_MESSAGES or self._behind_bytes >= WRITE_BEHIND_BYTES:
            self.write_waiting()
        elif not self._behind_timer and self._call_later is not None:
            self._behind_timer = True
            self._call_later(WRITE_BEHIND_S / 2, self._behind_due)

    def _count(self, message, device: HoldingDevice, rule) -> None:
        """The admin placement figures: only messages a device took."""
        message.rule = rule
        message.chosen = device.name
        placed = self._placed.get((device.name, rule))
        if placed is None:
            placed = self._placed[(device.name, rule)] = [0, 0]
        placed[0] += 1
        placed[1] += message.size

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
            device.held_messages -= 1           # memory.account(size, -1), inlined: once per message
            device.held_bytes -= message.size
        if device is not None:
            # counted under the device its rule chose, even when the heap holds it
            placed = self._placed.get((message.chosen or device.name, message.rule))
            if placed is not None:
                placed[0] -= 1
                placed[1] -= message.size
        message.device = None

    # -- write-behind ---------------------------------------------------------------------------
    def _behind_due(self) -> None:
        """The write-behind timer's tick: messages held before the previous tick have waited at least half
        of ``WRITE_BEHIND_S`` (at most all of it) and are written; younger ones wait for the next tick."""
        self._behind_timer = False
        self._behind_tick += 1
        self.write_waiting(held_before=self._behind_tick - 1)
        if self._behind and self._call_later is not None:
            self._behind_timer = True
            self._call_later(WRITE_BEHIND_S / 2, self._behind_due)

    def write_waiting(self, held_before: int | None = None) -> None:
        """Write every message still waiting for its device (or, with ``held_before``, those held before
        that tick of the timer), in placement order. A device that cannot take one now (fault, disk
        gone) leaves it held by the heap, as a refusal at ``hold`` would have, and the next barrier
        reports the error, so no receipt claims a durability it does not have."""
        if not self._behind:
            return
        if held_before is None:
            waiting, self._behind = self._behind, {}
            self._behind_bytes = 0
        else:
            waiting = {}
            for key, behind in self._behind.items():
                if behind[4] >= held_before:
                    break            # placement order is tick order: the rest are younger
                waiting[key] = behind
            if not waiting:
                return
            behind_map = self._behind
            for key, behind in waiting.items():
                del behind_map[key]
                self._behind_bytes -= behind[0].size
        for message, device, queues, deliveries, _ in waiting.values():
            parts = self.encode_parts(message)
            stored = StoredMessage(message.key, message.destination, message.seq, message.persistent,
                                   parts[0] if len(parts) == 1 else b"")
            try:
                if len(parts) == 1:
                    device.write(stored, queues)
                else:
                    device.write_parts(stored, parts, queues)
            except Exception as exc:  # noqa: BLE001 - a refusal or a device bug: the message stays in the heap
                error = exc if isinstance(exc, StorageError) else StorageError(
                    f"holding device {device.name} failed to write message {message.message_id}: "
                    f"{type(exc).__name__}: {exc}")
                log.error("holding device %s could not take message %s written behind: %s", device.name,
                          message.message_id, error.message)
                if self._behind_error is None:
                    self._behind_error = error
                self.forget(message)
                message.device = self.memory
                self.memory.account(message.size, 1)
                self._count(message, self.memory, None)
                continue
            self._dirty.add(device)
            if deliveries:
                for queue, count in deliveries.items():
                    device.record_delivery(message.key, queue, count)

    def waiting(self, message) -> bool:
        """True while ``message`` waits to be written behind (not on its device yet)."""
        return message.key in self._behind

    def add_reference(self, message, queue: str) -> bool:
        """One more queue owes an already-held message (moved to a peer's outbox, re-routed): True when
        a device stores the reference, False when the message is heap-held."""
        device = message.device
        if device is None or device is self.memory:
            return False
        behind = self._behind.get(message.key) if self._behind else None
        if behind is not None:
            behind[2].append(queue)
            return True
        device.add_reference(message.key, queue)
        self._dirty.add(device)
        return True

    # -- bulk blocks (broker/blocks.py): one record, rows settled one by one ----------------------
    def block_changed(self, block) -> None:
        """A row of a stored block was settled or delivered: its catalog record is written within
        ``DELIVERY_FLUSH_S`` (or by the next barrier), as a removal or a delivery record would be."""
        changed = self._blocks_changed
        if not changed and self._call_later is not None:
            self._call_later(DELIVERY_FLUSH_S, functools.partial(self._write_blocks, True))
        changed.add(block)

    def _write_blocks(self, flush: bool = False) -> None:
        changed, self._blocks_changed = self._blocks_changed, set()
        for block in changed:
            self.put_meta(block_state_key(block.holder.key, block.queue), block.state())
            block.recorded = True
        if flush and changed:
            try:
                self.catalog.flush()
            except StorageError as exc:     # the device is in fault now; the next barrier reports it
                log.error("flush of device %s failed: %s", self.catalog.name, exc.message)

    def block_done(self, block) -> None:
        """The last row of ``block`` is gone: its record's reference goes, and its catalog record."""
        self._blocks_changed.discard(block)
        if block.stored:
            self.release(block.holder, block.queue)
            if block.recorded:
                self.put_meta(block_state_key(block.holder.key, block.queue), None)

    def delivered(self, message, queue: str, count: int) -> None:
        """A stored persistent message went to a consumer that must acknowledge it, for the ``count``-th
        time: the device records it (issue 11: a poison message keeps its count across restarts).  The
        record rides with the device's next log write, which a busy broker makes anyway (every receipt's
        barrier flushes); an idle one flushes it at most ``DELIVERY_FLUSH_S`` later.  No fsync: a crash
        of the broker keeps it once flushed, a power cut may not (counts are at-least-once bookkeeping)."""
        behind = self._behind.get(message.key) if self._behind else None
        if behind is not None:
            # not on its device yet: the count is recorded right after the message is written
            deliveries = behind[3]
            if deliveries is None:
                behind[3] = {queue: count}
            else:
                deliveries[queue] = count
            return
        device = message.device
        if device is None or device is self.memory or not message.persistent:
            bulk = message.bulk
            if bulk is not None and bulk.stored and message.persistent:
                bulk.delivered(message, count)      # a row of a stored block: in the block's record
                self.block_changed(bulk)
            return
        device.record_delivery(message.key, queue, count)
        if device not in self._delivery_flush:
            self._delivery_flush.add(device)
            if len(self._delivery_flush) == 1 and self._call_later is not None:
                self._call_later(DELIVERY_FLUSH_S, self._flush_deliveries)

    def _flush_deliveries(self) -> None:
        devices, self._delivery_flush = self._delivery_flush, set()
        for device in devices:
            try:
                device.flush()
            except StorageError as exc:     # the device is in fault now; its repair records the counts
                log.error("flush of device %s failed: %s", device.name, exc.message)

    def mark_dirty(self, device: HoldingDevice) -> None:
        """Changes were made on ``device`` directly (a paged batch removed): the next barrier flushes it."""
        self._dirty.add(device)

    def release(self, message, queue: str) -> None:
        device = message.device
        if device is None or device is self.memory:
            return
        if self._behind:
            behind = self._behind.get(message.key)
            if behind is not None:
                # released before it was written: the device never sees it (nor its removal)
                queues = behind[2]
                try:
                    queues.remove(queue)
                except ValueError:
                    raise KeyError(f"message {message.key} has no reference for {queue!r}") from None
                if not queues:
                    del self._behind[message.key]
                    self._behind_bytes -= message.size
                return
        device.remove(message.key, queue)
        self._dirty.add(device)

    # -- durability -----------------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        return bool(self._dirty) or bool(self._behind)

    def _commit_for(self, device: HoldingDevice) -> GroupCommit:
        gc = self._commits.get(device.name)
        if gc is None:
            gc = self._commits[device.name] = GroupCommit(self.sync_policy, self.sync_window_ms)
        return gc

    def barrier(self, callback: BarrierCallback) -> None:
        """Call ``callback(None)`` once everything written so far is durable under the sync policy,
        or ``callback(error)`` when a device could not make it durable (a failed flush or sync: the
        receipts waiting on it become an ERROR, never a wait without end).

        Each dirty device gets the commit through its own :class:`GroupCommit`; ``callback`` runs
        once, when the last of them has answered, with the first error any of them met.
        """
        self.write_waiting()
        if self._blocks_changed:
            self._write_blocks()
        behind_error, self._behind_error = self._behind_error, None
        if behind_error is not None:
            # a message written behind could not be stored: this barrier cannot claim durability
            inner = callback

            def callback(error: StorageError | None) -> None:  # noqa: F811 - wraps the caller's
                inner(error if error is not None else behind_error)
        devices = list(self._dirty)
        self._dirty.clear()
        joining = not devices
        if joining:
            if not self._in_flight_devices():
                callback(None)
                return
            # nothing written since the last barrier, whose commit a sync still to finish covers:
            # wait for that sync (GroupCommit.join), not for one more of this barrier's own
            devices = [d for d in self.devices.values() if self._commit_for(d).pending]
        state: list = [len(devices), None]     # devices still to answer, first error

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
            gc = self._commit_for(device)
            gc.on_commit(functools.partial(self._committed, device, done=one_done))
            self._drive(device)

    def _committed(self, device: HoldingDevice, error: BaseException | None, done: Callable) -> None:
        if error is not None:
            log.error("sync of device %s failed: %s", device.name, getattr(error, "message", error))
        done(error)

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

                if self._call_later is None:
                    raise RuntimeError(f"sync policy {self.sync_policy!r} waits: the store needs call_later")
                self._call_later(when - now, fire)
            return
        gc.sync_started(now)
        if self._run_in_thread is None:
            try:
                device.sync()
            except Exception as exc:  # noqa: BLE001 - any failure is the commit's answer (receipts get ERROR)
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
        checkpoint = getattr(device, "checkpoint", None)      # devices with a log have one
        if checkpoint is None or not getattr(device, "checkpoint_due", False) or device.name in self._checkpointing:
            return
        self._checkpointing.add(device.name)

        def done(result, error: BaseException | None) -> None:
            self._checkpointing.discard(device.name)
            if error is not None:
                log.error("checkpoint of device %s failed: %s", device.name, error)

        self._run(checkpoint, done)

    def flush_all(self) -> list[str]:
        """Flush and sync every device (a clean stop); returns what failed, per device, instead of
        stopping at the first (a device in fault cannot sync; the others still must)."""
        self.write_waiting()
        if self._blocks_changed:
            self._write_blocks()
        failed = []
        if self._behind_error is not None:
            failed.append(self._behind_error.message)
            self._behind_error = None
        for device in self.devices.values():
            if device.name in self.unopened:
                continue
            try:
                device.flush()
                device.sync()
            except Exception as exc:  # noqa: BLE001 - keep going: every other device must still be synced
                failed.append(f"{device.name}: {getattr(exc, 'message', exc)}")
        self._dirty.clear()
        return failed

    # -- repairs -----------------------------------------------------------------------------------
    def maintain(self, now: float | None = None) -> None:
        """Try to bring back devices out of service: repair those in fault, open those that could not
        be opened; each in a worker thread, with a back-off per device (broker thread)."""
        now = self._clock() if now is None else now
        for device in self.devices.values():
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
            self._run(work, functools.partial(self._repaired, device, late))

    def _open_late(self, device: HoldingDevice) -> bool:
        device.open()
        return True

    def _repaired(self, device: HoldingDevice, late: bool, ok, error: BaseException | None) -> None:
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

    def _run(self, work: Callable, done: Callable) -> None:
        if self._run_in_thread is not None:
            self._run_in_thread(work, done)
            return
        try:
            result = work()
        except Exception as exc:  # noqa: BLE001 - handed to done, as a worker thread's failure is
            done(None, exc)
            return
        done(result, None)

    # -- recovery and catalog -------------------------------------------------------------------
    def recover(self):
        """(device, StoredMessage, queues) for every persistent message still referenced."""
        for device in self.devices.values():
            if device is self.memory or device.name in self.unopened:
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
