"""The admin HTTP port against malformed, slow, large and careless requests, on a real ``pymq-server``
(issue 24 item 2; server/admin/http.py, server/net/accept.py).

Figures measured on landed main with ``bench/admin_port.py`` (bench/README.md): 600 unauthenticated
POSTs of 1 MiB held +752 MiB of RSS and all 600 were open 75 s later; 600 clients sending a head byte
per second were all open after 75 s; a POST declaring 200 MiB got no answer; 40 malformed requests
wrote 25 tracebacks; 1,800 idle connections were all held; 4 non-reading ``browse-queue`` clients of
40 × 4 MiB messages grew RSS by 1,734 MiB, 854 MiB of it still held 5 s after they closed.

Each test here plays such clients with raw sockets and checks the broker's own process: its RSS, what
it closed and when, its log (no traceback), and that STOMP and HTTP clients are still served.
"""
from __future__ import annotations

import base64
import json
import os
import socket
import time

import pytest

import pymq
from tests.admin.conftest import ADMIN, ADMIN_PW, BrokerProcess
from tests.conftest import RawStomp, wait_for

MiB = 1024 * 1024
AUTH = "Basic " + base64.b64encode(f"{ADMIN}:{ADMIN_PW}".encode()).decode()
TIMEOUT_MS = 1500

#: requests no HTTP parser should take; each must be one log line, never a traceback
MALFORMED = [
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
    b"G\x00T / HTTP/1.1\r\n\r\n",
    b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + b"X-Long: " + b"b" * 20000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(500)) + b"\r\n",
    b"POST /api/purge-queue HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"POST /api/purge-queue HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n",
    b"POST /api/purge-queue HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /api/purge-queue HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,
    b"POST /api/session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n{{{{{",
    b"POST /api/status HTTP/1.1\r\nHost: x\r\nAuthorization: Basic !!!\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    ("POST /api/create-queue HTTP/1.1\r\nHost: x\r\nAuthorization: " + AUTH + "\r\nContent-Type: application/json"
     "\r\nContent-Length: 40000\r\n\r\n").encode() + b"[" * 20000 + b"]" * 20000,
    ("POST /api/create-queue HTTP/1.1\r\nHost: x\r\nAuthorization: " + AUTH + "\r\nContent-Type: application/json"
     "\r\nContent-Length: 9\r\n\r\n").encode() + b'{"name":\xff',
]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def admin_broker(tmp_path):
    started: list[BrokerProcess] = []

    def start(**config) -> BrokerProcess:
        cfg = {"admin_request_timeout_ms": TIMEOUT_MS, **config}
        bp = BrokerProcess(tmp_path / f"b{len(started)}", users={ADMIN: (ADMIN_PW, ["admin"])}, config=cfg)
        started.append(bp.start())
        return bp
    yield start
    for bp in started:
        bp.stop()


def _open(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


def answer_and_close(sock: socket.socket, seconds: float) -> tuple[bytes, bool]:
    """What the broker sends within ``seconds``, and whether it closed the connection by then."""
    data = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return data, False
        except OSError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def status_of(answer: bytes) -> int | None:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def serving(bp: BrokerProcess) -> bool:
    """Both ports answer: /healthz over HTTP and a STOMP CONNECT with a receipted SEND."""
    status, _, _ = bp.http("GET", "/healthz", user=None)
    with pymq.connect(bp.url, username=ADMIN, password=ADMIN_PW) as conn:
        conn.create_session().create_producer(pymq.Queue("still-serving")).send("x")
    return status == 200


def tracebacks(bp: BrokerProcess) -> list[str]:
    text = "".join(bp.log)
    return [block for block in text.split("Traceback")[1:]]



def _bytes_waiting(sock: socket.socket) -> bool:
    """Bytes (or the connection's end) wait in ``sock``, unread."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) is not None
    except BlockingIOError:
        return False
    except OSError:
        return True

def test_unauthenticated_posts_are_answered_before_their_bodies_are_read(admin_broker):
    """200 connections each POST 1 MiB without credentials: each gets 401 at once, its body unread, and is
    closed; the broker's RSS grows by a few MiB, not by the bodies (landed main: read them all)."""
    bp = admin_broker(admin_max_connections=250)
    before = rss_mib(bp.proc.pid)
    body = b"{" + b" " * (MiB - 2) + b"}"
    head = (b"POST /api/create-queue HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    socks = [_open(bp.admin_port) for _ in range(200)]
    for sock in socks:
        sock.setblocking(False)
        try:
            sock.send(head + body[:256 * 1024])
        except BlockingIOError:
            pass
    peak = rss_mib(bp.proc.pid)
    answers = [answer_and_close(sock, 10) for sock in socks]
    peak = max(peak, rss_mib(bp.proc.pid))
    assert all(status_of(a) == 401 for a, _ in answers), {status_of(a) for a, _ in answers}
    assert all(closed for _, closed in answers)
    assert peak - before < 64, f"RSS grew by {peak - before:.0f} MiB for 200 unauthenticated POSTs"
    for sock in socks:
        sock.close()
    assert not tracebacks(bp)
    assert serving(bp)


def test_a_head_or_body_that_trickles_is_closed_at_the_deadline(admin_broker):
    """Slow heads (a byte every 0.3 s) and slow bodies are closed once ``admin_request_timeout_ms`` has
    passed (landed main: aiohttp's keep-alive of an hour; no body deadline at all)."""
    bp = admin_broker()
    heads = [_open(bp.admin_port) for _ in range(20)]
    bodies = [_open(bp.admin_port) for _ in range(5)]
    for sock in bodies:
        sock.sendall(("POST /api/status HTTP/1.1\r\nHost: x\r\nAuthorization: " + AUTH +
                      "\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{").encode())
    request = b"GET /api/status HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100 + b"\r\n\r\n"
    started = time.monotonic()
    closed: set[int] = set()
    for i in range(40):                   # 12 s of trickling: four times the deadline
        for n, sock in enumerate(heads):
            if n in closed:
                continue
            try:
                sock.send(request[i:i + 1])
            except OSError:
                closed.add(n)
        if len(closed) == len(heads):
            break
        time.sleep(0.3)                   # the trickle's pace is the attack tested, not a wait
    assert all(answer_and_close(sock, 10)[1] for sock in heads), "a trickling head was kept open"
    assert time.monotonic() - started < 20
    for sock in bodies:
        answer, was_closed = answer_and_close(sock, 10)
        assert was_closed and status_of(answer) == 408, answer[:200]
    assert not tracebacks(bp)
    assert serving(bp)


@pytest.mark.parametrize("auth, expected", [(None, 401), (AUTH, 413)])
def test_a_declared_large_body_is_refused_before_it_is_sent(admin_broker, auth, expected):
    bp = admin_broker()
    sock = _open(bp.admin_port)
    extra = f"Authorization: {auth}\r\n" if auth else ""
    sock.sendall((f"POST /api/create-queue HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
                  f"Content-Length: {200 * MiB}\r\n\r\n").encode())
    answer, _ = answer_and_close(sock, 5)
    assert status_of(answer) == expected, answer[:300]
    sock.close()
    assert serving(bp)


def test_a_chunked_body_is_refused_as_it_grows_past_the_cap(admin_broker):
    bp = admin_broker(admin_max_body=64 * 1024)
    sock = _open(bp.admin_port)
    sock.sendall(("POST /api/create-queue HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Authorization: " + AUTH + "\r\nTransfer-Encoding: chunked\r\n\r\n").encode())
    chunk = b"%x\r\n%s\r\n" % (16 * 1024, b" " * 16 * 1024)
    sent = 0
    answer = b""
    sock.settimeout(0.2)
    while sent < 8 * MiB and not answer:
        try:
            sock.sendall(chunk)
            sent += len(chunk)
            answer = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            break
    if not answer:
        answer, _ = answer_and_close(sock, 5)
    assert status_of(answer) == 413, answer[:300]
    assert sent < 2 * MiB, f"{sent} bytes were sent before the 413"
    sock.close()
    assert serving(bp)


def test_malformed_requests_are_one_line_each_and_never_a_traceback(admin_broker):
    bp = admin_broker()
    lines_before = len(bp.log)
    for payload in MALFORMED * 3:
        sock = _open(bp.admin_port)
        try:
            sock.sendall(payload)
        except OSError:
            pass
        answer, closed = answer_and_close(sock, 5)
        assert closed or answer.startswith(b"HTTP/1.1 "), payload[:60]
        sock.close()
    assert wait_for(lambda: serving(bp))
    new = bp.log[lines_before:]
    assert not tracebacks(bp), "".join(new)[-3000:]
    assert len(new) <= len(MALFORMED) * 3, "".join(new)[-3000:]      # one line each at most


def test_the_admin_port_has_a_connection_cap_of_its_own(admin_broker):
    """``admin_max_connections`` 20: 60 idle sockets, at most 20 held (the rest 503 at once); STOMP clients
    are not affected, and the port serves again once the idle ones reach the head deadline."""
    bp = admin_broker(admin_max_connections=20)
    socks = [_open(bp.admin_port) for _ in range(60)]
    answers = [answer_and_close(sock, 0.5) for sock in socks]
    refused = [a for a, closed in answers if status_of(a) == 503]
    assert len(refused) >= 40, len(refused)
    client = RawStomp(bp.port)
    assert client.connect(ADMIN, ADMIN_PW).command == "CONNECTED"
    client.close()
    assert wait_for(lambda: bp.http("GET", "/healthz", user=None)[0] == 200, timeout=15)
    for sock in socks:
        sock.close()


def test_browse_pages_of_large_messages_are_capped_and_let_go(admin_broker):
    """Ten 4 MiB messages, 4 clients asking for all of them with 4 MiB bodies and never reading: each
    page stops at 4 MiB of body text (``page_bytes_cut``), the clients are closed at the deadline, and
    the broker's RSS comes back down (landed main: +1,734 MiB, 854 MiB still held after)."""
    bp = admin_broker()
    with pymq.connect(bp.url, username=ADMIN, password=ADMIN_PW) as conn:
        producer = conn.create_session().create_producer(pymq.Queue("big"))
        for _ in range(10):
            producer.send(os.urandom(4 * MiB))
    page = bp.op("browse-queue", name="big", limit=500, body_limit=4 * MiB)
    assert page["page_bytes_cut"] is True and len(page["messages"]) == 1 and page["next_offset"] == 1
    before = rss_mib(bp.proc.pid)
    request = (f"GET /api/browse-queue?name=big&limit=500&body_limit={4 * MiB} HTTP/1.1\r\nHost: x\r\n"
               f"Authorization: {AUTH}\r\n\r\n").encode()
    socks = [_open(bp.admin_port, rcvbuf=4096) for _ in range(4)]
    for sock in socks:
        sock.sendall(request)
    peak = before
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:    # the peak, sampled until every page is being written back
        peak = max(peak, rss_mib(bp.proc.pid))
        if all(_bytes_waiting(sock) for sock in socks):
            break
        time.sleep(0.1)
    peak = max(peak, rss_mib(bp.proc.pid))
    assert peak - before < 100, f"+{peak - before:.0f} MiB for 4 browse pages"
    for sock in socks:
        _, closed = answer_and_close(sock, 1)
        sock.close()
    assert wait_for(lambda: rss_mib(bp.proc.pid) - before < 24, timeout=10), rss_mib(bp.proc.pid) - before
    assert not tracebacks(bp)
    assert serving(bp)
    answer = json.loads(bp.http("GET", "/api/browse-queue?name=big&offset=1&limit=2&body_limit=16")[1])
    assert [m["body_size"] for m in answer["result"]["messages"]] == [4 * MiB, 4 * MiB]
