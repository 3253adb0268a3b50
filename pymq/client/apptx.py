"""``producer.send(message, transaction=conn)``: a message in the application's own database transaction.

When the broker keeps a SQL holding device in the application's database, the SDK writes the message as
a pending row with the application's SQLAlchemy ``Connection`` or ``Session``.  Consumers see it only
after that transaction commits (the broker claims committed rows, woken by NOTIFY on PostgreSQL or an
in-process signal on SQLite), and never if it rolls back.  No two-phase commit: the database's own
commit decides.  The row format and claim protocol are in spec/storage.md ("SQL device").

Both SDKs call :func:`pending_row` (the frame, built by the same code as any SEND) and write it with
:func:`insert_pending` (the SQL device's own writer, reached through :mod:`pymq.client.vm`, the
SDKs' one seam to the broker package); ``pymq.aio`` also accepts SQLAlchemy's ``AsyncConnection``/
``AsyncSession`` (through their ``run_sync``).
"""
from __future__ import annotations

from pymq.client.frames import ProducerDefaults, send_frame
from pymq.client.vm import pending_row_writer
from pymq.destination import Destination
from pymq.message import Message, MessageBody
from pymq.protocol.scanner import encode_frame


def pending_row(producer: ProducerDefaults, message: MessageBody, destination: Destination | str | None, *,
                delivery_mode: int | None = None, priority: int | None = None,
                time_to_live: int | None = None) -> tuple[Message, str, bytes]:
    """The Message, its destination and its encoded SEND frame, as the pending row holds them."""
    msg, frame = send_frame(producer, message, destination, delivery_mode=delivery_mode, priority=priority,
                            time_to_live=time_to_live, delivery_delay=0)
    return msg, frame.headers["destination"], encode_frame("SEND", frame.headers, frame.body, "1.2")


def insert_pending(transaction: object, destination: str, data: bytes, *, persistent: bool,
                   table_prefix: str = "pymq_", broker_id: str | None = None) -> int:
    """Write the pending row with the application's (synchronous) SQLAlchemy Connection or Session."""
    return pending_row_writer()(transaction, destination, data, persistent=persistent, broker_id=broker_id,
                       table_prefix=table_prefix)


def send_in_transaction(producer: ProducerDefaults, message: MessageBody, destination: Destination | str | None,
                        transaction: object, *, delivery_mode: int | None = None, priority: int | None = None,
                        time_to_live: int | None = None, table_prefix: str = "pymq_",
                        broker_id: str | None = None) -> Message:
    msg, target, data = pending_row(producer, message, destination, delivery_mode=delivery_mode,
                                    priority=priority, time_to_live=time_to_live)
    insert_pending(transaction, target, data, persistent=msg.persistent, table_prefix=table_prefix,
                   broker_id=broker_id)
    return msg
