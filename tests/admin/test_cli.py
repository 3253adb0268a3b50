"""``pymq-admin`` end to end: a real broker process, the CLI as a process, every command, its human
output, its ``--json`` output, its exit codes, and that a refused command changed nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

import pymq
from pymq.errors import AuthenticationFailed, PymqError
from tests.admin.conftest import (ADMIN, ADMIN_PW, APP, APP_PW, BrokerProcess, cli_json, run_cli,
                                  wait_until)


def _send(broker, queue, bodies, **kw):
    with pymq.connect(broker.url, username=ADMIN, password=ADMIN_PW) as conn:
        session = conn.create_session()
        producer = session.create_producer(pymq.Queue(queue))
        for body in bodies:
            producer.send(body, **kw)


def _depth(broker, queue):
    return broker.op("queue-info", name=queue)["metrics"]["depth"]


def _dead_letters(broker, queue, count):
    """``count`` messages of ``queue`` (max_deliveries 1) delivered once and given back: dead letters."""
    with pymq.connect(broker.url, username=ADMIN, password=ADMIN_PW) as conn:
        session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(pymq.Queue(queue))
        for _ in range(count):
            assert consumer.receive(5) is not None
        session.recover()
        consumer.close()
    assert wait_until(lambda: broker.op("queue-info", name="DLQ." + queue)["metrics"]["depth"] == count
                      if "DLQ." + queue in {q["name"] for q in broker.op("list-queues")} else False)


def test_help_lists_every_command_and_the_exit_codes():
    out = run_cli(None, "--help", user=None, password=None)
    assert out.returncode == 0
    for group in ("status", "health", "reload", "queues", "topics", "subscriptions", "messages", "dlq", "consumers",
                  "connections", "users", "grants", "storage", "cluster"):
        assert group in out.stdout
    assert "exit codes" in out.stdout and "  6  what the command names does not exist" in out.stdout
    assert run_cli(None, "queues", "--help", user=None, password=None).stdout.count("create") >= 1
    # the installed console script is the same program
    script = os.path.join(os.path.dirname(sys.executable), "pymq-admin")
    assert os.path.exists(script), "pymq-admin console script missing: pip install -e ."
    assert "Manage a running pymq broker" in subprocess.run([script, "--help"], capture_output=True,
                                                            text=True, timeout=30).stdout


def test_status_and_health(broker_process):
    out = run_cli(broker_process, "status")
    assert out.returncode == 0, out.stderr
    assert "ready          yes" in out.stdout and "storage        open" in out.stdout
    status = cli_json(broker_process, "status")
    assert status["ready"] is True and status["checks"]["recovered"] is True
    assert status["listeners"]["stomp"] == broker_process.port
    health = run_cli(broker_process, "health", user=None, password=None)
    assert health.returncode == 0 and health.stdout.strip() == "ready"


def test_queue_lifecycle(broker_process):
    b = broker_process
    out = run_cli(b, "queues", "create", "cli.orders", "--max-deliveries", "3", "--max-depth", "100",
                  "--overflow", "reject", "--set", "default_priority=7", "--grant", "role:app=produce,browse")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "queue /queue/cli.orders created"
    _send(b, "cli.orders", ["a", "b", "c"])
    listed = {q["name"]: q for q in cli_json(b, "queues", "list")}
    q = listed["cli.orders"]
    assert (q["depth"], q["ready"], q["in_flight"], q["consumers"], q["owner"]) == (3, 3, 0, 0, ADMIN)
    assert {"rate_in", "rate_out", "rate_ack"} <= set(q)
    human = run_cli(b, "queues", "list").stdout.splitlines()
    assert human[0].split()[:6] == ["NAME", "DEPTH", "READY", "IN-FLIGHT", "SCHED", "CONSUMERS"]
    row = next(line.split() for line in human if line.startswith("cli.orders "))
    assert row[1:4] == ["3", "3", "0"]
    shown = cli_json(b, "queues", "show", "cli.orders")
    assert shown["config"]["max_deliveries"] == 3 and shown["config"]["default_priority"] == 7
    assert shown["acl"]["grants"] == {"role:app": ["browse", "produce"]}
    assert "config.overflow" in run_cli(b, "queues", "show", "cli.orders").stdout
    # the same name with other settings: refused, exit 1, nothing changed
    again = run_cli(b, "queues", "create", "cli.orders", "--max-deliveries", "9")
    assert again.returncode == 1 and "destination-exists" in again.stderr
    assert cli_json(b, "queues", "show", "cli.orders")["config"]["max_deliveries"] == 3
    # bad settings are the broker's precise refusal
    bad = run_cli(b, "queues", "create", "cli.bad", "--set", "max_delivries=2")
    assert bad.returncode == 1 and "queue cli.bad: max_delivries: unknown queue setting" in bad.stderr
    assert run_cli(b, "queues", "create", "cli.bad2", "--set", "novalue").returncode == 2
    purge = run_cli(b, "queues", "purge", "cli.orders")
    assert purge.returncode == 0 and purge.stdout.strip() == "purged 3 messages from cli.orders"
    assert _depth(b, "cli.orders") == 0
    drop = run_cli(b, "queues", "drop", "cli.orders")
    assert drop.returncode == 0 and "dropped cli.orders (0 messages)" in drop.stdout
    missing = run_cli(b, "queues", "drop", "cli.orders")
    assert missing.returncode == 6 and "unknown-destination" in missing.stderr
    assert run_cli(b, "queues", "show", "cli.orders").returncode == 6


def test_drop_refused_while_consumed_unless_forced(broker_process):
    b = broker_process
    b.op("create-queue", name="cli.busy")
    with pymq.connect(b.url, username=ADMIN, password=ADMIN_PW) as conn:
        conn.create_session().create_consumer(pymq.Queue("cli.busy"))
        assert wait_until(lambda: b.op("queue-info", name="cli.busy")["metrics"]["consumers"] == 1)
        refused = run_cli(b, "queues", "drop", "cli.busy")
        assert refused.returncode == 1 and "illegal-state" in refused.stderr
        assert run_cli(b, "queues", "drop", "cli.busy", "--force").returncode == 0


def test_browse_pages_and_shows_messages(broker_process):
    b = broker_process
    _send(b, "cli.browse", [f"message {i}" for i in range(5)])
    _send(b, "cli.browse", [b"\xff\xfe\x00binary"])
    page = cli_json(b, "messages", "browse", "cli.browse", "--limit", "2", "--offset", "2")
    assert [m["body"] for m in page["messages"]] == ["message 2", "message 3"]
    assert page["ready"] == 6 and page["offset"] == 2
    first = page["messages"][0]
    assert first["headers"]["destination"] == "/queue/cli.browse" and first["persistent"] is True
    last = cli_json(b, "messages", "browse", "cli.browse", "--offset", "5")["messages"][0]
    assert "body" not in last and last["body_base64"] == "//4AYmluYXJ5" and last["body_size"] == 9
    human = run_cli(b, "messages", "browse", "cli.browse", "--limit", "2").stdout
    assert "message 0" in human and "message 2" not in human
    assert "messages 1-2 of 6 ready" in human and "next page: --offset 2" in human
    truncated = cli_json(b, "messages", "browse", "cli.browse", "--limit", "1", "--body-limit", "3")["messages"][0]
    assert truncated["body"] == "mes" and truncated["body_truncated"] is True
    one = cli_json(b, "messages", "show", "cli.browse", first["message_id"])
    assert one["body"] == "message 2" and one["message_id"] == first["message_id"]
    assert "message 2" in run_cli(b, "messages", "show", "cli.browse", first["message_id"]).stdout
    gone = run_cli(b, "messages", "show", "cli.browse", "ID:nope")
    assert gone.returncode == 6 and "unknown-message" in gone.stderr
    assert _depth(b, "cli.browse") == 6          # browsing took nothing


def test_move_and_drop_messages(broker_process):
    b = broker_process
    _send(b, "cli.src", ["one", "two", "three"], priority=5)
    ids = [m["message_id"] for m in cli_json(b, "messages", "browse", "cli.src")["messages"]]
    moved = run_cli(b, "messages", "move", "cli.src", "cli.dst", "--id", ids[1])
    assert moved.returncode == 0 and moved.stdout.strip() == "moved 1 message(s): 1 to /queue/cli.dst"
    dst = cli_json(b, "messages", "browse", "cli.dst")["messages"]
    assert [m["body"] for m in dst] == ["two"] and dst[0]["priority"] == 5
    # an unknown id: nothing moves at all
    bad = run_cli(b, "messages", "move", "cli.src", "cli.dst", "--id", ids[0], "--id", "ID:missing")
    assert bad.returncode == 6 and _depth(b, "cli.src") == 2
    dropped = run_cli(b, "messages", "drop", "cli.src", "--id", ids[0])
    assert dropped.returncode == 0 and dropped.stdout.strip() == "dropped 1 message(s) from cli.src"
    assert [m["body"] for m in cli_json(b, "messages", "browse", "cli.src")["messages"]] == ["three"]
    everything = cli_json(b, "messages", "move", "cli.src", "cli.dst")
    assert everything["moved"] == 1 and _depth(b, "cli.src") == 0 and _depth(b, "cli.dst") == 2


def test_move_stops_at_a_full_target_and_says_so(broker_process):
    b = broker_process                       # "limited" is configured with max_depth 2, overflow reject
    _send(b, "cli.many", ["1", "2", "3", "4"])
    out = run_cli(b, "messages", "move", "cli.many", "limited")
    assert out.returncode == 1
    assert "moved 2 message(s)" in out.stdout and "queue-full" in out.stderr
    assert _depth(b, "limited") == 2 and _depth(b, "cli.many") == 2    # nothing lost, nothing doubled
    b.op("purge-queue", name="limited")


def test_dead_letters_list_retry_move_drop(broker_process):
    b = broker_process
    b.op("create-queue", name="cli.work", config={"max_deliveries": 1})
    _send(b, "cli.work", ["d1", "d2", "d3", "d4"], )
    _dead_letters(b, "cli.work", 4)
    dlqs = {d["name"]: d for d in cli_json(b, "dlq", "list")}
    assert dlqs["DLQ.cli.work"]["source"] == "cli.work" and dlqs["DLQ.cli.work"]["depth"] == 4
    assert dlqs["DLQ.cli.work"]["reasons"] == {"delivered 1 times (maximum 1)": 4}
    assert "DLQ.cli.work" in run_cli(b, "dlq", "list").stdout
    letters = cli_json(b, "messages", "browse", "DLQ.cli.work")["messages"]
    assert letters[0]["headers"]["pymq-original-destination"] == "/queue/cli.work"
    ids = [m["message_id"] for m in letters]
    retry = run_cli(b, "dlq", "retry", "DLQ.cli.work", "--id", ids[0])
    assert retry.returncode == 0 and retry.stdout.strip() == "moved 1 message(s): 1 to /queue/cli.work"
    back = cli_json(b, "messages", "browse", "cli.work")["messages"]
    assert [m["body"] for m in back] == ["d1"]
    assert "pymq-dead-letter-reason" not in back[0]["headers"] and back[0]["deliveries"] == 0
    move = run_cli(b, "dlq", "move", "DLQ.cli.work", "cli.parking", "--id", ids[1])
    assert move.returncode == 0 and _depth(b, "cli.parking") == 1
    parked = cli_json(b, "messages", "browse", "cli.parking")["messages"][0]
    assert parked["headers"]["pymq-original-destination"] == "/queue/cli.work"   # a move keeps the origin
    assert run_cli(b, "dlq", "drop", "DLQ.cli.work").returncode == 2                # needs --id or --all
    one = run_cli(b, "dlq", "drop", "DLQ.cli.work", "--id", ids[2])
    assert one.returncode == 0 and _depth(b, "DLQ.cli.work") == 1
    rest = run_cli(b, "dlq", "drop", "DLQ.cli.work", "--all")
    assert rest.returncode == 0 and "dropped 1 dead letter(s)" in rest.stdout and _depth(b, "DLQ.cli.work") == 0


def test_retry_is_not_swallowed_by_duplicate_detection(broker_process):
    """A dead letter that carried a dedup id must come back: the id it had is still in the window."""
    b = broker_process
    b.op("create-queue", name="cli.dedup", config={"max_deliveries": 1})
    with pymq.connect(b.url, username=ADMIN, password=ADMIN_PW) as conn:
        session = conn.create_session()
        message = session.create_text_message("once")
        message.dedup_id = "order-42"
        session.create_producer(pymq.Queue("cli.dedup")).send(message)
    _dead_letters(b, "cli.dedup", 1)
    assert cli_json(b, "dlq", "retry", "DLQ.cli.dedup")["moved"] == 1
    assert _depth(b, "cli.dedup") == 1 and _depth(b, "DLQ.cli.dedup") == 0


def test_consumers_and_connections(broker_process):
    b = broker_process
    _send(b, "cli.held", ["held"])
    conn = pymq.connect(b.url, username=APP, password=APP_PW, client_id="cli-test-client")
    try:
        session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(pymq.Queue("cli.held"), selector="JMSPriority >= 0")
        assert consumer.receive(5).text == "held"
        assert _depth(b, "cli.held") == 1 and b.op("queue-info", name="cli.held")["metrics"]["in_flight"] == 1
        consumers = [c for c in cli_json(b, "consumers", "list", "--queue", "cli.held")]
        assert len(consumers) == 1
        c = consumers[0]
        assert (c["user"], c["destination"], c["in_flight"], c["selector"]) == \
            (APP, "/queue/cli.held", 1, "JMSPriority >= 0")
        assert c["ack"] in ("client", "client-individual")
        assert "cli.held" in run_cli(b, "consumers", "list").stdout
        connections = {x["client_id"]: x for x in cli_json(b, "connections", "list")}
        mine = connections["cli-test-client"]
        assert mine["user"] == APP and mine["subscriptions"] == 1
        assert "cli-test-client" in run_cli(b, "connections", "list").stdout
        closed = run_cli(b, "connections", "close", mine["id"])
        assert closed.returncode == 0 and closed.stdout.strip() == f"closed connection {mine['id']}"
        # its unacknowledged message is ready again
        assert wait_until(lambda: b.op("queue-info", name="cli.held")["metrics"]["ready"] == 1)
        assert mine["id"] not in {x["id"] for x in cli_json(b, "connections", "list")}
        assert run_cli(b, "connections", "close", mine["id"]).returncode == 6
    finally:
        try:
            conn.close()
        except PymqError:
            pass


def test_non_admin_is_refused_admin_commands_and_nothing_changes(broker_process):
    b = broker_process
    _send(b, "cli.owned", ["keep me"])          # owned by nobody: default permissions let alice consume
    b.op("create-queue", name="cli.private")
    _send(b, "cli.private", ["private"])
    for args in (["connections", "list"], ["consumers", "list"], ["users", "list"], ["storage", "status"]):
        out = run_cli(b, *args, user=APP, password=APP_PW)
        assert out.returncode == 5, (args, out.stderr)
        assert "access-denied" in out.stderr and "administrators only" in out.stderr
    refused = run_cli(b, "queues", "purge", "cli.private", user=APP, password=APP_PW)
    assert refused.returncode == 5 and "may not purge on /queue/cli.private" in refused.stderr
    assert _depth(b, "cli.private") == 1
    assert run_cli(b, "messages", "browse", "cli.private", user=APP, password=APP_PW).returncode == 5
    assert run_cli(b, "queues", "drop", "cli.private", user=APP, password=APP_PW).returncode == 5
    assert run_cli(b, "messages", "move", "cli.private", "cli.mine", user=APP, password=APP_PW).returncode == 5
    assert _depth(b, "cli.private") == 1 and "cli.mine" not in {q["name"] for q in b.op("list-queues")}
    # what the API lets alice do, the CLI lets alice do
    assert run_cli(b, "queues", "list", user=APP, password=APP_PW).returncode == 0
    assert cli_json(b, "messages", "browse", "cli.owned", user=APP, password=APP_PW)["messages"][0]["body"] == "keep me"


def test_grants(broker_process):
    b = broker_process
    b.op("create-queue", name="cli.granted")
    shown = cli_json(b, "grants", "show", "cli.granted")
    assert shown == {"owner": ADMIN, "grants": {}, "default": False}
    added = cli_json(b, "grants", "add", "cli.granted", f"user:{APP}", "browse,purge")
    assert added["grants"] == {f"user:{APP}": ["browse", "purge"]}
    assert run_cli(b, "queues", "purge", "cli.granted", user=APP, password=APP_PW).returncode == 0
    human = run_cli(b, "grants", "show", "/queue/cli.granted").stdout
    assert f"user:{APP}" in human and "browse,purge" in human
    removed = cli_json(b, "grants", "remove", "cli.granted", f"user:{APP}", "purge")
    assert removed["grants"] == {f"user:{APP}": ["browse"]}
    assert run_cli(b, "queues", "purge", "cli.granted", user=APP, password=APP_PW).returncode == 5
    bad = run_cli(b, "grants", "add", "cli.granted", "everyone", "consume")
    assert bad.returncode == 1 and "principal 'everyone'" in bad.stderr
    # alice may not grant herself more
    assert run_cli(b, "grants", "add", "cli.granted", f"user:{APP}", "consume",
                   user=APP, password=APP_PW).returncode == 5
    assert cli_json(b, "grants", "show", "cli.granted")["grants"] == {f"user:{APP}": ["browse"]}
    topic = cli_json(b, "grants", "show", "/topic/cli.news")
    assert topic["default"] is True


def test_topics_and_subscriptions(broker_process):
    b = broker_process
    with pymq.connect(b.url, username=ADMIN, password=ADMIN_PW, client_id="cli-sub") as conn:
        session = conn.create_session()
        session.create_durable_consumer(pymq.Topic("cli.news"), "reader", selector="kind = 'x'").close()
        session.create_producer(pymq.Topic("cli.news")).send(
            session.create_text_message("hi", properties={"kind": "x"}))
    topics = {t["name"]: t for t in cli_json(b, "topics", "list")}
    assert topics["cli.news"]["published"] == 1 and len(topics["cli.news"]["subscriptions"]) == 1
    assert "/topic/cli.news" in run_cli(b, "topics", "list").stdout
    subs = cli_json(b, "subscriptions", "list", "--topic", "cli.news")
    assert len(subs) == 1
    s = subs[0]
    assert (s["durable"], s["client_id"], s["depth"], s["selector"]) == (True, "cli-sub", 1, "kind = 'x'")
    human = run_cli(b, "subscriptions", "list").stdout
    assert "/topic/cli.news" in human and "kind = 'x'" in human


def test_users_change_the_running_broker(broker_process):
    b = broker_process
    listed = {u["name"]: u for u in cli_json(b, "users", "list")}
    assert listed[ADMIN]["roles"] == ["admin"] and listed[APP]["roles"] == ["app"]
    added = run_cli(b, "users", "add", "carol", "--roles", "app,audit", "--password-stdin", stdin="carol-1\n")
    assert added.returncode == 0 and added.stdout.strip() == "added user carol (roles: app, audit)"
    # no restart: carol logs in now, over STOMP and over the admin API
    with pymq.connect(b.url, username="carol", password="carol-1"):
        pass
    assert run_cli(b, "queues", "list", user="carol", password="carol-1").returncode == 0
    again = run_cli(b, "users", "add", "carol", "--password-stdin", stdin="x\n")
    assert again.returncode == 1 and "already exists" in again.stderr
    changed = run_cli(b, "users", "passwd", "carol", "--password-stdin", stdin="carol-2\n")
    assert changed.returncode == 0
    with pytest.raises(AuthenticationFailed):
        pymq.connect(b.url, username="carol", password="carol-1").close()
    assert run_cli(b, "status", user="carol", password="carol-1").returncode == 4
    with pymq.connect(b.url, username="carol", password="carol-2"):
        pass
    roles = run_cli(b, "users", "roles", "carol", "admin")
    assert roles.returncode == 0 and "carol now has roles: admin" in roles.stdout
    assert run_cli(b, "connections", "list", user="carol", password="carol-2").returncode == 0
    removed = run_cli(b, "users", "remove", "carol")
    assert removed.returncode == 0 and removed.stdout.strip() == "removed user carol"
    assert run_cli(b, "status", user="carol", password="carol-2").returncode == 4
    with pytest.raises(AuthenticationFailed):
        pymq.connect(b.url, username="carol", password="carol-2").close()
    assert run_cli(b, "users", "remove", "carol").returncode == 6
    assert run_cli(b, "users", "passwd", "nobody", "--password-stdin", stdin="x\n").returncode == 6
    # the last administrator stays
    before = open(b.users_file).read()
    last = run_cli(b, "users", "remove", ADMIN)
    assert last.returncode == 1 and "no user with the 'admin' role" in last.stderr
    assert run_cli(b, "users", "roles", ADMIN, "app").returncode == 1
    assert open(b.users_file).read() == before
    # hostile names and empty passwords are refused before anything is written
    assert run_cli(b, "users", "add", "cluster:evil", "--password-stdin", stdin="x\n").returncode == 1
    assert run_cli(b, "users", "add", "dave", "--password-stdin", stdin="\n").returncode == 2
    assert open(b.users_file).read() == before
    # the file is the record: an edit by hand takes effect on `reload` (what SIGHUP does)
    data = yaml.safe_load(before)
    data["users"]["erin"] = dict(data["users"][APP])
    with open(b.users_file, "w") as fh:
        yaml.safe_dump(data, fh)
    assert run_cli(b, "reload", user=APP, password=APP_PW).returncode == 5      # administrators only
    assert run_cli(b, "status", user="erin", password=APP_PW).returncode == 4
    reloaded = run_cli(b, "reload")
    assert reloaded.returncode == 0, reloaded.stderr
    assert reloaded.stdout.startswith("reloaded: 3 user(s) (alice, erin, root)")
    assert run_cli(b, "status", user="erin", password=APP_PW).returncode == 0
    with open(b.users_file, "w") as fh:
        fh.write(before)
    result = cli_json(b, "reload")
    assert result["users"] == [APP, ADMIN] and result["restart_needed"] == []
    # an invalid file keeps the users in use, and says why
    with open(b.users_file, "w") as fh:
        fh.write("users:\n  mallory: {password: plain-text}\n")
    broken = run_cli(b, "reload")
    assert broken.returncode == 1 and "mallory" in broken.stderr and "plain" in broken.stderr, broken.stderr
    assert run_cli(b, "status").returncode == 0
    with open(b.users_file, "w") as fh:
        fh.write(before)


def test_exit_codes_and_where_credentials_come_from(broker_process, tmp_path):
    b = broker_process
    assert run_cli(b, "status", password="wrong").returncode == 4
    unreachable = run_cli(None, "status", url="http://127.0.0.1:9")
    assert unreachable.returncode == 3 and "cannot reach" in unreachable.stderr
    assert run_cli(None, "status", url="ftp://x").returncode == 2
    assert run_cli(b, "no-such-command").returncode == 2
    # not a pymq admin port: the STOMP port speaks no HTTP
    for command in ("status", "health"):
        out = run_cli(None, "--timeout", "2", command, url=f"http://127.0.0.1:{b.port}")
        assert out.returncode == 3 and "Traceback" not in out.stderr, out.stderr
    # environment
    env = {"PYMQ_ADMIN_URL": b.admin_url, "PYMQ_ADMIN_USER": ADMIN, "PYMQ_ADMIN_PASSWORD": ADMIN_PW}
    assert run_cli(None, "status", user=None, password=None, env=env).returncode == 0
    # a flag beats the environment
    assert run_cli(None, "status", user=None, password="wrong", env=env).returncode == 4
    # a config file (and a warning when others can read the password in it)
    cfg = tmp_path / "admin.yaml"
    cfg.write_text(yaml.safe_dump({"url": b.admin_url, "user": ADMIN, "password": ADMIN_PW}))
    cfg.chmod(0o644)
    out = run_cli(None, "--config", str(cfg), "status", user=None, password=None)
    assert out.returncode == 0 and "others can read it" in out.stderr
    cfg.chmod(0o600)
    out = run_cli(None, "status", user=None, password=None, env={"PYMQ_ADMIN_CONFIG": str(cfg)})
    assert out.returncode == 0 and out.stderr == ""
    home = tmp_path / "home"
    (home / ".config" / "pymq").mkdir(parents=True)
    (home / ".config" / "pymq" / "admin.yaml").write_text(cfg.read_text())
    (home / ".config" / "pymq" / "admin.yaml").chmod(0o600)
    assert run_cli(None, "status", user=None, password=None, env={"HOME": str(home)}).returncode == 0
    cfg.write_text("url: x\npasword: typo\n")
    bad = run_cli(None, "--config", str(cfg), "status", user=None, password=None)
    assert bad.returncode == 2 and "unknown key(s) pasword" in bad.stderr
    assert run_cli(None, "--config", str(tmp_path / "missing.yaml"), "status").returncode == 2
    # --json errors are JSON too
    err = run_cli(b, "--json", "queues", "show", "nope")
    assert err.returncode == 6 and json.loads(err.stdout)["error"]["code"] == "unknown-destination"


def test_storage_status_and_rules(tmp_path):
    broker = BrokerProcess(tmp_path / "storage", config={"storage": {
        "devices": {"memory": {"kind": "memory"}, "file": {"kind": "file"}},
        "persistent_device": "file",
        "selection": {"strategy": "first-match", "default_device": "file", "rules": [
            {"id": "chatty", "device": "memory", "weight": 60, "condition": "DESTINATION_NAME = '/queue/chatty'"}]}}})
    broker.start()
    try:
        status = cli_json(broker, "storage", "status", user=None, password=None)
        assert {d["name"] for d in status["devices"]} == {"memory", "file"}
        assert status["persistent_device"] == "file"
        human = run_cli(broker, "storage", "status", user=None, password=None).stdout
        assert "DEVICE" in human and "SCORE" in human and "chatty" in human
        rules = cli_json(broker, "storage", "rules", user=None, password=None)
        assert [r["id"] for r in rules["ranking"]] == ["chatty"]
        added = cli_json(broker, "storage", "rule-add", "--id", "big", "--device", "file", "--weight", "80",
                         "--condition", "SIZE > 100", user=None, password=None)
        assert [r["id"] for r in added["ranking"]] == ["big", "chatty"]
        replaced = cli_json(broker, "storage", "rule-replace", "--id", "big", "--device", "memory",
                            "--weight", "10", "--condition", "SIZE > 100", user=None, password=None)
        assert [(r["id"], r["device"]) for r in replaced["ranking"]] == [("chatty", "memory"), ("big", "memory")]
        bad = run_cli(broker, "storage", "rule-add", "--id", "x", "--device", "file", "--condition", "SIZE >",
                      user=None, password=None)
        assert bad.returncode == 1
        removed = cli_json(broker, "storage", "rule-remove", "big", user=None, password=None)
        assert [r["id"] for r in removed["ranking"]] == ["chatty"]
        assert "chatty" in run_cli(broker, "storage", "rules", user=None, password=None).stdout
    finally:
        assert broker.stop() == 0


def test_storage_rules_without_selection_and_cluster_without_cluster(broker_process):
    out = run_cli(broker_process, "storage", "rules")
    assert out.returncode == 1 and "storage rules are not enabled" in out.stderr
    out = run_cli(broker_process, "cluster", "members")
    assert out.returncode == 1 and "not part of a cluster" in out.stderr


def test_pymq_server_help_shows_its_subcommands_and_points_at_pymq_admin():
    out = subprocess.run([sys.executable, "-m", "pymq_server.cli", "--help"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0
    assert "pymq-server passwd USER" in out.stdout and "pymq-admin --help" in out.stdout


def test_moves_run_in_bounded_batches(broker_process):
    """The broker moves at most 10,000 messages per request; the CLI asks again while there are more."""
    b = broker_process
    with pymq.connect(b.url, username=ADMIN, password=ADMIN_PW) as conn:
        producer = conn.create_session().create_producer(pymq.Queue("cli.bulk"))
        for i in range(10_003):
            producer.send(str(i), delivery_mode=pymq.NON_PERSISTENT)
    assert wait_until(lambda: _depth(b, "cli.bulk") == 10_003)
    one = b.op("move-messages", **{"from": "cli.bulk", "to": "cli.bulk.out", "limit": 2})
    assert (one["moved"], one["more"]) == (2, True)
    limited = cli_json(b, "messages", "move", "cli.bulk", "cli.bulk.out", "--limit", "1")
    assert limited["moved"] == 1                                          # --limit: one request
    everything = cli_json(b, "messages", "move", "cli.bulk", "cli.bulk.out", timeout=120)
    assert everything["moved"] == 10_000 and everything["more"] is False
    assert _depth(b, "cli.bulk") == 0 and _depth(b, "cli.bulk.out") == 10_003
    first = b.op("browse-queue", name="cli.bulk.out", limit=3)["messages"]
    assert [m["body"] for m in first] == ["0", "1", "2"]                  # delivery order kept
    b.op("purge-queue", name="cli.bulk.out")


def test_retry_takes_what_can_go_back_and_says_why_not_for_the_rest(broker_process):
    b = broker_process
    _send(b, "DLQ.cli.mixed", ["parked by hand"])                         # no origin: not a dead letter
    b.op("create-queue", name="cli.mixed", config={"max_deliveries": 1})
    _send(b, "cli.mixed", ["real"])
    with pymq.connect(b.url, username=ADMIN, password=ADMIN_PW) as conn:
        session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(pymq.Queue("cli.mixed"))
        assert consumer.receive(5) is not None
        session.recover()
        consumer.close()
    assert wait_until(lambda: _depth(b, "DLQ.cli.mixed") == 2)
    parked = cli_json(b, "messages", "browse", "DLQ.cli.mixed")["messages"][0]
    assert parked["body"] == "parked by hand"                             # first in line
    named = run_cli(b, "dlq", "retry", "DLQ.cli.mixed", "--id", parked["message_id"])
    assert named.returncode == 0 and "not a dead letter (use move)" in named.stdout
    everything = cli_json(b, "dlq", "retry", "DLQ.cli.mixed")
    assert everything["moved"] == 1 and everything["by_destination"] == {"/queue/cli.mixed": 1}
    assert _depth(b, "cli.mixed") == 1 and _depth(b, "DLQ.cli.mixed") == 1


def test_cli_and_console_over_https(tmp_path):
    """admin_tls: pymq-admin verifies the broker's certificate (--cafile), refuses an unknown one, and the
    console's session cookie is Secure."""
    import ssl
    import urllib.request

    from tests.client.tls import Authority
    ca = Authority(tmp_path)
    server = ca.issue("broker", dns=("localhost",), ips=("127.0.0.1",))
    broker = BrokerProcess(tmp_path / "tls", users={ADMIN: (ADMIN_PW, ["admin"])}, config={
        "admin_tls": True, "tls": {"cert_file": str(server.cert), "key_file": str(server.key)}})
    broker.start()
    try:
        assert broker.admin_url.startswith("https://")
        verified = run_cli(broker, "--cafile", str(ca.ca_file), "status")
        assert verified.returncode == 0, verified.stderr
        unknown = run_cli(broker, "status")
        assert unknown.returncode == 3 and "CERTIFICATE_VERIFY_FAILED" in unknown.stderr
        assert run_cli(broker, "--insecure", "queues", "list").returncode == 0
        assert run_cli(broker, "--cafile", str(ca.ca_file), "health", user=None, password=None).returncode == 0
        context = ssl.create_default_context(cafile=str(ca.ca_file))
        req = urllib.request.Request(broker.admin_url + "/api/session", method="POST",
                                     data=json.dumps({"user": ADMIN, "password": ADMIN_PW}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=15, context=context) as resp:
            cookie = resp.headers["Set-Cookie"]
        assert "Secure" in cookie and "HttpOnly" in cookie
    finally:
        assert broker.stop() == 0
