"""The frame scanner and encoder, both implementations, against spec/vectors/frames.json and hypothesis."""
from __future__ import annotations

import json
import pathlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq import errors
from pymq.protocol.frame import Frame
from tests.twins import twin_fixture

codec = twin_fixture("pymq.protocol._scanner_py", "pymq.protocol._scanner_c")

VECTORS = json.loads((pathlib.Path(__file__).parents[2] / "spec/vectors/frames.json").read_text())
PARSE = VECTORS["parse"]
ENCODE = VECTORS["encode"]


def _scanner(codec, case):
    return codec.FrameScanner(max_frame_size=case.get("max_frame_size", 4 * 1024 * 1024),
                              max_headers=case.get("max_headers", 1000), version=case["version"])


def _feed_all(scanner, data: bytes, chunks) -> list:
    out = []
    pos = 0
    for size in chunks:
        out += scanner.feed(data[pos:pos + size])
        pos += size
    out += scanner.feed(data[pos:])
    # a negotiating frame pauses the scanner: drain what it kept (the connection does this too)
    while True:
        more = scanner.feed(b"")
        if not more:
            return out
        out += more


def _splits(data: bytes, mode: str, seed: int = 0):
    if mode == "whole":
        return []
    if mode == "bytewise":
        return [1] * len(data)
    rnd = random.Random(seed)
    sizes, left = [], len(data)
    while left > 0:
        n = rnd.randint(1, max(1, left))
        sizes.append(n)
        left -= n
    return sizes


def _expected(case):
    return [(f["command"], [tuple(h) for h in f["headers"]], bytes.fromhex(f["body_hex"])) for f in case["frames"]]


@pytest.mark.parametrize("mode", ["whole", "bytewise", "random1", "random2", "random3"])
@pytest.mark.parametrize("case", PARSE, ids=[c["name"] for c in PARSE])
def test_parse_vectors(codec, case, mode):
    data = bytes.fromhex(case["input_hex"])
    scanner = _scanner(codec, case)
    chunks = _splits(data, mode, seed=hash(mode) & 0xFFFF)
    if "error" in case:
        cls = getattr(errors, case["error"]["class"])
        with pytest.raises(cls) as info:
            _feed_all(scanner, data, chunks)
        assert case["error"]["contains"] in str(info.value)
        # a failed scanner stays failed
        with pytest.raises(cls):
            scanner.feed(b"SEND\n\n\x00")
        return
    frames = _feed_all(scanner, data, chunks)
    got = [(f.command, list(f.headers.items()), f.body) for f in frames]
    assert got == _expected(case)
    if "buffered" in case:
        assert scanner.buffered == case["buffered"]


@pytest.mark.parametrize("case", ENCODE, ids=[c["name"] for c in ENCODE])
def test_encode_vectors(codec, case):
    headers = [tuple(h) for h in case["headers"]]
    body = bytes.fromhex(case["body_hex"])
    if "error" in case:
        with pytest.raises(getattr(errors, case["error"]["class"])) as info:
            codec.encode_frame(case["command"], headers, body, case["version"])
        assert case["error"]["contains"] in str(info.value)
    else:
        assert codec.encode_frame(case["command"], headers, body, case["version"]).hex() == case["bytes_hex"]


def test_pauses_after_connect_until_fed_again(codec):
    """Frames pipelined behind CONNECT are parsed with the version CONNECT negotiates."""
    scanner = codec.FrameScanner(version="1.0")
    data = b"CONNECT\naccept-version:1.2\n\n\x00SEND\ndestination:/q\nk:a\\cb\n\n\x00"
    first = scanner.feed(data)
    assert [f.command for f in first] == ["CONNECT"]
    scanner.version = "1.2"
    rest = scanner.feed(b"")
    assert rest[0].headers["k"] == "a:b"


def test_large_body_streamed_in_pieces(codec):
    body = bytes(range(256)) * 4096  # 1 MiB with NULs
    data = codec.encode_frame("SEND", {"destination": "/queue/big"}, body, "1.2")
    scanner = codec.FrameScanner(version="1.2")
    frames = []
    for i in range(0, len(data), 7001):
        frames += scanner.feed(data[i:i + 7001])
    assert len(frames) == 1 and frames[0].body == body


def test_views_of_a_read_are_fed_as_bytes_are(codec):
    """The broker's TCP layer hands a read over in views of it (server/net/tcp.py, the read budget): the
    same frames as bytes give, small and large bodies alike, and nothing kept refers to a view."""
    body = bytes(range(256)) * 800
    data = (codec.encode_frame("SEND", {"destination": "/queue/big"}, body, "1.2")
            + codec.encode_frame("SEND", {"destination": "/queue/a"}, b"x" * 10, "1.2"))
    read = bytes(data)
    scanner = codec.FrameScanner(version="1.2")
    frames = []
    view = memoryview(read)
    for i in range(0, len(read), 16 * 1024):
        frames += scanner.feed(view[i:i + 16 * 1024])
    assert [(f.command, f.body) for f in frames] == [("SEND", body), ("SEND", b"x" * 10)]
    assert all(type(f.body) is bytes for f in frames) and scanner.buffered == 0


def test_a_large_body_is_gathered_across_feeds(codec):
    """A body of LARGE_BODY or more that has not fully arrived is gathered chunk by chunk and joined once:
    the same frames, the same ``buffered`` count and the same errors as the scan buffer gave."""
    body = bytes(range(256)) * 800                                   # 200 KiB with NULs inside
    assert len(body) >= codec.LARGE_BODY
    big = codec.encode_frame("MESSAGE", {"subscription": "s1"}, body, "1.2")
    small = codec.encode_frame("RECEIPT", {"receipt-id": "r1"}, b"", "1.2")
    data = b"\n" + big + b"\n\n" + small + big + small[:5]
    for cuts in ([len(data)], [30, 100_000, 3], [1, 1, 40], [len(big), 1], [len(big) + 1, 2], [70_000] * 6):
        scanner = codec.FrameScanner(version="1.2")
        frames, pos = [], 0
        for size in cuts:
            frames += scanner.feed(data[pos:pos + size])
            pos += size
            assert scanner.buffered <= pos
        frames += scanner.feed(data[pos:])
        assert [(f.command, f.body == body) for f in frames] == \
            [("MESSAGE", True), ("RECEIPT", False), ("MESSAGE", True)], cuts
        assert scanner.buffered == 5
        assert scanner.feed(small[5:])[0].headers["receipt-id"] == "r1" and scanner.buffered == 0
    # the gathered bytes count as buffered, and the NUL arriving on its own completes the frame
    scanner = codec.FrameScanner(version="1.2")
    assert scanner.feed(big[:-1]) == [] and scanner.buffered == len(big) - 1
    assert scanner.feed(big[-1:])[0].body == body and scanner.buffered == 0
    # no NUL where content-length says: the same error as before, and the scanner stays failed
    bad = big[:-1] + b"x"
    scanner = codec.FrameScanner(version="1.2")
    assert scanner.feed(bad[:1000]) == []
    with pytest.raises(errors.MalformedFrame, match=f"expected NUL after {len(body)} body bytes"):
        scanner.feed(bad[1000:])
    with pytest.raises(errors.MalformedFrame):
        scanner.feed(small)
    # the limit is checked on the header, before anything is gathered
    scanner = codec.FrameScanner(max_frame_size=100_000, version="1.2")
    with pytest.raises(errors.FrameTooLarge):
        scanner.feed(big[:1000])


def test_a_body_past_the_up_front_allocation_grows_as_it_arrives(codec):
    """The compiled scanner makes a large body at its declared length up to 64 MiB and grows a longer one as
    its bytes arrive: a 64 MiB + 3 body fed in uneven pieces (views, as the broker's read budget cuts them)
    arrives whole, with the frame after it; a declared length far beyond what came holds only what came."""
    body = bytes(range(256)) * (64 * 4096) + b"end"
    head = codec.encode_frame("SEND", {"destination": "/queue/big"}, b"", "1.2")[:-1]
    data = head.replace(b"\n\n", b"\ncontent-length:%d\n\n" % len(body)) + body + b"\0" + \
        codec.encode_frame("SEND", {"destination": "/queue/a"}, b"after", "1.2")
    scanner = codec.FrameScanner(max_frame_size=1 << 30, version="1.2")
    frames, view = [], memoryview(data)
    for i in range(0, len(data), 3_000_017):
        frames += scanner.feed(view[i:i + 3_000_017])
    assert [(f.command, len(f.body)) for f in frames] == [("SEND", len(body)), ("SEND", 5)]
    assert frames[0].body == body and type(frames[0].body) is bytes and scanner.buffered == 0
    scanner = codec.FrameScanner(max_frame_size=1 << 62, version="1.2")
    assert scanner.feed(b"SEND\ncontent-length:%d\n\n" % (1 << 61) + b"x" * 100_000) == []
    assert scanner.buffered == len(b"SEND\ncontent-length:%d\n\n" % (1 << 61)) + 100_000


def test_body_missing_counts_what_a_large_body_still_needs(codec):
    """``body_missing``: the bytes a large body being gathered still needs, its NUL included (the broker's
    read budget lets exactly those in at once); 0 for a small frame not yet complete, and once complete."""
    body = b"\x00b" * 50_000
    data = codec.encode_frame("SEND", {"destination": "/queue/a"}, body, "1.2")
    head = len(data) - len(body) - 1
    scanner = codec.FrameScanner(version="1.2")
    assert scanner.feed(data[:head + 10]) == [] and scanner.body_missing == len(body) + 1 - 10
    assert scanner.feed(data[head + 10:-1]) == [] and scanner.body_missing == 1
    assert scanner.feed(data[-1:])[0].body == body and scanner.body_missing == 0
    small = codec.encode_frame("SEND", {"destination": "/queue/a"}, b"x" * 1000, "1.2")
    assert scanner.feed(small[:-5]) == [] and scanner.body_missing == 0


@settings(max_examples=60, deadline=None)
@given(size=st.integers(min_value=64 * 1024 - 3, max_value=64 * 1024 + 3000),
       cuts=st.lists(st.integers(min_value=1, max_value=40_000), max_size=8),
       tail=st.binary(max_size=20))
def test_twins_agree_on_large_bodies_in_any_pieces(size, cuts, tail):
    from pymq.protocol import scanner as picker
    impls = [m for m in picker.IMPLEMENTATIONS.values() if m is not None]
    data = impls[0].encode_frame("SEND", {"destination": "/q"}, b"\x00a" * (size // 2), "1.2") + tail
    results = []
    for impl in impls:
        s = impl.FrameScanner(max_frame_size=1 << 20, version="1.2")
        out, pos = [], 0
        try:
            for c in cuts:
                out += [tuple(f) for f in s.feed(data[pos:pos + c])]
                pos += c
                out.append(s.buffered)
            out += [tuple(f) for f in s.feed(data[pos:])]
            results.append(("ok", out, s.buffered))
        except errors.ProtocolError as exc:
            results.append(("err", type(exc).__name__, str(exc), out))
    assert all(r == results[0] for r in results)


def test_many_small_frames_in_one_read(codec):
    one = codec.encode_frame("SEND", {"destination": "/queue/a"}, b"x" * 10, "1.2")
    scanner = codec.FrameScanner(version="1.2")
    frames = scanner.feed(one * 5000 + one[:7])
    assert len(frames) == 5000 and scanner.buffered == 7
    assert len(scanner.feed(one[7:])) == 1


def test_slow_drip_header_is_not_rescanned_quadratically(codec):
    # 200 KB of header fed a byte at a time must finish promptly (would take minutes if rescanned)
    scanner = codec.FrameScanner(max_frame_size=1 << 20, version="1.2")
    header = b"SEND\ndestination:/q\nk:" + b"v" * 200_000 + b"\n\n"
    for i in range(len(header)):
        assert scanner.feed(header[i:i + 1]) == []
    assert scanner.feed(b"\x00")[0].headers["k"] == "v" * 200_000


_names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=12)
_values = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)


@settings(max_examples=300, deadline=None)
@given(command=st.sampled_from(["SEND", "MESSAGE", "ERROR"]),
       headers=st.dictionaries(_names, _values, max_size=8),
       body=st.binary(max_size=300),
       cuts=st.lists(st.integers(min_value=1, max_value=50), max_size=20))
def test_roundtrip_12(codec, command, headers, body, cuts):
    """encode → parse is the identity in 1.2 for any names, values (escaping) and binary bodies."""
    headers = {k: v for k, v in headers.items() if k != "content-length"}
    data = codec.encode_frame(command, headers, body, "1.2")
    scanner = codec.FrameScanner(version="1.2")
    frames = _feed_all(scanner, data, cuts)
    assert len(frames) == 1
    frame = frames[0]
    got = dict(frame.headers)
    if body:
        assert got.pop("content-length") == str(len(body))
    assert (frame.command, got, frame.body) == (command, headers, body)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=400), version=st.sampled_from(["1.0", "1.1", "1.2"]))
def test_twins_agree_on_arbitrary_bytes(data, version):
    """Compiled and Python scanners produce the same frames or the same error class on any input."""
    from pymq.protocol import scanner as picker
    impls = [m for m in picker.IMPLEMENTATIONS.values() if m is not None]
    results = []
    for impl in impls:
        s = impl.FrameScanner(max_frame_size=256, version=version)
        try:
            frames = s.feed(data)
            results.append(("ok", [tuple(f) for f in frames], s.buffered))
        except errors.ProtocolError as exc:
            results.append(("err", type(exc).__name__, str(exc)))
    assert all(r == results[0] for r in results), results


def test_frame_is_a_value():
    f = Frame("SEND", {"destination": "/q"}, b"x")
    assert f == ("SEND", {"destination": "/q"}, b"x") and f.command == "SEND"


@pytest.mark.parametrize("case", PARSE, ids=[c["name"] for c in PARSE])
def test_unparsed_bytes_continue_in_a_new_scanner(codec, case):
    """What a connection handed to another worker carries (server/cores/handover.py): after any prefix of
    the input, the frames so far plus a fresh scanner fed ``unparsed()`` and the rest are the whole input's
    frames; while a large body is gathered (its head already parsed) it is None."""
    data = bytes.fromhex(case["input_hex"])
    if "error" in case or any(f["command"] in ("CONNECT", "STOMP", "CONNECTED") for f in case["frames"]):
        return
    for cut in sorted({0, 1, len(data) // 3, len(data) // 2, len(data) - 1, len(data)}):
        first = _scanner(codec, case)
        got = list(first.feed(data[:cut]))
        rest = first.unparsed()
        assert rest is not None and len(rest) == first.buffered
        second = _scanner(codec, case)
        got += second.feed(rest + data[cut:])
        assert [(f.command, sorted(f.headers.items()), f.body) for f in got] == \
            [(c, sorted(dict(h).items()), b) for c, h, b in _expected(case)]


def test_unparsed_is_none_inside_a_large_body_and_after_an_error(codec):
    scanner = codec.FrameScanner(version="1.2")
    head = b"SEND\ndestination:/queue/a\ncontent-length:100000\n\n"
    assert scanner.feed(head + b"x" * 70_000) == [] and scanner.unparsed() is None
    assert [f.body for f in scanner.feed(b"x" * 30_000 + b"\x00SEN")] == [b"x" * 100_000]
    assert scanner.unparsed() == b"SEN"
    with pytest.raises(errors.ProtocolError):
        scanner.feed(b"D\ndestination:/q\ncontent-length:zz\n\n\x00")
    assert scanner.unparsed() is None
