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

:class:`LastValues` knows which entry waits for each key and performs the replacement on the queue it is
composed into (the queue owns the ready index, the counters and the state changes it uses).
"""
from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Iterable, Mapping

from pymq_server.broker.states import READY, Event, transition

if TYPE_CHECKING:
    from pymq_server.broker.entry import Entry
    from pymq_server.broker.queue import MessageQueue


class LastValues:
    """Key value -> the entry that waits with it (only waiting entries are kept), and the replacements."""

    __slots__ = ("queue", "key", "waiting")

    def __init__(self, queue: MessageQueue, key: str) -> None:
        self.queue = queue
        self.key = key
        self.waiting: dict[str, Entry] = {}

    def replaces(self, properties: Mapping[str, str]) -> bool:
        """A message with these properties would replace a waiting one (depth limits do not refuse it)."""
        value = properties.get(self.key)
        return value is not None and value in self.waiting

    def _index(self, entry: Entry) -> tuple[bool, Entry | None]:
        """An entry arrives or comes back: (it waits, the older waiting entry it replaces). It does not
        wait when a newer message of its key waits already (a recovered message older than another)."""
        value = entry.message.headers.get(self.key)
        if value is None:
            return True, None
        old = self.waiting.get(value)
        if old is not None and old.message.seq > entry.message.seq:
            return False, None
        self.waiting[value] = entry
        return True, old

    def admit(self, entry: Entry, returned: bool = False) -> bool:
        """Whether ``entry`` (new, or ``returned`` from a consumer: depth counted already) waits; the older
        waiting entry of its key is replaced; an entry a newer one outdates is replaced itself (it gives
        way)."""
        waits, older = self._index(entry)
        if older is not None:
            self.replace(older)
        if not waits:
            queue = self.queue
            entry.state = transition(entry.state, Event.REPLACE)
            queue.stats.replaced += 1
            queue.stats.removed += 1
            if returned:
                queue._depth_delta(-1)
            queue._drop(entry)
        return waits

    def gone(self, entry: Entry) -> None:
        """``entry`` no longer waits (delivered, completed, expired, purged, replaced)."""
        value = entry.message.headers.get(self.key)
        if value is not None and self.waiting.get(value) is entry:
            del self.waiting[value]

    def replace(self, entry: Entry) -> None:
        """A waiting entry gives way to a newer message of its key."""
        queue = self.queue
        if entry.state is READY:
            queue.ready.remove(entry)
            if entry.message.group_id is not None:
                queue.grouped_ready -= 1
        else:
            del queue.timed[entry]          # its timer finds it completed and does nothing
        entry.state = transition(entry.state, Event.REPLACE)
        queue.stats.replaced += 1
        queue.stats.removed += 1
        queue._depth_delta(-1)
        queue._drop(entry)

    def rebuild(self, waiting: Iterable[Entry]) -> None:
        """The queue's key changed (``alter``): its waiting entries indexed by this key, only the newest per
        key kept (the older ones replaced, as for arrivals)."""
        self.waiting.clear()
        older: list[Entry] = []
        for entry in sorted(waiting, key=lambda e: e.message.seq):
            _, old = self._index(entry)
            if old is not None:
                older.append(old)
        for entry in older:
            self.replace(entry)
