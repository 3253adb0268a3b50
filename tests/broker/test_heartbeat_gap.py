"""Broker→client heart-beats can be one whole interval late (server/net/tcp.py _beat).

A blocking-SDK connection with fast heart-beats, left idle, must stay open: spec/stomp.md §6 declares a
peer dead only after grace (2.0) × interval without traffic.  It is closed with HeartbeatTimeout in
most runs, because the broker skips a beat when it wrote anything during the previous interval, so the
gap after a write reaches 2 × interval.
"""
import time

import pymq


def test_idle_blocking_connection_with_fast_heartbeats_stays_open(broker_factory):
    broker = broker_factory(heartbeat_send_ms=200, heartbeat_recv_ms=200)
    errors = []
    for _ in range(5):
        conn = pymq.connect(broker.url, heartbeat=(200, 200))
        conn.exception_listener = errors.append
        time.sleep(1.0)         # idle under 200 ms heart-beats: the idle time is what is tested
        conn.close()
    assert not errors, errors
