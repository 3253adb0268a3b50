"""``producer.send(message, transaction=conn)``: a message in the application's own database transaction.

When the broker keeps a SQL holding device in the application's database, the SDK writes the message as
a pending row with the application's SQLAlchemy ``Connection`` or ``Session``.  Consumers see it only
after that transaction commits (the broker claims committed rows, woken by NOTIFY on PostgreSQL or an
in-process signal on SQLite), and never if it rolls back.  No two-phase commit: the database's own
commit decides.  The row format and claim protocol are in spec/storage.md ("SQL device").
"""
from __future__ import annotations

from typing import Any

from pymq.destination import as_destination
from pymq.errors import IllegalStateError, MessageFormatError
from pymq.message import NON_PERSISTENT, PERSISTENT, Message, make_message, now_ms
from pymq.protocol.scanner import encode_frame


def send_in_transaction(producer, message: Any, destination, transaction: Any, *,
                        delivery_mode: int | None = None, priority: int | None = None,
                        time_to_live: int | None = None, table_prefix: str = "pymq_",
                        broker_id: str | None = None) -> Message:
    try:
        from pymq_server.storage.sql import send_in_transaction as insert_pending
    except ImportError as exc:  # SQLAlchemy is an optional dependency
        raise IllegalStateError(f"sending in a database transaction needs SQLAlchemy: {exc}") from None
    target = as_destination(destination) if destination is not None else producer.destination
    if target is None:
        raise IllegalStateError("this producer has no destination: pass one to send()")
    msg = make_message(message)
    mode = producer.delivery_mode if delivery_mode is None else delivery_mode
    if mode not in (PERSISTENT, NON_PERSISTENT):
        raise MessageFormatError(f"delivery mode must be PERSISTENT (2) or NON_PERSISTENT (1), got {mode}")
    prio = producer.priority if priority is None else priority
    if not 0 <= prio <= 9:
        raise MessageFormatError(f"priority must be between 0 and 9, got {prio}")
    ttl = producer.time_to_live if time_to_live is None else time_to_live
    msg.destination = target
    msg.delivery_mode = mode
    msg.priority = prio
    msg.timestamp = now_ms()
    msg.expiration = msg.timestamp + ttl if ttl else 0
    headers = msg.to_headers()
    headers["destination"] = target.stomp_name
    data = encode_frame("SEND", headers, msg._body_bytes(), "1.2")
    insert_pending(transaction, target.stomp_name, data, persistent=mode == PERSISTENT,
                   broker_id=broker_id, table_prefix=table_prefix)
    return msg
