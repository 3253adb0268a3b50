"""``producer.send(message, transaction=conn)``: a message in the application's own database transaction.

When the broker keeps a SQL holding device in the application's database, the SDK writes the message as
a pending row with the application's SQLAlchemy ``Connection`` or ``Session``.  Consumers see it only
after that transaction commits (the broker claims committed rows, woken by NOTIFY on PostgreSQL or an
in-process signal on SQLite), and never if it rolls back.  No two-phase commit: the database's own
commit decides.  The row format and claim protocol are in spec/storage.md ("SQL device").
"""
from __future__ import annotations

from typing import Any

from pymq.client.frames import send_frame
from pymq.errors import IllegalStateError
from pymq.message import Message
from pymq.protocol.scanner import encode_frame


def send_in_transaction(producer, message: Any, destination, transaction: Any, *,
                        delivery_mode: int | None = None, priority: int | None = None,
                        time_to_live: int | None = None, table_prefix: str = "pymq_",
                        broker_id: str | None = None) -> Message:
    try:
        from pymq_server.storage.sql import send_in_transaction as insert_pending
    except ImportError as exc:  # SQLAlchemy is an optional dependency
        raise IllegalStateError(f"sending in a database transaction needs SQLAlchemy: {exc}") from None
    msg, frame = send_frame(producer, message, destination, delivery_mode=delivery_mode, priority=priority,
                            time_to_live=time_to_live, delivery_delay=0)
    data = encode_frame("SEND", frame.headers, frame.body, "1.2")
    insert_pending(transaction, frame.headers["destination"], data, persistent=msg.persistent,
                   broker_id=broker_id, table_prefix=table_prefix)
    return msg
