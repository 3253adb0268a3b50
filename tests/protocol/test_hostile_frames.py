"""Hostile framing: huge and malformed numbers, truncation, long runs — both scanners, same answers.

The compiled scanner once added a declared content-length to a ``Py_ssize_t`` offset; with
``content-length:9223372036854775807`` the sum wrapped, the size check passed and the body read went out
of bounds (a segfault on the first, unauthenticated frame).  The Python twin never crashed, so the twin
tests on good input never saw it.  Here the crashing inputs run in a child process (a segfault fails
the test instead of killing pytest), and hypothesis compares the twins on hostile generators.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq import errors
from pymq._accel import NO_EXTENSIONS
from pymq.protocol.connection import parse_heartbeat
from pymq.protocol.numbers import INT32_MAX, INT64_MAX
from tests.isolated import run_isolated
from tests.twins import compiled as compiled_twin
from tests.twins import twin_fixture

codec = twin_fixture("pymq.protocol._scanner_py", "pymq.protocol._scanner_c")
MODULES = {"c": "pymq.protocol._scanner_c", "py": "pymq.protocol._scanner_py"}
SSIZE_MAX = INT64_MAX        # 64-bit builds only, as the rest of the compiled core


def _module_name(which: str) -> str:
    if which == "c" and NO_EXTENSIONS:
        pytest.skip("PYMQ_NO_EXTENSIONS=1: the compiled twin is disabled on purpose")
    return MODULES[which]


@pytest.mark.parametrize("which", ["c", "py"])
def test_content_length_near_int64_max_is_refused_not_a_crash(which):
    """Regression (issue 10): the first frame ``CONNECT`` with ``content-length:2**63-1`` segfaulted
    the broker.  Every value near the wrap-around must be refused as too large, before any body read."""
    name = _module_name(which)
    values = [INT64_MAX, INT64_MAX - 1, INT64_MAX - 3, INT64_MAX - 40, INT64_MAX - 4 * 1024 * 1024,
              2 ** 62, 2 ** 32, 2 ** 31]
    outcome = run_isolated(f"""
        import importlib
        from pymq.errors import FrameTooLarge
        m = importlib.import_module({name!r})
        for value in {values!r}:
            scanner = m.FrameScanner()
            head = b"CONNECT\\ncontent-length:%d\\n\\n" % value
            try:
                got = scanner.feed(head + b"abc")
                print("accepted", value, got)
            except FrameTooLarge as exc:
                print("too-large", exc.size == len(head) + value)
        """)
    assert outcome.ok, outcome.describe()
    assert outcome.stdout.split() == ["too-large", "True"] * len(values), outcome.stdout


@pytest.mark.parametrize("which", ["c", "py"])
def test_no_wrap_when_the_frame_limit_is_huge(which):
    """With an operator-set limit near 2**63 the comparison passes; the end offset must then not
    wrap either (checked arithmetic in C): the scanner just waits for a body that never comes."""
    name = _module_name(which)
    outcome = run_isolated(f"""
        import importlib
        m = importlib.import_module({name!r})
        for limit, value, lead in [({SSIZE_MAX}, {SSIZE_MAX} - 50, 100), ({SSIZE_MAX}, {SSIZE_MAX} - 40, 0),
                                   (2 ** 62, 2 ** 62 - 100, 7)]:
            scanner = m.FrameScanner(max_frame_size=limit)
            data = b"\\n" * lead + b"SEND\\ncontent-length:%d\\n\\nabc" % value
            try:
                print(scanner.feed(data), scanner.buffered)
            except Exception as exc:
                print(type(exc).__name__)
        """)
    assert outcome.ok, outcome.describe()
    lines = outcome.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("[] ") or line == "FrameTooLarge" for line in lines), lines


@pytest.mark.parametrize("text", ["99999999999999999999", "9223372036854775808", "1" * 5000, "+5", " 5",
                                  "5 ", "-1", "-0", "0x10", "1e3", "\u0663", "\uff15", "5\u00a0", ""])
def test_every_bad_content_length_is_an_invalid_header_naming_it(codec, text):
    scanner = codec.FrameScanner(version="1.2")
    with pytest.raises(errors.InvalidHeader) as info:
        scanner.feed(("SEND\ndestination:/q\ncontent-length:" + text + "\n\nx\x00").encode())
    assert info.value.header == "content-length"
    assert len(str(info.value)) < 200       # a 5,000-digit value is not echoed back whole


# -- the twins agree on hostile input ------------------------------------------------------------------

_hostile_numbers = st.one_of(
    st.integers(min_value=0, max_value=2 ** 64 + 5).map(str),
    st.sampled_from([str(INT64_MAX), str(INT64_MAX + 1), str(INT64_MAX - 1), str(2 ** 64), "0" * 19 + "5",
                     "0" * 20 + "5", "9" * 19, "9" * 20, "+5", "-1", " 5", "5 ", "\u0663", "1_0", ""]),
    st.text(alphabet="0123456789", min_size=15, max_size=25),
)


@st.composite
def _hostile_streams(draw):
    command = draw(st.sampled_from(["CONNECT", "SEND", "MESSAGE", "SUBSCRIBE"]))
    length = draw(_hostile_numbers)
    body = draw(st.binary(max_size=64))
    headers = draw(st.lists(st.sampled_from([b"a:b", b"destination:/q", b"k:\\c", b"x:\\t", b"nocolon",
                                             b"content-length:1"]), max_size=4))
    lead = draw(st.sampled_from([b"", b"\n" * 3, b"\r\n" * 2, b"\n" * 300]))
    frame = lead + b"\n".join([command.encode(), b"content-length:" + length.encode(), *headers]) + \
        b"\n\n" + body + b"\x00"
    frame = frame * draw(st.integers(1, 3))
    cut = draw(st.integers(0, len(frame)))
    if draw(st.booleans()):
        frame = frame[:cut]                          # truncated anywhere
    splits = draw(st.lists(st.integers(1, 40), max_size=8))
    limit = draw(st.sampled_from([64, 4096, 4 * 1024 * 1024, 2 ** 62, INT64_MAX]))
    version = draw(st.sampled_from(["1.0", "1.1", "1.2"]))
    return frame, splits, limit, version


def _run(impl, stream):
    data, splits, limit, version = stream
    scanner = impl.FrameScanner(max_frame_size=limit, version=version)
    frames, pos = [], 0
    try:
        for size in splits:
            frames += scanner.feed(data[pos:pos + size])
            pos += size
        frames += scanner.feed(data[pos:])
        while True:                                  # drain after a negotiating frame
            more = scanner.feed(b"")
            if not more:
                break
            frames += more
        return ("ok", [tuple(f) for f in frames], scanner.buffered)
    except errors.ProtocolError as exc:
        return ("error", type(exc).__name__, str(exc), [tuple(f) for f in frames])


def _both():
    from pymq.protocol import scanner as picker
    return compiled_twin(picker.IMPLEMENTATIONS, "scanner"), picker.IMPLEMENTATIONS["py"]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=_hostile_streams())
def test_twins_agree_on_hostile_streams(stream):
    c, py = _both()
    assert _run(c, stream) == _run(py, stream)


@settings(max_examples=200, deadline=None)
@given(run=st.integers(1, 20_000), char=st.sampled_from([b"\n", b"\r\n", b"a", b":", b"\\"]),
       where=st.sampled_from(["lead", "header", "body"]))
def test_twins_agree_on_long_runs(run, char, where):
    c, py = _both()
    if where == "lead":
        data = char * run + b"SEND\n\nx\x00"
    elif where == "header":
        data = b"SEND\nk:" + char * run + b"\n\n\x00"
    else:
        data = b"SEND\n\n" + char * run
    stream = (data, [], 64 * 1024, "1.2")
    assert _run(c, stream) == _run(py, stream)


@pytest.mark.parametrize("data", [
    b"SEND\nd\x02SENND\nDepti\xe8\n\n",         # found by bench/fuzz_targets.py (atheris)
    b"SEND\nnocolon\nk:\xff\n\n\x00",
    b"\xffSEND\n\n\x00",
])
def test_an_invalid_utf8_header_block_is_reported_first_by_both_twins(data):
    """The compiled scanner judged header lines one by one and reported a missing colon on a line
    before a bad UTF-8 byte on a later one; the twin decodes the block first.  Same error from both."""
    c, py = _both()
    assert _run(c, (data, [], 4096, "1.1")) == _run(py, (data, [], 4096, "1.1"))
    assert _run(py, (data, [], 4096, "1.1"))[2] == "frame header is not valid UTF-8"


# -- heart-beat ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [("0,0", (0, 0)), ("10000,5000", (10000, 5000)),
                                             (f"{INT32_MAX},1", (INT32_MAX, 1)), ("", (0, 0))])
def test_heartbeat_accepts_two_wire_integers(value, expected):
    assert parse_heartbeat(value) == expected


@pytest.mark.parametrize("value", ["99999999999999999999999,0", f"{INT32_MAX + 1},0", "0,-1", "1, 2", " 1,2",
                                   "\u0663,0", "1,2,3", "1", ",", "a,b", "1e3,0", "+1,0", "1" * 5000 + ",0"])
def test_heartbeat_refuses_what_is_not_two_bounded_integers(value):
    """Regression (issue 10): ``int()`` accepted Unicode digits and 23-digit intervals, which then
    reached the event loop's timers as absurd delays."""
    with pytest.raises(errors.InvalidHeader) as info:
        parse_heartbeat(value)
    assert info.value.header == "heart-beat"
    assert len(str(info.value)) < 200

