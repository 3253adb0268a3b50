"""Password checks run off the event loop for every login, in a bounded pool (issue 24 item 7).

Landed main computed guest's scrypt hash *on the loop* for a CONNECT without ``login`` (no users file):
``needs_slow_check`` said "fast" for a missing login while ``authenticate`` then checked guest's password.
It also queued every slow check in the worker pool that storage syncs use, without bound.  These tests
record the thread every hash runs in, with real CONNECTs and HTTP requests against a real broker.
"""
from __future__ import annotations

import base64
import threading
import urllib.error
import urllib.request

import pytest
import yaml

from pymq_server.broker import auth
from pymq_server.broker.auth import hash_password
from tests.conftest import RawStomp, wait_for


@pytest.fixture
def hash_threads(monkeypatch):
    """The name of the thread each password hash ran in (the broker runs in this process)."""
    seen: list[str] = []
    original = auth.verify_password

    def recording(password, stored):
        seen.append(threading.current_thread().name)
        return original(password, stored)

    monkeypatch.setattr(auth, "verify_password", recording)
    return seen


def _users(tmp_path, **users) -> str:
    path = tmp_path / "users.yaml"
    path.write_text(yaml.safe_dump({"users": {name: {"password": hash_password(pw), "roles": roles}
                                              for name, (pw, roles) in users.items()}}))
    return str(path)


def test_a_connect_without_login_is_checked_off_the_loop(broker_factory, hash_threads):
    """No users file: a CONNECT without ``login`` is guest/guest, whose hash must not run on the loop."""
    broker = broker_factory()
    client = RawStomp(broker.port)
    client.sock.sendall(client.encode("CONNECT", {"accept-version": "1.2", "host": "/"}))
    assert client.read().command == "CONNECTED"
    client.close()
    assert hash_threads, "guest's password was not checked at all"
    assert all(name.startswith("pymq-hash") for name in hash_threads), hash_threads


@pytest.mark.parametrize("login, passcode", [("guest", "guest"), ("guest", "wrong"), ("nobody", "x"),
                                             (None, "wrong")])
def test_every_connect_hash_runs_in_the_hashing_pool(broker_factory, hash_threads, login, passcode):
    broker = broker_factory()
    client = RawStomp(broker.port)
    headers = {"accept-version": "1.2", "host": "/"}
    if login is not None:
        headers["login"] = login
    headers["passcode"] = passcode
    client.sock.sendall(client.encode("CONNECT", headers))
    frame = client.read()
    assert frame.command == ("CONNECTED" if passcode == "guest" else "ERROR")
    client.close()
    assert hash_threads and all(name.startswith("pymq-hash") for name in hash_threads), hash_threads


def test_an_unknown_user_costs_a_hash_like_a_known_one(broker_factory, hash_threads, tmp_path):
    broker = broker_factory(users_file=_users(tmp_path, alice=("a-pw", [])))
    for login in ("alice", "mallory"):
        client = RawStomp(broker.port)
        assert client.connect(login, "wrong").command == "ERROR"
        client.close()
    assert len(hash_threads) == 2 and all(n.startswith("pymq-hash") for n in hash_threads)


def test_admin_http_basic_auth_uses_the_same_pool(broker_factory, hash_threads, tmp_path):
    broker = broker_factory(admin_port=0, users_file=_users(tmp_path, root=("root-pw", ["admin"])))
    token = base64.b64encode(b"root:root-pw").decode()
    request = urllib.request.Request(f"http://127.0.0.1:{broker.server.admin_port}/api/status",
                                     headers={"Authorization": "Basic " + token})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    assert hash_threads and all(name.startswith("pymq-hash") for name in hash_threads), hash_threads


def test_concurrent_logins_past_the_bound_are_refused_at_once(broker_factory, monkeypatch, tmp_path):
    """``max_pending_logins`` 2: with two hashes stuck, a third CONNECT with a password to check gets
    ``resource-limit`` at once (nothing is queued for it); the two answer once the hashes finish, and a
    login already remembered needs no hash and is served meanwhile."""
    broker = broker_factory(max_pending_logins=2, users_file=_users(tmp_path, alice=("a-pw", [])))
    remembered = RawStomp(broker.port)
    assert remembered.connect("alice", "a-pw").command == "CONNECTED"
    gate = threading.Event()
    started = threading.Semaphore(0)
    original = auth.verify_password

    def stuck(password, stored):
        started.release()
        gate.wait(30)
        return original(password, stored)

    monkeypatch.setattr(auth, "verify_password", stuck)
    waiting = []
    try:
        for i in range(2):
            client = RawStomp(broker.port)
            client.sock.sendall(client.encode("CONNECT", {"accept-version": "1.2", "host": "/", "login": "alice",
                                                          "passcode": f"wrong-{i}"}))
            waiting.append(client)
        assert wait_for(lambda: broker.call(lambda: broker.broker.password_checks.pending) == 2)
        third = RawStomp(broker.port)
        frame = third.connect("alice", "wrong-3")
        assert frame.command == "ERROR" and frame.headers["pymq-code"] == "resource-limit"
        assert "max_pending_logins" in frame.headers["message"]
        again = RawStomp(broker.port)
        assert again.connect("alice", "a-pw").command == "CONNECTED"     # remembered: no hash
        again.close()
        third.close()
    finally:
        gate.set()
    for client in waiting:
        frame = client.read(10)
        assert frame.command == "ERROR" and frame.headers["pymq-code"] == "authentication-failed"
        client.close()
    assert wait_for(lambda: broker.call(lambda: broker.broker.password_checks.pending) == 0)
    remembered.close()
