"""spec/admin.md's permission matrix against a running broker: one test per cell.

The two tables of "Ownership and permissions" are read from the spec; every cell becomes a test that
makes a fresh destination of the row's kind (as the spec says: owned by alice, bob granted what the
operation needs), performs the operation as the column's principal over STOMP (and, for metrics and lists,
over HTTP too), and checks the outcome. A refused cell must also leave the broker exactly as it was:
queues and their depths and settings, temporary queues, topics and their subscriptions, durable
subscriptions and their creators, client-id bindings, access lists, declared queues and the catalog.

One broker serves the module (users with cheap hashes: logging in is not what this tests); each cell
uses destinations of its own.
"""
from __future__ import annotations

import base64
import itertools
import json
import os
import re
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from pymq_server.broker.auth import hash_password
from pymq_server.config import BrokerConfig
from tests.conftest import RawStomp, RunningBroker

SPEC = os.path.join(os.path.dirname(__file__), "..", "..", "spec", "admin.md")
PRINCIPALS = ("admin", "owner", "granted", "other", "anonymous", "monitor")
USER_OF = {"admin": "root", "owner": "alice", "granted": "bob", "other": "carol", "anonymous": None,
           "monitor": "mon"}
BROKER_WIDE = ("admin", "monitor", "user", "anonymous")
USER_OF_WIDE = {"admin": "root", "monitor": "mon", "user": "carol", "anonymous": None}
MARKS = {"✓": True, "✗": False}
EXPIRY = "expired"
DEFAULTS = {"user:alice": ["create", "produce"], "user:bob": ["create"]}


def _table(section: str, first: str) -> list[list[str]]:
    text = open(SPEC, encoding="utf-8").read()
    part = text.split(section, 1)[1]
    rows = []
    for line in part.splitlines():
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert rows[0][0] == first, rows[0]
    return rows[2:]


def code_for(text: str, principal: str) -> str:
    """A row's code for one principal: ``x``, or ``x for a and b, else y``."""
    m = re.fullmatch(r"(\S+) for (.+), else (\S+)", text)
    if m is None:
        return text
    named = {p.strip() for p in m.group(2).split(" and ")}
    assert named <= set(PRINCIPALS), text
    return m.group(1) if principal in named else m.group(3)


def destination_cells() -> list[tuple[str, str, str, bool, str]]:
    cells = []
    for row in _table("### Destination matrix", "operation"):
        op, kind, *marks, code = row
        assert len(marks) == len(PRINCIPALS), row
        for principal, mark in zip(PRINCIPALS, marks):
            cells.append((op, kind, principal, MARKS[mark], code_for(code, principal)))
    return cells


def broker_wide_cells() -> list[tuple[str, str, bool, str]]:
    cells = []
    for row in _table("### Broker-wide operations", "operation"):
        op, *marks, code = row
        assert len(marks) == len(BROKER_WIDE), row
        for principal, mark in zip(BROKER_WIDE, marks):
            cells.append((op, principal, MARKS[mark], code))
    return cells


CELLS = destination_cells()
WIDE = broker_wide_cells()
#: each cell with a configured queue gets a queue of its own from the broker's configuration
CONFIGURED = {f"cfg{i}": {"max_deliveries": 3} for i, c in enumerate(CELLS) if c[1] == "configured queue"}
_configured_names = iter(sorted(CONFIGURED, key=lambda n: int(n[3:])))


def test_the_matrix_covers_every_operation_and_kind():
    ops = {c[0] for c in CELLS}
    assert ops == {"create", "declare/alter", "alter", "drop", "purge", "produce", "consume", "browse", "ack-up-to",
                   "durable subscribe", "durable unsubscribe", "grant/revoke", "metrics", "list",
                   "dead-letter prefix"}
    kinds = {c[1] for c in CELLS}
    assert kinds == {"new name", "declared queue", "auto-created queue", "configured queue", "topic",
                     "temp queue", "temp topic", "dead-letter queue", "expiry queue", "admin destination",
                     "durable subscription", "custom dead-letter queue", "subscription dead-letter queue"}


#: derived names (issue 24 item 5): every operation that applies to them, for every principal
DERIVED = {"temp queue", "temp topic", "dead-letter queue", "custom dead-letter queue",
           "subscription dead-letter queue", "expiry queue"}


def test_every_operation_on_a_derived_name_is_in_the_matrix():
    have = {(c[0], c[1]) for c in CELLS}
    queue_ops = {"create", "alter", "drop", "purge", "produce", "consume", "browse", "ack-up-to", "grant/revoke",
                 "metrics", "list", "dead-letter prefix"}
    for kind in DERIVED - {"temp queue", "temp topic"}:
        assert {(op, kind) for op in queue_ops} <= have, kind
    for kind in ("temp queue", "temp topic"):
        ops = {"produce", "consume", "browse", "ack-up-to", "grant/revoke", "metrics", "list"}
        assert {(op, kind) for op in ops} <= have, kind
    assert {c[0] for c in WIDE} == {"storage rules", "cluster ops", "prometheus", "status"}


# -- the broker ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def matrix_broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("matrix")
    users = tmp / "users.yaml"
    users.write_text(yaml.safe_dump({"users": {
        name: {"password": hash_password(f"{name}pw", n=2), "roles": roles}
        for name, roles in (("root", ["admin"]), ("alice", []), ("bob", []), ("carol", []),
                            ("mon", ["monitor"]))}}))
    config = BrokerConfig.from_dict(dict(
        host="127.0.0.1", port=0, admin_port=0, data_dir=str(tmp / "data"), users_file=str(users),
        allow_anonymous=True, default_permissions=DEFAULTS, expiry_queue=EXPIRY, queues=CONFIGURED,
        # the helpers close sockets without DISCONNECT: their temporary queues must go at once, not wait for a
        # re-claim (spec/ha.md §4.7), or a snapshot taken meanwhile sees them
        temporary_reclaim_ms=0))
    rb = RunningBroker(config)
    yield rb
    rb.stop()


def snapshot(rb: RunningBroker) -> dict:
    """Everything a refused operation must leave as it was."""
    def read():
        b = rb.broker
        return {
            "queues": {n: (q.depth, json.dumps(q.config.to_dict(), sort_keys=True), len(q.consumers))
                       for n, q in b.queues.items()},
            "temp": sorted(b.destinations.temp_queues),
            "temp_topics": sorted(b.destinations.temp_topics),
            "topics": {n: sorted(t.subscriptions) for n, t in b.topics.items()},
            "durable": sorted(b.subscriptions.durable),
            "creators": dict(b.subscriptions.creators),
            "client_ids": dict(b.subscriptions.client_ids),
            "declared": json.dumps(b.declared, sort_keys=True),
            "acls": {d: a.to_dict() for d, a in b.acl.acls.items()},
            "catalog": sorted((k, bytes(v)) for k, v in b.store.iter_meta() if not k.startswith("seq:")),
        }
    return rb.call(read)


def settle(rb: RunningBroker, sessions: int) -> None:
    """Wait until the broker has seen the test's connections close."""
    deadline = time.monotonic() + 5
    while rb.call(lambda: len(rb.broker.sessions)) > sessions and time.monotonic() < deadline:
        time.sleep(0.01)


# -- clients -------------------------------------------------------------------------------------------------

class Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def connect(rb: RunningBroker, user: str | None, **headers: str) -> RawStomp:
    c = RawStomp(rb.port)
    h = {"accept-version": "1.2", "host": "/", **headers}
    if user is not None:
        h.update(login=user, passcode=f"{user}pw")
    c.send("CONNECT", h)
    frame = c.read()
    if frame.command == "ERROR":
        c.close()
        raise Refused(frame.headers.get("pymq-code", ""), frame.headers.get("message", ""))
    return c


def request(c: RawStomp, command: str, headers: dict, body: bytes = b"") -> None:
    """Send a frame with a receipt: return at the RECEIPT, raise Refused at an ERROR."""
    receipt = f"r-{uuid.uuid4().hex[:8]}"
    c.send(command, {**headers, "receipt": receipt}, body)
    while True:
        try:
            frame = c.read()
        except ConnectionError:
            raise Refused("closed", "connection closed without an answer") from None
        if frame.command == "ERROR":
            raise Refused(frame.headers.get("pymq-code", ""), frame.headers.get("message", ""))
        if frame.command == "RECEIPT" and frame.headers.get("receipt-id") == receipt:
            return


def admin_stomp(rb: RunningBroker, user: str | None, op: str, args: dict) -> Any:
    c = connect(rb, user)
    try:
        request(c, "SUBSCRIBE", {"destination": "/temp-queue/answers", "id": "answers"})
        c.send("SEND", {"destination": "/pymq/admin", "pymq-admin-op": op, "reply-to": "/temp-queue/answers",
                        "correlation-id": "1", "content-type": "application/json"}, json.dumps(args).encode())
        while True:
            frame = c.read()
            if frame.command == "MESSAGE":
                break
        answer = json.loads(frame.body)
    finally:
        c.close()
    if not answer["ok"]:
        raise Refused(answer["error"]["code"], answer["error"]["message"])
    return answer["result"]


def admin_http(rb: RunningBroker, user: str | None, op: str, args: dict) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{rb.server.admin_port}/api/{op}", method="POST",
                                 data=json.dumps(args).encode(), headers={"Content-Type": "application/json"})
    if user is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{user}pw".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            error = json.loads(body)["error"]
        except (ValueError, KeyError):
            error = {"code": str(exc.code), "message": body.decode(errors="replace")}
        raise Refused(error["code"], error["message"]) from None
    return answer["result"]


# -- destinations of every kind ------------------------------------------------------------------------------

#: the permission each operation needs, which "granted" (bob) gets
NEEDS = {"create": "create", "declare/alter": "consume", "alter": "manage", "drop": "manage", "purge": "purge", "produce": "produce",
         "consume": "consume", "browse": "browse", "ack-up-to": "consume", "durable subscribe": "consume",
         "durable unsubscribe": "consume", "grant/revoke": "manage", "metrics": "browse", "list": "browse",
         "dead-letter prefix": "create"}
_serial = itertools.count()


@dataclass
class Made:
    kind: str
    destination: str
    name: str = ""
    keep: list = field(default_factory=list)        # connections the destination lives on (a temp queue)
    client_id: str | None = None
    durable_name: str | None = None
    topic: str | None = None
    watch: str | None = None                        # a subscription key of the topic (its metrics)


def grant(rb: RunningBroker, actor: str, destination: str, principal: str, permission: str) -> None:
    admin_stomp(rb, actor, "grant", {"destination": destination, "principal": principal,
                                    "permissions": [permission]})


def send(rb: RunningBroker, user: str, destination: str, body: bytes = b"m") -> None:
    c = connect(rb, user)
    try:
        request(c, "SEND", {"destination": destination}, body)
    finally:
        c.close()


def make(rb: RunningBroker, kind: str, op: str) -> Made:
    n = next(_serial)
    perm = NEEDS[op]
    if kind == "new name":
        return Made(kind, f"/queue/new{n}", f"new{n}")
    if kind == "declared queue":
        name = f"decl{n}"
        admin_stomp(rb, "alice", "create-queue", {"name": name})
        send(rb, "alice", "/queue/" + name)
        grant(rb, "alice", "/queue/" + name, "user:bob", perm)
        return Made(kind, "/queue/" + name, name)
    if kind == "auto-created queue":
        name = f"auto{n}"
        send(rb, "alice", "/queue/" + name)            # alice makes it exist by use (default produce)
        grant(rb, "root", "/queue/" + name, "user:bob", perm)
        return Made(kind, "/queue/" + name, name)
    if kind == "configured queue":
        name = next(_configured_names)
        send(rb, "alice", "/queue/" + name)
        grant(rb, "root", "/queue/" + name, "user:bob", perm)
        return Made(kind, "/queue/" + name, name)
    if kind == "topic":
        name = f"topic{n}"
        send(rb, "alice", "/topic/" + name)
        grant(rb, "root", "/topic/" + name, "user:bob", perm)
        if op in ("metrics", "list"):
            # a subscription, so that the topic has metrics to show
            c = connect(rb, "root")
            request(c, "SUBSCRIBE", {"destination": "/topic/" + name, "id": "w",
                                     "durable-subscription-name": f"watch{n}"})
            c.close()
            return Made(kind, "/topic/" + name, name, watch=f"sub:root:watch{n}")
        return Made(kind, "/topic/" + name, name)
    if kind == "temp queue":
        c = connect(rb, "alice")
        request(c, "SUBSCRIBE", {"destination": "/temp-queue/mine", "id": "keep"})
        name = rb.call(lambda: next(q for q, v in rb.broker.destinations.temp_queues.items()
                                    if v.owner.user.name == "alice" and q.endswith(".mine")
                                    and not v.owner.closed))
        return Made(kind, "/temp-queue/" + name, name, keep=[c])
    if kind == "temp topic":
        c = connect(rb, "alice")
        request(c, "SUBSCRIBE", {"destination": "/temp-topic/mine", "id": "keep"})
        name = rb.call(lambda: next(t for t, v in rb.broker.destinations.temp_topics.items()
                                    if v.owner.user.name == "alice" and t.endswith(".mine")
                                    and not v.owner.closed))
        return Made(kind, "/temp-topic/" + name, name, keep=[c])
    if kind == "dead-letter queue":
        source = f"src{n}"
        admin_stomp(rb, "alice", "create-queue", {"name": source})
        send(rb, "root", f"/queue/DLQ.{source}")      # only the broker and administrators put messages there
        grant(rb, "alice", "/queue/" + source, "user:bob", perm)
        return Made(kind, f"/queue/DLQ.{source}", f"DLQ.{source}")
    if kind == "custom dead-letter queue":
        source = f"csrc{n}"
        admin_stomp(rb, "alice", "create-queue", {"name": source, "config": {"dead_letter_prefix": f"dl{n}."}})
        send(rb, "root", f"/queue/dl{n}.{source}")   # the queue was made with its source: reserved for it
        grant(rb, "alice", "/queue/" + source, "user:bob", perm)
        return Made(kind, f"/queue/dl{n}.{source}", f"dl{n}.{source}")
    if kind == "subscription dead-letter queue":
        topic = f"stopic{n}"
        grant(rb, "root", "/topic/" + topic, "user:alice", "consume")
        c = connect(rb, "alice")
        request(c, "SUBSCRIBE", {"destination": "/topic/" + topic, "id": "d", "durable-subscription-name": f"s{n}"})
        request(c, "UNSUBSCRIBE", {"id": "d"})              # detached; the subscription stays
        c.close()
        grant(rb, "root", "/topic/" + topic, "user:bob", perm)     # on the topic: not inherited
        send(rb, "root", f"/queue/DLQ.sub.alice.s{n}")
        return Made(kind, f"/queue/DLQ.sub.alice.s{n}", f"DLQ.sub.alice.s{n}")
    if kind == "expiry queue":
        rb.call(lambda: rb.broker.acl.forget("/queue/" + EXPIRY))
        send(rb, "root", "/queue/" + EXPIRY)
        grant(rb, "root", "/queue/" + EXPIRY, "user:bob", perm)
        return Made(kind, "/queue/" + EXPIRY, EXPIRY)
    if kind == "admin destination":
        return Made(kind, "/pymq/admin", "")
    if kind == "durable subscription":
        topic, cid = f"dtopic{n}", f"cid{n}"
        for user in ("alice", "bob"):
            grant(rb, "root", "/topic/" + topic, f"user:{user}", "consume")
        c = connect(rb, "alice", **{"client-id": cid})
        request(c, "SUBSCRIBE", {"destination": "/topic/" + topic, "id": "d", "durable-subscription-name": "d"})
        request(c, "UNSUBSCRIBE", {"id": "d"})             # detached; the subscription stays
        c.close()
        send(rb, "root", "/topic/" + topic)
        return Made(kind, "/topic/" + topic, topic, client_id=cid, durable_name="d", topic=topic)
    raise AssertionError(kind)


# -- operations ---------------------------------------------------------------------------------------------

def perform(rb: RunningBroker, op: str, made: Made, principal: str) -> bool | None:
    """Do ``op``; raise Refused when refused. For metrics and lists: whether the destination is shown."""
    user = USER_OF[principal]
    dest = made.destination
    if op in ("create", "declare/alter"):
        admin_stomp(rb, user, "create-queue", {"name": made.name})
    elif op == "dead-letter prefix":
        # a new queue whose dead-letter queue would be this destination
        admin_stomp(rb, user, "create-queue", {"name": made.name[1:], "config": {"dead_letter_prefix": made.name[0]}})
    elif op == "alter":
        admin_stomp(rb, user, "alter-queue", {"name": made.name, "config": {"max_deliveries": 7}})
    elif op == "drop":
        admin_stomp(rb, user, "drop-queue", {"name": made.name, "force": True})
    elif op == "purge":
        admin_stomp(rb, user, "purge-queue", {"name": made.name})
    elif op == "grant/revoke":
        admin_stomp(rb, user, "grant", {"destination": dest, "principal": "user:dave", "permissions": ["browse"]})
        admin_stomp(rb, user, "revoke", {"destination": dest, "principal": "user:dave", "permissions": ["browse"]})
    elif op in ("metrics", "list"):
        return visible(rb, op, made, user)
    else:
        on_frames(rb, op, made, principal, user)
    return None


def _on_owner_connection(made: Made, principal: str) -> RawStomp | None:
    # a temporary queue's owner is the connection that made it
    return made.keep[0] if made.kind in ("temp queue", "temp topic") and principal == "owner" else None


def on_frames(rb: RunningBroker, op: str, made: Made, principal: str, user: str | None) -> None:
    dest = made.destination
    headers = {"client-id": made.client_id} if made.client_id else {}
    own = _on_owner_connection(made, principal)
    c = own or connect(rb, user, **headers)
    try:
        if op == "produce":
            # a reply-to of one's own temporary queue makes that queue: a refused SEND must not
            extra = {"pymq-admin-op": "status"} if made.kind == "admin destination" else {}
            extra["reply-to"] = "/temp-queue/replies-here"
            request(c, "SEND", {"destination": dest, **extra}, b"{}")
        elif op == "consume":
            request(c, "SUBSCRIBE", {"destination": dest, "id": "c", "ack": "client-individual"})
        elif op == "browse":
            request(c, "SUBSCRIBE", {"destination": dest, "id": "b", "browser": "true"})
        elif op == "ack-up-to":
            h = {"id": "upto", "destination": dest, "pymq-ack-upto": "1000000"}
            if made.kind == "topic":
                h["durable-subscription-name"] = "mine"
            elif made.durable_name:
                h["durable-subscription-name"] = made.durable_name
            request(c, "ACK", h)
        elif op == "durable subscribe":
            request(c, "SUBSCRIBE", {"destination": dest, "id": "ds",
                                     "durable-subscription-name": made.durable_name or "mine"})
        elif op == "durable unsubscribe":
            request(c, "UNSUBSCRIBE", {"id": "gone", "pymq-durable-name": made.durable_name})
        else:
            raise AssertionError(op)
    finally:
        if own is None:
            c.close()


def visible(rb: RunningBroker, op: str, made: Made, user: str | None) -> bool:
    """Whether ``made`` appears in ``op``'s answers, over STOMP and over HTTP (which must agree)."""
    seen = []
    for call in (admin_stomp, admin_http):
        if call is admin_http and user is None:
            # no HTTP log-in for anonymous: the API answers 401 and shows nothing
            with pytest.raises(Refused):
                admin_http(rb, None, "metrics", {})
            seen.append(False)
            continue
        if op == "metrics":
            result = call(rb, user, "metrics", {})
            if made.kind == "topic":
                seen.append(made.watch in result["subscriptions"])
            else:
                seen.append(made.name in result["queues"])
        else:
            if made.kind == "topic":
                seen.append(made.name in [t["name"] for t in call(rb, user, "list-topics", {})])
                listed = made.destination in call(rb, user, "list-destinations", {})["topics"]
                assert listed == seen[-1]
            else:
                seen.append(made.name in [q["name"] for q in call(rb, user, "list-queues", {})])
                if made.kind in ("temp queue", "temp topic"):
                    # not among the queues: no queue-info, no topic listing, for anyone
                    assert made.destination not in json.dumps(call(rb, user, "list-destinations", {}))
                    assert made.name not in [t["name"] for t in call(rb, user, "list-topics", {})]
                    continue
                try:
                    call(rb, user, "queue-info", {"name": made.name})
                    info = True
                except Refused as exc:
                    assert exc.code == "access-denied", exc
                    info = False
                assert info == seen[-1], (op, made, user)
    assert seen[0] == seen[1], seen
    return seen[0]


# -- one test per cell -------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,kind,principal,allowed,code", CELLS,
                         ids=[f"{c[0]}|{c[1]}|{c[2]}" for c in CELLS])
def test_destination_cell(matrix_broker, op, kind, principal, allowed, code):
    rb = matrix_broker
    made = make(rb, kind, op)
    try:
        sessions = len(made.keep)            # the connections a temporary queue lives on
        settle(rb, sessions)
        before = snapshot(rb)
        try:
            shown = perform(rb, op, made, principal)
        except Refused as exc:
            assert not allowed, f"refused but the matrix allows it: {exc}"
            assert exc.code == code, exc
            if _on_owner_connection(made, principal) is not None:
                # the ERROR closed the owner's own connection, and its temporaries went with it (STOMP:
                # every error ends its connection); nothing else may change
                sessions = 0
                settle(rb, sessions)
                after = snapshot(rb)
                for key in ("temp", "temp_topics"):
                    before.pop(key), after.pop(key)
            else:
                settle(rb, sessions)
                after = snapshot(rb)
            assert after == before, "a refused operation changed the broker"
            return
        if shown is not None:                   # metrics and lists answer; the cell says what they show
            assert shown == allowed
            settle(rb, sessions)
            assert snapshot(rb) == before       # reading changes nothing
            return
        assert allowed, "allowed but the matrix refuses it"
    finally:
        for c in made.keep:
            c.close()


@pytest.mark.parametrize("op,principal,allowed,code", WIDE, ids=[f"{c[0]}|{c[1]}" for c in WIDE])
def test_broker_wide_cell(matrix_broker, op, principal, allowed, code):
    rb = matrix_broker
    user = USER_OF_WIDE[principal]
    sessions = 0
    settle(rb, sessions)
    before = snapshot(rb)
    calls = {"storage rules": ["storage", "list-rules", "add-rule", "remove-rule"],
             "cluster ops": ["cluster", "list-outboxes", "purge-outbox"],
             "status": ["status", "overview"]}
    if op == "prometheus":
        req = urllib.request.Request(f"http://127.0.0.1:{rb.server.admin_port}/metrics")
        if user is not None:
            req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{user}pw".encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                assert b"pymq_build_info" in response.read()
                ok = True
        except urllib.error.HTTPError as exc:
            assert exc.code in (401, 403)
            ok = False
        assert ok == allowed
        return
    args = {"id": "r1", "device": "memory", "weight": 1, "condition": "TRUE", "node": "n9"}
    for name in calls[op]:
        for call in (admin_stomp, admin_http):
            if call is admin_http and user is None:
                continue                        # anonymous has no HTTP log-in (401)
            try:
                call(rb, user, name, args)
                passed = True
            except Refused as exc:
                # the administrator passes the check; a broker without rules or a cluster then says so
                passed = exc.code != "access-denied"
                if not passed:
                    assert exc.code == code
            assert passed == allowed, (name, call.__name__, user)
    if not allowed:
        settle(rb, sessions)
        assert snapshot(rb) == before

