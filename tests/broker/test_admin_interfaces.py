"""The admin interfaces: HTTP (with Prometheus metrics) and the STOMP admin destination used by a
client nobody here wrote (stomp.py)."""
from __future__ import annotations

import base64
import json
import queue
import urllib.error
import urllib.request

import pytest
import stomp

import pymq


def _http(broker, method, path, body=None, user="guest", password="guest"):
    req = urllib.request.Request(f"http://127.0.0.1:{broker.server.admin_port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None)
    if user is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def admin_broker(broker_factory):
    return broker_factory(admin_port=0)


def test_http_admin_and_prometheus(admin_broker):
    status, text = _http(admin_broker, "POST", "/api/create-queue", {"name": "billing",
                                                                     "config": {"max_deliveries": 4}})
    assert status == 200 and json.loads(text)["result"]["created"] is True
    with pymq.connect(admin_broker.url) as conn:
        p = conn.create_session().create_producer(pymq.Queue("billing"))
        for i in range(3):
            p.send(str(i))
    status, text = _http(admin_broker, "GET", "/api/queues/billing")
    info = json.loads(text)["result"]
    assert status == 200 and info["metrics"]["depth"] == 3 and info["config"]["max_deliveries"] == 4
    status, text = _http(admin_broker, "GET", "/metrics")
    assert status == 200
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    assert samples['pymq_queue_depth{queue="/queue/billing",vhost="/"}'] == 3
    assert samples['pymq_queue_added_total{queue="/queue/billing",vhost="/"}'] == 3
    assert "# TYPE pymq_queue_failed_total counter" in text
    # errors and authentication
    status, text = _http(admin_broker, "POST", "/api/create-queue", {"name": "billing",
                                                                     "config": {"max_deliveries": 9}})
    assert status == 400 and json.loads(text)["error"]["code"] == "destination-exists"
    assert _http(admin_broker, "GET", "/api/queues/nope")[0] == 404
    assert _http(admin_broker, "GET", "/metrics", user=None)[0] == 401
    assert _http(admin_broker, "GET", "/api/queues", password="wrong")[0] == 401
    status, text = _http(admin_broker, "POST", "/api/no-such-op", {})
    assert status == 400 and "unknown admin operation" in text


def test_stomp_admin_destination_from_stomp_py(admin_broker):
    replies: queue.Queue = queue.Queue()

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            replies.put(frame)

    c = stomp.Connection12([("127.0.0.1", admin_broker.port)], heartbeats=(0, 0))
    c.set_listener("l", Listener())
    c.connect("guest", "guest", wait=True)
    c.subscribe("/temp-queue/admin-replies", id="r", ack="auto")
    c.send("/pymq/admin", json.dumps({"name": "from-stomp-py", "config": {"max_depth": 10,
                                                                        "overflow": "reject"}}),
           headers={"pymq-admin-op": "create-queue", "reply-to": "/temp-queue/admin-replies",
                    "correlation-id": "c1"})
    answer = replies.get(timeout=5)
    assert answer.headers["correlation-id"] == "c1"
    assert json.loads(answer.body)["result"]["queue"]["config"]["max_depth"] == 10
    # a refused request is an answer, not an ERROR: the connection stays usable
    c.send("/pymq/admin", json.dumps({"name": "nope"}), headers={
        "pymq-admin-op": "drop-queue", "reply-to": "/temp-queue/admin-replies", "correlation-id": "c2"})
    answer = json.loads(replies.get(timeout=5).body)
    assert answer["ok"] is False and answer["error"]["code"] == "unknown-destination"
    c.send("/queue/from-stomp-py", "still connected")
    c.disconnect()
    with pymq.connect(admin_broker.url) as conn:
        assert conn.create_session().create_consumer(pymq.Queue("from-stomp-py")).receive(5).text == \
            "still connected"
