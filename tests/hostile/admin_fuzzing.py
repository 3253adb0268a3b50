"""Generated HTTP requests against a real ``pymq-server``'s admin port (issue 24: every input surface in
the fuzz suite), shared by ``tests/hostile/test_admin_fuzz.py`` (a short run) and ``python -m bench.fuzz``
(``--only admin``, the long one).

A request is built from the port's own grammar — every route and admin operation, credentials right,
wrong, malformed or absent, a console cookie and CSRF token, Content-Length right, short, long, negative,
doubled or huge, chunked bodies with good and bad sizes, ``Expect: 100-continue``, JSON bodies of the
operations' own argument names with hostile values (deep nesting, huge numbers, long and odd strings) —
then sometimes mutated (bytes flipped, inserted or cut), sent in one to three writes, with or without
the write side shut.  What must hold for each one, checked from outside:

* the broker process is alive;
* within the request deadline the broker has answered with an HTTP status line or closed the
  connection — it never holds a connection that sends nothing more;
* no answer is ``500`` (an operation that failed for a reason of the broker's own);
* a request without valid credentials never gets a ``2xx`` from ``/api/`` (the log-in route aside), and
  nothing it names is created: every queue and user name such a request carries starts with ``unauth-``,
  and :func:`check_broker` finds none on the broker;
* after a batch, the log has no traceback and both ports still serve a client.
"""
from __future__ import annotations

import base64
import json
import re
import socket
import time
from dataclasses import dataclass, field

from hypothesis import strategies as st

FUZZ_USER, FUZZ_PW = "fuzz-admin", "fuzz-secret"
KEEPER, KEEPER_PW = "keeper", "keeper-secret"        # the checks' own administrator: fuzz bodies never name it
#: the broker's request deadline in the fuzz configuration (admin_request_timeout_ms)
DEADLINE_MS = 600

OPERATIONS = [
    "status", "overview", "list-queues", "create-queue", "alter-queue", "drop-queue", "purge-queue", "queue-info",
    "metrics", "list-destinations", "list-topics", "list-subscriptions", "grant", "revoke", "acl", "storage",
    "add-rule", "replace-rule", "remove-rule", "list-rules", "list-quarantine", "drop-quarantined", "connections",
    "close-connection", "list-consumers", "cluster", "list-outboxes", "purge-outbox", "browse-queue", "get-message",
    "move-messages", "retry-dead-letters", "drop-messages", "list-dead-letter-queues", "list-users", "add-user",
    "set-password", "set-roles", "remove-user", "reload", "export-definitions", "import-definitions", "list-vhosts",
    "no-such-op",
]
#: argument names the operations read (server/admin/ops.py, messages.py, users.py)
KEYS = ["name", "queue", "from", "to", "destination", "principal", "permissions", "grants", "config", "limit",
        "offset", "body_limit", "id", "ids", "message_id", "key", "device", "node", "user", "password", "roles",
        "force", "forget", "reasons", "selector", "match", "rule", "index", "dead_letter_prefix", "max_depth",
        "definitions", "pymq_definitions", "vhosts", "vhost", "queues", "users", "settings", "acl", "storage_rules"]
#: keys whose text names something the request could create (queues, users, destinations)
NAMING = {"name", "queue", "from", "to", "destination", "principal", "user", "key"}


def _auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


#: (header value or None, whether it authenticates)
CREDENTIALS = [
    (_auth(FUZZ_USER, FUZZ_PW), True),
    (_auth(FUZZ_USER, "wrong"), False),
    (_auth("unauth-nobody", "x"), False),
    ("Basic !!!not-base64", False),
    ("Basic " + base64.b64encode(b"no-colon").decode(), False),
    ("Basic " + base64.b64encode(b"\xff\xfe:\x00").decode(), False),
    ("Bearer abc.def", False),
    ("Basic " + "A" * 6000, False),
    (None, False),
]

_leaf = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.sampled_from([0, -1, 1, 2 ** 31, 2 ** 63, 2 ** 64, 10 ** 30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(["", "*", "#", "/queue/x", "/topic/#", "../../etc", "a" * 5000, "\u0000", "\ud7ff\ue000",
                     "DLQ.", "or", "/temp-queue/1", "pymq.", "$sys"]),
)
_json = st.recursive(_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                    st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)),
                     max_leaves=12)


@dataclass
class Request:
    raw: bytes
    authenticated: bool
    path: str
    pieces: list[int] = field(default_factory=list)     # cut points: the request is written in pieces
    shut: bool = False                                   # the write side shut after the last piece

    def describe(self) -> str:
        return f"{self.raw[:600]!r}{'...' if len(self.raw) > 600 else ''} (pieces {self.pieces}, shut {self.shut})"


def _name(draw, authenticated: bool) -> str:
    prefix = "fz-" if authenticated else "unauth-"
    return prefix + draw(st.text(alphabet="abcxyz.-_*#/$", max_size=12))


@st.composite
def bodies(draw, authenticated: bool) -> bytes:
    kind = draw(st.sampled_from(["args"] * 6 + ["json", "bytes", "deep", "empty"]))
    if kind == "empty":
        return b""
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "deep":
        depth = draw(st.integers(1, 5000))
        return b"[" * depth + b"]" * draw(st.sampled_from([depth, 0, depth // 2]))
    if kind == "json":
        return json.dumps(draw(_json)).encode()
    args = {}
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=5, unique=True)):
        value = draw(_json)
        if key in NAMING or isinstance(value, str):
            value = _name(draw, authenticated) if draw(st.booleans()) or key in NAMING else value
        args[key] = value
    return json.dumps(args).encode()


@st.composite
def requests(draw) -> Request:
    # half the requests log in, so the operations themselves are reached as often as the refusals
    credentials, authenticated = draw(st.sampled_from(CREDENTIALS[:1] * (len(CREDENTIALS) - 1) + CREDENTIALS[1:]))
    method = draw(st.sampled_from(["POST", "GET", "POST", "GET", "POST", "POST", "DELETE", "PUT", "HEAD", "OPTIONS",
                                   "PATCH", "G\x01T", "CONNECT"]))
    op = draw(st.sampled_from(OPERATIONS))
    path = draw(st.sampled_from([
        f"/api/{op}", f"/api/{op}", f"/api/{op}", "/api/session", "/api/queues", "/api/topics", "/api/storage",
        "/", "/healthz", "/readyz", "/metrics", "/console/app.js", "/console/..%2f..%2fetc%2fpasswd",
        "/api/queues/" + _name(draw, authenticated), "/api/" + "%ff" * 10, "/api/" + "x" * 9000, "*",
        "http://127.0.0.1/api/status", "/api/status?limit=" + "9" * 40]))
    lines = [f"{method} {path} HTTP/1.{draw(st.sampled_from([1, 1, 1, 0]))}", "Host: 127.0.0.1"]
    if credentials is not None:
        lines.append(f"Authorization: {credentials}")
    body = draw(bodies(authenticated))
    if draw(st.integers(0, 4)) != 4:           # (hypothesis draws the smallest value often: 0 is the usual case)
        lines.append("Content-Type: " + draw(st.sampled_from(["application/json"] * 4 + [
            "text/plain", "application/json; charset=latin-1", "multipart/form-data; boundary=x"])))
    framing = draw(st.sampled_from(["length"] * 8 + ["none", "short", "long", "negative", "double", "huge",
                                                     "chunked", "chunked", "bad-chunk", "huge-chunk", "both"]))
    payload = body
    if framing == "length":
        lines.append(f"Content-Length: {len(body)}")
    elif framing == "short":
        lines.append(f"Content-Length: {max(0, len(body) - draw(st.integers(1, 50)))}")
    elif framing == "long":
        lines.append(f"Content-Length: {len(body) + draw(st.integers(1, 5000))}")
    elif framing == "negative":
        lines.append("Content-Length: -1")
    elif framing == "double":
        lines += [f"Content-Length: {len(body)}", f"Content-Length: {len(body) + 1}"]
    elif framing == "huge":
        lines.append("Content-Length: " + draw(st.sampled_from(["209715200", "99999999999999999999999", "1e9",
                                                                "0x10"])))
    elif framing in ("chunked", "bad-chunk", "huge-chunk", "both"):
        lines.append("Transfer-Encoding: chunked")
        if framing == "both":
            lines.append(f"Content-Length: {len(body)}")
        cut = draw(st.integers(1, 64))
        chunks = [body[i:i + cut] for i in range(0, len(body), cut)]
        size = {"bad-chunk": lambda c: "zz", "huge-chunk": lambda c: "fffffffffffffff"}.get(
            framing, lambda c: format(len(c), "x"))
        payload = b"".join(size(c).encode() + b"\r\n" + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    for header in draw(st.lists(st.sampled_from([
            "Connection: close", "Connection: keep-alive", "Expect: 100-continue", "Origin: http://evil.example",
            "Cookie: pymq-session=" + "x" * 40, "X-CSRF-Token: abc", "Accept-Encoding: gzip, deflate, br",
            "Upgrade: websocket", "X-Long: " + "y" * 9000]), max_size=3)):
        lines.append(header)
    if draw(st.integers(0, 5)) == 5:                     # a header no parser should take
        lines.insert(draw(st.integers(1, len(lines))), draw(st.sampled_from(
            ["Bad Header", ": empty-name", "X\x00Null: 1", "Host: second", " folded", "X-Big: " + "z" * 70000])))
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + payload
    # mutations: each may make a valid request invalid (never a wrong one authenticated: see the check)
    for _ in range(draw(st.integers(1, 3)) if draw(st.integers(0, 3)) == 3 else 0):
        at = draw(st.integers(0, max(0, len(raw) - 1)))
        how = draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        if how == "flip" and raw:
            raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1:]
        elif how == "insert":
            raw = raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
        elif how == "delete":
            raw = raw[:at] + raw[at + 1:]
        else:
            raw = raw[:at]
    pieces = sorted(draw(st.lists(st.integers(0, max(0, len(raw))), max_size=2)))
    return Request(raw, authenticated, path, pieces, shut=draw(st.integers(0, 3)) == 3)


def _answer(data: bytes, method_head: bool) -> tuple[int | None, bool]:
    """The first final status in ``data`` and whether its answer is complete."""
    while True:
        m = re.match(rb"HTTP/1\.[01] (\d{3})[^\r\n]*\r\n", data)
        if not m:
            return None, False
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return int(m.group(1)), False
        status = int(m.group(1))
        if status == 100:
            data = data[end + 4:]
            continue
        head = data[:end].lower()
        rest = data[end + 4:]
        if method_head or status in (204, 304):
            return status, True
        length = re.search(rb"\r\ncontent-length: *(\d+)", head)
        if length:
            return status, len(rest) >= int(length.group(1))
        if b"transfer-encoding: chunked" in head:
            return status, rest.endswith(b"0\r\n\r\n")
        return status, False                  # the answer ends when the connection does


def send(port: int, request: Request, deadline_s: float) -> tuple[int | None, str]:
    """Send one generated request; its final status (None if none) and how it ended: ``answered`` (a
    complete answer), ``closed`` (by the broker) or ``held`` (still open, nothing more, past the deadline)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    data = b""
    try:
        start = 0
        for cut in [*request.pieces, len(request.raw)]:
            try:
                sock.sendall(request.raw[start:cut])
            except OSError:
                break
            start = cut
        if request.shut:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        end = time.monotonic() + deadline_s
        head = request.raw.startswith(b"HEAD ")
        while time.monotonic() < end:
            sock.settimeout(max(0.01, end - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                return _answer(data, head)[0], "closed"
            if not chunk:
                return _answer(data, head)[0], "closed"
            data += chunk
            status, complete = _answer(data, head)
            if complete:
                return status, "answered"
        return _answer(data, head)[0], "held"
    finally:
        sock.close()


def check(port: int, request: Request, alive) -> str | None:
    """What went wrong with one request, or None."""
    deadline = 2 * DEADLINE_MS / 1000 + 3.0        # the broker's deadline, twice, and a loaded machine's slack
    status, how = send(port, request, deadline)
    if not alive():
        return f"the broker died after {request.describe()}"
    if how == "held":
        return f"held open {deadline:.1f} s without an answer ({status}): {request.describe()}"
    if status == 500:
        return f"500: {request.describe()}"
    if (status is not None and 200 <= status < 300 and not request.authenticated
            and request.path.startswith("/api/") and not request.path.startswith("/api/session")):
        return f"{status} without valid credentials: {request.describe()}"
    return None


def check_broker(http) -> list[str]:
    """After a batch: nothing a request without credentials named exists. ``http(method, path)`` answers
    as the keeper (status, JSON)."""
    problems = []
    status, queues = http("GET", "/api/queues")
    if status != 200:
        return [f"list-queues as the keeper answered {status}"]
    text = json.dumps(queues)
    if "unauth-" in text:
        problems.append(f"a queue named by an unauthenticated request exists: {text[:500]}")
    status, users = http("POST", "/api/list-users")
    if status == 200 and "unauth-" in json.dumps(users):
        problems.append(f"a user named by an unauthenticated request exists: {json.dumps(users)[:500]}")
    return problems


def start(directory):
    """A ``pymq-server`` with its admin port, the fuzz administrator and the checks' own."""
    from tests.admin.conftest import BrokerProcess
    return BrokerProcess(directory, users={FUZZ_USER: (FUZZ_PW, ["admin"]), KEEPER: (KEEPER_PW, ["admin"])},
                         config={"admin_request_timeout_ms": DEADLINE_MS}).start()


def keeper_http(bp):
    def http(method: str, path: str):
        status, raw, _ = bp.http(method, path, {} if method == "POST" else None, user=KEEPER, password=KEEPER_PW)
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")
    return http


def run_batch(bp, examples: int, stats: dict | None = None) -> list[str]:
    """``examples`` generated requests against ``bp``; the failures found (the batch goes on after one)."""
    from hypothesis import HealthCheck, Phase, given, settings

    failures: list[str] = []
    alive = lambda: bp.proc.poll() is None            # noqa: E731 - one line, read once per request

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(requests())
    def one(request: Request) -> None:
        if not alive():
            return
        problem = check(bp.admin_port, request, alive)
        if stats is not None:
            stats["requests"] = stats.get("requests", 0) + 1
            stats["bytes"] = stats.get("bytes", 0) + len(request.raw)
        if problem:
            failures.append(problem)

    one()
    if alive():
        failures += check_broker(keeper_http(bp))
    text = "".join(bp.log)
    if "Traceback" in text:
        failures.append("a traceback in the broker's log: " + text[text.index("Traceback"):][:2000])
    return failures
