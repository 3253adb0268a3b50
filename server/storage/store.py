"""The holding store: the one object the broker core calls to keep messages, whatever the device.

It places a message (``hold``): the device chooser (``chooser.py``, seed 000) picks a device, a device
that refuses is left out and the choice made again, and the message is written there with one reference
per queue — or handed to write-behind (``behind.py``) when the device writes behind and has room. It
removes references as entries complete, and tells the broker when everything written so far is durable
(``barrier``, through the commit driver, ``syncing.py``), which is when receipts for persistent SENDs
may go out. Devices out of service are brought back by ``repairs.py``.

The store is below the broker: messages are :class:`~.storable.Storable`, encoded by the codec it is
given (``codec=``); the store records the placement on the message (``device``, ``chosen``, ``rule``).
What a device can do is said by the device (``writes_behind``, ``pages_out``, ``durable``,
``checkpoint_due``), never by its kind.

Faults (spec/storage.md §8) are answered, never silent, and survived:

* a device that refuses a message (full, in fault, offline) makes ``hold`` ask the chooser again without it
  (seed 000: the next device the adjusted rules rank); only when no device can take it does ``hold``
  raise :class:`StorageError`, which the broker turns into an ERROR for the frame that sent it;
* a flush or sync that fails completes the barrier with the error, so the receipts waiting on it become
  an ERROR instead of waiting forever; so does a write behind that failed;
* ``maintain`` (the broker's timer) repairs devices in fault and opens devices that could not be opened
  at start-up, and starts the checkpoints devices say are due.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from pymq.errors import StorageError

from .behind import WriteBehind
from .chooser import DeviceChooser
from .device import DeviceStatus, HoldingDevice, StoredMessage
from .repairs import DeviceRepairs
from .storable import NoCodec, Storable, StoredBlock, StoredCodec
from .syncing import SYNC_POLICIES, BarrierCallback, CommitDriver, RunInThread

log = logging.getLogger("pymq.storage")

__all__ = ["HoldingStore", "block_state_key", "SYNC_POLICIES", "BarrierCallback", "DELIVERY_FLUSH_S"]

_NONE_EXCLUDED: frozenset[str] = frozenset()

#: delivery records reach the OS with the next write of the device's log, or after this long at most
DELIVERY_FLUSH_S = 0.010


#: the catalog record of an owner that has the store open (spec/ha.md §3.2)
RUN_MARKER = "run:open"


def block_state_key(record_key: int, queue: str) -> str:
    """The catalog record of a stored bulk block's settled rows (spec/storage.md §11)."""
    return f"rows:{record_key}:{queue}"


class HoldingStore:
    def __init__(self, devices: Iterable[HoldingDevice], *, persistent_device: str | None = None,
                 catalog_device: str | None = None, sync_policy: str = "always", sync_window_ms: float = 2.0,
                 call_later: Callable[..., object] | None = None, run_in_thread: RunInThread | None = None,
                 codec: StoredCodec | None = None) -> None:
        self.chooser = DeviceChooser(devices, persistent_device, catalog_device)
        self.devices = self.chooser.devices
        self.memory = self.chooser.memory
        self.persistent_device = self.chooser.persistent_device
        self.catalog = self.chooser.catalog
        #: account for a message a device wrote by itself (claimed from an application's transaction)
        self.adopt: Callable[[Storable], None] = self.chooser.adopt
        #: the last entry of a message is gone: it leaves the figures (once per message: no layer between)
        self.forget: Callable[[Storable], None] = self.chooser.forget
        self.codec: StoredCodec = codec if codec is not None else NoCodec()
        self.commits = CommitDriver(self.devices.values(), sync_policy, sync_window_ms, call_later, run_in_thread)
        #: changes were made on a device (a write, a removal; a paged batch removed directly): the next barrier
        #: flushes it (the commit driver's dirty set's ``add``)
        self.mark_dirty: Callable[[HoldingDevice], None] = self.commits.mark_dirty
        self.behind = WriteBehind(self.codec, self.chooser, self.mark_dirty, call_later)
        self.repairs = DeviceRepairs(self.devices.values(), run_in_thread)
        self.sync_policy = sync_policy
        self._call_later = call_later
        #: False turns write-behind off (every message written at ``hold``; cluster nodes, for now)
        self.write_behind = True
        self._delivery_flush: set[HoldingDevice] = set()   # devices with delivery records to hand out
        #: stored bulk blocks (broker/blocks.py) whose catalog record of settled rows is behind
        self._blocks_changed: set[StoredBlock] = set()
        #: called first by every barrier and by ``flush_all``, before anything is flushed: the broker writes
        #: its persisted duplicate window there (spec/ha.md §3.1)
        self.before_barrier: Callable[[], None] | None = None
        #: the store's previous owner did not close it cleanly (spec/ha.md §3.2): known once ``open`` ran
        self.unclean = False
        self._unit_depth = 0

    # -- what other parts read -------------------------------------------------------------------------
    @property
    def selection(self) -> Any:
        """The adaptive layer (seed 000) when storage rules are configured, else None."""
        return self.chooser.selection

    @property
    def uses_rules(self) -> bool:
        return self.chooser.selection is not None

    @property
    def syncs(self) -> int:
        return self.commits.syncs

    @property
    def unopened(self) -> dict[str, str]:
        return self.repairs.unopened

    @property
    def on_device_opened(self) -> Callable[[HoldingDevice], object] | None:
        return self.repairs.on_device_opened

    @on_device_opened.setter
    def on_device_opened(self, callback: Callable[[HoldingDevice], object] | None) -> None:
        self.repairs.on_device_opened = callback

    def use_selection(self, layer: Any, context: Callable[[Any], dict]) -> None:
        """Let the adaptive layer of seed 000 choose each message's device (``chooser.use_selection``)."""
        self.chooser.use_selection(layer, context)

    def paging_device(self) -> HoldingDevice | None:
        return self.chooser.paging_device()

    def placements(self) -> list[dict]:
        return self.chooser.placements()

    # -- lifecycle ------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Open every device. The catalog device must open (the broker cannot know its queues and
        numbering without it); any other one that cannot is left out of service, refusing messages, and
        ``maintain`` opens it later."""
        self.repairs.open((self.catalog, self.memory))
        if self.catalog is self.memory:
            return
        # spec/ha.md §3.2: a record that lives exactly as long as an owner has the store open; found at open,
        # the last owner ended without closing it (a kill, a crash, a takeover).  Durable before any delivery.
        self.unclean = any(key == RUN_MARKER for key, _ in self.catalog.iter_meta())
        try:
            self.catalog.put_meta(RUN_MARKER, b"1")
            self.catalog.flush()
            self.catalog.sync()
        except StorageError as exc:
            # a full or failing disk: the device serves what it holds read-only and takes no messages, and
            # records no deliveries either, until its repair (whose checkpoint carries the record)
            log.warning("storage at open: the run record is not durable yet: %s", exc.message)

    def close(self) -> None:
        self.behind.write()
        if self.catalog is not self.memory and self.catalog.name not in self.repairs.unopened:
            try:
                self.catalog.put_meta(RUN_MARKER, None)     # a clean close: delivery counts are exact
            except StorageError as exc:
                log.error("storage at close: %s", exc.message)
        errors = []
        for device in self.devices.values():
            try:
                device.close()
            except Exception as exc:  # noqa: BLE001 - keep closing the others; report all
                errors.append(f"{device.name}: {exc}")
        if errors:
            raise StorageError("closing devices failed: " + "; ".join(errors))

    def abandon(self) -> None:
        """Let every device go without writing (spec/ha.md §2.4: this process was fenced)."""
        self.before_barrier = None
        for device in self.devices.values():
            try:
                device.abandon()
            except Exception:  # noqa: BLE001 - let the others go too
                log.exception("abandoning device %s", device.name)

    # -- placement -----------------------------------------------------------------------------------------
    def hold(self, message: Storable, queues: Sequence[str]) -> bool:
        """Place ``message`` with references for ``queues``; True when a device stores it (so the
        entries must release their references later).  ``queues`` are the queues whose references
        must survive a restart (empty for a topic message with no durable subscriber).

        Without storage rules the default choice decides (persistent messages to the persistent device,
        written behind when it writes behind; the rest to the heap); with rules, a device that refuses the
        message is left out and the choice made again (seed 000: the next device the adjusted rules rank).
        StorageError, naming every refusal, when no device can take it. Nothing is counted or changed for
        a message that was refused."""
        if self.chooser.selection is not None:
            return self._hold_by_rules(message, queues)
        # the default choice: one device, nothing to fall over to
        device = self.persistent_device
        if not message.persistent or device is self.memory or not queues:
            self.chooser.in_heap(message, None)
            return False
        refusal: str | None
        if self.write_behind and device.writes_behind and not self._unit_depth:
            try:
                device.check_room(message.size)    # room now: a full disk refuses the SEND itself
            except StorageError as exc:
                refusal = f"{device.name}: {exc.message}"
            else:
                self.chooser.count(message, device, None)
                message.device = device
                self.behind.hold(message, device, queues)
                return True
        else:
            stored = StoredMessage(message.key, message.destination, message.seq, True, self.codec.encode(message))
            refusal = self._write(message, stored, device, None, queues)
            if refusal is None:
                return True
        raise StorageError(f"no holding device could take message {message.message_id}: {refusal}; no other "
                           f"holding device is configured for persistent messages")

    def _hold_by_rules(self, message: Storable, queues: Sequence[str]) -> bool:
        """``hold`` when storage rules choose (``chooser.py``): written at once, so a refusal can still fall
        over to the next device the rules rank."""
        chooser = self.chooser
        refused: list[str] = []
        exclude: frozenset[str] = _NONE_EXCLUDED
        stored: StoredMessage | None = None
        while True:
            try:
                device, rule = chooser.choose(message, exclude)
            except StorageError as exc:
                if not refused:
                    raise
                raise StorageError(f"no holding device could take message {message.message_id}: "
                                   f"{'; '.join(refused)}; {exc.message}") from None
            if device is self.memory or not queues:
                # the heap holds it: the rule chose memory, or no durable queue needs it. A non-persistent
                # message a rule sends to another device is held there, for real (spec/storage_rules.md §6.4)
                chooser.in_heap(message, rule)
                return False
            if stored is None:
                stored = StoredMessage(message.key, message.destination, message.seq, message.persistent,
                                       self.codec.encode(message))
            refusal = self._write(message, stored, device, rule, queues)
            if refusal is None:
                chooser.took(device, stored.size)
                return True
            refused.append(refusal)
            chooser.refused(device, stored.size)
            exclude = exclude | {device.name}

    def _write(self, message: Storable, stored: StoredMessage, device: HoldingDevice, rule: str | None,
               queues: Sequence[str]) -> str | None:
        """Write ``message`` to ``device`` now; None when it took it, else why it refused."""
        try:
            device.write(stored, queues)
        except StorageError as exc:
            return f"{device.name}: {exc.message}"
        except Exception as exc:     # a device bug or an unexpected client error: still a refusal
            log.exception("holding device %s failed to write message %s", device.name, message.message_id)
            return f"{device.name}: {type(exc).__name__}: {exc}"
        self.chooser.count(message, device, rule)
        message.device = device
        self.mark_dirty(device)
        return None

    def waiting(self, message: Storable) -> bool:
        """True while ``message`` waits to be written behind (not on its device yet; ``behind.holds``, asked for
        every message paged out: without the call)."""
        return message.key in self.behind.waiting

    def write_waiting(self) -> None:
        """Write every message waiting behind now (a reader needs it on its device)."""
        self.behind.write()

    def add_reference(self, message: Storable, queue: str) -> bool:
        """One more queue owes an already-held message (moved to a peer's outbox, re-routed): True when
        a device stores the reference, False when the message is heap-held."""
        device = message.device
        if device is None or device is self.memory:
            return False
        behind = self.behind
        if behind.waiting and behind.add_reference(message, queue):
            return True
        device.add_reference(message.key, queue)
        self.mark_dirty(device)
        return True

    def release(self, message: Storable, queue: str) -> None:
        device = message.device
        if device is None or device is self.memory:
            return
        behind = self.behind
        if behind.waiting and behind.release(message, queue):
            return      # released before it was written: the device never sees it (nor its removal)
        device.remove(message.key, queue)
        self.mark_dirty(device)

    @property
    def dirty(self) -> bool:
        return bool(self.commits.dirty) or bool(self.behind)

    # -- delivery counts and bulk blocks -----------------------------------------------------------------
    def delivered(self, message: Storable, queue: str, count: int) -> None:
        """A stored persistent message went to a consumer that must acknowledge it, for the ``count``-th
        time: the device records it (issue 11: a poison message keeps its count across restarts).  The
        record rides with the device's next log write, which a busy broker makes anyway (every receipt's
        barrier flushes); an idle one flushes it at most ``DELIVERY_FLUSH_S`` later.  No fsync: a crash
        of the broker keeps it once flushed, a power cut may not (counts are at-least-once bookkeeping)."""
        behind = self.behind
        if behind.waiting and behind.delivered(message, queue, count):
            return      # not on its device yet: the count is recorded right after the message is written
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

    def block_changed(self, block: StoredBlock) -> None:
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

    def block_done(self, block: StoredBlock) -> None:
        """The last row of ``block`` is gone: its record's reference goes, and its catalog record."""
        self._blocks_changed.discard(block)
        if block.stored:
            self.release(block.holder, block.queue)
            if block.recorded:
                self.put_meta(block_state_key(block.holder.key, block.queue), None)

    # -- units (spec/ha.md §3.4) --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def unit(self) -> Iterator[None]:
        """Changes made inside (synchronous code on the broker thread: a transaction's COMMIT) become durable
        all together or not at all, on every device; messages placed inside are written at once, not behind."""
        devices = [d for d in self.devices.values() if d is not self.memory]
        for device in devices:
            device.begin_unit()
        self._unit_depth += 1
        try:
            yield
        finally:
            self._unit_depth -= 1
            for device in devices:
                device.end_unit()

    @property
    def in_unit(self) -> bool:
        return self._unit_depth > 0

    # -- durability ------------------------------------------------------------------------------------------
    def barrier(self, callback: BarrierCallback) -> None:
        """Call ``callback(None)`` once everything written so far is durable under the sync policy,
        or ``callback(error)`` when a device could not make it durable (a failed flush or sync, or a
        message written behind that could not be stored: the receipts waiting on it become an ERROR,
        never a wait without end)."""
        if self.before_barrier is not None:
            self.before_barrier()
        self.behind.write()
        if self._blocks_changed:
            self._write_blocks()
        behind_error = self.behind.take_error()
        if behind_error is not None:
            inner = callback

            def callback(error: StorageError | None) -> None:
                inner(error if error is not None else behind_error)
        self.commits.barrier(callback)

    def flush_all(self) -> list[str]:
        """Flush and sync every device (a clean stop); returns what failed, per device, instead of
        stopping at the first (a device in fault cannot sync; the others still must)."""
        if self.before_barrier is not None:
            self.before_barrier()
        self.behind.write()
        if self._blocks_changed:
            self._write_blocks()
        failed = []
        behind_error = self.behind.take_error()
        if behind_error is not None:
            failed.append(behind_error.message)
        failed += self.commits.flush_all(skip=self.repairs.unopened)
        return failed

    def maintain(self, now: float | None = None) -> None:
        """Bring back devices out of service (``repairs.py``) and start the checkpoints that are due (broker
        thread, on a timer): a device short of space gives consumed space back this way even when nothing
        syncs (consumers acknowledging without receipts)."""
        self.repairs.maintain(now)
        for device in self.devices.values():
            if device.name not in self.repairs.unopened:
                self.commits.checkpoint_if_due(device)

    # -- recovery and catalog --------------------------------------------------------------------------------
    def recover(self) -> Iterator[tuple[HoldingDevice, StoredMessage, list[str]]]:
        """(device, StoredMessage, queues) for every persistent message still referenced."""
        for device in self.devices.values():
            if device is self.memory or device.name in self.repairs.unopened:
                continue
            for stored, queues in device.recover():
                yield device, stored, queues

    def put_meta(self, key: str, value: bytes | None) -> None:
        self.catalog.put_meta(key, value)
        self.commits.mark_dirty(self.catalog)

    def iter_meta(self) -> Iterable[tuple[str, bytes]]:
        return self.catalog.iter_meta()

    def status(self) -> list[DeviceStatus]:
        return [device.status() for device in self.devices.values()]
