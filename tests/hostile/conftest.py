"""A broker in a child process, for input that could crash or freeze it.

An in-process broker that segfaults takes pytest with it, and one that freezes its event loop hangs
the test thread; a ``pymq-server`` child turns both into a failing test: the test sees the process
gone (``returncode`` is the signal) or a deadline pass, and the fixture kills what is left.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest


@dataclass
class BrokerProcess:
    proc: subprocess.Popen
    port: int
    ws_port: int | None = None          # the WebSocket listener's, when the configuration has one

    @property
    def url(self) -> str:
        return f"stomp://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:      # a frozen loop cannot run its SIGTERM handler
                self.proc.kill()
                self.proc.wait(10)

    def describe(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "the broker is running"
        if code < 0:
            return f"the broker died of {signal.Signals(-code).name}"
        return f"the broker exited with {code}"


def start_broker(tmp_path, *args: str, env: dict[str, str] | None = None, websocket: bool = False) -> BrokerProcess:
    """``websocket``: the broker also listens for STOMP over WebSocket on a free port (``ws_port``)."""
    if websocket or not any(arg == "--config" for arg in args):
        config = tmp_path / "hostile.yaml"
        # a vhost the fuzzer's CONNECTs select (fuzzing.FUZZ_VHOSTS)
        config.write_text(("websocket: {port: 0}\n" if websocket else "") + "vhosts: {fuzz: ['*']}\n")
        args = ("--config", str(config), *args)
    log = open(tmp_path / "broker.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "pymq_server.cli", "--port", "0", "--data-dir",
                             str(tmp_path / "data"), *args], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=log, text=True, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        log.seek(0)
        text = log.read()
        m = re.search(r"pymq-server listening on 127\.0\.0\.1:(\d+)", text)
        ws = re.search(r"pymq-server websocket listening on ws://127\.0\.0\.1:(\d+)", text)
        if m and (ws or not websocket):
            return BrokerProcess(proc, int(m.group(1)), int(ws.group(1)) if ws else None)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    log.seek(0)
    raise AssertionError("broker did not start:\n" + log.read())


@pytest.fixture
def broker_process(tmp_path):
    started: list[BrokerProcess] = []

    def make(*args: str) -> BrokerProcess:
        bp = start_broker(tmp_path, *args)
        started.append(bp)
        return bp

    yield make
    for bp in started:
        bp.stop()
