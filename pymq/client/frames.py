"""What the SDKs put on the wire, built in one place: the client core (``pymq.client._core``) under both
SDKs and the application-transaction send call these, so a header rule (spec/stomp.md §4, §7, §9) is
written once.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pymq.destination import Destination, as_destination
from pymq.errors import IllegalStateError, MessageFormatError
from pymq.message import NON_PERSISTENT, PERSISTENT, Message, MessageBody, make_message, now_ms
from pymq.protocol.frame import Frame


class ProducerDefaults(Protocol):
    """What a producer contributes to a SEND: its destination and defaults."""

    destination: Destination | None
    delivery_mode: int
    priority: int
    time_to_live: int
    delivery_delay: int


def send_frame(producer: ProducerDefaults, message: MessageBody, destination: Destination | str | None, *,
               delivery_mode: int | None = None, priority: int | None = None, time_to_live: int | None = None,
               delivery_delay: int | None = None) -> tuple[Message, Frame]:
    """The Message and the SEND frame for ``producer.send(...)``: the producer's defaults, overridden
    by the call's arguments, validated before anything is written."""
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
    delay = producer.delivery_delay if delivery_delay is None else delivery_delay
    msg.destination = target
    msg.delivery_mode = mode
    msg.priority = prio
    msg.timestamp = now_ms()
    msg.expiration = msg.timestamp + ttl if ttl else 0
    headers = msg.to_headers()
    headers["destination"] = target.stomp_name
    if delay:
        headers["AMQ_SCHEDULED_DELAY"] = str(delay)
    return msg, Frame("SEND", headers, msg._body_bytes())


def checked_selector(selector: str | None) -> str | None:
    """``selector`` once the SDK's own compiler (the broker's) accepts it: an invalid one raises
    InvalidSelector here, before anything is sent, so a typo costs the call and not the connection
    (STOMP's ERROR would end it).  A broker configured with tighter selector limits than the defaults
    still refuses with an ERROR."""
    if selector and selector.strip():
        from pymq.selector import compile_selector
        compile_selector(selector)
    return selector


def subscribe_headers(destination: Destination, sub_id: str, cumulative: bool, prefetch: int, *,
                      selector: str | None = None, no_local: bool = False,
                      extra: dict[str, str] | None = None) -> dict[str, str]:
    """SUBSCRIBE headers: always broker-side credit (``client`` acks when ``cumulative``, else
    ``client-individual``, and a prefetch), so a consumer never holds more than ``prefetch`` messages."""
    headers = {"destination": destination.stomp_name, "id": sub_id,
               "ack": "client" if cumulative else "client-individual",
               "prefetch-count": str(prefetch)}
    if selector:
        headers["selector"] = checked_selector(selector) or ""
    if no_local:
        headers["no-local"] = "true"
    if extra:
        headers.update(extra)
    return headers


#: the content type of an Arrow IPC stream: a range read answered in Arrow, a bulk SEND (spec/spark.md §5)
ARROW_STREAM = "application/vnd.apache.arrow.stream"


def range_headers(*, from_seq: int | None = None, to_seq: int | None = None, max_messages: int | None = None,
                  max_bytes: int | None = None, from_timestamp: int | None = None, selector: str | None = None,
                  subscription: str | None = None, source: str | None = None,
                  arrow: bool = False, columns: Sequence[str] | None = None) -> dict[str, object]:
    """The extra SUBSCRIBE headers of a range read (spec/stomp.md §9).  There is always a start (0 =
    the earliest): a range read is in sequence order, never delivery order.  ``source``: "log" or
    "queue" (default: the destination's retained log when it has one).  ``arrow``: ask for the answer
    as one Arrow frame (spec/spark.md §6); ``columns``: only these columns of it (``pymq-columns``).  None
    values are left out."""
    return {"pymq-from-seq": from_seq or 0, "pymq-to-seq": to_seq, "pymq-max-messages": max_messages,
            "pymq-max-bytes": max_bytes, "pymq-from-timestamp": from_timestamp,
            "selector": checked_selector(selector) or None, "durable-subscription-name": subscription,
            "pymq-source": source,
            "pymq-format": "arrow" if arrow else None, "pymq-columns": ",".join(columns) if columns else None}


def bulk_frame(destination: Destination | str, data: bytes) -> Frame:
    """A bulk SEND (spec/spark.md §7): rows as an Arrow IPC stream, appended by the broker as a unit."""
    return Frame("SEND", {"destination": as_destination(destination).stomp_name, "pymq-format": "arrow",
                          "content-type": ARROW_STREAM}, data)


def ack_upto_frame(destination: Destination | str, seq: int, subscription: str | None = None) -> Frame:
    """Acknowledge every waiting message below ``seq`` (spec/stomp.md §9)."""
    headers = {"id": "pymq-upto", "pymq-ack-upto": str(int(seq)),
               "destination": as_destination(destination).stomp_name}
    if subscription:
        headers["durable-subscription-name"] = subscription
    return Frame("ACK", headers)
