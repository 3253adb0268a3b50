"""A head's bytes into strs: what the compiled scanner reads in one pass, both twins, same answers.

The compiled ``_parse_head`` (_ext/scanner.pyx) looks at a head 8 bytes at a time for a NUL, a non-ASCII
byte, a backslash and the line ends (it remembers 64 of them; a longer head finds the rest by memchr),
copies ASCII values without decoding, and hands out header names and commands from a cache (a slot
chosen by the name's length and first and last 8 bytes, checked byte for byte). Each of those is a place
where it can part from the twin: a byte at any offset of a word or of the tail, names that share a slot,
a head past 64 lines, names too long to cache, escapes in a name or a value, 1.0 and CONNECT unescaped.
"""
from __future__ import annotations

import pytest

from pymq import errors
from tests.protocol.test_hostile_frames import _both

VERSIONS = ["1.0", "1.1", "1.2"]


def _outcome(impl, data: bytes, version: str, limit: int = 1 << 20):
    scanner = impl.FrameScanner(max_frame_size=limit, version=version)
    try:
        frames = scanner.feed(data)
        return ("ok", [tuple(f) for f in frames], scanner.buffered)
    except errors.ProtocolError as exc:
        return ("error", type(exc).__name__, str(exc))


def _same(data: bytes, version: str):
    c, py = _both()
    got, want = _outcome(c, data, version), _outcome(py, data, version)
    assert got == want, (data, version)
    return want


HEAD = b"SEND\ndestination:/queue/a\ncontent-type:text/plain\napp-id:0123456789abcdef\nk:v\n\nbody\x00"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("byte", [b"\x00", b"\xff", b"\xc3\xa9", b"\\", b"\\c", b"\\n", b"\\t", b"\r", b":",
                                  b"\n", b"\r\n"])
def test_a_byte_at_every_offset_of_the_head(byte, version):
    """Every offset of the head (each place in an 8-byte word and in the tail the word loop leaves):
    a NUL, invalid and valid UTF-8, escapes good and bad, a CR, a colon, a line end."""
    head_end = HEAD.index(b"\n\n")
    for at in range(head_end + 1):
        _same(HEAD[:at] + byte + HEAD[at:], version)


@pytest.mark.parametrize("version", VERSIONS)
def test_names_that_share_a_cache_slot_stay_apart(version):
    """Names of one length whose first and last 8 bytes agree land in one slot of the compiled name cache:
    each frame must still get its own names (the slot is checked byte for byte), in any order."""
    names = [b"x-prefix-%d-suffix-x" % k for k in range(10)]      # 19 bytes: byte 9 differs only
    frames = b"".join(b"SEND\n" + b"".join(b"%s:%d\n" % (names[(i + j) % 10], j) for j in range(3))
                      + b"\n\x00" for i in range(12))
    outcome = _same(frames, version)
    assert outcome[0] == "ok" and len(outcome[1]) == 12
    assert list(outcome[1][1][1]) == [name.decode() for name in names[1:4]]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("size", [47, 48, 49, 200])
def test_long_and_non_ascii_names(size, version):
    """Names at and past the cache's 48 bytes, non-ASCII names and commands, the same name repeated."""
    name = b"n" * size
    data = (b"SEND\n" + name + b":1\n" + name + b":2\n" + b"\xc3\xa9" * size + b":3\nd\xc3\xa9st:4\n\n\x00"
            + b"SEN\xc3\x89\n" + name + b":5\n\n\x00")
    outcome = _same(data, version)
    assert outcome[0] == "ok"
    assert outcome[1][0][1][name.decode()] == "1"                  # the first of a repeated name wins


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("lines", [63, 64, 65, 130])
def test_heads_past_the_remembered_line_ends(lines, version):
    """More header lines than the 64 line ends the compiled first pass keeps: the rest are found by
    memchr, in the same order, with a bad line and a CRLF line anywhere, and the header limit around it."""
    body = [b"h%d:v%d" % (k, k) for k in range(lines)]
    good = b"SEND\n" + b"\n".join(body) + b"\n\n\x00"
    outcome = _same(good, version)
    assert outcome[0] == "ok" and len(outcome[1][0][1]) == lines
    for bad in (0, 62, 63, 64, 65, lines - 1):
        if bad >= lines:
            continue
        for broken in (b"nocolon", b":empty-name", b"crlf:v\r", b"e\\x:v"):
            wrong = list(body)
            wrong[bad] = broken
            _same(b"SEND\n" + b"\n".join(wrong) + b"\n\n\x00", version)
    c, py = _both()
    for limit in (lines - 1, lines):
        got = []
        for impl in (c, py):
            scanner = impl.FrameScanner(max_headers=limit, version=version)
            try:
                got.append(("ok", [tuple(f) for f in scanner.feed(good)]))
            except errors.ProtocolError as exc:
                got.append(("error", str(exc)))
        assert got[0] == got[1]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("command", [b"SEND", b"CONNECT", b"STOMP", b"CONNECTED", b"MESSAGE"])
def test_escapes_in_names_and_values_by_version_and_command(command, version):
    """Escapes are read from 1.1 on and never in CONNECT/STOMP/CONNECTED: a backslash in a name, in a
    value, in both, in the command line, and a head whose only backslash is in a cached name."""
    for lines in ([b"a\\cb:v"], [b"k:a\\nb\\\\c"], [b"a\\\\:\\r"], [b"destination:/q", b"x:\\c\\c"],
                  [b"destination:/q\\"], [b"persistent:true", b"we\\ird:1"]):
        data = command + b"\n" + b"\n".join(lines) + b"\n\n\x00"
        _same(data, version)
    _same(b"SE\\ND\nk:v\n\n\x00", version)


def test_a_long_realistic_read_is_the_same_frames():
    """64 SENDs of the load client's shape (four application headers, content-type, persistent) in one
    read and in 16 KiB slices: the frames are the twin's, header by header."""
    frames = b"".join(b"SEND\ndestination:/queue/bench\ncontent-type:text/plain\npersistent:true\n"
                      b"app-id:%08x-4b1d\napp-producer:0\napp-seq:%d\napp-ts:1790000000000\n"
                      b"content-length:128\n\n" % (k, k) + bytes([k]) * 128 + b"\x00" for k in range(64))
    c, py = _both()
    for impl_frames in ((c, py),):
        whole = [impl.FrameScanner(version="1.2").feed(frames) for impl in impl_frames]
        assert whole[0] == whole[1] and len(whole[0]) == 64
        sliced = []
        for impl in impl_frames:
            scanner = impl.FrameScanner(version="1.2")
            got = []
            for at in range(0, len(frames), 16384):
                got += scanner.feed(frames[at:at + 16384])
            sliced.append(got)
        assert sliced[0] == sliced[1] == whole[0]
