"""Write-behind (spec/storage.md §9): a persistent message waits a moment before it is written, and is
never written if every reference to it is released first.

The holding store checks the device for room when it accepts the message (a full disk still refuses
the SEND) and hands the message here; it is written to its device when something needs it there: a
barrier (a receipt, a commit), ``flush_all``, more than ``WRITE_BEHIND_MESSAGES`` or
``WRITE_BEHIND_BYTES`` waiting, or once it has waited half to all of ``WRITE_BEHIND_S`` (the timer's
ticks). References added or released, and deliveries recorded, while a message waits are applied to what
it will be written with; a message whose last reference goes before then costs no I/O at all.

A write that fails here (the device entered fault since the message was accepted) leaves the message in
the heap, still delivered, and keeps the error for the next barrier, so no receipt claims a durability it
does not have (``take_error``).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from pymq.errors import StorageError

from .chooser import DeviceChooser
from .device import HoldingDevice, StoredMessage
from .storable import Storable, StoredCodec

log = logging.getLogger("pymq.storage")

#: bounds: messages and stored bytes waiting, and how long a message may wait. The timer ticks every half
#: of WRITE_BEHIND_S while messages wait; each tick writes those held before the tick before it (so they
#: waited between a half and the whole of WRITE_BEHIND_S), not the ones just held: a message its consumer
#: takes within a tick or two is never written (spec/storage.md §9)
WRITE_BEHIND_MESSAGES = 4096
WRITE_BEHIND_BYTES = 1 << 20
WRITE_BEHIND_S = 0.05

#: a message waiting: [message, device, queues still referencing it, delivery counts recorded meanwhile
#: or None, the timer's tick when it was held]
Waiting = list


class WriteBehind:
    __slots__ = ("codec", "chooser", "mark_dirty", "call_later", "waiting", "bytes", "timer", "tick", "error")

    def __init__(self, codec: StoredCodec, chooser: DeviceChooser, mark_dirty: Callable[[HoldingDevice], None],
                 call_later: Callable[..., object] | None) -> None:
        self.codec = codec
        self.chooser = chooser
        self.mark_dirty = mark_dirty
        self.call_later = call_later
        #: key -> Waiting, in placement order (which is tick order)
        self.waiting: dict[int, Waiting] = {}
        self.bytes = 0
        self.timer = False
        self.tick = 0
        self.error: StorageError | None = None

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def hold(self, message: Storable, device: HoldingDevice, queues: Sequence[str]) -> None:
        """``message`` waits to be written to ``device``, which has room for it. The device is not marked
        dirty: a message released before it is written needs no sync (``write`` marks it when it writes)."""
        self.waiting[message.key] = [message, device, list(queues), None, self.tick]
        self.bytes += message.size
        if len(self.waiting) >= WRITE_BEHIND_MESSAGES or self.bytes >= WRITE_BEHIND_BYTES:
            self.write()
        elif not self.timer and self.call_later is not None:
            self.timer = True
            self.call_later(WRITE_BEHIND_S / 2, self._due)

    def holds(self, message: Storable) -> bool:
        """True while ``message`` waits (not on its device yet)."""
        return message.key in self.waiting

    def add_reference(self, message: Storable, queue: str) -> bool:
        """One more queue owes ``message``: True when it waits here (the reference joins it)."""
        waiting = self.waiting.get(message.key) if self.waiting else None
        if waiting is None:
            return False
        waiting[2].append(queue)
        return True

    def release(self, message: Storable, queue: str) -> bool:
        """``queue`` no longer owes ``message``: True when it waits here (then the device never sees it
        or its removal, once its last reference goes); KeyError when it waits without that reference."""
        waiting = self.waiting.get(message.key) if self.waiting else None
        if waiting is None:
            return False
        queues = waiting[2]
        try:
            queues.remove(queue)
        except ValueError:
            raise KeyError(f"message {message.key} has no reference for {queue!r}") from None
        if not queues:
            del self.waiting[message.key]
            self.bytes -= message.size
        return True

    def delivered(self, message: Storable, queue: str, count: int) -> bool:
        """A delivery count for ``message``: True when it waits here (recorded right after it is written)."""
        waiting = self.waiting.get(message.key) if self.waiting else None
        if waiting is None:
            return False
        deliveries = waiting[3]
        if deliveries is None:
            waiting[3] = {queue: count}
        else:
            deliveries[queue] = count
        return True

    def take_error(self) -> StorageError | None:
        error, self.error = self.error, None
        return error

    def _due(self) -> None:
        """The timer's tick: messages held before the previous tick have waited at least half of
        ``WRITE_BEHIND_S`` (at most all of it) and are written; younger ones wait for the next tick."""
        self.timer = False
        self.tick += 1
        self.write(held_before=self.tick - 1)
        if self.waiting and self.call_later is not None:
            self.timer = True
            self.call_later(WRITE_BEHIND_S / 2, self._due)

    def write(self, held_before: int | None = None) -> None:
        """Write every message still waiting (or, with ``held_before``, those held before that tick of the
        timer), in placement order. A device that cannot take one now (fault, disk gone) leaves it held by
        the heap, as a refusal at ``hold`` would have, and the next barrier reports the error."""
        if not self.waiting:
            return
        if held_before is None:
            batch, self.waiting = self.waiting, {}
            self.bytes = 0
        else:
            batch = {}
            for key, waiting in self.waiting.items():
                if waiting[4] >= held_before:
                    break            # placement order is tick order: the rest are younger
                batch[key] = waiting
            if not batch:
                return
            remaining = self.waiting
            for key, waiting in batch.items():
                del remaining[key]
                self.bytes -= waiting[0].size
        encode_parts = self.codec.encode_parts
        for message, device, queues, deliveries, _ in batch.values():
            parts = encode_parts(message)
            stored = StoredMessage(message.key, message.destination, message.seq, message.persistent,
                                   parts[0] if len(parts) == 1 else b"")
            try:
                if len(parts) == 1:
                    device.write(stored, queues)
                else:
                    device.write_parts(stored, parts, queues)
            except Exception as exc:  # noqa: BLE001 - a refusal or a device bug: the message stays in the heap
                self._left_in_heap(message, device, exc)
                continue
            self.mark_dirty(device)
            if deliveries:
                for queue, count in deliveries.items():
                    device.record_delivery(message.key, queue, count)

    def _left_in_heap(self, message: Storable, device: HoldingDevice, exc: Exception) -> None:
        error = exc if isinstance(exc, StorageError) else StorageError(
            f"holding device {device.name} failed to write message {message.message_id}: "
            f"{type(exc).__name__}: {exc}")
        log.error("holding device %s could not take message %s written behind: %s", device.name,
                  message.message_id, error.message)
        if self.error is None:
            self.error = error
        chooser = self.chooser
        chooser.forget(message)
        chooser.in_heap(message, None)
