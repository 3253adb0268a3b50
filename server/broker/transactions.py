"""A connection's STOMP transactions: what each holds until COMMIT (spec/stomp.md §5).

Transactions cover SEND, ACK and NACK. Nothing is applied before COMMIT; ABORT discards them (messages
acknowledged in the transaction stay outstanding). A connection that closes aborts its open transactions.
Both the number of open transactions and the operations one may hold are bounded, and so are the bytes
one holds (``max_transaction_bytes``): every BEGIN and operation is charged to the connection's budget
(budgets.py: its frame's bytes and ~0.5 KiB) until COMMIT or ABORT, so open transactions count in the
connection's and its user's budgets and in what all clients hold (half of ``max_memory``). A SEND inside a
transaction pauses its producer while message memory is high, as any SEND does.

COMMIT is all or nothing: :meth:`Transactions.commit` first *admits* every SEND in arrival order — the
checks a SEND would fail (permission, destination, temporary queue gone, schema, queue full, counting
what earlier SENDs of the same transaction add) without creating or numbering anything — and only when
every one passes hands the operations back to be applied. The first refusal is raised with the
operation's position and receipt (:func:`refusal`), and nothing of the transaction is applied. Frame
syntax (a priority out of range, a bad number) is refused when the SEND arrives, which also ends the
transaction with nothing applied. A storage device failing while the operations are applied (a full
disk) is the one thing validation cannot foresee.
"""
from __future__ import annotations

from typing import Any, Union
from collections.abc import Callable

from pymq_server.broker.budgets import OPERATION_COST, TRANSACTION_COST, Budget
from pymq_server.broker.requests import AckRequest, SendRequest

from pymq.errors import PymqError, ResourceLimit, TransactionError

#: what a transaction holds: its SENDs and its ACK/NACKs
TransactionOp = Union[SendRequest, AckRequest]
#: checks one SEND as if every earlier one were applied: (request, what the earlier SENDs add per
#: destination, which the check updates) -> None, or the PymqError the SEND would get
Admission = Callable[[SendRequest, "dict[str, Any]"], None]


def refusal(exc: PymqError, tx: str, position: int, count: int, op: TransactionOp) -> PymqError:
    """``exc`` again (same class, same fields) saying which operation of which transaction failed and
    that nothing was applied: fields ``transaction``, ``operation`` (1-based) and, when the operation's
    frame asked for one, ``operation_receipt``."""
    what = f"SEND to {op.destination}" if isinstance(op, SendRequest) else "ACK"
    receipt = getattr(op, "receipt", None)
    where = f"operation {position} of {count} ({what}{f', receipt {receipt!r}' if receipt else ''})"
    fields = {k: v for k, v in vars(exc).items() if k != "message"}
    fields.update(transaction=tx, operation=position)
    if receipt:
        fields["operation_receipt"] = receipt
    error = type(exc).__new__(type(exc))
    PymqError.__init__(error, f"COMMIT of transaction {tx!r} refused, nothing was applied: {where}: "
                              f"{exc.message}", **fields)
    return error


def operation_bytes(op: TransactionOp) -> int:
    """What an operation held until COMMIT costs: its frame's bytes and :data:`OPERATION_COST`."""
    if isinstance(op, SendRequest):
        return (OPERATION_COST + len(op.body) + len(op.destination) + len(op.receipt or "")
                + sum(len(k) + len(v) for k, v in op.properties.items()))
    return OPERATION_COST + len(op.token) + len(op.subscription or "")


class Transactions:
    __slots__ = ("max_open", "max_operations", "max_bytes", "budget", "_open", "_bytes")

    def __init__(self, max_open: int, max_operations: int, max_bytes: int, budget: Callable[[], Budget]) -> None:
        self.max_open = max_open
        self.max_operations = max_operations
        self.max_bytes = max_bytes
        self.budget = budget              # the connection's (made when first needed: the user is known then)
        self._open: dict[str, list[TransactionOp]] = {}
        self._bytes: dict[str, int] = {}  # what each open transaction is charged

    def begin(self, tx: str) -> None:
        if tx in self._open:
            raise TransactionError(f"transaction {tx!r} is already active", transaction=tx)
        if len(self._open) >= self.max_open:
            raise ResourceLimit(f"more than {self.max_open} open transactions on one connection")
        self._bytes[tx] = self.budget().charge(f"transaction {tx[:64]!r}", TRANSACTION_COST + len(tx))
        self._open[tx] = []

    def add(self, tx: str, op: TransactionOp) -> None:
        ops = self._open.get(tx)
        if ops is None:
            raise TransactionError(f"transaction {tx!r} was not begun on this connection", transaction=tx)
        if len(ops) >= self.max_operations:
            raise ResourceLimit(f"transaction {tx!r} has more than {self.max_operations} operations")
        cost = operation_bytes(op)
        held = self._bytes[tx]
        if held + cost > self.max_bytes:
            raise ResourceLimit(f"transaction {tx!r} would hold more than {self.max_bytes} bytes until COMMIT "
                                f"(max_transaction_bytes): it holds {held}, the next operation {cost}",
                                limit="max_transaction_bytes", transaction=tx, held=held, cost=cost)
        self._bytes[tx] = held + self.budget().charge(f"an operation of transaction {tx[:64]!r}", cost)
        ops.append(op)

    def commit(self, tx: str, admit: Admission) -> list[TransactionOp]:
        """The transaction's operations, in arrival order, to apply now: every SEND admitted first.
        A refusal ends the transaction (nothing applied) and is raised naming the operation."""
        ops = self._open.pop(tx, None)
        if ops is None:
            raise TransactionError(f"COMMIT of unknown transaction {tx!r}", transaction=tx)
        self._release(tx)
        unit: dict[str, Any] = {}
        for position, op in enumerate(ops, 1):
            if isinstance(op, SendRequest):
                try:
                    admit(op, unit)
                except PymqError as exc:
                    raise refusal(exc, tx, position, len(ops), op) from None
        return ops

    def abort(self, tx: str) -> None:
        if self._open.pop(tx, None) is None:
            raise TransactionError(f"ABORT of unknown transaction {tx!r}", transaction=tx)
        self._release(tx)

    def clear(self) -> None:
        for tx in list(self._open):
            self._release(tx)
        self._open.clear()

    def _release(self, tx: str) -> None:
        cost = self._bytes.pop(tx, 0)
        if cost:
            self.budget().release(cost)

    def __len__(self) -> int:
        return len(self._open)

    def names(self) -> list[str]:
        """The open transactions, in the order they were begun (server/cores/handover.py begins them again)."""
        return list(self._open)

    def with_operations(self) -> list[str]:
        """The open transactions that hold an operation (server/cores/home.py: they are fixed to this worker)."""
        return [tx for tx, ops in self._open.items() if ops]

    def __contains__(self, tx: object) -> bool:
        return tx in self._open
