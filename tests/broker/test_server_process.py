"""`pymq-server` as a user runs it: defaults, flags, a YAML config, and a clean stop on SIGTERM/SIGINT."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

import pymq


def _start(args, cwd):
    proc = subprocess.Popen([sys.executable, "-m", "pymq_server.cli", *args], cwd=cwd,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        m = re.search(r"pymq-server listening on 127\.0\.0\.1:(\d+)$", line.strip())
        if m:
            return proc, int(m.group(1)), lines
        if proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError("server did not start:\n" + "".join(lines))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_clean_stop_keeps_persistent_messages(tmp_path, sig):
    data = tmp_path / "data"
    proc, port, _ = _start(["--port", "0", "--data-dir", str(data)], tmp_path)
    with pymq.connect(f"stomp://127.0.0.1:{port}") as conn:
        conn.create_session().create_producer(pymq.Queue("kept")).send("survives a clean stop")
    proc.send_signal(sig)
    out = proc.stderr.read()
    assert proc.wait(20) == 0, out
    assert "pymq-server stopped" in out
    proc, port, _ = _start(["--port", "0", "--data-dir", str(data)], tmp_path)
    try:
        with pymq.connect(f"stomp://127.0.0.1:{port}") as conn:
            m = conn.create_session().create_consumer(pymq.Queue("kept")).receive(5)
            assert m is not None and m.text == "survives a clean stop"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_yaml_config_and_its_errors(tmp_path):
    cfg = tmp_path / "broker.yaml"
    cfg.write_text("port: 0\nnode_id: yaml-node\nqueues:\n  orders: {max_deliveries: 2}\n")
    proc, port, _ = _start(["--config", str(cfg), "--data-dir", str(tmp_path / "d")], tmp_path)
    try:
        with pymq.connect(f"stomp://127.0.0.1:{port}") as conn:
            sent = conn.create_session().create_producer(pymq.Queue("orders")).send("x")
            assert sent.message_id.startswith("ID:yaml-node-")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    cfg.write_text("port: 0\nmax_deliverys: 3\n")
    bad = subprocess.run([sys.executable, "-m", "pymq_server.cli", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert bad.returncode == 2 and "line 2: max_deliverys = 3: unknown setting" in bad.stderr


def test_busy_port_is_a_clear_error(tmp_path):
    proc, port, _ = _start(["--port", "0", "--data-dir", str(tmp_path / "a")], tmp_path)
    try:
        second = subprocess.run([sys.executable, "-m", "pymq_server.cli", "--port", str(port),
                                 "--data-dir", str(tmp_path / "b")], capture_output=True, text=True,
                                timeout=30, cwd=tmp_path)
        assert second.returncode == 1 and f"cannot listen on 127.0.0.1:{port} for the STOMP port" in second.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_passwd_writes_a_hash(tmp_path):
    users = tmp_path / "users.yaml"
    done = subprocess.run([sys.executable, "-m", "pymq_server.cli", "passwd", "alice", "--users-file",
                           str(users), "--roles", "admin", "--password-stdin"], input="s3cret\n",
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    text = users.read_text()
    assert "s3cret" not in text and "scrypt$" in text and "admin" in text
