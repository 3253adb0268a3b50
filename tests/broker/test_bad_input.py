"""Bad input gets a precise ERROR frame, the connection closes, and the broker keeps serving others."""
from __future__ import annotations

import socket
import time

import pytest

from tests.conftest import RawStomp, wait_for


def _error(client: RawStomp):
    frames = client.read_until_closed()
    errors = [f for f in frames if f.command == "ERROR"]
    assert errors, f"expected an ERROR frame, got {frames}"
    return errors[0]


def _still_serving(broker) -> None:
    other = RawStomp(broker.port)
    assert other.connect().command == "CONNECTED"
    other.send("SEND", {"destination": "/queue/alive", "receipt": "r"}, b"ok")
    assert other.read().command == "RECEIPT"
    other.close()


CASES = [
    ("undefined escape", b"SEND\ndestination:/queue/a\nk:a\\tb\n\nx\x00", "bad-escape", "undefined escape"),
    ("header without colon", b"SEND\ndestination:/queue/a\nbroken\n\nx\x00", "malformed-frame", "without ':'"),
    ("unknown command", b"FLY\ndestination:/queue/a\n\n\x00", "unknown-command", "unknown command 'FLY'"),
    ("missing destination", b"SEND\nfoo:bar\n\nx\x00", "missing-header", "'destination'"),
    ("bad content-length", b"SEND\ndestination:/queue/a\ncontent-length:zz\n\nx\x00", "invalid-header",
     "content-length"),
    ("body on SUBSCRIBE", b"SUBSCRIBE\ndestination:/queue/a\nid:1\n\nbody\x00", "malformed-frame",
     "must not have a body"),
    ("bad destination prefix", b"SEND\ndestination:orders\n\nx\x00", "invalid-destination",
     "must start with /queue/, /topic/, /temp-queue/ or /temp-topic/"),
    ("empty destination name", b"SEND\ndestination:/queue/\n\nx\x00", "invalid-destination", "empty name"),
    ("bad priority", b"SEND\ndestination:/queue/a\npriority:high\n\nx\x00", "invalid-header", "'priority'"),
    ("priority out of range", b"SEND\ndestination:/queue/a\npriority:12\n\nx\x00", "invalid-header",
     "between 0 and 9"),
    ("bad persistent", b"SEND\ndestination:/queue/a\npersistent:maybe\n\nx\x00", "invalid-header",
     "true or false"),
    ("unknown subscription", b"UNSUBSCRIBE\nid:nope\n\n\x00", "unknown-subscription", "'nope'"),
    ("ack of unknown message", b"ACK\nid:12345\n\n\x00", "unknown-message", "'12345'"),
    ("commit of unknown transaction", b"COMMIT\ntransaction:t9\n\n\x00", "transaction", "'t9'"),
    ("bad ack mode", b"SUBSCRIBE\ndestination:/queue/a\nid:1\nack:sometimes\n\n\x00", "invalid-header",
     "'sometimes'"),
    ("duplicate subscription id", b"SUBSCRIBE\ndestination:/queue/a\nid:1\n\n\x00SUBSCRIBE\n"
     b"destination:/queue/b\nid:1\n\n\x00", "invalid-header", "already in use"),
    ("CONNECT twice", b"CONNECT\naccept-version:1.2\n\n\x00", "protocol", "not allowed in state connected"),
]


@pytest.mark.parametrize("name,data,code,text", CASES, ids=[c[0] for c in CASES])
def test_bad_frame_gets_precise_error_and_close(broker, raw, name, data, code, text):
    client = raw()
    client.send_raw(data)
    err = _error(client)
    assert err.headers["pymq-code"] == code
    assert text in err.headers["message"], err.headers["message"]
    _still_serving(broker)


def test_error_carries_receipt_id_of_failing_frame(raw):
    client = raw()
    client.send_raw(b"SEND\ndestination:nowhere\nreceipt:77\n\nx\x00")
    err = _error(client)
    assert err.headers["receipt-id"] == "77"


def test_oversized_frame_refused_before_it_is_read(broker_factory):
    broker = broker_factory(max_frame_size=1024)
    client = RawStomp(broker.port)
    assert client.connect().command == "CONNECTED"
    # announce 10 MB: the broker must refuse on the header, not wait for (or buffer) the body
    client.send_raw(b"SEND\ndestination:/queue/big\ncontent-length:10000000\n\n")
    err = _error(client)
    assert err.headers["pymq-code"] == "frame-too-large"
    assert "exceeds the limit of 1024 bytes" in err.headers["message"]
    _still_serving(broker)


def test_oversized_body_without_content_length(broker_factory):
    broker = broker_factory(max_frame_size=4096)
    client = RawStomp(broker.port)
    client.connect()
    client.send_raw(b"SEND\ndestination:/queue/big\n\n" + b"x" * 10_000)
    err = _error(client)
    assert err.headers["pymq-code"] == "frame-too-large"
    _still_serving(broker)


def test_first_frame_must_be_connect(broker, raw):
    client = raw(connect=False)
    client.send_raw(b"SEND\ndestination:/queue/a\n\nx\x00")
    err = _error(client)
    assert "expected CONNECT or STOMP" in err.headers["message"]


def test_wrong_credentials(broker, raw):
    client = raw(connect=False)
    frame = client.connect(login="guest", passcode="wrong")
    assert frame.command == "ERROR"
    assert frame.headers["pymq-code"] == "authentication-failed"
    assert "wrong username or password" in frame.headers["message"]
    assert client.is_closed()
    _still_serving(broker)


def test_unsupported_version(broker, raw):
    client = raw(connect=False)
    client.send_raw(b"CONNECT\naccept-version:2.0,3.1\n\n\x00")
    err = _error(client)
    assert err.headers["pymq-code"] == "unsupported-version"
    assert "1.0,1.1,1.2" in err.headers["message"]


def test_peer_vanishing_mid_frame_returns_its_messages(broker, raw):
    producer = raw()
    for i in range(3):
        producer.send("SEND", {"destination": "/queue/vanish"}, f"m{i}".encode())
    consumer = raw()
    consumer.send("SUBSCRIBE", {"destination": "/queue/vanish", "id": "1", "ack": "client-individual"})
    got = [consumer.read() for _ in range(3)]
    assert [f.body for f in got] == [b"m0", b"m1", b"m2"]
    # half a frame, then the socket is gone
    consumer.send_raw(b"ACK\nid:")
    consumer.sock.close()
    assert wait_for(lambda: broker.call(lambda: broker.broker.queues["vanish"].ready.count) == 3)
    assert broker.call(lambda: len(broker.broker.sessions)) == 1   # only the producer is left
    again = raw()
    again.send("SUBSCRIBE", {"destination": "/queue/vanish", "id": "1", "ack": "auto"})
    frames = [again.read() for _ in range(3)]
    assert [f.body for f in frames] == [b"m0", b"m1", b"m2"]
    assert all(f.headers.get("redelivered") == "true" for f in frames)


def test_client_that_never_connects_is_dropped(broker_factory):
    broker = broker_factory(connect_timeout_ms=300)
    client = RawStomp(broker.port)
    client.send_raw(b"CONN")   # a partial command, then silence
    frames = client.read_until_closed(timeout=5)
    assert frames and frames[-1].headers["pymq-code"] == "heartbeat-timeout"
    assert "no CONNECT frame received in time" in frames[-1].headers["message"]
    assert broker.call(lambda: len(broker.broker.sessions)) == 0
    _still_serving(broker)


def test_connection_limit_is_an_error_frame(broker_factory):
    broker = broker_factory(max_connections=2)
    first, second = RawStomp(broker.port), RawStomp(broker.port)
    assert first.connect().command == "CONNECTED" and second.connect().command == "CONNECTED"
    third = RawStomp(broker.port)
    frame = third.connect()
    assert frame.command == "ERROR" and frame.headers["pymq-code"] == "resource-limit"
    assert "already has 2 connections" in frame.headers["message"]
    first.close()
    assert wait_for(lambda: RawStomp(broker.port).connect().command == "CONNECTED")


def test_garbage_bytes_do_not_crash_the_broker(broker):
    for payload in (b"\xff\xfe\x00\x01" * 100, b"\n\n\n\r\n" * 50 + b"\x00\x00", b"CONNECT\n" + b"a" * 70000):
        client = RawStomp(broker.port)
        try:
            client.send_raw(payload)
            client.read_until_closed(timeout=3)
        except (TimeoutError, OSError):
            pass
        client.close()
    _still_serving(broker)
