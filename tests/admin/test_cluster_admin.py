"""``pymq-admin cluster members`` and the console's cluster figures against two real nodes (membership in
the test Redis)."""
from __future__ import annotations

import re
import uuid

from tests.admin.conftest import cli_json, run_cli, wait_until
from tests.cluster.nodes import Node
from tests.storage.services import redis_url  # noqa: F401 - fixture


class AdminNode(Node):
    @property
    def admin_url(self) -> str:
        for line in self.log:
            m = re.search(r"admin and metrics on (http://127\.0\.0\.1:\d+)/", line)
            if m:
                return m.group(1)
        raise AssertionError("no admin port in the log:\n" + "".join(self.log))


def test_cluster_members(tmp_path, redis_url):  # noqa: F811
    cluster = {"store": redis_url, "secret": "s", "name": f"adm{uuid.uuid4().hex[:8]}",
               "heartbeat_ms": 200, "dead_after_ms": 1200}
    nodes = [AdminNode(f"a{i}", str(tmp_path / f"a{i}"), cluster, {"admin_port": 0}).start() for i in range(2)]
    try:
        first = nodes[0]
        assert wait_until(lambda: (lambda s: s["members"] == ["a0", "a1"] and all(s["links"].values()))(
            cli_json(first, "cluster", "members", user=None, password=None)), timeout=15)
        human = run_cli(first, "cluster", "members", user=None, password=None).stdout.splitlines()
        assert human[0].split() == ["NODE", "THIS", "LINK", "OUTBOX"]
        assert human[1].split()[:3] == ["a0", "yes", "-"] and human[2].split()[:3] == ["a1", "no", "up"]
        status = cli_json(first, "status", user=None, password=None)
        assert status["cluster"] == {"members": ["a0", "a1"]}
        assert "a0, a1" in run_cli(first, "status", user=None, password=None).stdout
    finally:
        for node in nodes:
            node.stop()
