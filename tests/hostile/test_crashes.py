"""The crashes and freezes of issue 10, against a real ``pymq-server`` process over TCP.

Each test does what an adversary did to the landed broker, then checks that the adversary got a precise
ERROR and that the broker is still up and serving an ordinary client.  On the landed main the first two
killed the process (SIGSEGV), the LIKE selector froze it for good, and the deep selectors and the
absurd heart-beat got a generic internal error.
"""
from __future__ import annotations

import socket
import subprocess
import threading
import time

import pytest

import pymq
from tests.conftest import RawStomp, wait_for


def _serves(bp) -> bool:
    """An ordinary client can still connect, send and receive."""
    with pymq.connect(bp.url, timeout=10) as conn:
        session = conn.create_session()
        queue = pymq.Queue(f"still-serving-{time.monotonic_ns()}")
        session.create_producer(queue).send("ok")
        message = session.create_consumer(queue).receive(timeout=10)
        return message is not None and message.text == "ok"


def _settled(bp) -> None:
    """Give a broker that is dying the time to die (its exit status then goes into the failure)."""
    try:
        bp.proc.wait(2)
    except subprocess.TimeoutExpired:
        pass


def _bytes_waiting(client: RawStomp) -> bool:
    try:
        return bool(client.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False


def _error_then_closed(client: RawStomp) -> dict:
    frame = client.read(timeout=20)
    assert frame.command == "ERROR", frame
    assert client.is_closed(10), "the connection stays open after an ERROR"
    return frame.headers


def test_first_frame_with_content_length_int64_max(broker_process):
    bp = broker_process()
    client = RawStomp(bp.port)
    client.send_raw(b"CONNECT\ncontent-length:9223372036854775807\n\nabc")
    try:
        headers = _error_then_closed(client)
    except (ConnectionError, TimeoutError):
        _settled(bp)
        pytest.fail(f"no ERROR frame; {bp.describe()}")
    finally:
        client.close()
    assert headers["pymq-code"] == "frame-too-large"
    assert bp.alive(), bp.describe()
    assert _serves(bp)


@pytest.mark.parametrize("selector, position", [
    ("x" + " + 1" * 80_000 + " > 0", None),                  # segfaulted the compiled evaluator
    ("x" + " + 1" * 3000 + " > 0", None),                    # within the length limit
    ("NOT " * 5000 + "b", None),                             # RecursionError: a generic error
    ("(" * 5000 + "x" + ")" * 5000 + " > 0", "64"),
])
def test_selectors_without_bounds_are_invalid_selectors(broker_process, selector, position):
    bp = broker_process()
    client = RawStomp(bp.port)
    try:
        assert client.connect().command == "CONNECTED"
        client.send("SUBSCRIBE", {"destination": "/queue/q", "id": "1", "selector": selector,
                                  "receipt": "r"})
        headers = _error_then_closed(client)
    except (ConnectionError, TimeoutError):
        _settled(bp)
        pytest.fail(f"no ERROR frame; {bp.describe()}")
    finally:
        client.close()
    assert headers["pymq-code"] == "invalid-selector", headers
    assert headers["receipt-id"] == "r"
    if position is not None:
        assert headers["pymq-field-position"] == position
    assert bp.alive(), bp.describe()
    assert _serves(bp)


def test_like_selector_does_not_freeze_the_broker(broker_process):
    bp = broker_process()
    subscriber = RawStomp(bp.port)
    producer = RawStomp(bp.port)
    try:
        assert subscriber.connect().command == "CONNECTED"
        subscriber.send("SUBSCRIBE", {"destination": "/queue/like", "id": "1",
                                      "selector": "p LIKE '%a%a%a%a%a%a%b'", "receipt": "sub"})
        assert subscriber.read(10).command == "RECEIPT"
        assert producer.connect().command == "CONNECTED"
        producer.send("SEND", {"destination": "/queue/like", "p": "a" * 3000, "receipt": "no-match"},
                      b"not selected")
        producer.send("SEND", {"destination": "/queue/like", "p": "a" * 3000 + "b", "receipt": "match"},
                      b"selected")
        receipts = [producer.read(20).headers.get("receipt-id") for _ in range(2)]
        assert receipts == ["no-match", "match"]
        message = subscriber.read(20)
        assert message.command == "MESSAGE" and message.body == b"selected"
    except TimeoutError:
        pytest.fail(f"the broker stopped answering; {bp.describe()}")
    finally:
        subscriber.close()
        producer.close()
    assert _serves(bp)


@pytest.mark.parametrize("value", ["99999999999999999999999,0", "0,99999999999999999999999", "\u0663,0",
                                   "1,2,3", "-5,0"])
def test_absurd_heart_beat_is_an_invalid_header(broker_process, value):
    bp = broker_process()
    client = RawStomp(bp.port)
    try:
        client.sock.sendall(f"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:guest\n"
                            f"heart-beat:{value}\n\n\x00".encode())
        headers = _error_then_closed(client)
    finally:
        client.close()
    assert headers["pymq-code"] == "invalid-header" and headers["pymq-field-header"] == "heart-beat"
    assert bp.alive(), bp.describe()


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_stomp_py_context_manager_returns_with_receipts_pending(broker_process, version):
    """``with stomp.Connection(...)``: persistent SENDs with receipts, then the block ends (DISCONNECT
    with a receipt).  The DISCONNECT's RECEIPT comes after the others, then the broker closes."""
    stomp = pytest.importorskip("stomp")
    bp = broker_process()
    done = threading.Event()
    failure: list[BaseException] = []
    receipts: list[str] = []

    class Listener(stomp.ConnectionListener):
        def on_receipt(self, frame):
            receipts.append(frame.headers["receipt-id"])

    def run():
        try:
            cls = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}[version]
            conn = cls([("127.0.0.1", bp.port)])
            conn.set_listener("receipts", Listener())
            with conn:
                conn.connect("guest", "guest", wait=True)
                for i in range(20):
                    conn.send("/queue/ctx", f"m{i}", headers={"persistent": "true", "receipt": f"s{i}"})
            done.set()
        except BaseException as exc:  # hand it to the test thread
            failure.append(exc)
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert done.wait(30), f"the `with stomp.Connection(...)` block did not return; {bp.describe()}"
    assert not failure, failure
    assert [r for r in receipts if r.startswith("s")] == [f"s{i}" for i in range(20)]
    assert receipts[-1] not in {f"s{i}" for i in range(20)}   # the DISCONNECT's receipt came last
    assert bp.alive()


def test_half_open_socket_garbage_does_not_kill_the_broker(broker_process):
    """Random bytes, then a reset, on many connections at once: every one costs its connection only."""
    bp = broker_process()
    import random
    rnd = random.Random(10)
    for _ in range(30):
        s = socket.create_connection(("127.0.0.1", bp.port), timeout=5)
        s.sendall(bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 3000))))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    assert bp.alive(), bp.describe()
    assert _serves(bp)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_large_message_to_many_subscribers_is_held_once(broker_process, tmp_path):
    """Landed main joined each subscriber's MESSAGE into one bytes object (a copy of the body per
    subscriber, then another in the socket buffer): 30 topic subscribers that do not read made the
    broker hold 30 copies of a 3.5 MiB body.  Now the body is queued by reference and written in
    slices while the socket's buffer has room: about one copy, plus the write buffers."""
    config = tmp_path / "broker.yaml"
    config.write_text("write_buffer_high: 65536\nwrite_buffer_low: 16384\n")
    bp = broker_process("--config", str(config))
    subscribers = []
    try:
        for i in range(30):
            client = RawStomp(bp.port, rcvbuf=4096)
            subscribers.append(client)
            assert client.connect().command == "CONNECTED"
            client.send("SUBSCRIBE", {"destination": "/topic/large", "id": "s", "receipt": "r"})
            assert client.read(10).command == "RECEIPT"
        before = _rss(bp.proc.pid)
        body = b"L" * (3 * 1024 * 1024 + 512 * 1024)
        producer = RawStomp(bp.port)
        subscribers.append(producer)
        assert producer.connect().command == "CONNECTED"
        producer.send("SEND", {"destination": "/topic/large", "persistent": "false", "receipt": "sent"}, body)
        assert producer.read(30).command == "RECEIPT"
        del body
        # the broker has written to every subscriber (bytes wait in each socket): the body is held now
        assert wait_for(lambda: all(_bytes_waiting(c) for c in subscribers[:30]), timeout=30)
        grown = _rss(bp.proc.pid) - before
        assert bp.alive(), bp.describe()
        # one body (3.5 MiB) in the broker, at most ~320 KiB queued per subscriber's socket, and slack
        # for the parse (the frame's bytes and the body are both alive for a moment)
        assert grown < 30 * 1024 * 1024, f"the broker grew by {grown / 1048576:.1f} MiB"
    finally:
        for client in subscribers:
            client.close()
