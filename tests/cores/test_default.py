"""One worker is today's broker: nothing of server/cores is loaded, no supervisor, no new header; and the
multi-worker settings it cannot honour are refused before anything starts."""
from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from tests.client.tls import Authority
from tests.conftest import RawStomp


def test_the_one_process_broker_does_not_load_the_multi_worker_code():
    out = subprocess.run([sys.executable, "-c", "import sys, pymq_server.cli, pymq_server.app, pymq_server.net.tcp; "
                          "print(sorted(m for m in sys.modules if m.startswith('pymq_server.cores')))"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_workers_1_is_the_one_process_broker(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "pymq_server.cli", "--port", "0", "--data-dir", str(tmp_path / "d"),
                             "--workers", "1", "--log-level", "WARNING"], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", proc.stderr.readline())
            port = int(m.group(1)) if m else None
        assert port is not None
        assert subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout == ""
        c = RawStomp(port)
        frame = c.connect()
        assert frame.command == "CONNECTED" and "pymq-worker" not in frame.headers
        assert "pymq-placement" not in frame.headers and "pymq-workers" not in frame.headers
        assert frame.headers["session"].startswith("c")
        c.sock.close()
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("setting,why", [
    ("cluster: {store: 'redis://127.0.0.1:1/0', secret: s3cret}\n", "`cluster`"),
    ("websocket: {port: 0}\n", "`websocket`"),
    ("tls_port: 0\ntls: {cert_file: CERT, key_file: KEY}\n", "`tls_port: 0`"),
])
def test_settings_the_workers_cannot_honour_are_refused(tmp_path, setting, why):
    if "CERT" in setting:       # a real pair: the TLS files are opened and matched before the workers' rule
        issued = Authority(tmp_path).issue("broker", ips=("127.0.0.1",))
        setting = setting.replace("CERT", str(issued.cert)).replace("KEY", str(issued.key))
    cfg = tmp_path / "broker.yaml"
    cfg.write_text(setting)
    done = subprocess.run([sys.executable, "-m", "pymq_server.cli", "--port", "0", "--data-dir", str(tmp_path / "d"),
                           "--workers", "2", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "workers: 2 cannot be combined with" in done.stderr and why in done.stderr, done.stderr


def test_another_worker_count_on_the_same_data_is_refused(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "cores.json").write_text('{"workers": 3}')
    done = subprocess.run([sys.executable, "-m", "pymq_server.cli", "--port", "0", "--data-dir", str(data),
                           "--workers", "2"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "was written by 3 workers, not 2" in done.stderr, done.stderr
    single = tmp_path / "single"
    (single / "file").mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "pymq_server.cli", "--port", "0", "--data-dir", str(single),
                           "--workers", "2"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "one-process broker's storage" in done.stderr, done.stderr
