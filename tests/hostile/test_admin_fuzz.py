"""The admin HTTP port in the fuzz suite (issue 24): generated requests against a real ``pymq-server``
(tests/hostile/admin_fuzzing.py says what is generated and what must hold); ``python -m bench.fuzz
--only admin`` runs the same for longer."""
from __future__ import annotations

import socket

import pytest

import pymq
from tests.conftest import wait_for
from tests.hostile import admin_fuzzing


@pytest.fixture
def broker(tmp_path):
    bp = admin_fuzzing.start(tmp_path / "broker")
    yield bp
    bp.stop()


def test_generated_admin_requests_are_answered_refused_or_closed_and_break_nothing(broker):
    stats: dict = {}
    failures = admin_fuzzing.run_batch(broker, 120, stats)
    assert not failures, "\n".join(failures[:10])
    assert stats["requests"] >= 100
    status, _, _ = broker.http("GET", "/healthz", user=None)
    assert status == 200
    with pymq.connect(broker.url, username=admin_fuzzing.KEEPER, password=admin_fuzzing.KEEPER_PW) as conn:
        conn.create_session().create_producer(pymq.Queue("still-serving")).send("x")


def test_a_client_gone_before_its_100_continue_is_one_line_not_a_traceback(broker):
    """Found by the fuzzer: aiohttp writes ``100 Continue`` for ``Expect: 100-continue`` and, when the
    client has already shut its side, logged 'Error handling request' with a traceback (one per request:
    20 of 20 on landed main)."""
    credentials = admin_fuzzing.CREDENTIALS[0][0]
    for _ in range(10):
        sock = socket.create_connection(("127.0.0.1", broker.admin_port), timeout=10)
        sock.sendall(f"POST /api/create-queue HTTP/1.1\r\nHost: x\r\nAuthorization: {credentials}\r\n"
                     f"Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n".encode())
        sock.shutdown(socket.SHUT_WR)
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass
        sock.close()
    wait_for(lambda: sum("went away mid-request" in line for line in broker.log) >= 10, timeout=10)
    assert "Traceback" not in "".join(broker.log)


@pytest.mark.parametrize("path", ["/api/status", "/no/such/route", "/api/queues/x"])
def test_an_expect_header_that_is_not_utf8_is_a_417_not_a_500(broker, path):
    """Found by the fuzzer: aiohttp's own Expect handler put the header's text in its 417 and, for bytes
    that are not UTF-8, failed with a 500 and a traceback (for every route, and for paths no route has)."""
    sock = socket.create_connection(("127.0.0.1", broker.admin_port), timeout=10)
    sock.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nExpect: 100-\xff\xfecontinue\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    sock.close()
    assert answer.startswith(b"HTTP/1.1 417 "), answer[:200]
    assert "Traceback" not in "".join(broker.log)
