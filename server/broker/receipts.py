"""Receipts of one connection: in order, and never before the data they confirm is durable.

A RECEIPT confirms every earlier frame of the connection and, for persistent SENDs, that their data is
durable under the sync policy (spec/stomp.md §5). A SEND that wrote data marks the connection
*unsynced*; the next receipt then asks the store for a barrier. One barrier per loop iteration covers
every receipt of the batch of frames just read: a pipelining producer costs one flush and one commit
wait per read, not one per message. Receipts wait in a FIFO behind their barrier, so they leave in order.
A barrier that fails (the data could not be made durable: a full or failing disk) answers the first
receipt still waiting with an ERROR instead (``receipt_failed``): never a receipt that lies, never silence.
"""
from __future__ import annotations

from collections import deque
from typing import Protocol
from collections.abc import Callable


class ReceiptOwner(Protocol):
    """What the receipt queue needs from its connection and broker."""

    closed: bool

    def write_receipt(self, receipt_id: str, extra: dict[str, str] | None) -> None: ...

    def call_soon(self, fn: Callable[[], None]) -> None: ...

    def barrier(self, done: Callable[[BaseException | None], None]) -> None: ...

    def receipt_failed(self, receipt_id: str, error: BaseException) -> None: ...


class ReceiptQueue:
    __slots__ = ("owner", "unsynced", "_barrier_seq", "_barrier_done", "_scheduled", "_waiting")

    def __init__(self, owner: ReceiptOwner) -> None:
        self.owner = owner
        self.unsynced = False                # wrote data a receipt must wait for
        self._barrier_seq = 0
        self._barrier_done = 0
        self._scheduled = False
        self._waiting: deque[tuple[int, str, dict[str, str] | None]] = deque()

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    @property
    def pending(self) -> int:
        """How many receipts wait for their barrier (server/cores/home.py: when a connection starts to span workers)."""
        return len(self._waiting)

    def receipt(self, receipt_id: str, extra: dict[str, str] | None = None) -> None:
        if self.unsynced:
            self.unsynced = False
            self._barrier_seq += 1
            if not self._scheduled:
                self._scheduled = True
                self.owner.call_soon(self._issue_barrier)
        if not self._waiting and self._barrier_done >= self._barrier_seq:
            self.owner.write_receipt(receipt_id, extra)
        else:
            self._waiting.append((self._barrier_seq, receipt_id, extra))

    def _issue_barrier(self) -> None:
        self._scheduled = False
        if self.owner.closed:
            return
        barrier = self._barrier_seq
        self.owner.barrier(lambda error: self._barrier_complete(barrier, error))

    def _barrier_complete(self, barrier: int, error: BaseException | None = None) -> None:
        if error is not None:
            if self._waiting and not self.owner.closed:
                # the first receipt not yet given depends on writes that are not durable
                _, receipt_id, _ = self._waiting.popleft()
                self._waiting.clear()
                self.owner.receipt_failed(receipt_id, error)
            return
        if barrier > self._barrier_done:
            self._barrier_done = barrier
        waiting = self._waiting
        owner = self.owner
        while waiting and waiting[0][0] <= self._barrier_done and not owner.closed:
            _, receipt_id, extra = waiting.popleft()
            owner.write_receipt(receipt_id, extra)

    def clear(self) -> None:
        self._waiting.clear()
