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
