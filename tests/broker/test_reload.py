"""Live changes: SIGHUP makes a running ``pymq-server`` read its configuration and users file again —
users, default permissions and storage rules change without dropping a connection, an invalid file is
refused (the old one stays, the log says why), and SIGHUP no longer kills the broker."""
from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

import pymq
from pymq.errors import AccessDenied, AuthenticationFailed

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGHUP is POSIX")


class ServerProcess:
    """``pymq-server`` in a child process, its stderr read line by line on a thread."""

    def __init__(self, args, cwd) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "pymq_server.cli", *args], cwd=cwd,
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        line = self.wait_for(r"pymq-server listening on 127\.0\.0\.1:(\d+)$")
        self.port = int(re.search(r":(\d+)$", line.strip()).group(1))
        self.url = f"stomp://127.0.0.1:{self.port}"

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for(self, pattern: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.seen.append(line)
            if re.search(pattern, line.strip()):
                return line
        raise AssertionError(f"no line matching {pattern!r}; stderr so far:\n" + "".join(self.seen))

    def hup(self) -> None:
        self.proc.send_signal(signal.SIGHUP)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


def _passwd(users, name: str, password: str, roles: str | None = None) -> None:
    args = [sys.executable, "-m", "pymq_server.cli", "passwd", name, "--users-file", str(users),
            "--password-stdin"]
    if roles:
        args += ["--roles", roles]
    subprocess.run(args, input=password + "\n", text=True, check=True, capture_output=True, timeout=60)


@pytest.fixture
def server(tmp_path):
    users = tmp_path / "users.yaml"
    _passwd(users, "alice", "alice-pw", "admin")
    rules = tmp_path / "rules.yaml"
    rules.write_text("default_device: file\nrules:\n"
                     "  - {id: small-to-memory, device: memory, weight: 50, condition: SIZE < 100}\n")
    cfg = tmp_path / "broker.yaml"
    cfg.write_text(f"port: 0\nusers_file: {users}\nstorage:\n  selection: {rules}\n")
    proc = ServerProcess(["--config", str(cfg), "--data-dir", str(tmp_path / "data")], tmp_path)
    proc.users, proc.rules, proc.cfg = users, rules, cfg
    yield proc
    proc.stop()


def _roundtrip(conn, name: str, text: str) -> str:
    s = conn.create_session()
    s.create_producer(pymq.Queue(name)).send(text)
    got = s.create_consumer(pymq.Queue(name)).receive(5)
    return got.text if got is not None else None


def test_sighup_adds_a_user_without_dropping_connections(server):
    with pymq.connect(server.url, username="alice", password="alice-pw") as alice:
        assert _roundtrip(alice, "before", "one") == "one"
        _passwd(server.users, "bob", "bob-pw")
        with pytest.raises(AuthenticationFailed):           # written, not yet read by the broker
            pymq.connect(server.url, username="bob", password="bob-pw").close()
        server.hup()
        server.wait_for(r"pymq-server reloaded: 2 user\(s\)$")
        with pymq.connect(server.url, username="bob", password="bob-pw") as bob:
            assert _roundtrip(bob, "for-bob", "hello bob") == "hello bob"
        assert _roundtrip(alice, "after", "two") == "two"      # the same connection, still open
    assert server.proc.poll() is None


def test_sighup_with_an_invalid_users_file_keeps_the_old_one_and_says_why(server):
    with pymq.connect(server.url, username="alice", password="alice-pw") as alice:
        server.users.write_text("alice: {password: x}\n")      # no `users:` key
        server.hup()
        line = server.wait_for(r"reload refused")
        assert f"invalid users file in {server.users}" in line or "users" in line
        server.wait_for(r"users: expected a value \(required\)")
        assert server.proc.poll() is None
        assert _roundtrip(alice, "still", "open") == "open"
        with pymq.connect(server.url, username="alice", password="alice-pw") as again:   # old users kept
            assert _roundtrip(again, "again", "x") == "x"
    # a broken configuration file is refused the same way
    good = server.cfg.read_text()
    server.cfg.write_text(good + "max_memory: lots\n")
    server.hup()
    server.wait_for(r"reload refused")
    server.wait_for(r"max_memory = 'lots': expected a size")
    assert server.proc.poll() is None


def test_sighup_applies_default_permissions_and_storage_rules(server):
    _passwd(server.users, "carol", "carol-pw", "app")
    server.cfg.write_text(server.cfg.read_text()
                          + "default_permissions: {'role:app': [consume, browse]}\n")
    server.rules.write_text("default_device: file\nrules:\n"
                            "  - {id: all-to-file, device: file, weight: 50, condition: SIZE < 100}\n")
    with pymq.connect(server.url, username="alice", password="alice-pw") as alice:
        qm = alice.queue_manager()
        assert [r["id"] for r in qm.call("storage")["rules"]["ranking"]] == ["small-to-memory"]
        server.hup()
        server.wait_for(r"pymq-server reloaded: 2 user\(s\)$")
        assert [r["id"] for r in qm.call("storage")["rules"]["ranking"]] == ["all-to-file"]
        alice.create_session().create_producer(pymq.Queue("placed")).send("tiny")    # held, not consumed
        placements = {(p["device"], p["rule"]) for p in qm.call("storage")["placements"]}
        assert ("file", "all-to-file") in placements
    with pymq.connect(server.url, username="carol", password="carol-pw") as carol:
        producer = carol.create_session().create_producer(pymq.Queue("guarded"))
        with pytest.raises(AccessDenied, match="may not produce"):
            producer.send("refused by the reloaded default permissions")


def test_sighup_reports_settings_that_need_a_restart(server):
    server.cfg.write_text(server.cfg.read_text() + "max_connections: 5\n")
    server.hup()
    server.wait_for(r"pymq-server reloaded: 1 user\(s\), needing a restart: max_connections$")
    assert server.stop() == 0


def test_sighup_refuses_the_next_send_of_a_connection_open_across_it(server):
    """A connection keeps what its SENDs to a destination decided (server/broker/routes.py); a reload of the
    default permissions drops it: the same producer's next SEND is refused, and nothing of it is placed."""
    _passwd(server.users, "carol", "carol-pw", "app")
    server.hup()
    server.wait_for(r"pymq-server reloaded: 2 user\(s\)$")
    with pymq.connect(server.url, username="carol", password="carol-pw") as carol:
        producer = carol.create_session().create_producer(pymq.Queue("guarded"))
        producer.send("one")
        producer.send("two")                        # the open defaults: taken, and its decision kept
        server.cfg.write_text(server.cfg.read_text() + "default_permissions: {'role:app': [consume, browse]}\n")
        server.hup()
        server.wait_for(r"pymq-server reloaded: 2 user\(s\)$")
        with pytest.raises(AccessDenied, match="may not produce"):
            producer.send("three")
    with pymq.connect(server.url, username="alice", password="alice-pw") as alice:
        consumer = alice.create_session().create_consumer(pymq.Queue("guarded"))
        got = [consumer.receive(5), consumer.receive(5), consumer.receive(0.3)]
        assert [m.text if m is not None else None for m in got] == ["one", "two", None]
