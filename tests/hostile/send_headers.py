"""A SEND frame's headers as an input surface (spec/stomp.md §4): whatever the bytes of the header block,
``parse_send``'s compiled twin (_ext/send.pyx) and its pure one (server/broker/_send_py.py) give the same
request, field by field and type by type (``True`` is not ``1``, properties in the same order), or raise the
same exception class naming the same header with the same text; and a request is a SendRequest whose numbers
are within their bounds. Used by tests/broker/test_send_twins.py, tests/hostile/test_send_headers.py and the
coverage-guided target ``bench/fuzz_targets.py send``."""
from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from pymq.errors import ProtocolError
from pymq.protocol.numbers import INT64_MAX
from pymq.protocol.scanner import FrameScanner
from pymq_server.broker import _send_py

Outcome = tuple


def outcome(module: ModuleType, headers: Mapping[str, str], body: bytes = b"x") -> Outcome:
    """What ``module.parse_send`` gives, comparable across twins: each field with its type, or the error."""
    try:
        request = module.parse_send(headers, body)
    except Exception as exc:            # the exception itself is what is compared
        return ("raised", type(exc), getattr(exc, "header", None), str(exc))
    assert type(request) is _send_py.SendRequest
    return ("request", tuple((type(field), field) for field in request), list(request.properties.items()))


def check_headers(compiled: ModuleType, headers: Mapping[str, str], body: bytes = b"x") -> Outcome:
    """Both twins on ``headers`` (each on its own copy): the same outcome, and a sane one."""
    expected = outcome(_send_py, dict(headers), body)
    got = outcome(compiled, dict(headers), body)
    assert got == expected, f"parse_send twins disagree on {dict(headers)!r}:\n  c:  {got!r}\n  py: {expected!r}"
    if expected[0] == "raised":
        # a missing destination is the state table's to refuse first; anything else is a header's error
        assert expected[1] is KeyError or issubclass(expected[1], ProtocolError), expected
        return expected
    fields = dict(zip(_send_py.SendRequest._fields, (value for _, value in expected[1])))
    assert fields["priority"] is None or 0 <= fields["priority"] <= 9
    for name in ("expires", "ttl", "timestamp", "delay", "deliver_at"):
        assert fields[name] is None or 0 <= fields[name] <= INT64_MAX
    assert fields["persistent"] in (None, True, False)
    return expected


def check_block(compiled: ModuleType, block: bytes) -> Outcome | None:
    """``block`` as a SEND's header lines, scanned as the broker scans them (STOMP 1.2, the first of a
    repeated header wins), then :func:`check_headers`; None when the scanner refuses the frame."""
    try:
        frames = FrameScanner(version="1.2").feed(b"SEND\n" + block + b"\n\n\x00")
    except ProtocolError:
        return None
    if not frames:
        return None
    return check_headers(compiled, frames[0].headers, frames[0].body)
