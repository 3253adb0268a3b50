"""Prometheus export and health probes, scraped from a real broker process and parsed with
prometheus_client's own parser: per-queue ready / in-flight / delivered / acknowledged / dead-lettered /
expired / scheduled, topic and subscription counts, process_* and build info; /healthz and /readyz,
including a broker whose storage device goes away and comes back."""
from __future__ import annotations

import json
import uuid
from urllib.parse import urlsplit, urlunsplit

from prometheus_client.parser import text_string_to_metric_families

import pymq
from tests.admin.conftest import ADMIN, ADMIN_PW, APP, APP_PW, BrokerProcess, cli_json, run_cli, wait_until
from tests.storage.services import TcpProxy, redis_url  # noqa: F401 - fixture


def scrape(b, user=ADMIN, password=ADMIN_PW) -> dict:
    status, raw, headers = b.http("GET", "/metrics", user=user, password=password)
    assert status == 200, raw
    assert headers["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(raw.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def test_queue_topic_process_and_build_metrics(broker_process):
    b = broker_process
    q = {"queue": "/queue/m.work", "vhost": "/"}
    b.op("create-queue", name="m.work", config={"max_deliveries": 1})
    with pymq.connect(b.url, username=ADMIN, password=ADMIN_PW, client_id="m-client") as conn:
        session = conn.create_session()
        producer = session.create_producer(pymq.Queue("m.work"))
        for i in range(5):
            producer.send(session.create_text_message(f"m{i}", properties={"n": i}))
        producer.send("later", delivery_delay=600_000)                       # scheduled
        session.create_producer(pymq.Queue("m.expiring")).send("short", time_to_live=50)
        # selectors pick one message each: an auto-ack consumer would take everything at once
        auto = session.create_consumer(pymq.Queue("m.work"), "n = 0")
        assert auto.receive(5).text == "m0"                                  # delivered + acknowledged
        auto.close()
        held_session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        held = held_session.create_consumer(pymq.Queue("m.work"), "n = 1")
        assert held.receive(5).text == "m1"                                  # in flight (unacked)
        dead_session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        # a second consumer takes m2 and gives it back: max_deliveries 1 -> dead-lettered
        dying = dead_session.create_consumer(pymq.Queue("m.work"), "n = 2")
        assert dying.receive(5).text == "m2"
        dead_session.recover()
        dying.close()
        topic = pymq.Topic("m.news")
        session.create_durable_consumer(topic, "keeper").close()
        listener = session.create_consumer(topic)
        publisher = session.create_producer(topic)
        publisher.send("n1")
        publisher.send("n2")
        assert listener.receive(5).text == "n1"

        def settled(s):
            return (value(s, "pymq_queue_dead_lettered_total", **q) == 1
                    and value(s, "pymq_queue_expired_total", queue="/queue/m.expiring", vhost="/") == 1)
        samples = wait_until(lambda: (lambda s: s if settled(s) else None)(scrape(b)), timeout=15)
        assert samples, "dead letter or expiry never showed up"
        assert value(samples, "pymq_queue_ready", **q) == 2                  # m3, m4
        assert value(samples, "pymq_queue_in_flight", **q) == 1              # m1
        assert value(samples, "pymq_queue_scheduled", **q) == 1              # later
        assert value(samples, "pymq_queue_depth", **q) == 4
        assert value(samples, "pymq_queue_delivered_total", **q) == 3        # m0, m1, m2
        assert value(samples, "pymq_queue_acknowledged_total", **q) == 1     # m0
        assert value(samples, "pymq_queue_added_total", **q) == 6
        assert value(samples, "pymq_queue_failed_total", **q) == 1
        assert value(samples, "pymq_queue_consumers", **q) == 1
        assert value(samples, "pymq_queue_ready", queue="/queue/DLQ.m.work", vhost="/") == 1
        assert value(samples, "pymq_queue_ready", queue="/queue/m.expiring", vhost="/") == 0
        t = {"topic": "/topic/m.news", "vhost": "/"}
        assert value(samples, "pymq_topic_published_total", **t) == 2
        assert value(samples, "pymq_topic_subscriptions", **t) == 2
        assert value(samples, "pymq_topics", ) >= 1 and value(samples, "pymq_subscriptions") >= 2
        durable = {"topic": "/topic/m.news", "subscription": "sub:m-client:keeper", "durable": "true",
                   "vhost": "/"}
        assert value(samples, "pymq_subscription_ready", **durable) == 2
        assert value(samples, "pymq_subscription_delivered_total", **durable) == 0
        live = [k for k in samples if k[0] == "pymq_subscription_delivered_total"
                and dict(k[1]).get("durable") == "false" and dict(k[1])["topic"] == "/topic/m.news"]
        assert len(live) == 1 and samples[live[0]] == 2     # an auto-ack consumer takes both
        assert value(samples, "pymq_connections") >= 1
        build = [dict(k[1]) for k in samples if k[0] == "pymq_build_info"]
        assert build and build[0]["version"] == pymq.__version__ and build[0]["core"] in ("compiled", "pure")
        assert value(samples, "process_resident_memory_bytes") > 10_000_000
        assert value(samples, "process_cpu_seconds_total") > 0
        assert value(samples, "process_open_fds") > 0
        assert any(k[0] == "python_info" for k in samples)
        assert value(samples, "pymq_ready") == 1
        assert value(samples, "pymq_device_online", device="file", kind="file") == 1
        held_session.acknowledge()
    after = scrape(b)
    assert value(after, "pymq_queue_acknowledged_total", **q) == 2


def test_metrics_need_a_user(broker_process):
    status, _, headers = broker_process.http("GET", "/metrics", user=None)
    assert status == 401 and headers["WWW-Authenticate"] == 'Basic realm="pymq"'
    # the exposition names every destination: the admin or monitor role only (spec/admin.md)
    status, raw, _ = broker_process.http("GET", "/metrics", user=APP, password=APP_PW)
    assert status == 403 and b"admin or monitor role" in raw


def test_readyz_follows_a_storage_device_that_goes_away(tmp_path, redis_url):  # noqa: F811
    parts = urlsplit(redis_url)
    proxy = TcpProxy(parts.hostname, parts.port or 6379)
    url = urlunsplit(parts._replace(netloc=f"{parts.hostname}:{proxy.port}"))
    broker = BrokerProcess(tmp_path / "grid", config={"storage": {
        "devices": {"memory": {"kind": "memory"}, "file": {"kind": "file"},
                    "grid": {"kind": "grid", "url": url, "namespace": f"rz{uuid.uuid4().hex[:8]}"}},
        "persistent_device": "file"}})
    broker.start()
    try:
        status, raw, _ = broker.http("GET", "/readyz", user=None)
        assert status == 200 and json.loads(raw)["checks"]["devices"] == {"memory": True, "file": True, "grid": True}
        proxy.cut()
        status, raw, _ = broker.http("GET", "/readyz", user=None)
        body = json.loads(raw)
        assert status == 503 and body["ready"] is False and body["checks"]["devices"]["grid"] is False
        assert body["checks"]["storage"] is False and body["checks"]["recovered"] is True
        assert broker.http("GET", "/healthz", user=None)[0] == 200        # alive, just not ready
        health = run_cli(broker, "health", user=None, password=None)
        assert health.returncode == 1 and '"grid": false' in health.stderr
        status = cli_json(broker, "status", user=None, password=None)
        assert status["ready"] is False and status["checks"]["devices"]["grid"] is False
        assert "NOT READY: grid" in run_cli(broker, "status", user=None, password=None).stdout
        proxy.restore()
        assert wait_until(lambda: broker.http("GET", "/readyz", user=None)[0] == 200, timeout=20)
        assert run_cli(broker, "health", user=None, password=None).returncode == 0
    finally:
        proxy.restore()
        assert broker.stop() == 0
        proxy.close()
