"""parse_send's two implementations (server/broker/_send_py.py and _ext/send.pyx) agree on every input.

The compiled one is what the broker runs; the twin defines the semantics. On hostile SEND headers — numbers
huge, negative, with leading zeros, plus signs, blanks, underscores, exponents or non-ASCII digits; every
spelling of a boolean; empty values; non-ASCII names; the scheduling, duplicate and cluster headers; a header
repeated as the scanner delivers it (the first wins) — both give the same request, field by field and type by
type (``True`` is not ``1``), with the properties in the same order, or raise the same exception class naming
the same header with the same text (tests/hostile/send_headers.py states the property, also a fuzz target:
``python -m bench.fuzz``'s ``send``).
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.protocol.numbers import INT64_MAX
from pymq.protocol.scanner import FrameScanner, encode_frame
from pymq_server.broker import requests
from pymq_server.broker._send_py import DEDUP_ID, DELAY, DELIVER_AT, DROPPED, MAPPED, SPECIAL
from tests.hostile.send_headers import check_headers
from tests.twins import compiled as compiled_twin

#: every name parse_send treats apart, and a few it does not
NAMES = sorted({*DROPPED, *MAPPED, *SPECIAL, *DELAY, *DELIVER_AT, *DEDUP_ID, "JMSXGroupID", "reply-to",
                "content-type", "colour", "Persistent", "PRIORITY", "persistent ", "priorité"})
#: values that sit on a rule's edge: numbers, booleans, blanks
EDGES = ["", "0", "00", "007", "9", "10", "+5", "-1", "-0", " 5", "5 ", "5\t", "1_000", "1e3", "0x10", "1.5",
         "\u0665", "\uff15", "\u00b2", "9" * 18, "9" * 19, "9" * 20, "0" * 19, "0" * 25 + "7", str(INT64_MAX),
         str(INT64_MAX + 1), str(INT64_MAX - 1), str(1 << 64), "true", "false", "TRUE", "False", "tRuE", "yes",
         "1", "tru", "true ", " true", "tru\u0435", "\u0130", "on", "/queue/q", "ID:n-1", "node-b"]

names = st.one_of(st.sampled_from(NAMES), st.text(min_size=0, max_size=12))
values = st.one_of(st.sampled_from(EDGES), st.text(max_size=24), st.integers().map(str),
                   st.integers(min_value=0, max_value=1 << 70).map(lambda n: "0" * (n % 3) + str(n)))


def _both():
    return compiled_twin(requests.SEND_IMPLEMENTATIONS, "parse_send"), requests.SEND_IMPLEMENTATIONS["py"]


def _agree(headers):
    compiled, _ = _both()
    return check_headers(compiled, headers)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers=st.dictionaries(names, values, max_size=10), destination=st.booleans())
def test_twins_agree_on_hostile_header_maps(headers, destination):
    if destination:
        headers.setdefault("destination", "/queue/q")
    _agree(headers)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs=st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(EDGES)), max_size=12),
       body=st.binary(max_size=8))
def test_twins_agree_on_frames_as_the_scanner_delivers_them(pairs, body):
    """Repeated headers on the wire: the scanner keeps the first (STOMP 1.2), and both parse what it kept."""
    pairs = [("destination", "/queue/q"), *pairs]
    wire = encode_frame("SEND", [(n, v) for n, v in pairs if n != "content-length"], body, "1.2")
    frame = FrameScanner().feed(wire)[0]
    compiled, _ = _both()
    check_headers(compiled, frame.headers, frame.body)


@pytest.mark.parametrize("name, maximum", [("priority", 9), ("expires", INT64_MAX), ("expiration", INT64_MAX),
                                           ("timestamp", INT64_MAX)])
def test_every_mapped_number_edge_is_the_same_answer(name, maximum):
    for value in EDGES + [str(maximum), str(maximum + 1), "0" * 18 + "1", "0" * 17 + str(maximum)[-1:]]:
        kind, *rest = _agree({"destination": "/queue/q", name: value})
        if kind == "raised":
            assert rest[1] == name, rest


def test_every_boolean_spelling_is_the_same_answer():
    for value in EDGES + ["TrUe", "FALSE", "fAlSe"]:
        kind, *rest = _agree({"destination": "/queue/q", "persistent": value})
        if kind == "request":
            persistent = rest[0][5]
            assert persistent in ((type(None), None), (bool, True), (bool, False))
            assert persistent[1] is (None if value == "" else value.lower() == "true")


def test_special_headers_take_the_rarer_path_on_both():
    headers = {"destination": "/queue/q", "pymq-delay": "5", "AMQ_SCHEDULED_TIME": "9", "_AMQ_DUPL_ID": "d",
               "pymq-dedup-id": "", "pymq-forwarded": "node-b", "pymq-subscription": "k", "colour": "red"}
    kind, fields, properties = _agree(headers)
    assert kind == "request"
    # scheduling consumed; the empty dedup spelling skipped for the next one; a forward's cluster headers
    # taken out of the properties into their fields (forwarded.split)
    assert [value for _, value in fields[9:16]] == [5, 9, None, "d", "node-b", "k", None]
    assert properties == [("_AMQ_DUPL_ID", "d"), ("pymq-dedup-id", ""), ("colour", "red")]


def test_a_missing_destination_is_the_same_key_error_after_the_headers_are_checked():
    assert _agree({"colour": "red"})[1] is KeyError
    assert _agree({"priority": "x"})[2] == "priority"          # the header's error comes first
    assert _agree({"pymq-delay": "x"})[2] == "pymq-delay"


def test_the_broker_runs_the_compiled_one():
    compiled, _ = _both()
    assert requests.parse_send is compiled.parse_send
