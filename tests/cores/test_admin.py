"""The admin port of a multi-worker broker answers for every worker: /metrics sums, the listings join
(spec/cores.md §3.7)."""
from __future__ import annotations

import base64
import json
import re
import socket
import urllib.request

from tests.cores.conftest import owned_by, start_broker, stop_broker
from tests.cores.test_cross_shard import _passwd
from tests.cores.test_forwarding import _receipt


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"alice:alice-pw").decode())
    with urllib.request.urlopen(req, timeout=20) as resp:   # noqa: S310 - a local test server
        return resp.read().decode()


def test_metrics_and_listings_cover_every_worker(tmp_path):
    users = tmp_path / "users.yaml"
    _passwd(users, "alice", "alice-pw", "admin")
    admin_port = _free_port()
    cluster = start_broker(str(tmp_path / "data"), "--users-file", str(users), "--admin-port", str(admin_port))
    try:
        queues = {k: owned_by(k, prefix="/queue/admin.")[0] for k in (0, 1)}
        p = cluster.connect(1, login="alice", passcode="alice-pw")
        for k, dest in queues.items():
            for _ in range(k + 2):                  # 2 messages on worker 0's queue, 3 on worker 1's
                p.send("SEND", {"destination": dest}, b"x")
        p.send("SEND", {"destination": queues[0], "receipt": "r"}, b"x")
        _receipt(p, "r")
        listed = json.loads(_get(admin_port, "/api/queues"))["result"]
        depth = {q["destination"]: q["depth"] for q in listed}
        assert depth[queues[0]] == 3 and depth[queues[1]] == 3, listed
        text = _get(admin_port, "/metrics")
        for dest in queues.values():
            m = re.search(r'^pymq_queue_depth\{queue="%s"\} (\S+)$' % re.escape(dest), text, re.M)
            assert m and float(m.group(1)) == 3.0, dest
        assert len(re.findall(r"^# TYPE pymq_queue_depth ", text, re.M)) == 1      # one family, merged
        ready = re.search(r"^pymq_ready (\S+)$", text, re.M)
        assert ready and float(ready.group(1)) == 1.0                           # not summed
    finally:
        stop_broker(cluster)
