"""Start real pymq-server processes as cluster nodes on loopback (membership in the test Redis)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import yaml


class Node:
    def __init__(self, node_id: str, data_dir: str, cluster: dict, extra: dict | None = None) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        os.makedirs(data_dir, exist_ok=True)
        cfg = {"node_id": node_id, "cluster": cluster, "log_level": "INFO"}
        cfg.update(extra or {})
        self.config_path = os.path.join(data_dir, "broker.yaml")
        with open(self.config_path, "w") as fh:
            yaml.safe_dump(cfg, fh)
        self.log: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    def start(self, port: int = 0) -> "Node":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pymq_server.cli", "--port", str(port), "--data-dir", self.data_dir,
             "--config", self.config_path], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                break
            self.log.append(line)
            m = re.search(r"pymq-server listening on 127\.0\.0\.1:(\d+)$", line.strip())
            if m:
                self.port = int(m.group(1))
                threading.Thread(target=self._drain, daemon=True).start()
                return self
        raise RuntimeError(f"node {self.node_id} did not start:\n{''.join(self.log)}")

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)

    @property
    def url(self) -> str:
        return f"stomp://127.0.0.1:{self.port}"

    def stop(self, timeout: float = 20) -> None:
        """A clean leave (SIGTERM): hand-over, then exit."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
