"""Altering a queue as an operator does it: ``pymq-admin queues alter`` and ``POST /api/alter-queue`` against a
real broker process, the permission check (owner or administrator), and the change surviving a restart."""
from __future__ import annotations

import json

import pymq
from tests.admin.conftest import ADMIN, ADMIN_PW, APP, APP_PW, BrokerProcess, cli_json, run_cli


def test_queues_alter_from_the_cli_and_http_kept_across_a_restart(tmp_path):
    b = BrokerProcess(tmp_path / "b", users={ADMIN: (ADMIN_PW, ["admin"]), APP: (APP_PW, ["app"])}).start()
    try:
        assert run_cli(b, "queues", "create", "cli.alter", "--max-deliveries", "5").returncode == 0
        out = run_cli(b, "queues", "alter", "cli.alter", "--max-deliveries", "2", "--set", "last_value_key=sym",
                      "--overflow", "reject")
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("queue /queue/cli.alter: ")
        assert "max_deliveries: 5 -> 2" in out.stdout and "last_value_key: None -> 'sym'" in out.stdout
        again = run_cli(b, "queues", "alter", "cli.alter", "--max-deliveries", "2")
        assert again.returncode == 0 and again.stdout.strip() == "queue /queue/cli.alter: no change"
        as_json = cli_json(b, "queues", "alter", "cli.alter", "--set", "exclusive=true")
        assert as_json["changes"] == ["exclusive: False -> True"] and as_json["queue"]["config"]["exclusive"]
        # nothing named: a usage error; a bad value or unknown queue: the broker's refusal, nothing changed
        assert run_cli(b, "queues", "alter", "cli.alter").returncode == 2
        bad = run_cli(b, "queues", "alter", "cli.alter", "--set", "max_deliveries=lots")
        assert bad.returncode == 1 and "max_deliveries" in bad.stderr
        assert run_cli(b, "queues", "alter", "no.such", "--max-deliveries", "1").returncode == 6
        # HTTP, as the console and scripts call it; another user may not alter an administrator's queue
        status, raw, _ = b.http("POST", "/api/alter-queue", {"name": "cli.alter", "config": {"max_deliveries": 9}},
                                user=APP, password=APP_PW)
        assert status == 403 and json.loads(raw)["error"]["code"] == "access-denied"
        denied = run_cli(b, "queues", "alter", "cli.alter", "--max-deliveries", "9", user=APP, password=APP_PW)
        assert denied.returncode == 5
        assert b.op("queue-info", name="cli.alter")["config"]["max_deliveries"] == 2
        assert b.op("alter-queue", name="cli.alter", config={"default_priority": 8})["altered"] is True
        # the owner (not an administrator) may alter its own queue
        with pymq.connect(b.url, username=APP, password=APP_PW) as conn:
            conn.queue_manager().create("app.owned", max_deliveries=3)
        assert run_cli(b, "queues", "alter", "app.owned", "--max-deliveries", "4", user=APP,
                       password=APP_PW).returncode == 0
        assert b.stop() == 0
        b.start()
        config = b.op("queue-info", name="cli.alter")["config"]
        assert (config["max_deliveries"], config["last_value_key"], config["overflow"], config["exclusive"],
                config["default_priority"]) == (2, "sym", "reject", True, 8)
        owned = b.op("queue-info", name="app.owned")
        assert owned["config"]["max_deliveries"] == 4 and owned["acl"]["owner"] == APP
    finally:
        b.stop()
