"""``log_format: json``: every line a broker process writes to stderr is one JSON object, from start-up
to a clean stop; the formatter keeps multi-line messages and tracebacks inside one record."""
from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time

import yaml

import pymq
from pymq_server.logs import JsonFormatter, configure_logging


def test_json_formatter_keeps_each_record_on_one_line():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)          # pytest's capture handlers stay in place after
    stream = io.StringIO()
    configure_logging("DEBUG", "json", stream)
    try:
        log = logging.getLogger("pymq.test")
        log.info('two\nlines and "quotes"', extra={"queue": "/queue/a", "depth": 3, "obj": object()})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == 'two\nlines and "quotes"' and first["level"] == "INFO"
    assert first["logger"] == "pymq.test" and first["queue"] == "/queue/a" and first["depth"] == 3
    assert "obj" not in first                                       # not JSON: left out, not repr'd
    assert first["ts"].endswith("Z") and len(first["ts"]) == len("2026-01-01T00:00:00.000Z")
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exc"]
    assert isinstance(JsonFormatter().format(logging.makeLogRecord({"msg": "x"})), str)


def test_a_broker_process_logs_json_from_start_to_stop(tmp_path):
    cfg = tmp_path / "broker.yaml"
    cfg.write_text(yaml.safe_dump({"log_format": "json", "admin_port": 0}))
    proc = subprocess.Popen([sys.executable, "-m", "pymq_server.cli", "--port", "0", "--config", str(cfg),
                             "--data-dir", str(tmp_path / "data")], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    port = None
    deadline = time.monotonic() + 60
    while port is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        record = json.loads(line)
        if record["message"].startswith("pymq-server listening on 127.0.0.1:") and "(" not in record["message"]:
            port = int(record["message"].rsplit(":", 1)[1])
    assert port, "".join(lines)
    with pymq.connect(f"stomp://127.0.0.1:{port}") as conn:
        conn.queue_manager().create("logged")
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=30)
    assert proc.returncode == 0
    lines += rest.splitlines(keepends=True)
    records = [json.loads(line) for line in lines if line.strip()]   # every line parses
    messages = [r["message"] for r in records]
    assert any(m.startswith("admin and metrics on http://127.0.0.1:") for m in messages)
    assert "admin create-queue by guest: ok" in messages
    assert messages[-1] == "pymq-server stopped"
    assert {r["level"] for r in records} <= {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


def test_log_format_is_checked(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pymq_server.cli", "--log-format", "loud", "--port", "0",
                          "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=30,
                         env={**os.environ})
    assert out.returncode == 2 and "log_format = 'loud': expected 'text' or 'json'" in out.stderr
