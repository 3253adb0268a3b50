"""A connection's STOMP transactions: what each holds until COMMIT (spec/stomp.md §5).

Transactions cover SEND, ACK and NACK. Nothing is applied before COMMIT, which hands back the operations
in arrival order; ABORT discards them (messages acknowledged in the transaction stay outstanding). A
connection that closes aborts its open transactions. Both the number of open transactions and the
operations one may hold are bounded.
"""
from __future__ import annotations

from typing import Union

from pymq_server.broker.requests import AckRequest, SendRequest

from pymq.errors import ResourceLimit, TransactionError

#: what a transaction holds: its SENDs and its ACK/NACKs
TransactionOp = Union[SendRequest, AckRequest]


class Transactions:
    __slots__ = ("max_open", "max_operations", "_open")

    def __init__(self, max_open: int, max_operations: int) -> None:
        self.max_open = max_open
        self.max_operations = max_operations
        self._open: dict[str, list[TransactionOp]] = {}

    def begin(self, tx: str) -> None:
        if tx in self._open:
            raise TransactionError(f"transaction {tx!r} is already active", transaction=tx)
        if len(self._open) >= self.max_open:
            raise ResourceLimit(f"more than {self.max_open} open transactions on one connection")
        self._open[tx] = []

    def add(self, tx: str, op: TransactionOp) -> None:
        ops = self._open.get(tx)
        if ops is None:
            raise TransactionError(f"transaction {tx!r} was not begun on this connection", transaction=tx)
        if len(ops) >= self.max_operations:
            raise ResourceLimit(f"transaction {tx!r} has more than {self.max_operations} operations")
        ops.append(op)

    def commit(self, tx: str) -> list[TransactionOp]:
        """The transaction's operations, in arrival order, to apply now."""
        ops = self._open.pop(tx, None)
        if ops is None:
            raise TransactionError(f"COMMIT of unknown transaction {tx!r}", transaction=tx)
        return ops

    def abort(self, tx: str) -> None:
        if self._open.pop(tx, None) is None:
            raise TransactionError(f"ABORT of unknown transaction {tx!r}", transaction=tx)

    def clear(self) -> None:
        self._open.clear()

    def __len__(self) -> int:
        return len(self._open)
