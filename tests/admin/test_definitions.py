"""Definitions export/import (spec/admin.md "Definitions"): one JSON document moves queues with their settings,
access lists (topic patterns too), durable subscriptions, users (password hashes only), storage rules and
vhosts from one broker process to another, over HTTP and ``pymq-admin``; importing twice changes nothing,
and a document that cannot be applied whole is refused with nothing changed."""
from __future__ import annotations

import copy
import json
import pathlib

import pymq
import pytest

from tests.admin.conftest import ADMIN, ADMIN_PW, APP, APP_PW, BrokerProcess, run_cli

CONFIG = {"vhosts": {"shop": ["role:app"]},
          "default_permissions": {"role:admin": ["produce", "consume", "browse"], "role:app": ["create"]}}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    source = BrokerProcess(tmp_path_factory.mktemp("source"),
                           users={ADMIN: (ADMIN_PW, ["admin"]), APP: (APP_PW, ["app"])}, config=CONFIG).start()
    target = BrokerProcess(tmp_path_factory.mktemp("target"), users={ADMIN: (ADMIN_PW, ["admin"])},
                           config=CONFIG).start()
    yield source, target
    for b in (source, target):
        b.stop()


def _summary(doc: dict) -> dict:
    return {"queues": doc["queues"], "permissions": doc["permissions"], "users": doc["users"],
            "durable_subscriptions": doc["durable_subscriptions"], "vhosts": doc["vhosts"]}


def _target_state(b) -> dict:
    doc = b.op("export-definitions")
    return _summary(doc)


def test_export_then_import_moves_everything_and_twice_changes_nothing(pair, tmp_path):
    source, target = pair
    source.op("create-queue", name="orders", config={"max_depth": 10, "overflow": "reject", "max_deliveries": 4},
              grants={"role:app": ["produce", "consume"]})
    source.op("grant", destination="/topic/stocks.*", principal="role:app", permissions=["consume"])
    source.op("grant", destination="/queue/$vh.shop.carts", principal="user:alice", permissions=["produce"])
    with pymq.connect(source.url, username=APP, password=APP_PW, client_id="app") as alice:
        alice.create_session().create_durable_consumer(pymq.Topic("stocks.*"), "feed", "price > 1").close()
    path = tmp_path / "defs.json"
    out = run_cli(source, "definitions", "export", str(path))
    assert out.returncode == 0, out.stderr
    text = path.read_text()
    doc = json.loads(text)
    assert APP_PW not in text and ADMIN_PW not in text and '"password_hash": "scrypt$' in text
    assert [q["name"] for q in doc["queues"]] == ["orders"]
    assert doc["queues"][0]["settings"]["max_depth"] == 10
    assert {p["destination"] for p in doc["permissions"]} == {"/topic/stocks.*", "/queue/$vh.shop.carts"}
    assert [s["key"] for s in doc["durable_subscriptions"]] == ["sub:app:feed"]
    assert doc["vhosts"] == {"shop": ["role:app"]}
    import jsonschema
    schema = json.loads((pathlib.Path(__file__).resolve().parents[2] / "spec" / "schemas" /
                         "definitions.schema.json").read_text())
    jsonschema.validate(doc, schema)        # the export is what spec/admin.md's schema says
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(doc, users=[{"name": "x", "password_hash": "plain"}]), schema)

    # over HTTP into a broker that has none of it
    status, raw, _ = target.http("POST", "/api/import-definitions", {"definitions": doc})
    answer = json.loads(raw)
    assert status == 200 and answer["ok"], answer
    # users: alice added, root's entry replaced by the source's (another salt of the same password)
    assert answer["result"] == {"queues_created": 1, "acls_set": 3, "subscriptions_created": 1, "rules_set": 0,
                                "users_changed": 2}
    assert _target_state(target) == _summary(doc)
    # alice logs in to the target with her own password (her hash moved), and her grants hold there
    with pymq.connect(target.url, username=APP, password=APP_PW, client_id="app") as alice:
        s = alice.create_session()
        s.create_producer(pymq.Queue("orders")).send("moved")
        assert s.create_consumer(pymq.Queue("orders")).receive(5).text == "moved"
        feed = s.create_durable_consumer(pymq.Topic("stocks.*"), "feed", "price > 1")
        with pymq.connect(target.url, username=ADMIN, password=ADMIN_PW) as root:
            p = root.create_session().create_producer(pymq.Topic("stocks.ibm"))
            p.send(pymq.TextMessage("cheap", properties={"price": 1}))
            p.send(pymq.TextMessage("dear", properties={"price": 5}))
        assert feed.receive(5).text == "dear"
    # again, with pymq-admin from the file: nothing changes
    out = run_cli(target, "--json", "definitions", "import", str(path))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"queues_created": 0, "acls_set": 0, "subscriptions_created": 0,
                                      "rules_set": 0, "users_changed": 0}
    assert _target_state(target) == _summary(doc)


def _refused(target, doc, code: str, words: str) -> None:
    before = _target_state(target)
    status, raw, _ = target.http("POST", "/api/import-definitions", {"definitions": doc})
    answer = json.loads(raw)
    assert not answer["ok"] and answer["error"]["code"] == code, answer
    assert words in answer["error"]["message"], answer
    assert _target_state(target) == before          # nothing of it was applied


def test_a_document_that_cannot_be_applied_whole_changes_nothing(pair):
    source, target = pair
    base = {"pymq_definitions": 1, "queues": [{"name": "fresh-queue", "settings": {"max_depth": 5}}],
            "permissions": [{"destination": "/topic/fresh.#", "owner": None, "grants": {"*": ["consume"]}}],
            "users": [{"name": "carol", "roles": [], "password_hash": "scrypt$16384$8$1$c2FsdA$ZGlnZXN0"}]}
    # every part is fine on its own; one bad entry anywhere refuses the whole document
    bad_permission = copy.deepcopy(base)
    bad_permission["permissions"].append({"destination": "/queue/x", "grants": {"*": ["fly"]}})
    _refused(target, bad_permission, "config", "permission")
    plain_password = copy.deepcopy(base)
    plain_password["users"].append({"name": "dave", "password_hash": "hunter2"})
    _refused(target, plain_password, "config", "plain passwords are never imported")
    unknown_vhost = dict(base, vhosts={"elsewhere": ["*"]})
    _refused(target, unknown_vhost, "config", "not configured on this broker")
    bad_selector = dict(base, durable_subscriptions=[{"topic": "t", "owner": "o", "name": "n",
                                                      "selector": "price >>> 1"}])
    _refused(target, bad_selector, "config", "durable_subscriptions[0]")
    target.op("create-queue", name="clash", config={"max_depth": 4})
    clash = dict(base, queues=base["queues"] + [{"name": "clash", "settings": {"max_depth": 3}}])
    _refused(target, clash, "destination-exists", "other settings")
    for hostile in (["not", "an", "object"], {"pymq_definitions": 2}, {"pymq_definitions": 1, "extra": 1},
                    {"pymq_definitions": 1, "queues": {"name": "x"}}, "{not json"):
        status, raw, _ = target.http("POST", "/api/import-definitions", {"definitions": hostile})
        assert not json.loads(raw)["ok"]
    status, raw, _ = target.http("GET", "/api/queue-info?name=fresh-queue")
    assert not json.loads(raw)["ok"]


def test_only_an_administrator_exports_or_imports(pair):
    source, _ = pair
    for op, args in (("export-definitions", {}), ("import-definitions", {"definitions": {"pymq_definitions": 1}})):
        status, raw, _ = source.http("POST", "/api/" + op, args, user=APP, password=APP_PW)
        answer = json.loads(raw)
        assert not answer["ok"] and answer["error"]["code"] == "access-denied", answer
