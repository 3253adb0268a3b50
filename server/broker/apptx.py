"""Messages written in the application's own database transaction (seed 001), broker side.

An application that shares the SQL device's database calls ``producer.send(msg, transaction=conn)``:
the SDK inserts a *pending* row (a SEND frame, spec/storage.md "SQL device") with the application's
connection, so it commits or rolls back with the application's data — no two-phase commit.  This
claimer turns committed rows into messages: it is woken by the device's listener (PostgreSQL
``NOTIFY``, delivered only at commit; an in-process signal for SQLite), watched with the event loop's
``add_reader`` — nothing polls — and claims rows in the broker thread.

Claiming inserts the message rows and deletes the pending rows in one database transaction, so a crash
between the two is impossible and a row is claimed exactly once.  Inside that transaction each row goes
through the one placement path's decisions (spec/placement.md: duplicates, schema, cluster routing,
depth, queue defaults, retained log), which say which references the device writes; after the
transaction commits, the messages enter their queues.  Nothing inside the transaction may write to the
store on its own: with SQLite as the store that write would wait on the claim's own lock.  So sequence
numbers are reserved before the transaction, and a row that needs a new reservation rolls the claim back,
reserves, and claims again.
"""
from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, Protocol
from collections.abc import Sequence

from pymq_server.broker.sequences import ReservationNeeded, SequenceBook
from pymq_server.storage.device import StoredMessage

from pymq.errors import PymqError

if TYPE_CHECKING:
    from pymq_server.storage.sql import PendingMessage

#: the router's plan for one claimed row (router.PendingPlan), opaque here
PendingPlan = Any

log = logging.getLogger("pymq.apptx")

BATCH = 100


class PendingPlacement(Protocol):
    """The router's side of a claim (server/broker/router.py)."""

    def plan_pending(self, destination: str, data: bytes, batch: set[tuple[str, str]]) -> PendingPlan | None: ...

    def pending_write(self, plan: Any) -> tuple[StoredMessage, list[str]] | None: ...

    def commit_pending(self, pending: PendingPlan, device: Any) -> None: ...


class PendingClaimer:
    def __init__(self, router: PendingPlacement, seqs: SequenceBook, device: Any, loop: Any) -> None:
        self.router = router
        self.seqs = seqs
        self.device = device
        self.loop = loop
        self.listener: Any = None
        self.claimed = 0
        self.discarded = 0

    def start(self) -> None:
        self.listener = self.device.pending_listener()
        self.loop.add_reader(self.listener.fileno(), self._readable)
        self.claim_all()          # rows committed before the listener existed

    def stop(self) -> None:
        if self.listener is not None:
            try:
                self.loop.remove_reader(self.listener.fileno())
            except (ValueError, OSError):
                pass
            self.listener.close()
            self.listener = None

    def _readable(self) -> None:
        try:
            woke = self.listener.drain()
        except PymqError as exc:
            log.error("pending-message listener of %s failed: %s", self.device.name, exc)
            return
        if woke:
            self.claim_all()

    def claim_all(self) -> None:
        while True:
            claimed = self._claim_batch()
            if claimed is None or claimed < BATCH:
                return

    def _claim_batch(self) -> int | None:
        """Claim up to BATCH rows; how many the device took (None: the claim failed)."""
        self.seqs.reserve_ahead("", BATCH)              # message keys: no reservation inside the claim
        while True:
            ready: list[tuple[PendingPlan, bool]] = []
            dropped: list[int] = []
            batch: set[tuple[str, str]] = set()
            try:
                with self.seqs.no_reservations():
                    claimed = self.device.claim_pending(
                        functools.partial(self._assign, ready=ready, dropped=dropped, batch=batch), limit=BATCH)
            except ReservationNeeded as need:
                # rolled back, nothing was claimed: reserve outside the database transaction, claim again
                self.seqs.reserve_ahead(need.name, BATCH)
                continue
            except PymqError as exc:
                log.error("claiming pending messages from %s failed: %s", self.device.name, exc)
                return None
            for pending, written in ready:
                self.router.commit_pending(pending, self.device if written else None)
            self.claimed += len(ready)
            self.discarded += len(dropped)
            return len(claimed)

    def _assign(self, pending: PendingMessage, ready: list, dropped: list[int], batch: set[tuple[str, str]]
                ) -> tuple[StoredMessage, Sequence[str]] | None:
        """Inside the claiming transaction: what the device writes for one pending row, or None."""
        try:
            plan = self.router.plan_pending(pending.destination, pending.data, batch)
        except PymqError as exc:
            # its transaction has committed and nobody waits for an answer: say why, in the broker's log
            log.error("discarding pending message %d for %s: %s", pending.id, pending.destination, exc)
            dropped.append(pending.id)
            return None
        if plan is None:
            log.info("pending message %d for %s is a duplicate; dropped", pending.id, pending.destination)
            return None
        write = self.router.pending_write(plan[0])
        ready.append((plan, write is not None))
        return write
