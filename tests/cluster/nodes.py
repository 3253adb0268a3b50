"""Start real pymq-server processes as cluster nodes on loopback (membership in the test Redis)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import yaml

import pymq
from tests.conftest import wait_for


class Node:
    def __init__(self, node_id: str, data_dir: str, cluster: dict, extra: dict | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.node_id = node_id
        self.env = env                   # the process's environment (None: this one's; given: started in
                                         # its data directory, so the current one's packages do not shadow it)
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

    def start(self, port: int = 0) -> Node:
        data_dir = self.data_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pymq_server.cli", "--port", str(port), "--data-dir", self.data_dir,
             "--config", self.config_path], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env=self.env, cwd=None if self.env is None else data_dir)
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


def cluster_cfg(store_url: str, **over) -> dict:
    cfg = {"store": store_url, "secret": "test-secret", "name": f"t{uuid.uuid4().hex[:8]}",
           "heartbeat_ms": 200, "dead_after_ms": 1200}
    cfg.update(over)
    return cfg


def status(node: Node) -> dict:
    """The node's admin ``cluster`` operation."""
    with pymq.connect(node.url) as conn:
        return conn.queue_manager().call("cluster")


def start_cluster(tmp_path, store_url: str, n: int = 3, **over) -> tuple[list[Node], dict]:
    """n nodes n0..n(n-1) that all see each other with links up."""
    cfg = cluster_cfg(store_url, **over)
    nodes = [Node(f"n{i}", str(tmp_path / f"n{i}"), cfg).start() for i in range(n)]
    ids = {f"n{i}" for i in range(n)}
    for node in nodes:
        def joined(node: Node = node) -> bool:
            seen = status(node)
            return set(seen["members"]) == ids and all(seen["links"].values()) and len(seen["links"]) == n - 1
        assert wait_for(joined, timeout=10), status(node)
    return nodes, cfg


def wait_topic_seen(node: Node, topic: str, by: list[Node], timeout: float = 10) -> None:
    """Until ``topic`` is in ``node``'s filter and every node of ``by`` holds that announcement (or a later
    one) of ``node``'s digest: from then on they forward the topic's messages to it."""
    assert wait_for(lambda: topic in status(node)["filter_topics"], timeout=timeout), status(node)
    serial = status(node)["filter"]["serial"]
    for peer in by:
        def holds(peer: Node = peer) -> bool:
            return ((status(peer)["peer_filters"].get(node.node_id) or {}).get("serial") or 0) >= serial
        assert wait_for(holds, timeout=timeout), status(peer)["peer_filters"]


def wait_consumers_seen(node: Node, queue: str, by: list[Node], timeout: float = 10) -> None:
    """Until every node of ``by`` knows that ``node`` has a consumer of ``queue`` (its consumer map)."""
    for peer in by:
        def knows(peer: Node = peer) -> bool:
            return status(peer)["remote_consumers"].get("/queue/" + queue, {}).get(node.node_id, 0) > 0
        assert wait_for(knows, timeout=timeout), status(peer)["remote_consumers"]


def wait_heartbeats(nodes: list[Node], rounds: int, timeout: float = 30) -> None:
    """Until each node has read the cluster store ``rounds`` more times (its heartbeat: time passing,
    measured by the nodes themselves rather than slept by the test)."""
    before = {node.node_id: status(node)["heartbeats"] for node in nodes}
    for node in nodes:
        def beaten(node: Node = node) -> bool:
            return status(node)["heartbeats"] >= before[node.node_id] + rounds
        assert wait_for(beaten, timeout=timeout, interval=0.05), status(node)["heartbeats"]
