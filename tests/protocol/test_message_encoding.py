"""MESSAGE encoding is the codec's (StompConnection.send_message): from the parts a link caches (the
subscription's head, the message's header block) it produces the bytes encode_frame produces for the same
frame, in every version, with every per-delivery header, and a large body apart from its head."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq.errors import ProtocolError
from pymq.protocol.connection import LARGE_BODY, Role, StompConnection, message_head
from pymq.protocol.frame import Frame
from pymq.protocol.scanner import encode_frame, encode_headers

from tests.twins import compiled as compiled_twin


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


# -- the header block's encoder: both twins, byte for byte -----------------------------------------------

_TEXT = st.text(alphabet=st.sampled_from("ab:\\\n\r\x00 -/é€😀"), max_size=10)


@settings(max_examples=400, deadline=None)
@given(pairs=st.lists(st.tuples(_TEXT, st.one_of(_TEXT, st.integers(), st.booleans())), max_size=6),
       version=st.sampled_from(["1.0", "1.1", "1.2"]), as_dict=st.booleans())
def test_both_encoders_write_the_same_header_block(pairs, version, as_dict):
    """The compiled encode_headers writes an all-ASCII block straight into its bytes, escaping as it copies,
    and any other block the general way: both must give the twin's bytes for names and values with every
    escape (1.2's CR, 1.1's raw CR, 1.0's blanked LF), non-ASCII text, numbers, pairs or a dict."""
    from pymq.protocol import scanner as picker
    c, py = compiled_twin(picker.IMPLEMENTATIONS, "scanner"), picker.IMPLEMENTATIONS["py"]
    headers = dict(pairs) if as_dict else pairs
    escaped, cr = version != "1.0", version == "1.2"
    assert c.encode_headers(headers, escaped, cr) == py.encode_headers(headers, escaped, cr)


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
@pytest.mark.parametrize("unicode", [{}, {"ünï": "cødé"}], ids=["ascii", "non-ascii"])
def test_a_block_needing_escapes_reads_back_as_its_headers(version, unicode):
    """A MESSAGE whose header block needs escaping in 1.1/1.2 (colons, backslashes, LF, CR; a name with a
    colon) and none in 1.0 (where only a value's LF cannot travel: it is blanked): a peer's scanner of that
    version reads the same headers back, from both encoders."""
    from pymq.protocol import scanner as picker
    headers = {"destination": "/queue/q", "message-id": "ID:node-1:7", "path": "C:\\dir\\x", "plain": "v",
               "lines": "a\nb", "cr": "x\ry", "app:id": "1", **unicode}
    for name in ("py", "c"):     # the twin first: PYMQ_NO_EXTENSIONS=1 checks it, then skips the compiled one
        module = picker.IMPLEMENTATIONS["py"] if name == "py" else compiled_twin(picker.IMPLEMENTATIONS, "scanner")
        block = module.encode_headers(headers, version != "1.0", version == "1.2")
        frame, = module.FrameScanner(version=version).feed(b"MESSAGE\n" + block + b"\n\x00")
        if version == "1.0":
            assert b"\\" not in block.replace(b"C:\\dir\\x", b"")       # nothing escaped
            expected = {k: v.replace("\n", " ") for k, v in headers.items()}
            del expected["app:id"]                                  # 1.0 cannot carry a colon in a name:
            expected["app"] = "id:1"                                # the line splits at the first
        else:
            assert (b"x\\ry" in block) == (version == "1.2")           # 1.1 has no CR escape
            assert b"app\\cid:1" in block and b"ID\\cnode-1\\c7" in block
            expected = headers
        assert dict(frame.headers) == expected, (name, version, block)
