"""A real ``pymq-server`` process with its admin HTTP port and a users file, and ``pymq-admin`` run as a
process against it: what an operator runs, end to end."""
from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml

from pymq_server.broker.auth import hash_password

ADMIN, ADMIN_PW = "root", "root-secret"
APP, APP_PW = "alice", "alice-secret"


class BrokerProcess:
    """``python -m pymq_server.cli`` with ``admin_port: 0``; learns both ports from its log."""

    def __init__(self, directory, *, users: dict | None = None, config: dict | None = None) -> None:
        self.dir = str(directory)
        os.makedirs(self.dir, exist_ok=True)
        self.users_file = None
        if users is not None:
            self.users_file = os.path.join(self.dir, "users.yaml")
            with open(self.users_file, "w") as fh:
                yaml.safe_dump({"users": {name: {"password": hash_password(pw), "roles": roles}
                                          for name, (pw, roles) in users.items()}}, fh)
        cfg = {"admin_port": 0, "log_level": "INFO"}
        cfg.update(config or {})
        self.config_path = os.path.join(self.dir, "broker.yaml")
        with open(self.config_path, "w") as fh:
            yaml.safe_dump(cfg, fh)
        self.log: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.admin_port: int | None = None
        self.scheme = "http"

    def start(self) -> "BrokerProcess":
        args = [sys.executable, "-m", "pymq_server.cli", "--port", "0", "--data-dir",
                os.path.join(self.dir, "data"), "--config", self.config_path]
        if self.users_file:
            args += ["--users-file", self.users_file]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                break
            self.log.append(line)
            m = re.search(r"admin and metrics on (https?)://127\.0\.0\.1:(\d+)/", line)
            if m:
                self.scheme, self.admin_port = m.group(1), int(m.group(2))
            m = re.search(r"^pymq-server listening on 127\.0\.0\.1:(\d+)$", line.strip())
            if m:
                self.port = int(m.group(1))
                threading.Thread(target=self._drain, daemon=True).start()
                assert self.admin_port is not None, "".join(self.log)
                return self
        self.kill()
        raise RuntimeError("broker did not start:\n" + "".join(self.log))

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)

    @property
    def url(self) -> str:
        return f"stomp://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.admin_port}"

    def stop(self) -> int | None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode if self.proc else None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    # -- HTTP as curl would -------------------------------------------------------------------------
    def http(self, method: str, path: str, body=None, user: str | None = ADMIN, password: str = ADMIN_PW,
             headers: dict | None = None) -> tuple[int, bytes, dict]:
        data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        req = urllib.request.Request(self.admin_url + path, method=method, data=data)
        if user is not None:
            req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                return resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as err:
            return err.code, err.read(), dict(err.headers)

    def op(self, op: str, as_user: str = ADMIN, as_password: str = ADMIN_PW, **args):
        status, raw, _ = self.http("POST", "/api/" + op, args, user=as_user, password=as_password)
        answer = json.loads(raw)
        if not answer["ok"]:
            raise AssertionError(f"{op} failed ({status}): {answer['error']}")
        return answer["result"]


def run_cli(broker: BrokerProcess | None, *args: str, user: str | None = ADMIN, password: str | None = ADMIN_PW,
            env: dict | None = None, stdin: str | None = None, url: str | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
    """``pymq-admin --url <broker> [--user --password] args...`` as a process."""
    cmd = [sys.executable, "-m", "pymq_server.admin.cli"]
    if url is not None or broker is not None:
        cmd += ["--url", url or broker.admin_url]
    if user is not None:
        cmd += ["--user", user]
    if password is not None:
        cmd += ["--password", password]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYMQ_ADMIN_")}
    full_env["HOME"] = full_env.get("PYMQ_TEST_HOME", "/nonexistent-home")   # no personal config file
    full_env.update(env or {})
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout, env=full_env,
                          input=stdin)


def cli_json(broker: BrokerProcess, *args: str, **kw):
    result = run_cli(broker, "--json", *args, **kw)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def broker_process(tmp_path_factory):
    """One broker process per test module, with an administrator and an application user."""
    broker = BrokerProcess(tmp_path_factory.mktemp("broker"),
                           users={ADMIN: (ADMIN_PW, ["admin"]), APP: (APP_PW, ["app"])},
                           config={"queues": {"limited": {"max_depth": 2, "overflow": "reject"}}})
    broker.start()
    yield broker
    assert broker.stop() == 0, "".join(broker.log[-30:])


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()
