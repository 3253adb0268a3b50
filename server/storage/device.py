"""The persistence interface between the broker core and every holding device.

The broker core never talks to a file, a database or Redis directly: it talks to a
:class:`HoldingDevice`.  A device holds *messages* (opaque encoded bytes plus the few fields storage
needs for ordering and recovery) and *references* (which queue or subscription still owes a message
to a consumer).  A topic message with three durable subscribers is one message and three references;
the device frees the message when its last reference is removed.

Threading and durability contract (every device honours it; tests in tests/storage run all devices):

* ``allocate``/``write``/``remove``/``read``/``flush`` are called from the broker's thread only.
* ``write`` and ``remove`` may buffer.  ``flush`` hands buffered changes to the OS / server; it is
  cheap and never blocks for long.
* ``sync`` makes everything flushed before the call durable.  It may run in a worker thread while
  the broker thread keeps calling ``write``/``flush`` (fsync and a database commit release the GIL),
  so a device must guard whatever the two threads share.  The group-commit policy (every commit,
  within N ms, never) lives above the device, in :mod:`server.storage.store`.
* Non-persistent messages may be written to a device too (to page them out of memory); a device
  never logs them and drops them on recovery.
* ``recover`` yields every persistent message that still has references, with those references, in
  ascending ``seq``-then-``key`` order, after a clean shutdown or a crash alike.
"""
from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from collections.abc import Iterable, Iterator, Sequence


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """What a device keeps for one message."""

    key: int                 # broker-wide unique, increasing at enqueue (never reused, not dense)
    destination: str         # where it was sent, e.g. "/queue/orders"
    seq: int                 # per-destination sequence number (time-sequence order within a queue)
    persistent: bool
    data: bytes              # the broker's encoding of headers and body; opaque to the device

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True, slots=True)
class Allocation:
    """Room reserved for a message of ``size`` bytes on a device, before it is written."""

    device: str
    size: int
    persistent: bool
    token: object = None     # device-private (a page and slot for the file device)


@dataclass(slots=True)
class DeviceStatus:
    """What a device reports to the storage monitor (seed 000)."""

    name: str
    kind: str
    messages: int = 0             # messages held (persistent and not)
    bytes_used: int = 0           # payload bytes held
    bytes_free: int | None = None # None: unbounded / unknown
    capacity: int | None = None   # None: unbounded / unknown
    errors: int = 0               # failed operations since open
    write_latency_s: float = 0.0  # recent average latency of write+sync
    online: bool = True
    extra: dict = field(default_factory=dict)


class HoldingDevice(abc.ABC):
    """One place messages can be held: memory, paged file store, SQL database, Redis grid."""

    #: configured name ("memory", "file", "db1", ...); unique within a broker
    name: str
    #: the device family: "memory" | "file" | "sql" | "grid"
    kind: str
    #: what it holds survives a crash of the broker process (spec/storage_rules.md §6.4): a persistent
    #: message goes to a device that is not durable only when a rule says ``downgrade_durability``
    durable: bool = True
    #: the holding store may keep a persistent message back a moment before writing it here, and never
    #: write it if it is released first (spec/storage.md §9): for a device whose every write costs a log
    #: frame (the file device); a device that batches its writes itself (SQL, grid) does not need it
    writes_behind: bool = False
    #: keeps non-persistent messages in storage of their own that is never logged nor recovered, so the
    #: broker can page heap-held messages out to it (the file device's non-persistent pages)
    pages_out: bool = False

    # open, close, flush and sync are hooks a device without a backing store or buffer leaves empty
    def open(self) -> None:  # noqa: B027 - a hook (see above)
        """Open or create the device's backing store; called once before anything else."""

    def close(self) -> None:  # noqa: B027
        """Flush, sync and release resources (a clean shutdown)."""

    def allocate(self, size: int, persistent: bool) -> Allocation:
        """Reserve room for a message; raises :class:`pymq.errors.StorageError` when full."""
        return Allocation(self.name, size, persistent)

    def check_room(self, size: int) -> None:
        """``allocate`` for a persistent message of ``size`` bytes, when the caller needs no Allocation
        (the holding store's write-behind asks it for every message; a device may answer faster)."""
        self.allocate(size, True)

    @abc.abstractmethod
    def write(self, message: StoredMessage, queues: Sequence[str],
              allocation: Allocation | None = None) -> None:
        """Hold ``message`` with one reference per queue (subscription) that must deliver it."""

    def write_parts(self, message: StoredMessage, parts: tuple[bytes, ...], queues: Sequence[str]) -> None:
        """``write`` of a message whose bytes are ``parts`` back to back (``message.data`` is not read): a
        device that can keep them without joining them says so by overriding this (the file device)."""
        self.write(dataclasses.replace(message, data=b"".join(parts)), queues)

    @abc.abstractmethod
    def remove(self, key: int, queue: str) -> None:
        """Drop one reference (the message was consumed from ``queue``, expired or moved)."""

    @abc.abstractmethod
    def read(self, key: int) -> StoredMessage:
        """Read a held message back; :class:`KeyError` if the device does not hold it."""

    def add_reference(self, key: int, queue: str) -> None:
        """Give a held message one more reference (a message moved to a DLQ keeps its bytes)."""
        raise NotImplementedError(f"{self.kind} device does not support add_reference")

    def flush(self) -> None:  # noqa: B027
        """Hand buffered changes to the OS or server (cheap; broker thread)."""

    def sync(self) -> None:  # noqa: B027
        """Make everything flushed so far durable (may run in a worker thread)."""

    def abandon(self) -> None:  # noqa: B027 - devices holding files or connections override
        """Let go of everything without writing a byte (high availability: another process holds the store
        now, spec/ha.md §2.4).  The device is unusable afterwards."""

    # -- units (spec/ha.md §3.4): a transaction's changes become durable all together or not at all
    def begin_unit(self) -> None:  # noqa: B027 - devices whose writes could be split override
        """Changes from now until :meth:`end_unit` (broker thread, synchronous code) are one unit: a crash
        keeps all of them or none.  Units nest; the outermost end closes the unit."""

    def end_unit(self) -> None:  # noqa: B027
        """Close the unit :meth:`begin_unit` opened."""

    @property
    def checkpoint_due(self) -> bool:
        """A device with a log says when it should be trimmed (``checkpoint``); the store asks after syncs."""
        return False

    def checkpoint(self) -> None:  # noqa: B027
        """Trim the device's log (may run in a worker thread; never inside a sync)."""

    # -- delivery state (spec/storage.md, frame DELIVERED): what survives a restart besides the message
    def record_delivery(self, key: int, queue: str, count: int) -> None:  # noqa: B027 - devices that keep it override
        """Message ``key`` was delivered from ``queue`` for the ``count``-th time to a consumer that must
        acknowledge it.  Devices that keep it make it durable with their next flush; the default keeps
        nothing (after a restart such a message counts as never delivered)."""

    def deliveries(self, key: int) -> dict[str, int]:
        """Queue -> delivery count recorded for a recovered message (empty: none recorded)."""
        return {}

    # -- faults (spec/storage.md §8): a device that failed refuses new messages until it is repaired
    @property
    def needs_repair(self) -> bool:
        """True while the device is out of service and :meth:`repair` should be tried."""
        return False

    def repair(self) -> bool:
        """Try to return to service (may run in a worker thread); True when back in service."""
        return True

    def holds(self, key: int) -> bool:
        """Whether the device still holds message ``key`` (any reference left)."""
        try:
            self.read(key)
        except KeyError:
            return False
        return True

    @abc.abstractmethod
    def recover(self) -> Iterator[tuple[StoredMessage, list[str]]]:
        """Every persistent message still referenced, with its queues, in (seq, key) order."""

    @abc.abstractmethod
    def status(self) -> DeviceStatus:
        """Current figures for the storage monitor."""

    # -- catalog: small durable key/value records (queue configs, durable subscriptions, sequence
    #    reservations).  The default device keeps the broker's catalog.
    def put_meta(self, key: str, value: bytes | None) -> None:
        """Durably (after the next sync) set or, with None, delete a catalog record."""
        raise NotImplementedError(f"{self.kind} device keeps no catalog")

    def iter_meta(self) -> Iterable[tuple[str, bytes]]:
        raise NotImplementedError(f"{self.kind} device keeps no catalog")
