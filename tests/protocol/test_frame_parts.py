"""A frame sent as pieces (StompConnection.send_parts: head, body, NUL for a large body) is the very frame
each scanner twin's encode_frame writes, and a real broker takes it so."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

import pymq
from pymq.errors import InvalidHeader
from pymq.protocol.connection import LARGE_BODY, Role, StompConnection, encode_frame_parts
from pymq.protocol.frame import Frame
from tests.twins import twin_fixture

codec = twin_fixture("pymq.protocol._scanner_py", "pymq.protocol._scanner_c")

header_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
headers = st.lists(st.tuples(header_text.filter(bool), header_text), max_size=5)


@settings(max_examples=150, deadline=None)
@given(command=st.sampled_from(["SEND", "MESSAGE", "ACK", "CONNECT"]), pairs=headers,
       size=st.sampled_from([0, 1, LARGE_BODY - 1, LARGE_BODY, LARGE_BODY + 7, 3 * LARGE_BODY]),
       version=st.sampled_from(["1.1", "1.2"]), content_length=st.booleans())
def test_the_pieces_are_the_frame(codec, command, pairs, size, version, content_length):
    if content_length:
        pairs.append(("content-length", "12"))          # ignored by both: the body's length is written
    body = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    try:
        whole = codec.encode_frame(command, pairs, body, version)
    except InvalidHeader:
        with pytest.raises(InvalidHeader):               # what cannot be encoded is refused either way
            encode_frame_parts(command, pairs, body, version)
        return
    parts = encode_frame_parts(command, pairs, body, version)
    assert b"".join(parts) == whole
    if size >= LARGE_BODY:
        assert len(parts) == 3 and parts[1] is body     # the caller's own bytes, not a copy
    else:
        assert len(parts) == 1


def test_a_large_send_in_pieces_reaches_a_real_broker_whole(broker):
    body = bytes(range(256)) * (5 * LARGE_BODY // 256)
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        consumer = s.create_consumer(pymq.Queue("parts"))
        s.create_producer(pymq.Queue("parts")).send(s.create_bytes_message(body))
        s.create_producer(pymq.Queue("parts")).send(s.create_text_message("after"))
        got = consumer.receive(5)
        assert got is not None and got.body == body
        assert consumer.receive(5).text == "after"          # the stream stayed in step after the large frame


def test_send_parts_checks_the_frame_like_send():
    client = StompConnection(Role.CLIENT)
    try:
        client.send_parts(Frame("SEND", {"destination": "/queue/x"}, b"x" * LARGE_BODY))
    except pymq.errors.ProtocolError:
        pass
    else:
        raise AssertionError("a SEND before CONNECT was encoded")
