"""The memory device: messages held only in the broker's own heap.

The fastest device and the one that loses everything on a crash (seed 000).  The broker already keeps
every message it holds in memory, so for messages placed here the store records only the figures the
storage monitor needs; ``write`` with explicit bytes is still honoured so the device passes the same
contract tests as the others (a process that restarts starts empty, so ``recover`` yields nothing from a
fresh instance).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

from pymq_server.storage.device import Allocation, DeviceStatus, HoldingDevice, StoredMessage


class MemoryDevice(HoldingDevice):
    kind = "memory"
    durable = False

    def __init__(self, name: str = "memory", capacity: int | None = None) -> None:
        self.name = name
        self.capacity = capacity
        self._messages: dict[int, StoredMessage] = {}
        self._refs: dict[int, set[str]] = {}
        self._meta: dict[str, bytes] = {}
        self.held_messages = 0     # messages accounted for (including heap-only ones)
        self.held_bytes = 0

    # heap-only accounting, used by the store for messages it never serialises
    def account(self, size: int, delta: int) -> None:
        self.held_messages += delta
        self.held_bytes += size * delta

    def write(self, message: StoredMessage, queues: Sequence[str],
              allocation: Allocation | None = None) -> None:
        self._messages[message.key] = message
        self._refs[message.key] = set(queues)
        self.account(message.size, 1)

    def remove(self, key: int, queue: str) -> None:
        refs = self._refs.get(key)
        if refs is None:
            return
        refs.discard(queue)
        if not refs:
            del self._refs[key]
            msg = self._messages.pop(key)
            self.account(msg.size, -1)

    def add_reference(self, key: int, queue: str) -> None:
        self._refs[key].add(queue)

    def read(self, key: int) -> StoredMessage:
        return self._messages[key]

    def holds(self, key: int) -> bool:
        return key in self._refs

    def recover(self) -> Iterator[tuple[StoredMessage, list[str]]]:
        for msg in sorted(self._messages.values(), key=lambda m: (m.seq, m.key)):
            if msg.persistent and self._refs.get(msg.key):
                yield msg, sorted(self._refs[msg.key])

    def put_meta(self, key: str, value: bytes | None) -> None:
        if value is None:
            self._meta.pop(key, None)
        else:
            self._meta[key] = value

    def iter_meta(self):
        return list(self._meta.items())

    def status(self) -> DeviceStatus:
        free = None if self.capacity is None else max(0, self.capacity - self.held_bytes)
        return DeviceStatus(self.name, self.kind, messages=self.held_messages, bytes_used=self.held_bytes,
                            bytes_free=free, capacity=self.capacity)
