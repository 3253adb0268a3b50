"""MESSAGE encoding is the codec's (StompConnection.send_message): from the parts a link caches (the
subscription's head, the message's header block) it produces the bytes encode_frame produces for the same
frame, in every version, with every per-delivery header, and a large body apart from its head."""
from __future__ import annotations

import pytest

from pymq.errors import ProtocolError
from pymq.protocol.connection import LARGE_BODY, Role, StompConnection, message_head
from pymq.protocol.frame import Frame
from pymq.protocol.scanner import encode_frame, encode_headers


def _connected(version: str) -> StompConnection:
    conn = StompConnection(Role.SERVER)
    conn.receive_frame(Frame("CONNECT", {"accept-version": version}, b""))
    conn.send(Frame("CONNECTED", {"version": version}, b""))
    return conn


def _block(headers: dict[str, str], body: bytes, version: str) -> bytes:
    block = encode_headers(headers, version != "1.0", version == "1.2")
    return block + (b"content-length:%d\n" % len(body) if body else b"")


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
@pytest.mark.parametrize("ack,deliveries,first", [(None, 1, False), ("7", 1, False), (None, 3, True), ("9", 2, True)])
@pytest.mark.parametrize("body", [b"", b"hello", b"x" * LARGE_BODY])
def test_the_parts_make_the_frame_encode_frame_makes(version, ack, deliveries, first, body):
    sub = "sub:1" if version == "1.0" else "sub:1\nx\\y"
    headers = {"destination": "/queue/q", "message-id": "ID:n-1", "pymq-seq": "1", "k": "v:w"}
    pieces = _connected(version).send_message(message_head(sub, version), _block(headers, body, version), body,
                                              ack, deliveries, first)
    expected = {"subscription": sub}
    if ack is not None:
        expected["ack"] = ack
    if deliveries > 1:
        expected.update({"redelivered": "true", "JMSXDeliveryCount": str(deliveries)})
    if first:
        expected["JMSXGroupFirstForConsumer"] = "true"
    expected.update(headers)
    frame = encode_frame("MESSAGE", expected, body, version)
    assert b"".join(pieces) == frame
    assert len(pieces) == (3 if len(body) >= LARGE_BODY else 1)
    if len(pieces) == 3:
        assert pieces[1] is body                # the message's own bytes, not a copy


def test_the_state_table_guards_a_message():
    conn = StompConnection(Role.SERVER)        # no CONNECT yet: a MESSAGE is not allowed
    with pytest.raises(ProtocolError):
        conn.send_message(message_head("s", "1.2"), b"", b"")
