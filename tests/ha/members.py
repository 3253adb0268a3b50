"""Real ``pymq-server`` processes of a high-availability group (spec/ha.md), for the tests of tests/ha and the
failover harness (bench/bench_failover.py).

A member is started without waiting (it may wait as a backup for a long time); its stderr is read by a
thread, and the test waits on what it announces: ``pymq-server backup of node N waiting`` (a backup, its
admin port on the next line), ``pymq-server listening on HOST:PORT`` (it took the store and serves), and
``pymq-server fenced`` (it found another holding the store).  Signals: ``stop()`` SIGSTOP, ``cont()``
SIGCONT, ``kill()`` SIGKILL, ``terminate()`` SIGTERM.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import yaml

LISTENING = re.compile(r"^pymq-server listening on 127\.0\.0\.1:(\d+)$", re.M)
ADMIN = re.compile(r"^pymq-server admin listening on http://127\.0\.0\.1:(\d+)/$", re.M)
BACKUP = re.compile(r"^pymq-server backup of node \S+ waiting", re.M)
FENCED = re.compile(r"^pymq-server fenced", re.M)


def ha_config(path: Path, *, lease_ms: int = 1000, poll_ms: int = 50, after_fenced: str = "backup",
              postgres_url: str | None = None, table_prefix: str = "pymq_", extra: dict | None = None) -> Path:
    """A group member's configuration file: the file store of ``--data-dir`` or, with ``postgres_url``, the
    SQL device on that database (its own ``table_prefix``, so tests share one server)."""
    doc: dict = {"ha": {"lease_ms": lease_ms, "poll_ms": poll_ms, "after_fenced": after_fenced},
                 "heartbeat_send_ms": 500, "heartbeat_recv_ms": 500}
    if postgres_url is not None:
        doc["storage"] = {"devices": {"memory": {}, "db": {"kind": "sql", "url": postgres_url,
                                                           "table_prefix": table_prefix}},
                          "persistent_device": "db"}
    doc.update(extra or {})
    path.write_text(yaml.safe_dump(doc))
    return path


class Member:
    """One ``pymq-server`` of a group."""

    def __init__(self, name: str, data_dir: Path, config: Path, *args: str) -> None:
        self.name = name
        self.data_dir = data_dir
        cmd = [sys.executable, "-m", "pymq_server.cli", "--port", "0", "--admin-port", "0", "--data-dir",
               str(data_dir), "--config", str(config), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._drain, daemon=True, name=f"member-{name}")
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lock:
                self._lines.append(line)

    @property
    def log(self) -> str:
        with self._lock:
            return "".join(self._lines)

    # -- what it announced ---------------------------------------------------------------------------------
    def _wait(self, find, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while True:
            found = find(self.log)
            if found is not None:
                return found
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before {what}:\n{self.log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no {what} within {timeout} s:\n{self.log[-3000:]}")
            time.sleep(0.005)

    def ports(self) -> list[int]:
        """Every STOMP port it announced (one per time it became live)."""
        return [int(p) for p in LISTENING.findall(self.log)]

    def wait_live(self, timeout: float = 60.0, times: int = 1) -> int:
        """The STOMP port of its ``times``-th time live."""
        return self._wait(lambda log: (lambda ps: ps[times - 1] if len(ps) >= times else None)(
            [int(p) for p in LISTENING.findall(log)]), timeout, f"live #{times}")

    def wait_backup(self, timeout: float = 60.0, times: int = 1) -> int:
        """The admin port it announced with its ``times``-th wait as a backup."""
        def find(log: str):
            starts = [m.end() for m in BACKUP.finditer(log)]
            if len(starts) < times:
                return None
            m = ADMIN.search(log, starts[times - 1])
            return int(m.group(1)) if m else None
        return self._wait(find, timeout, f"backup #{times}")

    def wait_fenced(self, timeout: float = 60.0) -> None:
        self._wait(lambda log: FENCED.search(log), timeout, "fenced")

    @property
    def live(self) -> bool:
        return bool(LISTENING.search(self.log))

    # -- its admin port ------------------------------------------------------------------------------------
    def admin_port(self) -> int:
        ports = [int(p) for p in ADMIN.findall(self.log)]
        if not ports:
            raise AssertionError(f"{self.name} announced no admin port")
        return ports[-1]

    def http(self, path: str, auth: bool = True, timeout: float = 10.0) -> tuple[int, dict | str]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.admin_port()}{path}")
        if auth:
            import base64
            request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                status, body = answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read().decode()
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body

    # -- signals -------------------------------------------------------------------------------------------
    def stop(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def cont(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.cont()
            self.proc.kill()
        self.proc.wait(30)

    def terminate(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.cont()
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise

    def exited(self) -> int | None:
        return self.proc.poll()


def store_digest(data_dir: Path) -> dict[str, tuple[str, int]]:
    """Every file of a file store but the lease's: (sha-256 prefix, size) by path, to show a paused former
    live wrote nothing."""
    out = {}
    for path in sorted(data_dir.rglob("*")):
        if path.is_file() and "ha" not in path.relative_to(data_dir).parts:
            data = path.read_bytes()
            out[str(path.relative_to(data_dir))] = (hashlib.sha256(data).hexdigest()[:16], len(data))
    return out


def port_refuses(port: int) -> bool:
    """Nothing accepts on ``port`` any more."""
    import socket
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return False
    except OSError:
        return True
