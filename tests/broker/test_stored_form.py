"""A message's stored form (spec/storage.md: a MESSAGE frame) is the same bytes whether it is built from the
cached wire header block (the fast path, issue 16) or encoded from the headers, and decodes back to the
same message, for any header names and values (escapes, colons, CR/LF, non-ASCII) and bodies."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pymq.protocol.scanner import encode_frame
from pymq_server.broker.message import BrokerMessage
from pymq_server.broker.stored_form import (LARGE_BODY, decode_stored, encode_stored, encode_stored_parts,
                                            stored_message)

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12).filter(
    lambda n: n not in ("destination", "message-id", "pymq-seq", "content-length", "pymq-deliver-at"))
values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


def message(headers: dict, body: bytes, deliver_at: int = 0) -> BrokerMessage:
    h = dict(headers)
    h.update({"persistent": "true", "priority": "4", "timestamp": "1700000000000", "expires": "0"})
    return BrokerMessage(7, "ID:m-7", "/queue/a", 42, h, body, True, 4, 1700000000000, 0, deliver_at)


def slow_path(m: BrokerMessage) -> bytes:
    headers = m.frame_headers()
    if m.deliver_at:
        headers["pymq-deliver-at"] = str(m.deliver_at)
    return encode_frame("MESSAGE", headers, m.body, "1.2")


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(names, values, max_size=6), st.binary(max_size=64), st.sampled_from([0, 0, 1700000001234]))
def test_stored_form_is_the_encoded_frame_and_round_trips(headers, body, deliver_at):
    m = message(headers, body, deliver_at)
    data = encode_stored(m)
    assert data == slow_path(m)
    if any("\0" in k + v for k, v in headers.items()):
        return      # a NUL ends a frame: the scanner refuses such headers on input, so none is ever stored
    back = decode_stored(stored_message(m))
    assert back.headers == m.headers and back.body == body and back.deliver_at == deliver_at
    assert back.message_id == m.message_id


def test_the_fast_path_shares_the_wire_header_block():
    m = message({"app-id": "a:b\nc"}, b"body")
    data = encode_stored(m)
    block = m.header_block("1.2")
    assert data == b"MESSAGE\n" + block + b"\n" + b"body\0"
    assert m.header_block("1.2") is block     # encoded once, for the disk and the wire


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(names, values, max_size=4), st.sampled_from([0, 5, LARGE_BODY - 1, LARGE_BODY, LARGE_BODY + 7]),
       st.sampled_from([0, 0, 1700000001234]), st.booleans())
def test_the_stored_form_as_parts_joins_to_the_stored_form(headers, size, deliver_at, length_header):
    """A large body stays its own bytes object among the parts (the file device keeps it, no copy)."""
    if length_header:
        headers = {**headers, "content-length": str(size)}
    m = message(headers, bytes(range(256)) * (size // 256) + b"x" * (size % 256), deliver_at)
    parts = encode_stored_parts(m)
    assert b"".join(parts) == encode_stored(m)
    plain = size >= LARGE_BODY and not deliver_at and not length_header
    assert len(parts) == (3 if plain else 1)
    if plain:
        assert parts[1] is m.body
