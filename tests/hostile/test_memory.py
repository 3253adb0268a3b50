"""Memory bounded per connection and overall, before and after login (issue 10 item 3).

Each test plays a client that tries to make the broker hold memory — bytes behind a CONNECT whose
password is being checked, partial frames from connections that never log in, receipts for a client
that never reads — and measures, on the broker's own loop, what the broker holds for it: the scanner's
buffer, bytes held behind a pause, and the bytes queued to the socket.  Figures measured on the landed
main are in the docstrings.
"""
from __future__ import annotations

import socket
import threading
import time

import pytest

from pymq.protocol.scanner import encode_frame
from tests.conftest import RawStomp, wait_for

KiB, MiB = 1024, 1024 * 1024


def _all_protocols_held(rb) -> int:
    """Bytes the broker holds for its open connections (logged in or not): scanner buffers, bytes
    behind a pause, and output not yet written to the socket."""
    def measure():
        total = 0
        for session in _live_sessions(rb):
            total += session.conn.buffered + sum(len(b) for b in (session._held or ()))
            link = session.link
            total += getattr(link, "_out_bytes", 0)
            transport = getattr(link, "transport", None)
            if transport is not None and not transport.is_closing():
                total += transport.get_write_buffer_size()
        return total
    return rb.call(measure)


def _answered(client: RawStomp) -> bool:
    """Bytes (or the connection's end) wait in ``client``'s socket, unread."""
    try:
        return client.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) is not None
    except BlockingIOError:
        return False
    except OSError:
        return True


def _live_sessions(rb):
    import gc
    from pymq_server.broker.session import BrokerSession
    return [o for o in gc.get_objects() if isinstance(o, BrokerSession) and o.broker is rb.broker
            and not o.closed]


def _slow_logins(rb):
    """Make every CONNECT wait in the worker thread until the returned event is set."""
    gate = threading.Event()
    auth = rb.broker.authenticator
    original = auth.authenticate

    def authenticate(login, passcode, host):
        gate.wait(30)
        return original(login, passcode, host)

    def install():
        auth.needs_slow_check = lambda login, passcode: True
        auth.authenticate = authenticate
    rb.call(install)
    return gate


def _pump(sock: socket.socket, data: bytes, seconds: float) -> int:
    """Send as much of ``data`` as the peer takes within ``seconds``; returns bytes sent."""
    sock.setblocking(False)
    sent, deadline = 0, time.monotonic() + seconds
    view = memoryview(data)
    while sent < len(data) and time.monotonic() < deadline:
        try:
            sent += sock.send(view[sent:sent + 65536])
        except BlockingIOError:
            time.sleep(0.01)
        except OSError:
            break
    sock.setblocking(True)
    return sent


def test_bytes_after_a_connect_being_checked_wait_in_the_socket(broker):
    """Landed main: everything after a CONNECT whose password is being checked was buffered in the
    broker (50 such connections: +944 MiB).  Now reading pauses until CONNECTED: at most one read is
    held."""
    gate = _slow_logins(broker)
    clients = []
    try:
        for _ in range(4):
            client = RawStomp(broker.port)
            clients.append(client)
            client.sock.sendall(encode_frame("CONNECT", {"accept-version": "1.2", "login": "guest",
                                                         "passcode": "guest"}, b"", "1.2"))
            _pump(client.sock, b"SEND\ndestination:/queue/x\n\n" + b"x" * (8 * MiB), 1.5)
        held = _all_protocols_held(broker)
        assert held < 4 * (256 * KiB + 64 * KiB), f"{held} bytes held for 4 connections"
    finally:
        gate.set()
        for c in clients:
            c.close()


def test_a_frame_before_connected_is_at_most_64_kib(broker):
    """Landed main: an unauthenticated connection could hold a 4 MiB partial frame (100 of them: +400
    MiB).  Now a frame before CONNECTED over ``max_connect_frame_size`` (64 KiB) is refused."""
    client = RawStomp(broker.port)
    try:
        client.sock.sendall(b"CONNECT\naccept-version:1.2\nx:" + b"y" * (100 * KiB))
        err = client.read(10)
        assert err.command == "ERROR" and err.headers["pymq-code"] == "frame-too-large"
        assert "65536" in err.headers["message"]
    finally:
        client.close()


def test_all_unauthenticated_connections_share_one_cap(broker_factory):
    rb = broker_factory(max_unauthenticated_bytes=512 * KiB)
    clients, refused = [], 0
    try:
        for _ in range(16):                      # 16 x 60 KiB = 960 KiB > the 512 KiB cap
            client = RawStomp(rb.port)
            clients.append(client)
            client.sock.sendall(b"CONNECT\naccept-version:1.2\nx:" + b"y" * (60 * KiB))
        # the broker has read past the cap: the refusals are on their way back
        assert wait_for(lambda: sum(_answered(c) for c in clients) >= 7, timeout=10)
        for client in clients:
            try:
                frame = client.read(0.5)
            except (TimeoutError, ConnectionError):
                continue
            if frame.command == "ERROR" and frame.headers["pymq-code"] == "resource-limit":
                refused += 1
        assert refused >= 7
        assert _all_protocols_held(rb) <= 512 * KiB + 64 * KiB
        # a client that logs in normally is still served
        ok = RawStomp(rb.port)
        clients.append(ok)
        for client in clients[:-1]:
            client.close()
        assert wait_for(lambda: _all_protocols_held(rb) == 0)
        assert ok.connect().command == "CONNECTED"
    finally:
        for c in clients:
            c.close()


def test_receipts_for_a_client_that_never_reads_do_not_pile_up(broker_factory):
    """Landed main: RECEIPTs for a client that sends but never reads piled up in the broker (+198
    MiB).  Now reading pauses while the connection's outgoing bytes are over the high-water mark."""
    rb = broker_factory(write_buffer_high=64 * KiB, write_buffer_low=16 * KiB)
    client = RawStomp(rb.port, rcvbuf=4096)
    try:
        assert client.connect().command == "CONNECTED"
        pair = b"BEGIN\ntransaction:t\nreceipt:r-0000001\n\n\x00ABORT\ntransaction:t\nreceipt:r-0000002\n\n\x00"
        data = pair * (16 * MiB // len(pair))
        sent = _pump(client.sock, data, 8.0)
        held = _all_protocols_held(rb)
        # one read and one turn's receipts may be in flight beyond the mark, nothing like the 16 MiB
        assert held <= 64 * KiB + 512 * KiB, f"{held} bytes held after {sent} bytes sent"
        assert sent < len(data), "the broker read everything: it did not stop reading"
    finally:
        client.close()


def test_partial_frame_times_out_without_heart_beats(broker_factory):
    """Landed main: without heart-beats a connection holding half a frame was never timed out."""
    rb = broker_factory(frame_timeout_ms=300, frame_min_rate=1 * MiB)
    client = RawStomp(rb.port)
    try:
        assert client.connect().command == "CONNECTED"
        client.sock.sendall(b"SEND\ndestination:/queue/half\ncontent-length:100\n\nonly a part")
        err = client.read(30)
        assert err.command == "ERROR" and err.headers["pymq-code"] == "frame-timeout"
        assert client.is_closed(10)
    finally:
        client.close()


def test_a_byte_every_so_often_inside_a_frame_does_not_keep_it_open(broker_factory):
    """Landed main: a byte every 2 s inside a frame kept a heart-beating connection open for ever."""
    rb = broker_factory(frame_timeout_ms=500, frame_min_rate=1 * MiB, heartbeat_recv_ms=200)
    client = RawStomp(rb.port)
    try:
        assert client.connect(**{"heart-beat": "200,0"}).command == "CONNECTED"
        client.sock.sendall(b"SEND\ndestination:/queue/slow\n\n")
        got = None
        for _ in range(100):                     # at most ~10 s of trickling
            try:
                client.sock.sendall(b"x")
            except OSError:
                break
            try:
                got = client.read(0.1)
                break
            except TimeoutError:
                continue
            except ConnectionError:
                break
        assert got is not None and got.command == "ERROR", got
        assert got.headers["pymq-code"] == "frame-timeout"
    finally:
        client.close()


@pytest.mark.parametrize("size", [16 * MiB, 40 * MiB])
def test_large_messages_are_accepted_and_delivered_whole(broker, size):
    """Landed main: a 16 MiB SEND closed the connection (4 MiB limit); RabbitMQ and ActiveMQ take it."""
    import pymq
    body = bytes(range(256)) * (size // 256)
    with pymq.connect(broker.url) as conn:
        session = conn.create_session()
        queue = pymq.Queue(f"large-{size}")
        consumers = [session.create_consumer(queue)]
        session.create_producer(queue).send(pymq.BytesMessage(body))
        message = consumers[0].receive(timeout=60)
        assert message is not None and message.body == body


def test_browsing_a_queue_respects_the_outgoing_buffer(broker_factory):
    """Landed main: ``browser:true`` wrote the whole queue to the connection at once, whatever the
    write buffer (10 browse SUBSCRIBEs, ~600 bytes in: +415 MiB).  Now a browse pauses while the
    connection's outgoing buffer is over the mark and resumes as the client reads."""
    import pymq
    rb = broker_factory(write_buffer_high=64 * KiB, write_buffer_low=16 * KiB)
    body = b"m" * (8 * KiB)
    with pymq.connect(rb.url) as conn:
        producer = conn.create_session().create_producer(pymq.Queue("browsed"))
        for _ in range(1000):                                   # 8 MiB held by the queue
            producer.send(pymq.BytesMessage(body), delivery_mode=pymq.NON_PERSISTENT)
    client = RawStomp(rb.port, rcvbuf=4096)
    try:
        assert client.connect().command == "CONNECTED"
        for i in range(10):
            client.send("SUBSCRIBE", {"destination": "/queue/browsed", "id": f"b{i}", "browser": "true"})
        # the broker filled what it may for this client and paused its browses (the session is not writable)
        assert wait_for(lambda: rb.call(lambda: any(not s.writable for s in _live_sessions(rb))), timeout=10)
        held = _all_protocols_held(rb)
        assert held <= 64 * KiB + 512 * KiB, f"{held} bytes queued for a client that does not read"
        # the client reads everything in the end: 10 x 1000 messages, then 10 end markers
        seen, ends = 0, 0
        while ends < 10:
            frame = client.read(30)
            if frame.headers.get("browser") == "end":
                ends += 1
                assert frame.headers["pymq-count"] == "1000"
            else:
                seen += 1
        assert seen == 10_000
    finally:
        client.close()
