"""Virtual hosts in the admin surfaces (spec/admin.md "Virtual hosts"), against a real broker process: lists
name each thing's vhost and narrow to one with the vhost argument (STOMP admin, HTTP GET and POST), list-vhosts
gives each vhost's figures and limits, the metrics carry a vhost label and per-vhost gauges, and
pymq-admin --vhost works inside one vhost."""
from __future__ import annotations

import json

import pymq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.admin.conftest import ADMIN, ADMIN_PW, APP, APP_PW, BrokerProcess, cli_json, run_cli

VHOSTS = {"shop": {"principals": ["*"], "max_connections": 50, "max_queues": 100, "max_memory": "8MiB"},
          "books": ["*"]}


@pytest.fixture(scope="module")
def vh_broker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("vhosts"), config={"vhosts": VHOSTS},
                           users={ADMIN: (ADMIN_PW, ["admin"]), APP: (APP_PW, ["app"])})
    broker.start()
    yield broker
    assert broker.stop() == 0, "".join(broker.log[-30:])


def _send(b, queue: str, vhost: str | None, body: str) -> None:
    with pymq.connect(b.url, username=ADMIN, password=ADMIN_PW, **({"vhost": vhost} if vhost else {})) as conn:
        conn.create_session().create_producer(pymq.Queue(queue)).send(body)


def _scrape(b) -> dict:
    status, raw, _ = b.http("GET", "/metrics")
    assert status == 200, raw
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(raw.decode()) for s in family.samples}


def test_lists_name_and_narrow_to_a_vhost_and_metrics_carry_it(vh_broker):
    b = vh_broker
    for vhost in ("shop", "books", None):
        _send(b, "orders", vhost, f"to {vhost}")
    held = pymq.connect(b.url + "/shop", username=APP, password=APP_PW)
    try:
        shop = b.op("list-queues", vhost="shop")
        assert shop and all(q["vhost"] == "shop" and q["name"].startswith("$vh.shop.") for q in shop)
        assert [q["depth"] for q in shop if q["name"] == "$vh.shop.orders"] == [1]
        default = b.op("list-queues", vhost="/")
        assert "orders" in {q["name"] for q in default} and {q["vhost"] for q in default} == {"/"}
        assert {"orders", "$vh.shop.orders", "$vh.books.orders"} <= {q["name"] for q in b.op("list-queues")}
        # the same over HTTP GET, the vhost with or without its '/'
        status, raw, _ = b.http("GET", "/api/list-queues?vhost=%2Fbooks")
        assert status == 200 and {q["vhost"] for q in json.loads(raw)["result"]} == {"books"}
        status, raw, _ = b.http("GET", "/api/list-queues?vhost=nope")
        assert status == 404 and json.loads(raw)["error"]["code"] == "unknown-destination"
        conns = b.op("connections", vhost="shop")
        assert conns and {c["vhost"] for c in conns} == {"shop"} and APP in {c["user"] for c in conns}
        assert APP not in {c["user"] for c in b.op("connections", vhost="/")}
        rows = {v["name"]: v for v in b.op("list-vhosts")}
        assert list(rows) == ["/", "books", "shop"]
        assert rows["shop"]["limits"] == {"max_connections": 50, "max_queues": 100, "max_memory": 8 << 20}
        assert rows["books"]["limits"] == {"max_connections": None, "max_queues": None, "max_memory": None}
        assert rows["shop"]["connections"] >= 1 and rows["shop"]["depth"] == 1
        assert rows["shop"]["memory_bytes"] == len("to shop") + 768
        status, raw, _ = b.http("GET", "/api/list-vhosts", user=APP, password=APP_PW)
        assert json.loads(raw)["error"]["code"] == "access-denied"
        samples = _scrape(b)
        for vhost in ("/", "shop", "books"):
            assert samples[("pymq_queue_depth", (("queue", "/queue/orders"), ("vhost", vhost)))] == 1
        assert samples[("pymq_vhost_connections", (("vhost", "shop"),))] >= 1
        assert samples[("pymq_vhost_messages", (("vhost", "books"),))] == 1
        assert samples[("pymq_vhost_memory_bytes", (("vhost", "shop"),))] == len("to shop") + 768
        assert samples[("pymq_vhost_limit", (("limit", "max_queues"), ("vhost", "shop")))] == 100
        assert ("pymq_vhost_limit", (("limit", "max_queues"), ("vhost", "books"))) not in samples
    finally:
        held.close()


def test_pymq_admin_works_inside_a_vhost(vh_broker):
    b = vh_broker
    for vhost in ("shop", "books", None):
        _send(b, "cli.orders", vhost, f"to {vhost}")
    listed = cli_json(b, "--vhost", "shop", "queues", "list")
    assert {q["name"] for q in listed} >= {"cli.orders"} and not any(q["name"].startswith("$vh.") for q in listed)
    assert {q["destination"] for q in listed if q["name"] == "cli.orders"} == {"/queue/cli.orders"}
    shown = cli_json(b, "queues", "show", "cli.orders", "--vhost", "/shop")
    assert shown["metrics"]["depth"] == 1 and shown["destination"] == "/queue/cli.orders"
    purged = run_cli(b, "--vhost", "shop", "queues", "purge", "cli.orders")
    assert purged.returncode == 0, purged.stderr
    assert b.op("queue-info", name="$vh.shop.cli.orders")["metrics"]["depth"] == 0
    assert b.op("queue-info", name="$vh.books.cli.orders")["metrics"]["depth"] == 1
    assert b.op("queue-info", name="cli.orders")["metrics"]["depth"] == 1
    table = run_cli(b, "vhosts", "list")
    assert table.returncode == 0 and "books" in table.stdout and "shop" in table.stdout, table
    unknown = run_cli(b, "--vhost", "nope", "queues", "list")
    assert unknown.returncode != 0 and "unknown-destination" in unknown.stderr
    assert run_cli(b, "--vhost", "not a name", "queues", "list").returncode != 0
