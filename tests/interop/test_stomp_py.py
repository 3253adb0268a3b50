"""stomp.py (a STOMP client nobody here wrote) and the pymq SDK exchange messages both ways."""
from __future__ import annotations

import uuid

import pytest
import stomp

import pymq
from tests.conftest import wait_for
from tests.stomp_py_client import connections


@pytest.fixture(params=["1.1", "1.2"])
def stomppy(request, broker):
    cls = stomp.Connection12 if request.param == "1.2" else stomp.Connection11
    yield from connections(cls, broker.port)


def _ack_args(c, frame, sub="1") -> dict:
    """stomp.py's 1.2 ack takes the ack header; 1.1 takes message-id and subscription."""
    if isinstance(c, stomp.Connection12):
        return {"id": frame.headers["ack"]}
    return {"id": frame.headers["message-id"], "subscription": sub}


def _name(kind):
    return f"{kind}-{uuid.uuid4().hex[:8]}"


def test_stomp_py_to_sdk_queue(broker, stomppy):
    c, _ = stomppy()
    name = _name("q")
    c.send(f"/queue/{name}", "from stomp.py", headers={"correlation-id": "c-1", "colour": "red",
                                                        "priority": "7"})
    with pymq.connect(broker.url) as conn:
        m = conn.create_session().create_consumer(pymq.Queue(name)).receive(5)
    assert isinstance(m, pymq.TextMessage) and m.text == "from stomp.py"
    assert m.correlation_id == "c-1" and m.properties["colour"] == "red" and m.priority == 7


def test_sdk_to_stomp_py_queue_with_client_individual_ack(broker, stomppy):
    c, listener = stomppy()
    name = _name("q")
    with pymq.connect(broker.url) as conn:
        p = conn.create_session().create_producer(pymq.Queue(name))
        for i in range(3):
            p.send(pymq.TextMessage(f"m{i}", properties={"n": i}))
    c.subscribe(f"/queue/{name}", id="1", ack="client-individual")
    frames = [listener.next() for _ in range(3)]
    assert [f.body for f in frames] == ["m0", "m1", "m2"]
    assert [f.headers["n"] for f in frames] == ["0", "1", "2"]
    c.ack(**_ack_args(c, frames[1]))
    c.nack(**_ack_args(c, frames[0]))
    redelivered = listener.next()
    assert redelivered.body == "m0" and redelivered.headers["redelivered"] == "true"


def test_topics_both_ways(broker, stomppy):
    c, listener = stomppy()
    topic = _name("t")
    c.subscribe(f"/topic/{topic}", id="1", ack="auto", headers={"receipt": "sub"})
    assert listener.receipts.get(timeout=5) == "sub"
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        sdk_sub = s.create_consumer(pymq.Topic(topic))
        s.create_producer(pymq.Topic(topic)).send("from sdk")
        c.send(f"/topic/{topic}", "from stomp.py")
        got_by_stomp = sorted([listener.next().body, listener.next().body])
        got_by_sdk = sorted([sdk_sub.receive(5).text, sdk_sub.receive(5).text])
    assert got_by_stomp == got_by_sdk == ["from sdk", "from stomp.py"]


def test_stomp_py_transaction_and_receipts(broker, stomppy):
    c, listener = stomppy()
    name = _name("q")
    with pymq.connect(broker.url) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue(name))
        tx = c.begin()
        c.send(f"/queue/{name}", "one", transaction=tx)
        c.send(f"/queue/{name}", "two", transaction=tx)
        assert consumer.receive(0.3) is None
        c.commit(tx)
        assert [consumer.receive(5).text, consumer.receive(5).text] == ["one", "two"]
        tx2 = c.begin()
        c.send(f"/queue/{name}", "never", transaction=tx2)
        c.abort(tx2)
        c.send(f"/queue/{name}", "after", headers={"receipt": "r-after"})
        assert listener.receipts.get(timeout=5) == "r-after"
        assert consumer.receive(5).text == "after"


def test_stomp_py_acks_inside_a_transaction(broker, stomppy):
    c, listener = stomppy()
    name = _name("q")
    with pymq.connect(broker.url) as conn:
        p = conn.create_session().create_producer(pymq.Queue(name))
        p.send("a")
        p.send("b")
    c.subscribe(f"/queue/{name}", id="1", ack="client-individual")
    frames = [listener.next(), listener.next()]
    tx = c.begin()
    for f in frames:
        c.ack(transaction=tx, **_ack_args(c, f))
    c.commit(tx)
    c.unsubscribe("1")
    assert wait_for(lambda: broker.call(lambda: broker.broker.queues[name].depth) == 0)
    with pymq.connect(broker.url) as conn:
        assert conn.create_session().create_consumer(pymq.Queue(name)).receive(0.3) is None


def test_stomp_py_binary_body_to_sdk_bytes(broker, stomppy):
    c, _ = stomppy()
    name = _name("q")
    payload = bytes(range(256))
    c.send(f"/queue/{name}", payload, content_type="application/octet-stream")
    with pymq.connect(broker.url) as conn:
        m = conn.create_session().create_consumer(pymq.Queue(name)).receive(5)
    assert isinstance(m, pymq.BytesMessage) and m.data == payload


def test_request_reply_sdk_client_stomp_py_service(broker, stomppy):
    c, listener = stomppy()
    service = _name("svc")
    c.subscribe(f"/queue/{service}", id="svc", ack="auto")
    assert wait_for(lambda: broker.call(lambda: service in broker.broker.queues
                                        and len(broker.broker.queues[service].consumers) == 1))
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        requestor = pymq.Requestor(s, pymq.Queue(service))
        import threading

        def serve():
            req = listener.next()
            c.send(req.headers["reply-to"], req.body.upper(),
                   headers={"correlation-id": req.headers["correlation-id"]})

        t = threading.Thread(target=serve)
        t.start()
        reply = requestor.request("hello", timeout=5)
        t.join()
    assert reply.text == "HELLO"


def test_stomp_py_durable_subscription(broker, stomppy):
    topic = _name("t")
    c, listener = stomppy()
    c.subscribe(f"/topic/{topic}", id="d", ack="auto",
                headers={"activemq.subscriptionName": "keep", "receipt": "s"})
    assert listener.receipts.get(timeout=5) == "s"
    c.disconnect()
    with pymq.connect(broker.url) as conn:
        p = conn.create_session().create_producer(pymq.Topic(topic))
        p.send("while away 1")
        p.send("while away 2")
    c2, listener2 = stomppy()
    c2.subscribe(f"/topic/{topic}", id="d", ack="auto", headers={"activemq.subscriptionName": "keep"})
    assert [listener2.next().body, listener2.next().body] == ["while away 1", "while away 2"]


@pytest.mark.parametrize("cls", [stomp.Connection11, stomp.Connection12], ids=["1.1", "1.2"])
def test_context_manager_returns_with_receipts_pending(broker, cls):
    """stomp.py's `with stomp.Connection(...)` block: a persistent SEND with a receipt just before the block
    ends, then the DISCONNECT the block sends with its own receipt. The broker answers the SEND's receipt, then
    the DISCONNECT's, then closes, so __exit__ returns (on the landed main it waited forever: the first RECEIPT
    moved the connection to closed and the DISCONNECT's receipt was never sent)."""
    import threading

    dest = f"/queue/{_name('ctx')}"
    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            with cls([("127.0.0.1", broker.port)], heartbeats=(0, 0)) as c:
                c.connect("guest", "guest", wait=True)
                for i in range(20):
                    c.send(dest, f"m{i}", headers={"persistent": "true", "receipt": f"r{i}"})
            done.set()
        except BaseException as exc:  # noqa: BLE001 - reported below, on the test's thread
            failure.append(exc)
            done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert done.wait(15), "the with-block did not return: DISCONNECT's receipt or the close never came"
    assert not failure, failure
    with pymq.connect(f"stomp://127.0.0.1:{broker.port}") as conn:
        session = conn.create_session()
        consumer = session.create_consumer(pymq.Queue(dest[len("/queue/"):]))
        got = [consumer.receive(timeout=5).text for _ in range(20)]
    assert got == [f"m{i}" for i in range(20)]


def test_numeric_selector_on_stomp_py_headers(broker, stomppy):
    """stomp.py sends ``n:9``; ``SUBSCRIBE selector:n > 5`` delivers it (issue 27 item 3; ActiveMQ 5.17 does,
    and main delivered nothing). ``=`` against a number compares numbers, against a string the text."""
    c, listener = stomppy()
    name = _name("q")
    c.subscribe(f"/queue/{name}", id="1", ack="auto", headers={"selector": "n > 5", "receipt": "s1"})
    c.subscribe(f"/queue/{name}-eq", id="2", ack="auto",
                headers={"selector": "n = 9 AND label = '007'", "receipt": "s2"})
    assert sorted([listener.receipts.get(timeout=5), listener.receipts.get(timeout=5)]) == ["s1", "s2"]
    for n in ("9", "3", "12", "abc", "5.5"):
        c.send(f"/queue/{name}", f"m{n}", headers={"n": n})
    got = sorted(listener.next().body for _ in range(3))
    assert got == ["m12", "m5.5", "m9"]
    for n, label in (("9", "007"), ("9.0", "007"), ("09", "7"), ("8", "007")):
        c.send(f"/queue/{name}-eq", f"{n}/{label}", headers={"n": n, "label": label})
    assert sorted([listener.next().body, listener.next().body]) == ["9.0/007", "9/007"]
    assert listener.none()


def test_stomp_py_wildcard_subscriptions(broker, stomppy):
    """Topic patterns (spec/routing.md §5) from stomp.py: ``*`` one word, ``#`` and ActiveMQ's ``>`` any
    number; a durable pattern subscription keeps what arrives while its subscriber is away."""
    c, listener = stomppy()
    base = _name("w")
    c.subscribe(f"/topic/{base}.*", id="star", ack="auto")
    c.subscribe(f"/topic/{base}.>", id="gt", ack="auto", headers={"receipt": "subs"})
    assert listener.receipts.get(timeout=5) == "subs"
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        s.create_producer(pymq.Topic(f"{base}.ibm")).send("one word")
        s.create_producer(pymq.Topic(f"{base}.nyse.ibm")).send("two words")
        s.create_producer(pymq.Topic(f"{base}x")).send("another topic")
        s.create_producer(pymq.Topic(f"{base}.last")).send("last")
    got = [listener.next() for _ in range(5)]
    by_sub: dict[str, list[tuple[str, str]]] = {}
    for f in got:
        by_sub.setdefault(f.headers["subscription"], []).append((f.body, f.headers["destination"]))
    assert by_sub["star"] == [("one word", f"/topic/{base}.ibm"), ("last", f"/topic/{base}.last")]
    assert [b for b, _ in by_sub["gt"]] == ["one word", "two words", "last"]


def test_stomp_py_wildcard_grant_and_publish_refused(broker_factory, tmp_path):
    """A user granted ``consume`` on ``stocks.*`` subscribes to it from stomp.py, is refused ``#`` (an ERROR
    with access-denied, and no topic made), and a SEND to a pattern is refused as invalid-destination."""
    from pymq_server.broker.auth import save_user
    from tests.stomp_py_client import Collector
    users = str(tmp_path / "users.yaml")
    save_user(users, "root", "rootpw", ["admin"])
    save_user(users, "alice", "alicepw", [])
    b = broker_factory(users_file=users, default_permissions={"role:admin": ["produce", "consume"]})
    with pymq.connect(b.url, username="root", password="rootpw") as root:
        root.queue_manager().grant("/topic/stocks.*", "user:alice", "consume")

    def alice():
        c = stomp.Connection12([("127.0.0.1", b.port)], heartbeats=(0, 0))
        listener = Collector()
        c.set_listener("collector", listener)
        c.connect("alice", "alicepw", wait=True)
        return c, listener

    c, listener = alice()
    c.subscribe("/topic/stocks.*", id="1", headers={"receipt": "ok"})
    assert listener.receipts.get(timeout=5) == "ok"
    with pymq.connect(b.url, username="root", password="rootpw") as root:
        root.create_session().create_producer(pymq.Topic("stocks.ibm")).send("tick")
    assert listener.next().body == "tick"
    c.disconnect()
    for destination, code, frame in (("/topic/#", "access-denied", "subscribe"),
                                     ("/topic/stocks.*", "invalid-destination", "send")):
        c, listener = alice()
        if frame == "subscribe":
            c.subscribe(destination, id="2", headers={"receipt": "no"})
        else:
            c.send(destination, "x", headers={"receipt": "no"})
        error = listener.errors.get(timeout=5)
        assert error.headers["pymq-code"] == code, error.headers
    assert not any(t in ("#", "stocks.*") and b.broker.topics[t].subscriptions
                   for t in b.call(lambda: list(b.broker.topics)))
