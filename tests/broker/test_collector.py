"""A broker process tunes Python's cyclic collector (pymq_server.app.COLLECTOR_THRESHOLDS); an embedded
broker leaves its host's collector as it was."""
from __future__ import annotations

import gc
import uuid

import pymq
from pymq_server import cli
from pymq_server.app import COLLECTOR_THRESHOLDS


def test_the_server_process_runs_with_the_broker_thresholds(monkeypatch, tmp_path):
    seen: list[tuple[int, int, int]] = []

    def run(coro):
        seen.append(gc.get_threshold())
        coro.close()            # the broker itself is not started: only the process set-up is under test

    before = gc.get_threshold()
    monkeypatch.setattr(cli.asyncio, "run", run)
    monkeypatch.setattr(cli, "configure_logging", lambda *a: None)   # pytest's captured stderr closes
    try:
        assert cli.main(["--port", "0", "--data-dir", str(tmp_path), "--no-uvloop"]) == 0
    finally:
        gc.set_threshold(*before)
    assert seen == [COLLECTOR_THRESHOLDS]
    assert COLLECTOR_THRESHOLDS != (700, 10, 10) and COLLECTOR_THRESHOLDS[0] > 700


def test_an_embedded_broker_leaves_the_host_collector_alone():
    before = gc.get_threshold()
    with pymq.connect(f"vm://collector-{uuid.uuid4().hex[:8]}") as conn:
        session = conn.create_session()
        queue = pymq.Queue("collector.q")
        session.create_producer(queue).send(session.create_text_message("x"))
        assert session.create_consumer(queue).receive(5.0).text == "x"
        assert gc.get_threshold() == before
    assert gc.get_threshold() == before


# -- after start-up: what start-up made is out of the collector (issue 30 item 4) ---------------------------

def _started(owns_process: bool, tmp_path) -> int:
    """Start and stop a broker in this process; the freeze count while it ran."""
    import asyncio

    from pymq_server.app import BrokerServer
    from pymq_server.config import BrokerConfig

    async def run() -> int:
        server = BrokerServer(BrokerConfig.from_dict(dict(host="127.0.0.1", port=0, data_dir=str(tmp_path))))
        server.owns_process = owns_process
        await server.start()
        try:
            return gc.get_freeze_count()
        finally:
            await server.stop()
    return asyncio.run(run())


def test_a_broker_that_owns_its_process_freezes_what_start_up_made(tmp_path):
    before = gc.get_freeze_count()
    try:
        assert _started(True, tmp_path) > before
    finally:
        gc.unfreeze()           # this test process's objects back under the collector


def test_an_embedded_broker_freezes_nothing(tmp_path):
    before = gc.get_freeze_count()
    assert _started(False, tmp_path) == before


def _collector_lines(tmp_path, *extra: str, until: str) -> list[str]:
    """A real ``pymq-server`` at INFO: its start-up's stderr lines up to the one containing ``until``."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"                    # a worker's channel directory under the test's own
    run.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "pymq_server.cli", "--port", "0", "--data-dir",
                             str(tmp_path / "d"), "--log-level", "INFO", *extra], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env={**os.environ, "TMPDIR": str(run)},
                            start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            lines.append(line)
            if until in line:
                return [x for x in lines if "collector:" in x]
        raise AssertionError("the broker did not start:\n" + "".join(lines))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_the_one_process_broker_freezes_its_start_up(tmp_path):
    lines = _collector_lines(tmp_path, until="pymq-server listening")
    assert len(lines) == 1, lines
    assert int(lines[0].split("collector: ")[1].split()[0]) > 1000


def test_every_worker_freezes_its_start_up(tmp_path):
    lines = _collector_lines(tmp_path, "--workers", "2", until="pymq-server workers:")
    assert len(lines) == 2, lines           # once in each worker (the supervisor runs no broker)
    assert all(int(x.split("collector: ")[1].split()[0]) > 1000 for x in lines)
