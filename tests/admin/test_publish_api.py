"""The ``publish`` admin operation (the console's form) as an input surface: what it sends is what a SEND
by the same user would send; hostile arguments get a precise refusal (HTTP 400 with the error's code, 413 past
the port's body cap) and send nothing; a user without ``produce`` is refused and nothing is sent (or created)."""
from __future__ import annotations

import json

import pytest

import pymq
from tests.admin.conftest import ADMIN, ADMIN_PW, APP, APP_PW


def _post(broker, args, user=ADMIN, password=ADMIN_PW):
    status, body, _ = broker.http("POST", "/api/publish", args, user=user, password=password)
    return status, json.loads(body)


def _depth(broker, queue):
    return broker.op("queue-info", name=queue)["metrics"]["depth"]


def test_publish_sends_what_a_send_would(broker_process):
    b = broker_process
    b.op("create-queue", name="pub.plain")
    status, answer = _post(b, {"destination": "pub.plain", "body": "héllo", "headers": {"kind": "greeting"},
                               "persistent": False})
    assert status == 200 and answer["result"] == {"destination": "/queue/pub.plain", "bytes": 6, "persistent": False}
    with pymq.connect(b.url, username=ADMIN, password=ADMIN_PW) as conn:
        got = conn.create_session().create_consumer(pymq.Queue("pub.plain")).receive(5)
    assert got is not None and got.text == "héllo" and got.properties["kind"] == "greeting"
    assert got.delivery_mode == pymq.NON_PERSISTENT


@pytest.mark.parametrize("args, says", [
    # past the admin port's own cap (admin_max_body, 1 MiB) before the operation's: 413, resource-limit
    ({"destination": "pub.hostile", "body": "x" * (1024 * 1024 + 1)}, (413, "resource-limit", "at most 1048576")),
    ({"destination": "pub.hostile", "body": 5}, "'body' must be a string"),
    ({"destination": "pub.hostile", "body": "b", "headers": ["a"]}, "'headers' must be an object"),
    ({"destination": "pub.hostile", "body": "b", "headers": {f"h{i}": "v" for i in range(65)}}, "at most 64 headers"),
    ({"destination": "pub.hostile", "body": "b", "headers": {"n": 7}}, "names and values are strings"),
    ({"destination": "pub.hostile", "body": "b", "headers": {"n": "v" * 1025}}, "names and values are strings"),
    ({"destination": "pub.hostile", "body": "b", "headers": {"a\nb": "v"}}, "cannot be set here"),
    ({"destination": "pub.hostile", "body": "b", "headers": {"n": "v\r\nreceipt:1"}}, "cannot be set here"),
    ({"destination": "pub.hostile", "body": "b", "headers": {"destination": "/queue/elsewhere"}}, "cannot be set here"),
    ({"destination": "pub.hostile", "body": "b", "headers": {"pymq-types": "{}"}}, "cannot be set here"),
    ({"destination": "pub.hostile", "body": "b", "headers": {"priority": "99999999999999999999"}},
     (400, "invalid-header", "at most 19 are allowed")),
    ({"destination": "pub.hostile", "body": "b", "persistent": "maybe"}, "true or false"),
    ({"destination": "/temp-queue/x", "body": "b"}, (400, "invalid-destination", "published to a queue or a topic")),
    ({"body": "b"}, "'destination'"),
])
def test_hostile_arguments_are_refused_precisely_and_send_nothing(broker_process, args, says):
    b = broker_process
    b.op("create-queue", name="pub.hostile")
    status, answer = _post(b, args)
    want_status, code, says = says if isinstance(says, tuple) else (400, "config", says)
    assert status == want_status and answer["ok"] is False, (status, answer)
    assert answer["error"]["code"] == code and says in answer["error"]["message"], answer
    assert _depth(b, "pub.hostile") == 0


def test_a_user_without_produce_is_refused_and_nothing_is_sent_or_created(broker_process):
    b = broker_process
    b.op("create-queue", name="pub.closed")
    b.op("grant", destination="/queue/pub.closed", principal=f"user:{APP}", permissions=["consume"])
    status, answer = _post(b, {"destination": "pub.closed", "body": "no"}, user=APP, password=APP_PW)
    assert status == 403 and answer["error"]["code"] == "access-denied", answer
    assert _depth(b, "pub.closed") == 0
    b.op("grant", destination="/queue/pub.closed", principal=f"user:{APP}", permissions=["produce"])
    status, answer = _post(b, {"destination": "pub.closed", "body": "yes"}, user=APP, password=APP_PW)
    assert status == 200, answer
    assert _depth(b, "pub.closed") == 1
