"""``max_frame_size`` at its exact edge (issue 31): a frame of exactly the limit is taken, one byte more is
refused — on every path the scanner measures a frame (a declared content-length, a body running to its NUL,
a frame still arriving, a body gathered in pieces past LARGE_BODY), in both twins, and by a real broker.

A frame's size is its command, headers and blank line plus its body (the NUL that ends it not counted).
Each ``>`` of the scanner turned into ``>=`` (or the reverse) fails one of these.
"""
from __future__ import annotations

import pytest

from pymq.errors import FrameTooLarge
from pymq.protocol._scanner_py import LARGE_BODY
from tests.conftest import RawStomp
from tests.twins import twin_fixture

codec = twin_fixture("pymq.protocol._scanner_py", "pymq.protocol._scanner_c")


def _head(length: int | None) -> bytes:
    lines = ["SEND", "destination:/queue/edge"]
    if length is not None:
        lines.append(f"content-length:{length}")
    return ("\n".join(lines) + "\n\n").encode()


def frame_of(size: int, declared: bool) -> bytes:
    """A SEND of exactly ``size`` bytes (its NUL not counted), with or without content-length."""
    body = max(0, size - len(_head(size if declared else None)))
    while len(_head(body if declared else None)) + body != size:
        body -= 1
    return _head(body if declared else None) + b"x" * body + b"\x00"


def _scan(codec, limit: int, data: bytes, pieces: int) -> list:
    scanner = codec.FrameScanner(max_frame_size=limit, version="1.2")
    frames = []
    step = max(1, -(-len(data) // pieces))
    for at in range(0, len(data), step):
        frames += scanner.feed(data[at:at + step])
    return frames


@pytest.mark.parametrize("limit", [256, 4 * LARGE_BODY], ids=["small", "gathered"])
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "to-nul"])
@pytest.mark.parametrize("pieces", [1, 2, 7], ids=["whole", "halves", "sevenths"])
def test_a_frame_of_exactly_the_limit_is_taken_and_one_byte_more_is_refused(codec, limit, declared, pieces):
    exact = frame_of(limit, declared)
    assert len(exact) == limit + 1
    frames = _scan(codec, limit, exact, pieces)
    assert len(frames) == 1 and frames[0].command == "SEND"
    assert frames[0].body == exact[exact.index(b"\n\n") + 2:-1]
    with pytest.raises(FrameTooLarge) as info:
        _scan(codec, limit, frame_of(limit + 1, declared), pieces)
    assert info.value.limit == limit


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "to-nul"])
def test_a_frame_of_the_limit_waiting_for_its_nul_is_not_refused_early(codec, declared):
    """All but the NUL of an exactly-limit frame is buffered: still within the limit."""
    limit = 300
    exact = frame_of(limit, declared)
    scanner = codec.FrameScanner(max_frame_size=limit, version="1.2")
    assert scanner.feed(exact[:-1]) == []
    assert [f.command for f in scanner.feed(b"\x00")] == ["SEND"]


def test_a_header_block_of_exactly_the_limit_is_taken(codec):
    head = b"SEND\ndestination:/queue/edge\n"
    pad = b"p:"
    limit = 200
    line = pad + b"v" * (limit - len(head) - len(pad) - 2) + b"\n"
    frame = head + line + b"\n"
    assert len(frame) == limit
    assert len(_scan(codec, limit, frame + b"\x00", 1)) == 1
    with pytest.raises(FrameTooLarge):
        _scan(codec, limit - 1, frame + b"\x00", 1)


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "to-nul"])
def test_the_broker_takes_a_frame_of_exactly_max_frame_size_and_refuses_one_byte_more(broker_factory, declared):
    limit = 2048
    broker = broker_factory(max_frame_size=limit)
    client = RawStomp(broker.port)
    assert client.connect().command == "CONNECTED"
    receipt = b"receipt:r1\n"
    exact = frame_of(limit - len(receipt), declared)
    exact = exact.replace(b"SEND\n", b"SEND\n" + receipt, 1)          # asks for a receipt, same size
    assert len(exact) == limit + 1
    client.send_raw(exact)
    answer = client.read(10)
    assert answer.command == "RECEIPT", answer
    over = frame_of(limit + 1, declared)
    client.send_raw(over)
    error = client.read(10)
    assert error.command == "ERROR" and error.headers["pymq-code"] == "frame-too-large", error
    client.close()
