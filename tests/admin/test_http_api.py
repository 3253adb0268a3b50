"""The admin HTTP API as the console and curl use it: console sessions (HttpOnly cookie + CSRF token),
what a forged or cross-site request gets (refused, and nothing changed), GET only for read-only
operations, hostile arguments, the static console files, and the STOMP admin destination running an
operation whose slow part is offloaded."""
from __future__ import annotations

import json
import queue as queue_mod
import urllib.error
import urllib.request

import pytest
import stomp

import pymq
from tests.admin.conftest import ADMIN, ADMIN_PW, APP, APP_PW


def _login(b, user=ADMIN, password=ADMIN_PW):
    status, raw, headers = b.http("POST", "/api/session", {"user": user, "password": password}, user=None)
    assert status == 200, raw
    cookie = headers["Set-Cookie"]
    token = cookie.split(";", 1)[0]
    return token, json.loads(raw)["result"], cookie


def _depth(b, name):
    return b.op("queue-info", name=name)["metrics"]["depth"]


def _fill(b, name, n=3):
    with pymq.connect(b.url, username=ADMIN, password=ADMIN_PW) as conn:
        p = conn.create_session().create_producer(pymq.Queue(name))
        for i in range(n):
            p.send(f"m{i}")


def test_login_cookie_is_httponly_strict_and_csrf_guards_changes(broker_process):
    b = broker_process
    _fill(b, "http.csrf")
    token, session, cookie = _login(b)
    attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")}
    assert {"httponly", "samesite", "path"} <= attrs and "samesite=strict" in cookie.lower()
    assert session["user"] == ADMIN and session["admin"] is True and len(session["csrf"]) >= 40
    # reading with the cookie needs no CSRF token
    status, raw, _ = b.http("GET", "/api/list-queues", user=None, headers={"Cookie": token})
    assert status == 200 and "http.csrf" in raw.decode()
    status, raw, _ = b.http("GET", "/api/session", user=None, headers={"Cookie": token})
    assert status == 200 and json.loads(raw)["result"]["csrf"] == session["csrf"]
    # a change without the token, or with a wrong one: 403 and nothing purged
    for extra in ({}, {"X-CSRF-Token": "guess"}):
        status, raw, _ = b.http("POST", "/api/purge-queue", {"name": "http.csrf"}, user=None,
                                headers={"Cookie": token, **extra})
        assert status == 403 and json.loads(raw)["error"]["permission"] == "csrf"
    assert _depth(b, "http.csrf") == 3
    # a cross-site page's request (Origin of another site) is refused even with the token
    status, _, _ = b.http("POST", "/api/purge-queue", {"name": "http.csrf"}, user=None,
                          headers={"Cookie": token, "X-CSRF-Token": session["csrf"], "Origin": "https://evil.example"})
    assert status == 403 and _depth(b, "http.csrf") == 3
    # the page's own request
    status, raw, _ = b.http("POST", "/api/purge-queue", {"name": "http.csrf"}, user=None,
                            headers={"Cookie": token, "X-CSRF-Token": session["csrf"],
                                     "Origin": b.admin_url})
    assert status == 200 and json.loads(raw)["result"]["purged_messages"] == 3
    # log out: the cookie is worthless afterwards
    status, _, headers = b.http("DELETE", "/api/session", user=None,
                                headers={"Cookie": token, "X-CSRF-Token": session["csrf"]})
    assert status == 200 and "pymq_session=;" in headers["Set-Cookie"].replace('""', "")
    assert b.http("GET", "/api/list-queues", user=None, headers={"Cookie": token})[0] == 401


def test_login_refusals_and_no_credentials_in_urls(broker_process):
    b = broker_process
    status, raw, headers = b.http("POST", "/api/session", {"user": ADMIN, "password": "wrong"}, user=None)
    assert status == 401 and "Set-Cookie" not in headers
    assert json.loads(raw)["error"]["code"] == "authentication-failed"
    # credentials in a query string log nobody in
    status, _, headers = b.http("GET", f"/api/session?user={ADMIN}&password={ADMIN_PW}", user=None)
    assert status == 401 and "Set-Cookie" not in headers
    # a form post (what a cross-site page can send without asking) is not accepted
    status, raw, headers = b.http("POST", "/api/session", f"user={ADMIN}&password={ADMIN_PW}".encode(),
                                  user=None, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 400 and "Set-Cookie" not in headers
    status, _, _ = b.http("POST", "/api/session", b"[1, 2]", user=None)
    assert status == 400


def test_basic_auth_changes_need_json_and_get_is_read_only(broker_process):
    b = broker_process
    _fill(b, "http.form", 2)
    # a browser holding basic credentials could be made to send a form post: refused, nothing purged
    status, _, _ = b.http("POST", "/api/purge-queue", b"name=http.form",
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 400 and _depth(b, "http.form") == 2
    status, _, _ = b.http("POST", "/api/purge-queue", b'{"name": "http.form"}', headers={"Content-Type": "text/plain"})
    assert status == 400 and _depth(b, "http.form") == 2
    # GET never changes anything
    status, raw, _ = b.http("GET", "/api/purge-queue?name=http.form")
    assert status == 405 and "use POST" in json.loads(raw)["error"]["message"] and _depth(b, "http.form") == 2
    status, raw, _ = b.http("GET", "/api/browse-queue?name=http.form&limit=1")
    assert status == 200 and len(json.loads(raw)["result"]["messages"]) == 1


def test_sessions_follow_user_changes(broker_process):
    b = broker_process
    b.op("add-user", name="frank", password="frank-1", roles=["admin"])
    token, session, _ = _login(b, "frank", "frank-1")
    assert b.http("GET", "/api/connections", user=None, headers={"Cookie": token})[0] == 200
    b.op("set-roles", name="frank", roles=["app"])                 # demoted: refused at once
    status, raw, _ = b.http("GET", "/api/connections", user=None, headers={"Cookie": token})
    assert status == 403 and "administrators only" in json.loads(raw)["error"]["message"]
    b.op("set-password", name="frank", password="frank-2")          # new password: session ends
    assert b.http("GET", "/api/list-queues", user=None, headers={"Cookie": token})[0] == 401
    token, _, _ = _login(b, "frank", "frank-2")
    b.op("remove-user", name="frank")                               # removed: session ends
    assert b.http("GET", "/api/list-queues", user=None, headers={"Cookie": token})[0] == 401


def test_hostile_arguments_are_precise_errors(broker_process):
    b = broker_process
    _fill(b, "http.hostile", 1)
    cases = [
        ("browse-queue", {"name": "http.hostile", "limit": 10**12}, "between 1 and 500"),
        ("browse-queue", {"name": "http.hostile", "limit": "1e9"}, "digits only"),
        ("browse-queue", {"name": "http.hostile", "offset": "9" * 40}, "at most 19"),
        ("browse-queue", {"name": "http.hostile", "limit": True}, "must be an integer"),
        ("browse-queue", {"name": "x" * 5000}, "at most 1024"),
        ("browse-queue", {"name": ["a"]}, "must be a string"),
        ("move-messages", {"from": "http.hostile", "to": "other", "message_ids": ["x"] * 10_001}, "at most 10000"),
        ("move-messages", {"from": "http.hostile", "to": "/temp-queue/x"}, "to a queue or a topic"),
        ("move-messages", {"from": "http.hostile", "to": "http.hostile"}, "to itself"),
        ("drop-messages", {"name": "http.hostile"}, "use purge-queue"),
        ("create-queue", {"name": "q", "config": [1]}, "mapping"),
        ("add-user", {"name": "x\u0000y", "password": "p"}, "printable"),
        ("set-roles", {"name": ADMIN, "roles": [{"deep": ["nest"]}]}, "list of role names"),
    ]
    for op, args, expected in cases:
        status, raw, _ = b.http("POST", "/api/" + op, args)
        answer = json.loads(raw)
        assert status in (400, 404), (op, args, raw)
        assert expected in answer["error"]["message"], (op, expected, answer)
    status, raw, _ = b.http("POST", "/api/browse-queue", b'{"name": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert status == 400
    status, raw, _ = b.http("POST", "/api/status", b"{not json")
    assert status == 400 and "not JSON" in json.loads(raw)["error"]["message"]
    assert _depth(b, "http.hostile") == 1                         # and the broker is still fine
    assert b.op("status")["ready"] is True


def test_move_refused_on_either_side_moves_nothing(broker_process):
    b = broker_process
    b.op("create-queue", name="http.private-target")
    _fill(b, "http.open-source", 2)                  # auto-created: everyone may consume
    status, raw, _ = b.http("POST", "/api/move-messages", {"from": "http.open-source", "to": "http.private-target"},
                            user=APP, password=APP_PW)
    assert status == 403 and json.loads(raw)["error"]["destination"] == "/queue/http.private-target"
    assert _depth(b, "http.open-source") == 2 and _depth(b, "http.private-target") == 0


def test_console_files_and_security_headers(broker_process):
    b = broker_process
    status, raw, headers = b.http("GET", "/", user=None)
    assert status == 200 and b"<title>pymq console</title>" in raw
    assert headers["Content-Type"].startswith("text/html")
    assert "default-src 'self'" in headers["Content-Security-Policy"] and headers["X-Frame-Options"] == "DENY"
    for name, kind in (("app.js", "text/javascript"), ("charts.js", "text/javascript"), ("app.css", "text/css"),
                       ("favicon.svg", "image/svg+xml")):
        status, raw, headers = b.http("GET", "/console/" + name, user=None)
        assert status == 200 and headers["Content-Type"].startswith(kind) and raw
    for path in ("/console/../ops.py", "/console/%2e%2e%2fops.py", "/console/ops.py", "/console/"):
        assert b.http("GET", path, user=None)[0] == 404
    # no page asks the network for anything but its own origin
    for name in ("index.html", "app.js", "charts.js", "app.css"):
        text = b.http("GET", "/" if name == "index.html" else "/console/" + name, user=None)[1].decode()
        assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text
    status, _, headers = b.http("GET", "/api/status")
    assert headers["Cache-Control"] == "no-store"


def test_stomp_admin_destination_runs_offloaded_operations(broker_process):
    """add-user hashes in a worker thread: the answer still arrives on the reply-to queue."""
    b = broker_process
    replies: queue_mod.Queue = queue_mod.Queue()

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            replies.put(frame)

    c = stomp.Connection12([("127.0.0.1", b.port)], heartbeats=(0, 0))
    c.set_listener("l", Listener())
    c.connect(ADMIN, ADMIN_PW, wait=True)
    try:
        c.subscribe("/temp-queue/r", id="r", ack="auto")
        c.send("/pymq/admin", json.dumps({"name": "grace", "password": "grace-1", "roles": ["app"]}),
               headers={"pymq-admin-op": "add-user", "reply-to": "/temp-queue/r", "correlation-id": "u1"})
        answer = replies.get(timeout=10)
        assert answer.headers["correlation-id"] == "u1"
        assert json.loads(answer.body)["result"] == {"added": "grace", "roles": ["app"], "users": 3}
        c.send("/pymq/admin", json.dumps({"name": "grace", "password": "again"}),
               headers={"pymq-admin-op": "add-user", "reply-to": "/temp-queue/r", "correlation-id": "u2"})
        refused = json.loads(replies.get(timeout=10).body)
        assert refused["ok"] is False and "already exists" in refused["error"]["message"]
    finally:
        c.disconnect()
    with pymq.connect(b.url, username="grace", password="grace-1"):
        pass
    # alice is no administrator: refused before anything is hashed or written
    c = stomp.Connection12([("127.0.0.1", b.port)], heartbeats=(0, 0))
    c.set_listener("l", Listener())
    c.connect(APP, APP_PW, wait=True)
    try:
        c.subscribe("/temp-queue/r", id="r", ack="auto")
        c.send("/pymq/admin", json.dumps({"name": "mallory", "password": "x", "roles": ["admin"]}),
               headers={"pymq-admin-op": "add-user", "reply-to": "/temp-queue/r"})
        refused = json.loads(replies.get(timeout=10).body)
        assert refused["error"]["code"] == "access-denied"
    finally:
        c.disconnect()
    assert "mallory" not in open(b.users_file).read()
    b.op("remove-user", name="grace")


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_probes_need_no_login(broker_process, path):
    status, raw, _ = broker_process.http("GET", path, user=None)
    assert status == 200
    body = json.loads(raw)
    assert body.get("status") == "ok" or body.get("ready") is True


def test_deeply_nested_admin_bodies_are_answered_not_crashed(broker_process):
    """Regression: JSON nested 100,000 deep made the HTTP API answer 500 and cost a STOMP client its
    connection (RecursionError escaped the admin adapters)."""
    b = broker_process
    nested = "[" * 100_000 + "]" * 100_000
    status, raw, _ = b.http("POST", "/api/list-queues", nested.encode())
    assert status == 400 and "nested too deeply" in json.loads(raw)["error"]["message"]
    replies: queue_mod.Queue = queue_mod.Queue()

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            replies.put(frame)

    c = stomp.Connection12([("127.0.0.1", b.port)], heartbeats=(0, 0))
    c.set_listener("l", Listener())
    c.connect(ADMIN, ADMIN_PW, wait=True)
    try:
        c.subscribe("/temp-queue/r", id="r", ack="auto")
        c.send("/pymq/admin", nested, headers={"pymq-admin-op": "list-queues", "reply-to": "/temp-queue/r"})
        answer = json.loads(replies.get(timeout=10).body)
        assert answer["ok"] is False and "nested too deeply" in answer["error"]["message"]
        c.send("/pymq/admin", "{}", headers={"pymq-admin-op": "status", "reply-to": "/temp-queue/r"})
        assert json.loads(replies.get(timeout=10).body)["result"]["ready"] is True   # still connected
    finally:
        c.disconnect()


def test_a_failing_operation_is_answered_and_logged_not_the_callers_loss(broker_factory, monkeypatch, caplog):
    """A bug inside an operation (here: one that raises ZeroDivisionError) is an answer — HTTP 500, a STOMP
    reply — with the traceback in the broker's log; the STOMP client keeps its connection."""
    from pymq_server.admin import ops

    def broken(admin, user, args):
        return 1 // 0
    monkeypatch.setitem(ops.OPERATIONS, "status", broken)
    rb = broker_factory(admin_port=0)
    req = urllib.request.Request(f"http://127.0.0.1:{rb.server.admin_port}/api/status",
                                 headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("expected HTTP 500")
    except urllib.error.HTTPError as err:
        assert err.code == 500
        assert json.loads(err.read())["error"]["message"] == "status failed: internal broker error (see the broker's log)"
    replies: queue_mod.Queue = queue_mod.Queue()

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            replies.put(frame)

    c = stomp.Connection12([("127.0.0.1", rb.port)], heartbeats=(0, 0))
    c.set_listener("l", Listener())
    c.connect("guest", "guest", wait=True)
    try:
        c.subscribe("/temp-queue/r", id="r", ack="auto")
        c.send("/pymq/admin", "{}", headers={"pymq-admin-op": "status", "reply-to": "/temp-queue/r"})
        assert json.loads(replies.get(timeout=10).body)["ok"] is False
        c.send("/pymq/admin", "{}", headers={"pymq-admin-op": "list-queues", "reply-to": "/temp-queue/r"})
        assert json.loads(replies.get(timeout=10).body)["ok"] is True            # still connected
    finally:
        c.disconnect()
    assert any("ZeroDivisionError" in (r.exc_text or "") or (r.exc_info and r.exc_info[0] is ZeroDivisionError)
               for r in caplog.records if r.name == "pymq.admin")
