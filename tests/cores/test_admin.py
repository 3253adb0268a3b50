"""The admin port of a multi-worker broker answers for every worker: /metrics sums, the listings join
(spec/cores.md §3.7)."""
from __future__ import annotations

import base64
import json
import re
import urllib.request

from tests.cores.conftest import owned_by, start_broker, stop_broker
from tests.cores.test_cross_shard import _passwd
from tests.conftest import wait_for
from tests.cores.test_forwarding import _receipt


def _with_admin_port(tmp_path):
    """A 2-worker broker with an admin port and the administrator alice: (the broker, its admin port).
    The admin port binds port 0 and worker 0 says which one it got (no port picked free, then lost)."""
    users = tmp_path / "users.yaml"
    _passwd(users, "alice", "alice-pw", "admin")
    cluster = start_broker(str(tmp_path / "data"), "--users-file", str(users), "--admin-port", "0")
    said = re.findall(r"^pymq-server admin listening on http://127\.0\.0\.1:(\d+)/$", "".join(cluster.stderr), re.M)
    assert len(said) == 1 and int(said[0]) > 0, "".join(cluster.stderr)
    return cluster, int(said[0])


def _get(port: int, path: str) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"alice:alice-pw").decode())
    with urllib.request.urlopen(req, timeout=20) as resp:   # noqa: S310 - a local test server
        return resp.read().decode()


def test_metrics_and_listings_cover_every_worker(tmp_path):
    cluster, admin_port = _with_admin_port(tmp_path)
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
            m = re.search(r'^pymq_queue_depth\{queue="' + re.escape(dest) + r'",vhost="/"\} (\S+)$', text, re.M)
            assert m and float(m.group(1)) == 3.0, dest
        assert len(re.findall(r"^# TYPE pymq_queue_depth ", text, re.M)) == 1      # one family, merged
        ready = re.search(r"^pymq_ready (\S+)$", text, re.M)
        assert ready and float(ready.group(1)) == 1.0                           # not summed
    finally:
        stop_broker(cluster)


def _post(port: int, op: str, args: dict, auth: bytes = b"alice:alice-pw") -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/{op}", data=json.dumps(args).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    req.add_header("Authorization", "Basic " + base64.b64encode(auth).decode())
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:   # noqa: S310 - a local test server
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def test_queue_operations_run_at_the_owner_and_users_reach_every_worker(tmp_path):
    cluster, admin_port = _with_admin_port(tmp_path)
    try:
        far = owned_by(1, prefix="/queue/made.")[0]
        name = far[len("/queue/"):]
        made = _post(admin_port, "create-queue", {"name": name, "config": {"max_depth": 5}})
        assert made["ok"], made
        info = json.loads(_get(admin_port, f"/api/queues/{name}"))        # answered by worker 1
        assert info["ok"] and info["result"]["config"]["max_depth"] == 5, info
        listed = [q["destination"] for q in json.loads(_get(admin_port, "/api/queues"))["result"]]
        assert listed.count(far) == 1, listed
        # the STOMP admin destination, from a connection whose home is worker 0: also at the owner
        other = owned_by(1, prefix="/queue/made.", start=int(name.split(".")[-1]) + 1)[0]
        c = cluster.connect(0, login="alice", passcode="alice-pw")
        c.send("SUBSCRIBE", {"destination": "/temp-queue/answers", "id": "a"})
        c.send("SEND", {"destination": "/pymq/admin", "pymq-admin-op": "create-queue",
                        "reply-to": "/temp-queue/answers"},
               json.dumps({"name": other[len("/queue/"):]}).encode())
        answer = c.read()
        assert answer.command == "MESSAGE" and json.loads(answer.body)["ok"], answer
        info = json.loads(_get(admin_port, f"/api/queues/{other[len('/queue/'):]}"))
        assert info["ok"], info
        moved = _post(admin_port, "move-messages", {"from": name, "to": owned_by(0, prefix="/queue/made.")[0]})
        assert not moved["ok"] and "between workers" in moved["error"]["message"], moved
        # a user added through worker 0 logs in on worker 1 at once (every worker reloads the users file)
        added = _post(admin_port, "add-user", {"name": "dave", "password": "dave-pw-123", "roles": ["app"]})
        assert added["ok"], added
        d = cluster.connect(1, login="dave", passcode="dave-pw-123")
        d.send("DISCONNECT", {"receipt": "x"})
        assert d.read().command == "RECEIPT"
    finally:
        stop_broker(cluster)


def test_dead_letters_belong_to_the_owner_of_their_queue(tmp_path):
    cfg = tmp_path / "broker.yaml"
    cfg.write_text("queue_defaults: {max_deliveries: 1}\n")
    cluster = start_broker(str(tmp_path / "data"), "--config", str(cfg))
    try:
        dest = owned_by(1, prefix="/queue/poison.")[0]
        c = cluster.connect(0)
        c.send("SUBSCRIBE", {"destination": dest, "id": "s", "ack": "client-individual"})
        c.send("SEND", {"destination": dest, "receipt": "p"}, b"poison")
        frames = [c.read(), c.read()]
        m = next(f for f in frames if f.command == "MESSAGE")
        c.send("NACK", {"id": m.headers["ack"], "receipt": "n"})
        _receipt(c, "n")
        d = cluster.connect(0)
        d.send("SUBSCRIBE", {"destination": "/queue/DLQ." + dest[len("/queue/"):], "id": "dlq"})
        dead = d.read()
        assert dead.command == "MESSAGE" and dead.body == b"poison", dead
    finally:
        stop_broker(cluster)


def test_a_consumer_that_does_not_read_stops_its_remote_owner(tmp_path):
    """A client whose output is full at its home (it does not read) makes the owner stop dispatching to
    it (FULL), so the messages stay in the owner's queue instead of piling up in the home; once it reads,
    everything arrives, in order."""
    from tests.conftest import RawStomp
    cluster, admin_port = _with_admin_port(tmp_path)
    try:
        dest = owned_by(1, prefix="/queue/slow.")[0]
        name = dest[len("/queue/"):]
        count, size = 600, 32 * 1024                    # 19 MiB: far over a connection's 1 MiB mark
        consumer = None
        for _ in range(200):                            # a consumer with a small window, homed at worker 0
            c = RawStomp(cluster.port, rcvbuf=16 * 1024)
            if c.connect("alice", "alice-pw").headers.get("pymq-worker") == "0":
                consumer = c
                break
            c.sock.close()
        assert consumer is not None
        consumer.send("SUBSCRIBE", {"destination": dest, "id": "s", "ack": "auto"})   # and it reads no more
        p = cluster.connect(1, login="alice", passcode="alice-pw")
        body = b"x" * size
        for i in range(count):
            p.send("SEND", {"destination": dest, "persistent": "false", "seq": str(i)}, body)
        p.send("SEND", {"destination": dest, "persistent": "false", "seq": "end", "receipt": "r"}, b"x")
        _receipt(p, "r", timeout=60)

        def read_depth() -> int:
            return json.loads(_get(admin_port, f"/api/queues/{name}"))["result"]["metrics"]["depth"]
        seen: list[int] = []
        # dispatch has settled: the depth read twice in a row, 0.1 s apart, is the same (bounded)
        assert wait_for(lambda: seen.append(read_depth()) or len(seen) > 1 and seen[-1] == seen[-2], 10, 0.1), seen
        depth = seen[-1]
        assert depth > count // 2, depth                # most are still at the owner, not in the home
        got = []
        consumer.sock.settimeout(30)
        while len(got) < count + 1:
            f = consumer.read(30)
            assert f.command == "MESSAGE", f
            got.append(f.headers["seq"])
        assert got == [str(i) for i in range(count)] + ["end"]
    finally:
        stop_broker(cluster)
