"""The device chooser: which holding device takes a message (seed 000), and the figures of what each holds.

Seed 000's adaptive storage layer picks a device per message from the message's properties, the storage
selection rules and each device's status (``selection/``, spec/storage_rules.md §6); a device that
refuses the write is left out and the choice made again (§6.4): the caller passes the devices to leave
out. Without rules the choice is the simple default — persistent messages to the persistent device, the
rest to memory — which the holding store applies itself (one device, nothing to fall over to).

The chooser also keeps the admin's placement figures — messages and bytes per (device, deciding rule),
counting only what a device took (a message the heap holds counts under memory, whatever device its rule
chose) — and the memory device's figures for those messages. ``forget`` uncounts a message.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pymq.errors import StorageError

from .device import HoldingDevice
from .memory import MemoryDevice
from .storable import Storable

#: (message, devices to leave out) -> (device, deciding rule or fallback name, None for the default choice)
Choice = Callable[[Storable, frozenset[str]], tuple[HoldingDevice, str | None]]


def _no_rules(message: Storable, exclude: frozenset[str] = frozenset()) -> tuple[HoldingDevice, str | None]:
    raise StorageError("no storage rules are configured: the default choice applies")


class DeviceChooser:
    def __init__(self, devices: Iterable[HoldingDevice], persistent_device: str | None = None,
                 catalog_device: str | None = None) -> None:
        self.devices: dict[str, HoldingDevice] = {}
        for device in devices:
            if device.name in self.devices:
                raise StorageError(f"two holding devices are named {device.name!r}")
            self.devices[device.name] = device
        if "memory" not in self.devices:
            self.devices["memory"] = MemoryDevice("memory")
        memory = self.devices["memory"]
        if not isinstance(memory, MemoryDevice):
            raise StorageError("the device named 'memory' must be the memory device")
        self.memory: MemoryDevice = memory
        self.persistent_device = self.devices[persistent_device or "memory"]
        self.catalog = self.devices[catalog_device] if catalog_device else self.persistent_device
        #: the adaptive layer (seed 000) when storage rules are configured, else None (the default choice)
        self.selection: Any = None
        #: the rules' choice (``use_selection``); without rules the store applies the default choice
        self.choose: Choice = _no_rules
        self._placed: dict[tuple[str | None, str | None], list[int]] = {}
        # the figures of (persistent device, no rule) and (memory, no rule), looked up once: most messages
        # go there
        self._default_placed: list[int] | None = None
        self._heap_placed: list[int] | None = None

    @property
    def uses_rules(self) -> bool:
        return self.selection is not None

    def use_selection(self, layer: Any, context: Callable[[Any], dict]) -> None:
        """Let the adaptive layer of seed 000 choose each message's device.

        ``context(message)`` builds the rule context (spec/storage_rules.md §2) for a message."""
        self.selection = layer
        devices = self.devices

        def choose(message: Storable, exclude: frozenset[str] = frozenset()) -> tuple[HoldingDevice, str | None]:
            decision = layer.select(context(message), exclude=exclude, size=message.size)
            return devices[decision.device], decision.rule_id or decision.fallback

        self.choose = choose

    def took(self, device: HoldingDevice, size: int) -> None:
        """The adaptive layer learns that ``device`` took a message (its known free space goes down)."""
        if self.selection is not None:
            self.selection.consumed(device.name, size)

    def refused(self, device: HoldingDevice, size: int) -> None:
        """... or refused one (it takes none of that size until its next check)."""
        if self.selection is not None:
            self.selection.refused(device.name, size)

    def paging_device(self) -> HoldingDevice | None:
        """The device queues page heap-held messages out to (backlog.py): one that keeps non-persistent
        messages in pages of their own and is in service, the persistent device first."""
        device = self.persistent_device
        if device.pages_out and not device.needs_repair:
            return device
        return next((d for d in self.devices.values() if d.pages_out and not d.needs_repair), None)

    # -- the figures ----------------------------------------------------------------------------------------
    def count(self, message: Storable, device: HoldingDevice, rule: str | None) -> None:
        """``device`` took ``message`` (chosen by ``rule``): the placement figures count it there."""
        message.rule = rule
        message.chosen = name = device.name
        placed: list[int] | None
        if rule is not None:
            placed = self._figures(name, rule)
        elif device is self.persistent_device:
            placed = self._default_placed
            if placed is None:
                placed = self._default_placed = self._figures(name, None)
        elif device is self.memory:
            placed = self._heap_placed
            if placed is None:
                placed = self._heap_placed = self._figures(name, None)
        else:
            placed = self._figures(name, None)
        placed[0] += 1
        placed[1] += message.size

    def _figures(self, device: str | None, rule: str | None) -> list[int]:
        placed = self._placed.get((device, rule))
        if placed is None:
            placed = self._placed[(device, rule)] = [0, 0]
        return placed

    def in_heap(self, message: Storable, rule: str | None) -> None:
        """The heap holds ``message``: it counts under the memory device, whichever device ``rule`` chose (a
        message is never counted where it is not; memory.account inlined: once per non-persistent message)."""
        memory = self.memory
        self.count(message, memory, rule)
        message.device = memory
        memory.held_messages += 1
        memory.held_bytes += message.size

    def adopt(self, message: Storable) -> None:
        """Account for a message a device wrote by itself (claimed from an application's transaction)."""
        placed = self._figures(message.chosen, message.rule)
        placed[0] += 1
        placed[1] += message.size

    def forget(self, message: Storable) -> None:
        """The last entry of a message is gone; heap-held messages leave the memory figures."""
        device = message.device
        if device is self.memory:
            device.held_messages -= 1           # memory.account(size, -1), inlined: once per message
            device.held_bytes -= message.size
        if device is not None:
            placed = self._placed.get((message.chosen or device.name, message.rule))
            if placed is not None:
                placed[0] -= 1
                placed[1] -= message.size
        message.device = None

    def placements(self) -> list[dict]:
        """Messages and bytes held per device and per deciding rule (the admin view)."""
        return [{"device": device, "rule": rule, "messages": n, "bytes": size}
                for (device, rule), (n, size) in sorted(self._placed.items(), key=lambda kv: str(kv[0]))
                if n]
