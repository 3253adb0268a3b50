"""The per-turn read budget (spec/stomp.md §10 "Fairness") hands a large read over in budget-sized parts
without copying it: each part is a view of the bytes read, in order, one part per event-loop turn.

Before, the rest of a read was copied at every turn (``data[room:]``): a 256 KiB read handed over 16 KiB
a turn copied each byte about eight times, and a 4 MiB bulk SEND paid for it on every read.
"""
from __future__ import annotations

from tests.hostile.test_watchdog import _protocol

import tests.hostile.test_watchdog as fakes


class Recording(fakes.Session):
    def __init__(self):
        super().__init__()
        self.parts: list = []

    def data_received(self, data):
        self.parts.append(data)


def _feed(*reads: bytes) -> list:
    protocol = _protocol(read_budget=16 * 1024)
    session = protocol.session = Recording()
    for data in reads:
        protocol.data_received(data)
        assert len(session.parts) == 1                    # the first turn's budget only: the rest waits
    fakes.clock.advance(fakes.clock.now)                  # the loop's turns (the fake runs them all)
    assert protocol._backlog is None and "budget" not in protocol._pauses
    return session.parts


def test_a_read_over_the_budget_is_handed_over_as_views_of_it():
    first = bytes(range(256)) * 1024                      # 256 KiB in one read
    parts = _feed(first)
    assert b"".join(parts) == first
    assert [len(p) for p in parts] == [16 * 1024] * 16    # one budget per turn
    assert all(isinstance(p, memoryview) and p.obj is first for p in parts)   # no copy of what was read


def test_a_read_arriving_while_one_waits_follows_it_in_order():
    first, second = bytes(range(256)) * 100, b"the next read" * 3000
    parts = _feed(first, second)
    assert b"".join(parts) == first + second
    assert all(len(p) <= 16 * 1024 for p in parts)


def test_the_rest_of_a_large_body_goes_in_at_once_and_what_follows_it_waits():
    """A large body whose head was read is only copied until its NUL: its rest is handed over in one part
    whatever the budget (a bulk SEND's 8 MiB were 512 turns of 16 KiB, each pausing the socket); the bytes
    after it are handed over a budget per turn as before."""
    protocol = _protocol(read_budget=16 * 1024)
    session = protocol.session = Recording()
    session.conn.body_missing = 200_000
    read = bytes(range(256)) * 1024                       # 256 KiB: the body's last 200,000 bytes, then more
    protocol.data_received(read)
    assert [len(p) for p in session.parts] == [200_000]
    session.conn.body_missing = 0                         # its frame is complete
    fakes.clock.advance(fakes.clock.now)
    assert b"".join(session.parts) == read
    assert [len(p) for p in session.parts[1:]] == [16 * 1024] * 3 + [(256 * 1024 - 200_000) - 3 * 16 * 1024]
