"""Hostile HANDOVER envelopes (spec/cores.md §2.1, §2.4): a connection's state that is truncated, nested, of the
wrong types or out of bounds is refused whole with ValueError; one that is accepted is adopted as a connection
in the state CONNECTED, or closed with an ERROR (an unknown vhost, a client id in use, hostile frames behind
it), never by a catch-all (tests/hostile/handover_states.py states the property); also a coverage-guided
target (``bench/fuzz_targets.py handover``, ``python -m bench.fuzz``)."""
from __future__ import annotations

import random
import struct
import time

import pytest
from tests.hostile.handover_states import LOCAL, adopter, check_state, good_state

from pymq.protocol.scanner import encode_frame
from pymq_server.cores.handover import pack_state


def _raw(state: bytes, unread: bytes = b"") -> bytes:
    return struct.pack(">I", len(state)) + state + unread


@pytest.fixture(scope="module", autouse=True)
def _one_adopter():
    yield
    from tests.hostile import handover_states
    if handover_states._ADOPTER:
        handover_states._ADOPTER.pop().close()


def test_named_hostile_states():
    send = encode_frame("SEND", {"destination": LOCAL, "receipt": "r"}, b"x", "1.2")
    cases = {
        "the state hand_over writes": (pack_state(good_state(), send), "adopted"),
        "a 1.0 connection of a vhost with heart-beats": (
            pack_state(good_state(version="1.0", vhost="shop", to_client=250, to_server=1000), b""), "adopted"),
        "only what is required": (pack_state({"user": "u", "version": "1.1"}, b""), "adopted"),
        "empty": (b"", "refused"),
        "length past the end": (struct.pack(">I", 0xFFFFFFFF) + b"{}", "refused"),
        "not JSON": (_raw(b"{user: 1}"), "refused"),
        "not UTF-8": (_raw(b'{"user": "\xff", "version": "1.2"}'), "refused"),
        "deep nesting": (_raw(b"[" * 100_000), "refused"),
        "deep nesting in a field": (_raw(b'{"user": "u", "version": "1.2", "roles": ' + b"[" * 100_000 + b"}"),
                                    "refused"),
        "an array": (_raw(b"[1, 2]"), "refused"),
        "no user": (pack_state({"version": "1.2"}, b""), "refused"),
        "a user that is a number": (pack_state(good_state(user=7), b""), "refused"),
        "roles that are a string": (pack_state(good_state(roles="admin"), b""), "refused"),
        "roles that are an object": (pack_state(good_state(roles={"a": 1}), b""), "refused"),
        "a role that is null": (pack_state(good_state(roles=[None]), b""), "refused"),
        "an unknown version": (pack_state(good_state(version="9.9"), b""), "refused"),
        "a heart-beat that is a string": (pack_state(good_state(to_client="250"), b""), "refused"),
        "a heart-beat that is true": (pack_state(good_state(to_server=True), b""), "refused"),
        "a negative heart-beat": (pack_state(good_state(to_client=-1), b""), "refused"),
        "a heart-beat of 2**64 ms": (pack_state(good_state(to_client=2 ** 64), b""), "refused"),
        "a heart-beat that is a float": (pack_state(good_state(to_client=1.5), b""), "refused"),
        "an unknown field": (pack_state(good_state(admin=True), b""), "refused"),
        "a client id that is a list": (pack_state(good_state(client_id=["a"]), b""), "refused"),
        "a user of 1 MiB": (pack_state(good_state(user="u" * (1 << 20)), b""), "refused"),
        "an unknown vhost": (pack_state(good_state(vhost="nowhere"), b""), "failed"),
        "frames the state table refuses behind it": (pack_state(good_state(), b"CONNECT\n\n\0"), "failed"),
        "a frame over the size limit behind it": (pack_state(
            good_state(), b"SEND\ndestination:" + LOCAL.encode() + b"\ncontent-length:99999999999\n\n"), "failed"),
        "bytes that are no frame": (pack_state(good_state(), b"\xff\xfe\x00garbage\n\n\0"), "failed"),
        "its own DISCONNECT behind it": (pack_state(good_state(), b"DISCONNECT\n\n\0"), "ended"),
    }
    for name, (payload, outcome) in cases.items():
        assert check_state(payload) == outcome, name


def test_a_client_id_held_here_refuses_the_adoption():
    a = adopter()
    outcome, first = a.adopt(good_state(client_id="one"), b"", keep=True)
    try:
        assert outcome == "adopted"
        assert check_state(pack_state(good_state(client_id="one"), b"")) == "failed"
    finally:
        first.connection_lost(None)
    assert check_state(pack_state(good_state(client_id="one"), b"")) == "adopted"   # free again


def test_random_states_keep_the_property():
    """Mutations of good states, at the byte and the JSON level; bounded in count and in time."""
    rng = random.Random(30_36)
    values = [None, True, -1, 0, 1, 2 ** 31, 2 ** 63, 1.5, "", "1.2", "shop", "/", "x" * 70_000, [], ["a"], [1],
              {}, {"a": None}]
    outcomes = set()
    deadline = time.monotonic() + 8.0
    for _ in range(1_500):
        if time.monotonic() > deadline:
            break
        doc = good_state()
        for _ in range(rng.randrange(0, 3)):
            key = rng.choice(sorted(doc) + ["extra"])
            if rng.random() < 0.3:
                doc.pop(key, None)
            else:
                doc[key] = rng.choice(values)
        unread = rng.choice([b"", encode_frame("SEND", {"destination": LOCAL}, b"x", "1.2"), b"\0\n",
                             b"SUBSCRIBE\nid:1\n\n\0", rng.randbytes(rng.randrange(0, 40))])
        try:
            payload = bytearray(pack_state(doc, unread))
        except (TypeError, ValueError):
            continue
        for _ in range(rng.randrange(0, 3) if rng.random() < 0.4 else 0):
            payload[rng.randrange(len(payload))] = rng.randrange(256)
        if rng.random() < 0.1:
            payload = payload[:rng.randrange(len(payload) + 1)]
        outcomes.add(check_state(bytes(payload)))
    assert {"refused", "adopted", "failed"} <= outcomes, outcomes
