"""STOMP clients in other languages under pytest's control, and the scenarios each of them runs with the SDK.

A *driver* is a small program in the client's own language (``tests/interop/node/driver.js`` for stompit,
``tests/interop/go/main.go`` for go-stomp) that makes its client library do what the test asks.  The test
talks to it over pipes, one JSON object per line each way, strictly one reply per request, in order:

=============  ==================================================================  ========================
op             request fields                                                      reply (besides ``ok``)
=============  ==================================================================  ========================
hello          —                                                                   client, library,
                                                                                   error_frames (bool: does
                                                                                   the client expose ERROR
                                                                                   headers)
connect        port, host, version (the one version to accept), login, passcode,   version, headers
               headers{} (more CONNECT headers: host:/<vhost> a virtual host)
send           destination, body_hex, content_type, headers{}, receipt, transaction receipted
subscribe      id, destination, ack, headers{}                                     —
sync           — (BEGIN + ABORT with a receipt: a barrier for earlier frames)      —
receive        subscription, timeout_ms                                            message: {headers: [[k,
                                                                                   v]...], body_hex} | null
ack / nack     message_id, transaction                                             —
begin          transaction (a name; the driver maps it to the client's own id)    transaction_id
commit / abort transaction, receipt                                                receipted
unsubscribe    id, headers{}  (returns once the broker processed it)               —
error          timeout_ms: wait for the first ERROR/connection failure seen        error: {message, ...}|null
disconnect     —                                                                   —
=============  ==================================================================  ========================

A failed op replies ``{"ok": false, "error": "<text>", "frame": {...}}``.  Headers sent are escaped and
headers received are unescaped by the client library itself: the drivers never touch frames.

Drivers are found through environment variables set by ``.ci/interop-clients.sh`` (a command line, split
with shlex).  An unset variable is a skip naming the variable and the script, or a failure under ``CI``:
the rule of ``tests/storage/services.py``, reused here.  A driver that is set but does not answer
``hello`` is always a failure.

``SCENARIOS`` are plain functions ``scenario(broker, connect)``; ``connect()`` returns a new, connected
:class:`ForeignClient` speaking the STOMP version the test module parametrises.  Every foreign-client test
module runs all of them (see ``test_node_stompit.py`` and ``test_go_stomp.py``).
"""
from __future__ import annotations

import json
import queue
import shlex
import subprocess
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterator

import pytest

import pymq
from tests.storage.services import service_url

PROVIDER = ".ci/interop-clients.sh"


class DriverError(AssertionError):
    """The driver process broke its protocol (no answer, exit, unparsable line)."""


@dataclass
class ForeignMessage:
    """A MESSAGE as the foreign client handed it over (headers already unescaped by that client)."""

    header_list: list[tuple[str, str]]
    body: bytes
    headers: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.headers = {}
        for name, value in self.header_list:
            self.headers.setdefault(name, value)          # repeated header: first wins (STOMP 1.2)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    @property
    def message_id(self) -> str:
        return self.headers["message-id"]


class ForeignClient:
    """One driver process, i.e. one connection of the foreign client library."""

    def __init__(self, argv: list[str], label: str) -> None:
        self.label = label
        self.version: str | None = None
        self._stderr = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=self._stderr)
        except OSError as exc:
            pytest.fail(f"cannot start the {label} driver {argv}: {exc}", pytrace=False)
        self._replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name=f"{label}-replies").start()
        hello = self.call("hello", timeout=60)
        self.error_frames = bool(hello.get("error_frames"))

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                self._replies.put(json.loads(line))
            except ValueError:
                self._replies.put({"ok": False, "error": f"unparsable driver output: {line!r}"})
        self._replies.put(None)

    def _stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")[-4000:]

    # -- protocol ------------------------------------------------------------------------------
    def call(self, op: str, timeout: float = 20.0, **fields) -> dict:
        """Send one request and return the reply as it is (``ok`` may be false)."""
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps({"op": op, **fields}) + "\n").encode("utf-8"))
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise DriverError(f"{self.label} driver is gone; its stderr:\n{self._stderr_text()}") from None
        try:
            reply = self._replies.get(timeout=timeout)
        except queue.Empty:
            raise DriverError(f"{self.label} driver did not answer {op!r} within {timeout} s; "
                              f"its stderr:\n{self._stderr_text()}") from None
        if reply is None:
            raise DriverError(f"{self.label} driver exited (code {self._proc.wait(5)}) during {op!r}; "
                              f"its stderr:\n{self._stderr_text()}")
        return reply

    def ok(self, op: str, timeout: float = 20.0, **fields) -> dict:
        reply = self.call(op, timeout, **fields)
        if not reply.get("ok"):
            raise AssertionError(f"{self.label} {op} {fields} failed: {reply.get('error')} "
                                 f"{reply.get('frame', '')}")
        return reply

    # -- the client's operations ---------------------------------------------------------------
    def connect(self, port: int, version: str, login: str = "guest", passcode: str = "guest",
                headers: dict | None = None) -> dict:
        """``headers``: more CONNECT headers (``host`` names a virtual host, spec/stomp.md §1)."""
        reply = self.ok("connect", port=port, host="127.0.0.1", version=version, login=login,
                        passcode=passcode, headers=headers or {})
        self.version = reply["version"]
        return reply

    def send(self, destination: str, body: bytes | str = b"", *, headers: dict | None = None,
             content_type: str | None = None, receipt: bool = False, transaction: str | None = None) -> dict:
        data = body.encode("utf-8") if isinstance(body, str) else body
        fields: dict = {"destination": destination, "body_hex": data.hex(), "headers": headers or {},
                        "receipt": receipt}
        if content_type:
            fields["content_type"] = content_type
        if transaction:
            fields["transaction"] = transaction
        return self.ok("send", **fields)

    def subscribe(self, sub_id: str, destination: str, ack: str = "auto", headers: dict | None = None,
                  *, sync: bool = True) -> None:
        self.ok("subscribe", id=sub_id, destination=destination, ack=ack, headers=headers or {})
        if sync:
            self.sync()

    def sync(self) -> None:
        self.ok("sync")

    def receive(self, sub_id: str, timeout: float = 5.0) -> ForeignMessage | None:
        reply = self.ok("receive", timeout=timeout + 15, subscription=sub_id, timeout_ms=int(timeout * 1000))
        m = reply["message"]
        if m is None:
            return None
        return ForeignMessage([tuple(h) for h in m["headers"]], bytes.fromhex(m["body_hex"]))

    def expect(self, sub_id: str, timeout: float = 5.0) -> ForeignMessage:
        m = self.receive(sub_id, timeout)
        assert m is not None, f"{self.label} received nothing on {sub_id!r} within {timeout} s"
        return m

    def ack(self, message: ForeignMessage, transaction: str | None = None) -> None:
        self.ok("ack", message_id=message.message_id, **({"transaction": transaction} if transaction else {}))

    def nack(self, message: ForeignMessage, transaction: str | None = None) -> None:
        self.ok("nack", message_id=message.message_id, **({"transaction": transaction} if transaction else {}))

    def begin(self, name: str) -> None:
        self.ok("begin", transaction=name)

    def commit(self, name: str, receipt: bool = False) -> None:
        self.ok("commit", transaction=name, receipt=receipt)

    def abort(self, name: str, receipt: bool = False) -> None:
        self.ok("abort", transaction=name, receipt=receipt)

    def unsubscribe(self, sub_id: str) -> None:
        self.ok("unsubscribe", id=sub_id)

    def error(self, timeout: float = 5.0) -> dict | None:
        return self.ok("error", timeout=timeout + 15, timeout_ms=int(timeout * 1000))["error"]

    def disconnect(self) -> None:
        self.ok("disconnect")

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                self._proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait(5)
        self._stderr.close()


def driver_argv(variable: str, what: str) -> list[str]:
    """The driver command line from ``variable`` (skip, or fail under CI, when it is not set)."""
    return shlex.split(service_url(variable, what, PROVIDER))


def connector(argv: list[str], label: str, broker, version: str) -> Iterator[Callable[[], ForeignClient]]:
    """Generator body for a fixture: yields ``connect()`` and closes every client afterwards."""
    clients: list[ForeignClient] = []

    def connect() -> ForeignClient:
        client = ForeignClient(argv, label)
        clients.append(client)
        client.connect(broker.port, version)
        assert client.version == version, f"{label} negotiated {client.version}, asked for {version}"
        return client

    try:
        yield connect
    finally:
        for client in clients:
            client.close()


# ---------------------------------------------------------------------------------------------------
# Scenarios: the foreign client and the pymq SDK exchange messages both ways.
# ---------------------------------------------------------------------------------------------------

def _name(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}"


def _types(header: str) -> set[str]:
    return set(header.split(",")) if header else set()


def queue_foreign_to_sdk(broker, connect) -> None:
    c = connect()
    name = _name("q")
    c.send(f"/queue/{name}", "from the foreign client",
           headers={"correlation-id": "c-1", "type": "order", "priority": "7", "colour": "red",
                    "JMSXGroupID": "g-1"})
    with pymq.connect(broker.url) as conn:
        m = conn.create_session().create_consumer(pymq.Queue(name)).receive(5)
    # no content-type and a UTF-8 body: a TextMessage (spec/stomp.md section 7)
    assert isinstance(m, pymq.TextMessage) and m.text == "from the foreign client"
    assert (m.correlation_id, m.type, m.priority) == ("c-1", "order", 7)
    assert m.properties["colour"] == "red" and m.group_id == "g-1"
    assert m.persistent                       # pymq's default for SEND without 'persistent'


def queue_sdk_to_foreign(broker, connect) -> None:
    c = connect()
    name = _name("q")
    text = "héllo wörld"
    with pymq.connect(broker.url) as conn:
        conn.create_session().create_producer(pymq.Queue(name)).send(
            pymq.TextMessage(text, properties={"n": 3, "ratio": 0.5, "flag": True, "label": "x"},
                             correlation_id="c-9", type="t"), priority=6)
    c.subscribe("s", f"/queue/{name}")
    m = c.expect("s")
    h = m.headers
    assert m.text == text and int(h["content-length"]) == len(text.encode("utf-8"))
    assert h["content-type"] == "text/plain;charset=utf-8"
    # typed properties arrive as plain strings, their types in pymq-types
    assert (h["n"], h["ratio"], h["flag"], h["label"]) == ("3", "0.5", "true", "x")
    assert _types(h["pymq-types"]) == {"n=i", "ratio=f", "flag=b"}
    assert (h["correlation-id"], h["type"], h["priority"], h["persistent"]) == ("c-9", "t", "6", "true")
    assert h["destination"] == f"/queue/{name}" and h["subscription"] == "s"
    assert h["message-id"].startswith("ID:") and "redelivered" not in h


def topics_both_ways(broker, connect) -> None:
    c = connect()
    topic = _name("t")
    c.subscribe("t", f"/topic/{topic}")
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        sdk_sub = s.create_consumer(pymq.Topic(topic))
        s.create_producer(pymq.Topic(topic)).send("from sdk")
        c.send(f"/topic/{topic}", "from foreign", receipt=True)
        got_by_foreign = sorted([c.expect("t").text, c.expect("t").text])
        got_by_sdk = sorted([sdk_sub.receive(5).text, sdk_sub.receive(5).text])
    assert got_by_foreign == got_by_sdk == ["from foreign", "from sdk"]
    assert c.receive("t", 0.3) is None


def _sdk_sends(broker, name: str, bodies: list[str]) -> None:
    with pymq.connect(broker.url) as conn:
        p = conn.create_session().create_producer(pymq.Queue(name))
        for body in bodies:
            p.send(body)


def _sdk_drains(broker, name: str) -> list[str]:
    """Everything waiting on the queue, consumed by the SDK: a long wait for the first message, then a
    short one for the absence of more."""
    out = []
    with pymq.connect(broker.url) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue(name))
        while (m := consumer.receive(0.5 if out else 5.0)) is not None:
            out.append(m.text)
    return out


def client_individual_ack_and_nack(broker, connect) -> None:
    name = _name("q")
    _sdk_sends(broker, name, ["m0", "m1", "m2"])
    c = connect()
    c.subscribe("s", f"/queue/{name}", ack="client-individual")
    frames = [c.expect("s") for _ in range(3)]
    assert [f.text for f in frames] == ["m0", "m1", "m2"]
    if c.version == "1.2":
        assert all(f.headers.get("ack") for f in frames)
    c.ack(frames[1])
    c.nack(frames[0])                     # pymq redelivers a NACKed message (spec/stomp.md section 4)
    again = c.expect("s")
    assert again.text == "m0"
    assert again.headers["redelivered"] == "true" and again.headers["JMSXDeliveryCount"] == "2"
    c.ack(again)
    c.disconnect()                        # m2 was never acked: it returns to the queue
    assert _sdk_drains(broker, name) == ["m2"]


def client_ack_is_cumulative(broker, connect) -> None:
    name = _name("q")
    _sdk_sends(broker, name, ["a", "b", "c"])
    c = connect()
    c.subscribe("s", f"/queue/{name}", ack="client")
    frames = [c.expect("s") for _ in range(3)]
    c.ack(frames[1])                      # covers a and b
    c.disconnect()
    assert _sdk_drains(broker, name) == ["c"]


def prefetch_limits_outstanding_messages(broker, connect) -> None:
    name = _name("q")
    _sdk_sends(broker, name, ["one", "two"])
    c = connect()
    c.subscribe("s", f"/queue/{name}", ack="client-individual", headers={"prefetch-count": "1"})
    first = c.expect("s")
    assert c.receive("s", 0.5) is None    # credit 1: the second waits for the ack
    c.ack(first)
    assert c.expect("s").text == "two"


def foreign_transaction_send_commit_abort(broker, connect) -> None:
    c = connect()
    name = _name("q")
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        consumer = s.create_consumer(pymq.Queue(name))
        c.begin("t1")
        c.send(f"/queue/{name}", "one", transaction="t1")
        c.send(f"/queue/{name}", "two", transaction="t1")
        c.sync()
        assert consumer.receive(0.3) is None
        c.commit("t1", receipt=True)
        assert [consumer.receive(5).text, consumer.receive(5).text] == ["one", "two"]
        c.begin("t2")
        c.send(f"/queue/{name}", "never", transaction="t2")
        c.abort("t2", receipt=True)
        c.send(f"/queue/{name}", "after", receipt=True)
        assert consumer.receive(5).text == "after"
        assert consumer.receive(0.3) is None


def foreign_transaction_acks_commit_and_abort(broker, connect) -> None:
    name = _name("q")
    _sdk_sends(broker, name, ["a", "b"])
    c = connect()
    c.subscribe("s", f"/queue/{name}", ack="client-individual")
    a, b = c.expect("s"), c.expect("s")
    c.begin("aborted")
    c.ack(a, transaction="aborted")
    c.abort("aborted", receipt=True)      # the ack of a is discarded: a stays outstanding
    c.begin("committed")
    c.ack(b, transaction="committed")
    c.commit("committed", receipt=True)
    c.disconnect()                        # a, never acked, returns to the queue
    assert _sdk_drains(broker, name) == ["a"]


def sdk_transaction_to_foreign(broker, connect) -> None:
    c = connect()
    name = _name("q")
    c.subscribe("s", f"/queue/{name}")
    with pymq.connect(broker.url) as conn:
        s = conn.create_session(transacted=True)
        p = s.create_producer(pymq.Queue(name))
        p.send("rolled back")
        s.rollback()
        p.send("x1")
        p.send("x2")
        assert c.receive("s", 0.3) is None
        s.commit()
    assert [c.expect("s").text, c.expect("s").text] == ["x1", "x2"]
    assert c.receive("s", 0.3) is None


def receipt_means_the_broker_holds_the_messages(broker, connect) -> None:
    c = connect()
    name = _name("q")
    for i in range(4):
        c.send(f"/queue/{name}", f"r{i}")
    c.send(f"/queue/{name}", "r4", receipt=True)   # a RECEIPT confirms every earlier frame
    with pymq.connect(broker.url) as conn:
        # a browse sees what is waiting now, without waiting for anything to arrive
        seen = [m.text for m in conn.create_session().create_browser(pymq.Queue(name)).messages()]
    assert seen == ["r0", "r1", "r2", "r3", "r4"]


def binary_bodies_both_ways(broker, connect) -> None:
    c = connect()
    name = _name("q")
    payload = bytes(range(256)) * 3                  # NULs, high bytes, invalid UTF-8
    c.send(f"/queue/{name}", payload, content_type="application/octet-stream")
    c.send(f"/queue/{name}", b"\xff\x00\xfe")        # no content-type, not UTF-8: a BytesMessage
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        consumer = s.create_consumer(pymq.Queue(name))
        first, second = consumer.receive(5), consumer.receive(5)
        assert isinstance(first, pymq.BytesMessage) and first.data == payload
        assert isinstance(second, pymq.BytesMessage) and second.data == b"\xff\x00\xfe"
        s.create_producer(pymq.Queue(name)).send(pymq.BytesMessage(payload[::-1] + b"\x00"))
    c.subscribe("s", f"/queue/{name}")
    m = c.expect("s")
    assert m.body == payload[::-1] + b"\x00"
    assert m.headers["content-type"] == "application/octet-stream"
    assert int(m.headers["content-length"]) == len(payload) + 1


def large_body_both_ways(broker, connect) -> None:
    c = connect()
    name = _name("q")
    payload = bytes((i * 7 + i // 256) & 0xFF for i in range(1 << 20))   # 1 MiB, many frames of TCP
    c.send(f"/queue/{name}", payload, content_type="application/octet-stream", receipt=True)
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        got = s.create_consumer(pymq.Queue(name)).receive(10)
        assert isinstance(got, pymq.BytesMessage) and got.data == payload
        s.create_producer(pymq.Queue(name)).send(pymq.BytesMessage(payload[::-1]))
    c.subscribe("s", f"/queue/{name}")
    assert c.expect("s", 10).body == payload[::-1]


def map_message_to_foreign(broker, connect) -> None:
    c = connect()
    name = _name("q")
    with pymq.connect(broker.url) as conn:
        conn.create_session().create_producer(pymq.Queue(name)).send(
            pymq.MapMessage({"sku": "A-1", "qty": 3, "price": 9.5, "gift": False, "blob": b"\x00\x01"}))
    c.subscribe("s", f"/queue/{name}")
    m = c.expect("s")
    assert m.headers["content-type"] == "application/x-pymq-map+json"
    assert json.loads(m.text) == {"sku": "A-1", "qty": 3, "price": 9.5, "gift": False,
                                  "blob": {"$bytes": "AAE="}}


def selector_on_a_foreign_subscription(broker, connect) -> None:
    """The foreign client's selector sees the SDK's typed properties as numbers (pymq-types)."""
    c = connect()
    name = _name("q")
    c.subscribe("s", f"/queue/{name}", headers={"selector": "qty > 10 AND colour = 'red'"})
    with pymq.connect(broker.url) as conn:
        p = conn.create_session().create_producer(pymq.Queue(name))
        for qty, colour in ((5, "red"), (20, "blue"), (20, "red"), (100, "red")):
            p.send(pymq.TextMessage(f"{qty}-{colour}", properties={"qty": qty, "colour": colour}))
    assert [c.expect("s").text, c.expect("s").text] == ["20-red", "100-red"]
    assert c.receive("s", 0.3) is None


def numeric_selector_on_plain_headers(broker, connect) -> None:
    """A plain header that reads as a number compares as one (issue 27 item 3, spec/selector.md §3): the
    foreign client's ``n:9`` is selected by ``n > 5``, as ActiveMQ does for STOMP; the SDK's string
    property ``"9"`` stays a string (its message carries pymq-types), its integer 7 is a number."""
    c = connect()
    name = _name("q")
    c.subscribe("s", f"/queue/{name}", headers={"selector": "n > 5 AND n <> 12.0"})
    c.sync()
    for n in ("9", "3", "12", "x", "06", "1e1"):
        c.send(f"/queue/{name}", f"plain-{n}", headers={"n": n}, receipt=True)
    with pymq.connect(broker.url) as conn:
        p = conn.create_session().create_producer(pymq.Queue(name))
        p.send(pymq.TextMessage("sdk-string-9", properties={"n": "9"}))
        p.send(pymq.TextMessage("sdk-int-7", properties={"n": 7}))
    got = [c.expect("s").text for _ in range(4)]
    assert got == ["plain-9", "plain-06", "plain-1e1", "sdk-int-7"], got
    assert c.receive("s", 0.3) is None


def wildcard_subscriptions(broker, connect) -> None:
    """Topic patterns (spec/routing.md §5): the foreign client's ``*`` gets one word, ActiveMQ's ``>`` any
    number; MESSAGE names the topic published to; from the foreign client and from the SDK alike."""
    c = connect()
    base = _name("w")
    c.subscribe("star", f"/topic/{base}.*")
    c.subscribe("gt", f"/topic/{base}.>")
    c.sync()
    c.send(f"/topic/{base}.ibm", "foreign-ibm", receipt=True)
    with pymq.connect(broker.url) as conn:
        conn.create_session().create_producer(pymq.Topic(f"{base}.nyse.ibm")).send("sdk-deep")
        conn.create_session().create_producer(pymq.Topic(f"{base}x.ibm")).send("sdk-other")
    c.send(f"/topic/{base}.last", "foreign-last", receipt=True)
    star = [c.expect("star"), c.expect("star")]
    assert [(m.text, m.headers["destination"]) for m in star] == \
        [("foreign-ibm", f"/topic/{base}.ibm"), ("foreign-last", f"/topic/{base}.last")]
    gt = [c.expect("gt").text for _ in range(3)]
    assert gt == ["foreign-ibm", "sdk-deep", "foreign-last"]
    assert c.receive("star", 0.3) is None and c.receive("gt", 0.1) is None


def durable_wildcard_subscription_keeps_messages_while_away(broker, connect) -> None:
    base = _name("dw")
    durable = {"durable-subscription-name": _name("keep")}
    c = connect()
    c.subscribe("d", f"/topic/{base}.#", headers=durable)
    c.disconnect()
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        s.create_producer(pymq.Topic(f"{base}.a")).send("away a")
        s.create_producer(pymq.Topic(f"{base}.b.c")).send("away b.c")
        s.create_producer(pymq.Topic(f"other.{base}")).send("not for it")
    back = connect()
    back.subscribe("d", f"/topic/{base}.#", headers=durable)
    assert [back.expect("d").text, back.expect("d").text] == ["away a", "away b.c"]
    assert back.receive("d", 0.3) is None


#: a value that needs every STOMP 1.1 escape (':' '\n' '\\'); a '\r' is checked on its own below
ESCAPED = "a:b\nc\\d:"


def header_escaping_both_ways(broker, connect) -> None:
    c = connect()
    name = _name("q") + ":x"                          # the destination header needs escaping too
    c.send(f"/queue/{name}", "to sdk", headers={"note": ESCAPED, "correlation-id": "id:" + ESCAPED,
                                                  "route:key": "k\n"})
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        m = s.create_consumer(pymq.Queue(name)).receive(5)
        assert m.text == "to sdk" and m.properties["note"] == ESCAPED
        assert m.correlation_id == "id:" + ESCAPED and m.properties["route:key"] == "k\n"
        assert m.destination == pymq.Queue(name)
        s.create_producer(pymq.Queue(name)).send(
            pymq.TextMessage("to foreign", properties={"note": ESCAPED, "route:key": "k\n"},
                             correlation_id="id:" + ESCAPED))
    c.subscribe("s", f"/queue/{name}")
    got = c.expect("s")
    assert got.text == "to foreign"
    assert got.headers["note"] == ESCAPED and got.headers["route:key"] == "k\n"
    assert got.headers["correlation-id"] == "id:" + ESCAPED
    assert got.headers["destination"] == f"/queue/{name}"


def carriage_return_in_a_header_both_ways(broker, connect) -> None:
    """A CR in a header value crosses both ways.

    1.2 escapes it as ``\\r``.  1.1 defines only ``\\n \\c \\\\`` ("undefined escape sequences MUST be
    treated as a fatal protocol error") and ends lines with LF alone, so a 1.1 peer sends a CR raw; a CR
    at the very end of a value cannot be told from a CRLF line end, so 1.1 gets one in the middle.
    """
    c = connect()
    name = _name("q")
    value = "line1\r\nline2\r" if c.version == "1.2" else "a\rb"
    c.send(f"/queue/{name}", "to sdk", headers={"note": value})
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        assert s.create_consumer(pymq.Queue(name)).receive(5).properties["note"] == value
        s.create_producer(pymq.Queue(name)).send(pymq.TextMessage("to foreign", properties={"note": value}))
    c.subscribe("s", f"/queue/{name}", sync=False)
    got = c.receive("s", 5)
    refused = c.error(0.2)
    assert refused is None, f"the {c.label} client (STOMP {c.version}) refused the MESSAGE: {refused}"
    assert got is not None and got.headers["note"] == value


def request_reply_through_a_temporary_queue(broker, connect) -> None:
    c = connect()
    service = _name("svc")
    c.subscribe("svc", f"/queue/{service}")
    with pymq.connect(broker.url) as conn:
        requestor = pymq.Requestor(conn.create_session(), pymq.Queue(service))
        result: list = []
        t = threading.Thread(target=lambda: result.append(requestor.request("ping", timeout=10)))
        t.start()
        req = c.expect("svc")
        assert req.headers["reply-to"].startswith("/temp-queue/")
        c.send(req.headers["reply-to"], req.text.upper(),
               headers={"correlation-id": req.headers["correlation-id"]})
        t.join(15)
    assert result and result[0].text == "PING"


def foreign_request_sdk_reply_through_its_temporary_queue(broker, connect) -> None:
    """The foreign client's own /temp-queue/ in reply-to is rewritten to a global name the SDK can answer."""
    c = connect()
    service = _name("svc")
    c.subscribe("replies", "/temp-queue/replies")
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        requests = s.create_consumer(pymq.Queue(service))
        c.send(f"/queue/{service}", "ping", headers={"reply-to": "/temp-queue/replies", "correlation-id": "r-1"})
        req = requests.receive(5)
        assert req is not None and req.text == "ping"
        assert req.reply_to is not None and req.reply_to.stomp_name != "/temp-queue/replies"
        pymq.reply(s, req, "pong")
    answer = c.expect("replies")
    assert answer.text == "pong" and answer.headers["correlation-id"] == "r-1"


def durable_subscription_keeps_messages_while_away(broker, connect) -> None:
    topic = _name("t")
    durable = {"durable-subscription-name": _name("keep")}
    c = connect()
    c.subscribe("d", f"/topic/{topic}", headers=durable)
    c.disconnect()
    with pymq.connect(broker.url) as conn:
        p = conn.create_session().create_producer(pymq.Topic(topic))
        p.send("while away 1")
        p.send("while away 2")
    back = connect()
    back.subscribe("d", f"/topic/{topic}", headers=durable)
    assert [back.expect("d").text, back.expect("d").text] == ["while away 1", "while away 2"]


def unsubscribe_stops_delivery(broker, connect) -> None:
    c = connect()
    name = _name("q")
    c.subscribe("s", f"/queue/{name}")
    c.unsubscribe("s")
    _sdk_sends(broker, name, ["kept"])
    assert _sdk_drains(broker, name) == ["kept"]


def error_frame_reaches_the_foreign_client(broker, connect) -> None:
    c = connect()
    c.subscribe("s", f"/queue/{_name('q')}")
    reply = c.call("send", destination="/bad/x", body_hex=b"x".hex(), headers={}, receipt=True)
    assert reply["ok"] is False
    assert "/bad/x" in reply["error"] and "/queue/" in reply["error"]
    seen = c.error(5)
    assert seen is not None and "/bad/x" in seen["message"]
    if c.error_frames:
        headers = dict(seen["headers"])
        assert headers["pymq-code"] == "invalid-destination"
        assert headers["pymq-field-destination"] == "/bad/x"
        assert b"SEND" in bytes.fromhex(seen["body_hex"])
    # the broker closed that connection and keeps serving everyone else
    other = connect()
    name = _name("q")
    other.send(f"/queue/{name}", "still here", receipt=True)
    assert _sdk_drains(broker, name) == ["still here"]


SCENARIOS = [
    queue_foreign_to_sdk,
    queue_sdk_to_foreign,
    topics_both_ways,
    client_individual_ack_and_nack,
    client_ack_is_cumulative,
    prefetch_limits_outstanding_messages,
    foreign_transaction_send_commit_abort,
    foreign_transaction_acks_commit_and_abort,
    sdk_transaction_to_foreign,
    receipt_means_the_broker_holds_the_messages,
    binary_bodies_both_ways,
    large_body_both_ways,
    map_message_to_foreign,
    selector_on_a_foreign_subscription,
    numeric_selector_on_plain_headers,
    header_escaping_both_ways,
    carriage_return_in_a_header_both_ways,
    request_reply_through_a_temporary_queue,
    foreign_request_sdk_reply_through_its_temporary_queue,
    durable_subscription_keeps_messages_while_away,
    wildcard_subscriptions,
    durable_wildcard_subscription_keeps_messages_while_away,
    unsubscribe_stops_delivery,
    error_frame_reaches_the_foreign_client,
]
