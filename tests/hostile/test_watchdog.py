"""The transport's receive deadlines, on a clock the test drives (no timing in the test).

Regression (issue 10 item 5): a heart-beating peer that went silent was declared dead after up to twice
the promised time, because the broker sampled "anything received?" once per window instead of keeping a
deadline from the last byte (spec/stomp.md §6: dead after ``heartbeat_grace`` × interval).  And a frame
trickled a byte at a time, or half a frame and silence without heart-beats, held a connection for ever.
"""
from __future__ import annotations

import heapq
import itertools
from types import SimpleNamespace

from pymq.errors import FrameTimeout, HeartbeatTimeout
from pymq.protocol.connection import State
from pymq_server.config import BrokerConfig
from pymq_server.net.tcp import StompServerProtocol


class Handle:
    def __init__(self, loop, when, fn, args):
        self.loop, self._when, self.fn, self.args, self.cancelled = loop, when, fn, args, False

    def cancel(self):
        self.cancelled = True

    def when(self):
        return self._when


class FakeLoop:
    """call_soon / call_later / call_at and time() on a clock that only ``advance`` moves."""

    def __init__(self):
        self.now = 0.0
        self._timers: list = []
        self._seq = itertools.count()

    def time(self):
        return self.now

    def call_at(self, when, fn, *args):
        handle = Handle(self, when, fn, args)
        heapq.heappush(self._timers, (when, next(self._seq), handle))
        return handle

    def call_later(self, delay, fn, *args):
        return self.call_at(self.now + delay, fn, *args)

    def call_soon(self, fn, *args):
        return self.call_at(self.now, fn, *args)

    def advance(self, to: float):
        while self._timers and self._timers[0][0] <= to:
            when, _, handle = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not handle.cancelled:
                handle.fn(*handle.args)
        self.now = to


class Session:
    def __init__(self):
        self.id = "c1"
        self.closed = False
        self.failures: list = []
        self.writable = True
        self._held = None
        self.conn = SimpleNamespace(state=State.CONNECTED, buffered=0, body_missing=0)

    def data_received(self, data):
        self.conn.buffered += len(data) if not data.endswith(b"\x00") else -self.conn.buffered

    def fail(self, exc, frame=None):
        self.failures.append((exc, clock.now))
        self.closed = True

    def set_writable(self, writable):
        self.writable = writable


class Transport:
    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def write(self, data):
        pass

    def get_write_buffer_size(self):
        return 0


clock: FakeLoop


class Broker:
    serving = None          # no ha: section (server/net/tcp.py reads it)

    def __init__(self, config):
        self.config = config


def _protocol(**config):
    global clock
    clock = FakeLoop()
    broker = Broker(BrokerConfig(**config))
    protocol = StompServerProtocol(broker, clock)
    protocol.transport = Transport()
    protocol.session = Session()
    protocol._connected = True
    return protocol


def test_silent_heart_beating_peer_is_dead_grace_times_interval_after_its_last_byte():
    protocol = _protocol(heartbeat_grace=2.0)
    protocol.start_heartbeat(protocol.session, 0, 10_000)       # the peer promised a beat every 10 s
    clock.advance(7.0)
    protocol.data_received(b"\n")                               # its last byte, at 7 s
    clock.advance(26.99)
    assert protocol.session.failures == []
    clock.advance(40.0)
    [(exc, when)] = protocol.session.failures
    assert isinstance(exc, HeartbeatTimeout)
    assert when == 27.0                                          # 7 s + 2.0 x 10 s, not 40 s


def test_half_a_frame_and_silence_times_out_without_heart_beats():
    protocol = _protocol(frame_timeout_ms=30_000, frame_min_rate=1024)
    clock.advance(5.0)
    protocol.data_received(b"x" * 2048)                         # a frame starts (2 KiB, no NUL)
    clock.advance(1000.0)
    [(exc, when)] = protocol.session.failures
    assert isinstance(exc, FrameTimeout)
    assert when == 5.0 + 30.0 + 2.0                              # 30 s + one second per 1 KiB received


def test_trickling_a_frame_does_not_keep_the_connection_open():
    protocol = _protocol(frame_timeout_ms=30_000, frame_min_rate=8192, heartbeat_grace=2.0)
    protocol.start_heartbeat(protocol.session, 0, 1_000)        # heart-beats too: traffic is no excuse
    t = 0.0
    while not protocol.session.failures and t < 3600:
        t += 0.5
        clock.advance(t)
        if not protocol.session.closed:
            protocol.data_received(b"y")                        # one byte every 0.5 s
    [(exc, when)] = protocol.session.failures
    assert isinstance(exc, FrameTimeout) and when < 31.0


def test_a_frame_that_completes_clears_its_deadline():
    protocol = _protocol(frame_timeout_ms=1_000, frame_min_rate=1024)
    protocol.data_received(b"x" * 100)
    clock.advance(0.5)
    protocol.data_received(b"\x00")                             # the frame completes
    clock.advance(100.0)
    assert protocol.session.failures == []


def test_no_judgement_while_the_broker_is_not_reading():
    protocol = _protocol(heartbeat_grace=2.0)
    protocol.start_heartbeat(protocol.session, 0, 1_000)
    protocol.pause_reading()                                    # producer flow control
    clock.advance(60.0)
    assert protocol.session.failures == []
    protocol.resume_reading()                                   # the clock restarts here
    clock.advance(61.99)
    assert protocol.session.failures == []
    clock.advance(63.0)
    assert [when for _, when in protocol.session.failures] == [62.0]
