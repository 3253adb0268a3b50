"""Heart-beats as clients ask (issue 27 item 5, spec/stomp.md §6).

The broker honours a client's own intervals down to ``heartbeat_min_ms`` (RabbitMQ honours the client's
request): stomp.py asking ``heart-beat:0,500`` against the default configuration gets a beat every 500 ms,
where it got the broker's 10 s offer before. The grace rule and the hostile-input bounds stay.
"""
from __future__ import annotations

import queue
import socket
import time

import pytest
import stomp

from pymq.protocol.connection import negotiate_heartbeat, offer_heartbeat, parse_heartbeat
from tests.conftest import RawStomp


class Beats(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.connected: queue.Queue = queue.Queue()
        self.beats: queue.Queue = queue.Queue()
        self.timeouts = 0

    def on_connected(self, frame):
        self.connected.put(frame.headers)

    def on_heartbeat(self):
        self.beats.put(time.monotonic())

    def on_heartbeat_timeout(self):
        self.timeouts += 1


@pytest.mark.parametrize("cls", [stomp.Connection11, stomp.Connection12])
def test_stomp_py_asking_500_ms_gets_500_ms_from_the_default_broker(broker, cls):
    c = cls([("127.0.0.1", broker.port)], heartbeats=(0, 500))
    listener = Beats()
    c.set_listener("beats", listener)
    c.connect("guest", "guest", wait=True)
    try:
        headers = listener.connected.get(timeout=5)
        sx, sy = parse_heartbeat(headers["heart-beat"])
        # the interval the client computes from the broker's answer (STOMP: the larger of the two numbers)
        assert negotiate_heartbeat((0, 500), (sx, sy)) == (0, 500)
        # and the beats come: four within a few seconds (the broker's 10 s offer sent none in that time)
        got = [listener.beats.get(timeout=5) for _ in range(4)]
        assert len(got) == 4
        assert listener.timeouts == 0
    finally:
        c.disconnect()


def test_a_client_asking_for_beats_faster_than_the_floor_gets_the_floor(broker):
    raw = RawStomp(broker.port)
    try:
        connected = raw.connect(**{"heart-beat": "1,1"})
        assert connected.command == "CONNECTED"
        assert parse_heartbeat(connected.headers["heart-beat"]) == (250, 250)   # heartbeat_min_ms
    finally:
        raw.close()


def test_the_floor_is_a_setting(broker_factory):
    b = broker_factory(heartbeat_min_ms=1000)
    raw = RawStomp(b.port)
    try:
        connected = raw.connect(**{"heart-beat": "0,500"})
        assert parse_heartbeat(connected.headers["heart-beat"])[0] == 1000
    finally:
        raw.close()


def test_a_client_held_to_its_own_promise_with_the_grace_rule(broker):
    """A client promising a beat every 300 ms and then silent is dead after grace (2.0) x 300 ms, not
    after the broker's 10 s: it gets ``heartbeat-timeout``."""
    raw = RawStomp(broker.port)
    try:
        connected = raw.connect(**{"heart-beat": "300,0"})
        assert parse_heartbeat(connected.headers["heart-beat"])[1] == 300
        error = raw.read(timeout=5)
        assert error is not None and error.command == "ERROR"
        assert error.headers["pymq-code"] == "heartbeat-timeout"
        assert raw.is_closed()
    finally:
        raw.close()


def test_the_hostile_input_bounds_stay(broker):
    """Intervals past 2^31-1 ms, signs and garbage are still refused as ``invalid-header``."""
    for value in ("0,2147483648", "-1,5", "5", "a,b", "1,2,3"):
        raw = RawStomp(broker.port)
        try:
            raw.send("CONNECT", {"accept-version": "1.2", "host": "/", "login": "guest", "passcode": "guest",
                                 "heart-beat": value})
            error = raw.read(timeout=5)
            assert error is not None and error.command == "ERROR", value
            assert error.headers["pymq-code"] == "invalid-header", value
        finally:
            raw.close()


@pytest.mark.parametrize("connect, longest, floor, offered", [
    ((0, 500), (10_000, 10_000), 250, (500, 10_000)),     # a client's own interval
    ((0, 10), (10_000, 10_000), 250, (250, 10_000)),      # down to the floor
    ((0, 60_000), (10_000, 10_000), 250, (10_000, 10_000)),   # longer than the offer: STOMP's max rule
    ((300, 0), (10_000, 10_000), 250, (10_000, 300)),     # a client's promise to send
    ((1, 1), (10_000, 10_000), 250, (250, 250)),
    ((0, 100), (200, 200), 250, (200, 200)),              # an operator's shorter offer wins over the floor
    ((0, 500), (0, 10_000), 250, (0, 10_000)),            # a broker that sends none still sends none
    ((500, 0), (10_000, 0), 250, (10_000, 0)),            # nor wants any
])
def test_offer_heartbeat(connect, longest, floor, offered):
    assert offer_heartbeat(connect, longest, floor) == offered


def test_a_socket_asking_nothing_gets_nothing(broker):
    raw = RawStomp(broker.port)
    try:
        connected = raw.connect(**{"heart-beat": "0,0"})
        assert parse_heartbeat(connected.headers["heart-beat"]) == (0, 0)
        raw.sock.settimeout(1.0)
        with pytest.raises(socket.timeout):
            raw.sock.recv(1)        # no beat in a second
    finally:
        raw.close()
