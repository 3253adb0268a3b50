"""A message's stored form, and what storage rules see of it.

A message is stored as its MESSAGE frame (spec/stomp.md framing; spec/storage.md) plus
``pymq-deliver-at`` when its delivery is delayed; the holding store writes what :func:`encode_stored`
returns (through :data:`STORED_CODEC`, the codec it is made with), and recovery reads it back with
:func:`decode_stored`. :func:`rule_context_of` gives the
storage-rule context of a message (spec/storage_rules.md §2).
"""
from __future__ import annotations

from pymq_server.broker.message import BrokerMessage
from pymq_server.storage.device import StoredMessage

from pymq.errors import StorageError
from pymq.protocol.scanner import FrameScanner, encode_frame


def encode_stored(message: BrokerMessage) -> bytes:
    """A message's storage form: its MESSAGE frame, plus deliver-at.

    Without deliver-at this is the STOMP 1.2 header block every MESSAGE frame of the message repeats
    (cached on the message), so a stored message is encoded once for the disk and the wire together;
    the bytes are the same as :func:`encode_frame` gives (tests/broker/test_stored_form.py)."""
    if not message.deliver_at and "content-length" not in message.headers:
        # one join: the body (a bulk SEND's is megabytes) is copied once, not once per ``+``
        return b"".join((b"MESSAGE\n", message.header_block("1.2"), b"\n", message.body, b"\0"))
    headers = message.frame_headers()
    if message.deliver_at:
        headers["pymq-deliver-at"] = str(message.deliver_at)
    return encode_frame("MESSAGE", headers, message.body, "1.2")


#: a body at least this long is stored from its own bytes (:func:`encode_stored_parts`)
LARGE_BODY = 64 * 1024


def encode_stored_parts(message: BrokerMessage) -> tuple[bytes, ...]:
    """:func:`encode_stored` as pieces whose concatenation it is: for a large body (a bulk SEND's, megabytes)
    the header block, the body itself and the NUL, so that the file device stores and logs the body from
    the message's own bytes instead of a copy made for it (the copy landed in fresh memory: the kernel
    zeroing pages for every frame); otherwise the one encoded piece."""
    body = message.body
    if len(body) >= LARGE_BODY and type(body) is bytes and not message.deliver_at \
            and "content-length" not in message.headers:
        return b"MESSAGE\n" + message.header_block("1.2") + b"\n", body, b"\0"
    return (encode_stored(message),)


class StoredCodec:
    """The holding store's codec (``storage.storable.StoredCodec``): what it writes for a message."""

    __slots__ = ()

    def encode(self, message: BrokerMessage) -> bytes:
        return encode_stored(message)

    def encode_parts(self, message: BrokerMessage) -> tuple[bytes, ...]:
        return encode_stored_parts(message)


#: the codec the broker's holding store is made with (server/app.py)
STORED_CODEC = StoredCodec()


def stored_message(message: BrokerMessage) -> StoredMessage:
    """What a device writes for ``message``."""
    return StoredMessage(message.key, message.destination, message.seq, message.persistent, encode_stored(message))


def decode_stored(stored: StoredMessage) -> BrokerMessage:
    scanner = FrameScanner(max_frame_size=len(stored.data) + 1, version="1.2")
    frames = scanner.feed(stored.data)
    if len(frames) != 1:
        raise StorageError(f"stored message {stored.key} does not decode to one frame")
    h = dict(frames[0].headers)
    body = frames[0].body
    message_id = h.pop("message-id")
    h.pop("destination", None)
    h.pop("pymq-seq", None)
    h.pop("content-length", None)
    deliver_at = int(h.pop("pymq-deliver-at", "0"))
    return BrokerMessage(stored.key, message_id, stored.destination, stored.seq, h, body,
                         stored.persistent, int(h.get("priority", 4)), int(h.get("timestamp", 0)),
                         int(h.get("expires", 0)), deliver_at)


def rule_context_of(message: BrokerMessage) -> dict:
    """The storage-rule context (spec/storage_rules.md §2) of a message."""
    from pymq.selector import rule_context
    ctype = message.headers.get("content-type", "")
    if ctype.startswith("application/x-pymq-map") or message.headers.get("transformation") == "jms-map-json":
        body_type = "MAP"
    elif ctype.startswith("text/") or not ctype:
        body_type = "TEXT" if ctype or _is_text(message.body) else "BYTES"
    else:
        body_type = "BYTES"
    dest_type = "TOPIC" if message.destination.startswith("/topic/") else "QUEUE"
    return rule_context(size_bytes=message.size, body_type=body_type, headers=message.headers,
                        destination=message.destination, destination_type=dest_type,
                        client_id=message.client_id, priority=message.priority,
                        persistent=message.persistent, producer=message.user)


def _is_text(body: bytes) -> bool:
    try:
        body.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
