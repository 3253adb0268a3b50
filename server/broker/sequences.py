"""Sequence numbers and message keys that survive restarts without a write per message.

Each destination has its own counter (``pymq-seq``, spec/stomp.md §4) and the broker one more for message
keys (the name ``""``). Numbers are reserved in blocks recorded — and synced — in the catalog before any
number of the block is used, so after a crash numbering resumes past the last reservation: gaps are
allowed, going backwards never is (the Spark connector's offsets rely on it).

A reservation syncs the catalog, which must not happen while a database transaction of the same store is
open (the claim of messages written in an application's transaction, apptx.py: with SQLite as the store
the sync would wait on the claim's own write lock). Inside :meth:`SequenceBook.no_reservations` a number
that would need a reservation raises :class:`ReservationNeeded` instead; the caller leaves the
transaction, calls :meth:`SequenceBook.reserve_ahead` and tries again.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from collections.abc import Iterator

from pymq.errors import StorageError
from pymq_server.storage.store import HoldingStore

log = logging.getLogger("pymq.broker")

RESERVE_BLOCK = 10_000
#: a bulk take that needs a reservation reserves this many blocks of its own size ahead
BULK_RESERVE_TAKES = 16


class ReservationNeeded(Exception):
    """A number was asked for inside ``no_reservations()`` and the block of ``name`` is used up."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class SequenceBook:
    """Per-destination sequence numbers (and the global message key, name ``""``) reserved in durable blocks."""

    def __init__(self, store: HoldingStore) -> None:
        self.store = store
        self._next: dict[str, int] = {}
        self._limit: dict[str, int] = {}
        self._reserving = True
        # With a memory catalog nothing is remembered across restarts: start every counter from the
        # clock (ms × 1000), which stays ahead of the previous run unless it averaged over 1M/s.
        self._origin = 1 if store.catalog.kind != "memory" else int(time.time() * 1000) * 1000

    def load(self, reserved: dict[str, int]) -> None:
        for name, upto in reserved.items():
            self._next[name] = upto
            self._limit[name] = upto

    def observe(self, name: str, value: int) -> None:
        """A recovered message used ``value``: never hand it out again."""
        if self._next.get(name, 1) <= value:
            self._next[name] = value + 1
            self._limit[name] = max(self._limit.get(name, 0), value + 1)

    def next(self, name: str) -> int:
        n = self._next.get(name)
        if n is None:
            n = self._origin
        if n >= self._limit.get(name, 0):
            if not self._reserving:
                raise ReservationNeeded(name)
            self._reserve(name, n + RESERVE_BLOCK)
        self._next[name] = n + 1
        return n

    def take(self, name: str, count: int) -> int:
        """``count`` consecutive numbers at once (a bulk SEND's block, spec/spark.md §7); the first.

        A reservation made here reaches :data:`BULK_RESERVE_TAKES` blocks of this size ahead (at least
        :data:`RESERVE_BLOCK`): bulk SENDs of tens of thousands of rows each would otherwise sync the
        catalog twice per frame (its sequence numbers and its message keys), which was most of a
        retained topic's bulk write after its own WAL record.  A crash skips at most what was reserved."""
        n = self._next.get(name)
        if n is None:
            n = self._origin
        if n + count > self._limit.get(name, 0):
            if not self._reserving:
                raise ReservationNeeded(name)
            self._reserve(name, n + count + max(RESERVE_BLOCK, count * BULK_RESERVE_TAKES))
        self._next[name] = n + count
        return n

    def raise_to(self, name: str, value: int) -> None:
        """The next number of ``name`` is at least ``value`` (a gap; never backwards)."""
        if self._next.get(name, self._origin) < value:
            self._next[name] = value

    def highest(self, prefix: str) -> int:
        """Past every number handed out or reserved for the names starting with ``prefix`` (recovered ones
        included): the next number of each is at most this."""
        return max([n for name, n in self._next.items() if name.startswith(prefix)], default=self._origin)

    def peek(self, name: str) -> int:
        return self._next.get(name, self._origin)

    def reserve_ahead(self, name: str, count: int) -> None:
        """Make sure ``count`` more numbers of ``name`` need no reservation."""
        n = self._next.get(name, self._origin)
        if n + count > self._limit.get(name, 0):
            self._next.setdefault(name, n)
            self._reserve(name, n + max(count, RESERVE_BLOCK))

    @contextmanager
    def no_reservations(self) -> Iterator[None]:
        """Numbers handed out inside need no catalog sync, or raise :class:`ReservationNeeded`."""
        self._reserving = False
        try:
            yield
        finally:
            self._reserving = True

    def _reserve(self, name: str, upto: int) -> None:
        self._limit[name] = upto
        if self.store.catalog.kind == "memory":
            return
        self.store.put_meta("seq:" + name, str(upto).encode())
        if self.store.in_unit:
            # inside a transaction's unit (spec/ha.md §3.4) the reservation is one of its changes: durable with
            # the messages numbered from it, or gone with them; a sync here would split the unit
            return
        # a reservation must be durable before any number from it is used
        catalog = self.store.catalog
        try:
            catalog.flush()
            catalog.sync()
        except StorageError as exc:
            # The catalog device is in fault (a full or failing disk).  Messages keep flowing with the
            # numbers reserved in memory: the device's repair writes the reservation with its checkpoint;
            # only a crash before that repair could hand out these numbers again (spec/storage.md §8).
            log.warning("sequence reservation for %r is not durable yet (%s); numbering continues",
                        name or "message keys", exc.message)
