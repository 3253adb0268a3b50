"""Last-value queues (Artemis ``last-value-key``): while a message waits, a newer message with the same value
of the queue's key property replaces it, so a consumer that arrives reads the latest value of each key.

The rules (spec/admin.md "Last-value queues"):

* only a *waiting* entry (ready or scheduled) is replaced, through the state table's REPLACE event
  (→ completed; counted as ``replaced``, its storage reference released);
* a delivered, unacknowledged entry is not replaced: the newer message waits beside it. If it comes back
  (NACK, a lost consumer, a delivery timeout) while a newer message of its key waits, it gives way and is
  replaced instead of redelivered; if none waits, it is its key's waiting value again;
* a message without the property waits like any other;
* the sequence number decides which message is newer, not arrival (recovery hands messages back in any
  order), so after a restart the same message per key waits as before.

:class:`LastValues` knows which entry waits for each key; :class:`~pymq_server.broker.queue.MessageQueue`
asks it and performs the replacement (it owns the ready index and the state changes).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any
from collections.abc import Iterable, Mapping

from pymq_server.broker.states import READY, Event, transition

if TYPE_CHECKING:
    from pymq_server.broker.entry import Entry
    from pymq_server.broker.ready import ReadyIndex
    from pymq_server.broker.stats import QueueStats


class LastValues:
    """Key value -> the entry that waits with it (only waiting entries are kept)."""

    __slots__ = ("key", "waiting")

    def __init__(self, key: str) -> None:
        self.key = key
        self.waiting: dict[str, Entry] = {}

    def replaces(self, properties: Mapping[str, str]) -> bool:
        """A message with these properties would replace a waiting one (depth limits do not refuse it)."""
        value = properties.get(self.key)
        return value is not None and value in self.waiting

    def admit(self, entry: Entry) -> tuple[bool, Entry | None]:
        """A new entry arrives: (it waits, the older waiting entry it replaces). It does not wait when a
        newer message of its key waits already (a recovered message older than another)."""
        value = entry.message.headers.get(self.key)
        if value is None:
            return True, None
        old = self.waiting.get(value)
        if old is not None and old.message.seq > entry.message.seq:
            return False, None
        self.waiting[value] = entry
        return True, old

    def gone(self, entry: Entry) -> None:
        """``entry`` no longer waits (delivered, completed, expired, purged, replaced)."""
        value = entry.message.headers.get(self.key)
        if value is not None and self.waiting.get(value) is entry:
            del self.waiting[value]

    def returned(self, entry: Entry) -> tuple[bool, Entry | None]:
        """A delivered entry comes back: (it waits again, the older waiting entry it replaces); it gives
        way (False) to a newer waiting message of its key."""
        return self.admit(entry)

    def rebuild(self, waiting: Iterable[Entry]) -> list[Entry]:
        """The queue's key changed: index its waiting entries anew; the older entries of each key, which
        the caller replaces (so that, as for arrivals, only the latest per key waits)."""
        self.waiting.clear()
        older: list[Entry] = []
        for entry in sorted(waiting, key=lambda e: e.message.seq):
            _, old = self.admit(entry)
            if old is not None:
                older.append(old)
        return older


class Replacing:
    """The replacement itself, as part of :class:`~pymq_server.broker.queue.MessageQueue` (which owns the
    ready index, the counters and the state changes these use)."""

    last_values: LastValues | None
    ready: ReadyIndex
    stats: QueueStats
    scheduled: int
    grouped_ready: int

    def _depth_delta(self, delta: int, now: float | None = None) -> None: ...

    def _drop(self, entry: Any) -> None: ...

    def _admit_last_value(self, entry: Entry, returned: bool = False) -> bool:
        """Whether ``entry`` (new, or ``returned`` from a consumer: depth counted already) waits; the
        older waiting entry of its key is replaced; an entry a newer one outdates is replaced itself."""
        waits, older = self.last_values.admit(entry)  # type: ignore[union-attr]
        if older is not None:
            self._replace(older)
        if not waits:
            entry.state = transition(entry.state, Event.REPLACE)
            self.stats.replaced += 1
            self.stats.removed += 1
            if returned:
                self._depth_delta(-1)
            self._drop(entry)
        return waits

    def _replace(self, entry: Entry) -> None:
        """A waiting entry gives way to a newer message of its key (last-value queue)."""
        if entry.state is READY:
            self.ready.remove(entry)
            if entry.message.group_id is not None:
                self.grouped_ready -= 1
        else:
            self.scheduled -= 1            # its timer finds it completed and does nothing
        entry.state = transition(entry.state, Event.REPLACE)
        self.stats.replaced += 1
        self.stats.removed += 1
        self._depth_delta(-1)
        self._drop(entry)

    def _rekey(self, key: str | None) -> None:
        """The queue's last-value key changed (``alter``): its waiting entries indexed by the new key, only
        the newest per key kept (the older ones replaced); None: a plain queue again."""
        self.last_values = LastValues(key) if key else None
        if self.last_values is not None:
            for entry in self.last_values.rebuild(list(self.ready)):
                self._replace(entry)
