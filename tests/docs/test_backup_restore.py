"""docs/backup-restore.md is true: a clean stop, a copy of the data directory and a broker started on the
copy keep every persistent message, declared queue and durable subscription; a second broker cannot open
a directory one holds."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys

import pymq
from tests.broker.test_reload import ServerProcess


def test_cold_copy_and_restore(tmp_path):
    live = tmp_path / "live"
    server = ServerProcess(["--port", "0", "--data-dir", str(live)], tmp_path)
    with pymq.connect(server.url, client_id="archiver") as conn:
        session = conn.create_session()
        conn.queue_manager().create("invoices", max_deliveries=3)
        session.create_durable_consumer(pymq.Topic("audit"), "trail").close()
        producer = session.create_producer()
        for i in range(50):
            producer.send(f"invoice {i}", pymq.Queue("invoices"))
        producer.send("audit entry", pymq.Topic("audit"))
    # a second broker on the same directory is refused while the first holds it
    second = subprocess.run([sys.executable, "-m", "pymq_server.cli", "--port", "0", "--data-dir", str(live)],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert second.returncode == 1 and "in use by another process" in second.stderr
    # the documented cold backup: stop cleanly, copy, (start again)
    assert server.stop() == 0
    backup = tmp_path / "backup"
    shutil.copytree(live, backup, symlinks=True)
    # ... later, everything on the live broker is lost; restore the copy and start on it
    shutil.rmtree(live)
    shutil.copytree(backup, live, symlinks=True)
    restored = ServerProcess(["--port", "0", "--data-dir", str(live)], tmp_path)
    try:
        assert any("recovered 51 persistent messages" in line for line in restored.seen), restored.seen
        with pymq.connect(restored.url, client_id="archiver") as conn:
            session = conn.create_session()
            consumer = session.create_consumer(pymq.Queue("invoices"))
            got = [consumer.receive(5).text for _ in range(50)]
            assert got == [f"invoice {i}" for i in range(50)]
            assert conn.queue_manager().info("invoices")["config"]["max_deliveries"] == 3
            trail = session.create_durable_consumer(pymq.Topic("audit"), "trail")
            assert trail.receive(5).text == "audit entry"
    finally:
        restored.proc.send_signal(signal.SIGTERM)
        restored.proc.wait(30)
