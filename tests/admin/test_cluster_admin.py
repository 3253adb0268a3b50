"""``pymq-admin cluster members / outboxes / purge-outbox`` against real nodes (membership in the test
Redis), including a dead peer whose durable subscriber's messages are held."""
from __future__ import annotations

import re
import uuid

import pymq
from tests.admin.conftest import cli_json, run_cli, wait_until
from tests.cluster.nodes import Node, status
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


def hold_for_dead_peer(alive: Node, dead: Node, messages: int) -> str:
    """A durable subscriber on ``dead``, which is then killed; ``messages`` published on ``alive`` are held
    for it (spec/cluster.md §5).  Returns the topic."""
    topic = pymq.Topic(f"held.{uuid.uuid4().hex[:6]}")
    with pymq.connect(dead.url, client_id="watcher") as conn:
        conn.create_session().create_durable_consumer(topic, "inbox").close()
    assert wait_until(lambda: status(alive)["assignments"].get("sub:watcher:inbox") == dead.node_id, timeout=10)
    with pymq.connect(dead.url) as conn:          # receipted: the subscription's record is on disk
        conn.create_session().create_producer(topic).send("stored on the subscriber's node")
    dead.kill()
    assert wait_until(lambda: dead.node_id not in status(alive)["members"], timeout=10)
    with pymq.connect(alive.url) as conn:
        producer = conn.create_session().create_producer(topic)
        for i in range(messages):
            producer.send(f"while dead {i}")
    return topic.name


def test_cluster_outboxes_held_for_a_dead_peer_and_purged(tmp_path, redis_url):  # noqa: F811
    cluster = {"store": redis_url, "secret": "s", "name": f"adm{uuid.uuid4().hex[:8]}",
               "heartbeat_ms": 200, "dead_after_ms": 1200}
    nodes = [AdminNode(f"h{i}", str(tmp_path / f"h{i}"), cluster, {"admin_port": 0}).start() for i in range(2)]
    alive, dead = nodes
    try:
        assert wait_until(lambda: all(cli_json(alive, "cluster", "members", user=None, password=None)["links"].values())
                          and len(status(alive)["members"]) == 2, timeout=15)
        live = cli_json(alive, "cluster", "outboxes", user=None, password=None)
        assert [(o["node"], o["state"], o["held"]) for o in live] == [("h1", "alive", False)]
        hold_for_dead_peer(alive, dead, 3)
        held = cli_json(alive, "cluster", "outboxes", user=None, password=None)[0]
        assert (held["node"], held["state"], held["held"], held["messages"]) == ("h1", "dead", True, 3)
        assert held["subscriptions"] == ["sub:watcher:inbox"]
        human = run_cli(alive, "cluster", "outboxes", user=None, password=None).stdout.splitlines()
        assert human[0].split()[:4] == ["PEER", "STATE", "HELD", "MESSAGES"]
        assert human[1].split()[:4] == ["h1", "dead", "yes", "3"]
        itself = run_cli(alive, "cluster", "purge-outbox", "h0", user=None, password=None)
        assert itself.returncode == 1 and "illegal-state" in itself.stderr
        purged = run_cli(alive, "cluster", "purge-outbox", "h1", "--forget", user=None, password=None)
        assert purged.returncode == 0
        assert purged.stdout.strip() == "purged 3 message(s) held for h1; its membership record is forgotten"
        assert cli_json(alive, "cluster", "outboxes", user=None, password=None)[0]["messages"] == 0
    finally:
        for node in nodes:
            node.stop()
            node.kill()
