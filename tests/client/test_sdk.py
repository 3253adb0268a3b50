"""The JMS-style SDK against a real broker, over stomp:// and the in-process vm:// transport."""
from __future__ import annotations

import threading
import time
import uuid

import pytest

import pymq
from pymq.errors import AuthenticationFailed, ConnectFailed, ConnectionClosed, IllegalStateError, \
    InvalidSelector, MessageFormatError
from tests.conftest import wait_for


@pytest.fixture(params=["stomp", "vm"])
def url(request, broker):
    if request.param == "stomp":
        return broker.url
    return f"vm://test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def conn(url):
    c = pymq.connect(url)
    yield c
    c.close()


def q():
    return pymq.Queue(f"q-{uuid.uuid4().hex[:8]}")


def test_text_bytes_map_round_trip_with_typed_properties(conn):
    s = conn.create_session()
    dest = q()
    p = s.create_producer(dest)
    c = s.create_consumer(dest)
    p.send(pymq.TextMessage("héllo", properties={"n": 42, "ratio": 0.5, "ok": True, "who": "me"},
                            correlation_id="corr-1", type="greeting"))
    p.send(b"\x00\x01binary\xff")
    p.send({"a": 1, "b": "two", "c": 3.5, "d": False, "e": None, "f": b"\x00raw"})
    m1, m2, m3 = (c.receive(5) for _ in range(3))
    assert isinstance(m1, pymq.TextMessage) and m1.text == "héllo"
    assert m1.properties == {"n": 42, "ratio": 0.5, "ok": True, "who": "me", "JMSXDeliveryCount": 1}
    assert type(m1.properties["n"]) is int and type(m1.properties["ok"]) is bool
    assert m1.correlation_id == "corr-1" and m1.type == "greeting"
    assert m1.destination == dest and m1.message_id and m1.timestamp > 0
    assert m1.delivery_mode == pymq.PERSISTENT and m1.priority == 4 and not m1.redelivered
    assert isinstance(m2, pymq.BytesMessage) and m2.data == b"\x00\x01binary\xff"
    assert isinstance(m3, pymq.MapMessage)
    assert m3.map == {"a": 1, "b": "two", "c": 3.5, "d": False, "e": None, "f": b"\x00raw"}


def test_producer_options_priority_ttl_delivery_mode(conn):
    s = conn.create_session()
    dest = q()
    p = s.create_producer(dest)
    p.send("low", priority=1, delivery_mode=pymq.NON_PERSISTENT)
    p.send("high", priority=8, time_to_live=60_000)
    p.send("gone", time_to_live=1)
    sent = time.time() * 1000                   # "gone" arrived before this: it expires before sent + 1
    assert wait_for(lambda: time.time() * 1000 > sent + 1)
    c = s.create_consumer(dest)
    first, second = c.receive(5), c.receive(5)
    assert (first.text, first.priority) == ("high", 8) and first.expiration > time.time() * 1000
    assert (second.text, second.delivery_mode) == ("low", pymq.NON_PERSISTENT)
    assert c.receive(0.2) is None          # the expired one is never delivered


def test_sync_send_sets_message_id(conn):
    s = conn.create_session()
    sent = s.create_producer(q()).send("x")
    assert sent.message_id and sent.message_id.startswith("ID:")


def test_auto_ack_consumes(url, conn):
    s = conn.create_session()
    dest = q()
    s.create_producer(dest).send("once")
    c = s.create_consumer(dest)
    assert c.receive(5).text == "once"
    c.close()
    assert s.create_consumer(dest).receive(0.3) is None


def test_client_ack_and_recover(conn):
    s = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
    dest = q()
    p = s.create_producer(dest)
    for i in range(3):
        p.send(f"m{i}")
    c = s.create_consumer(dest)
    first = [c.receive(5) for _ in range(3)]
    assert [m.text for m in first] == ["m0", "m1", "m2"] and not any(m.redelivered for m in first)
    s.recover()                               # nothing acknowledged: all come back, in their order
    again = [c.receive(5) for _ in range(3)]
    assert [m.text for m in again] == ["m0", "m1", "m2"]
    assert all(m.redelivered and m.delivery_count == 2 for m in again)
    again[-1].acknowledge()                   # acknowledges everything consumed
    c.close()
    assert s.create_consumer(dest).receive(0.3) is None


def test_dups_ok_ack(conn):
    s = conn.create_session(ack_mode=pymq.DUPS_OK_ACKNOWLEDGE)
    dest = q()
    p = s.create_producer(dest)
    for i in range(50):
        p.send(str(i), delivery_mode=pymq.NON_PERSISTENT)
    c = s.create_consumer(dest, prefetch=8)
    assert [c.receive(5).text for _ in range(50)] == [str(i) for i in range(50)]
    c.close()
    assert s.create_consumer(dest).receive(0.3) is None


def test_transacted_session_commit_and_rollback(conn):
    tx = conn.create_session(transacted=True)
    dest = q()
    p = tx.create_producer(dest)
    p.send("a")
    p.send("b")
    observer = conn.create_session()
    oc = observer.create_consumer(dest)
    assert oc.receive(0.3) is None            # invisible before commit
    tx.commit()
    got = [oc.receive(5).text, oc.receive(5).text]
    assert got == ["a", "b"]
    oc.close()
    p.send("c")
    tx.rollback()                             # c is discarded
    c = tx.create_consumer(dest)
    assert c.receive(0.3) is None
    # consume in a transaction, roll back: the message comes back redelivered
    observer.create_producer(dest).send("d")
    m = c.receive(5)
    assert m.text == "d"
    tx.rollback()
    again = c.receive(5)
    assert again.text == "d" and again.redelivered
    tx.commit()
    c.close()
    assert observer.create_consumer(dest).receive(0.3) is None


def test_queue_browser(conn):
    s = conn.create_session()
    dest = q()
    p = s.create_producer(dest)
    for i in range(4):
        p.send(f"m{i}", priority=9 if i == 2 else 4)
    browser = s.create_browser(dest)
    assert [m.text for m in browser] == ["m2", "m0", "m1", "m3"]
    assert [m.text for m in browser] == ["m2", "m0", "m1", "m3"]    # still there
    assert len(s.create_consumer(dest).receive(5).text) == 2


def test_topics_durable_and_shared(url):
    with pymq.connect(url, client_id="sub-app") as c1:
        s = c1.create_session()
        durable = s.create_durable_consumer(pymq.Topic("prices"), "p-feed")
        durable.close()
        with pymq.connect(url) as pub:
            ps = pub.create_session()
            pp = ps.create_producer(pymq.Topic("prices"))
            for i in range(3):
                pp.send(f"tick{i}")
        back = s.create_durable_consumer(pymq.Topic("prices"), "p-feed")
        assert [back.receive(5).text for _ in range(3)] == ["tick0", "tick1", "tick2"]
        back.close()
        s.unsubscribe("p-feed")
        with pytest.raises(pymq.PymqError):
            s.unsubscribe("p-feed")               # gone


def test_shared_subscription_splits_messages(url):
    with pymq.connect(url) as a, pymq.connect(url) as b, pymq.connect(url) as pub:
        sa, sb = a.create_session(), b.create_session()
        ca = sa.create_shared_consumer(pymq.Topic("jobs"), "workers", prefetch=1)
        cb = sb.create_shared_consumer(pymq.Topic("jobs"), "workers", prefetch=1)
        p = pub.create_session().create_producer(pymq.Topic("jobs"))
        for i in range(10):
            p.send(str(i))
        got = []
        while True:
            m = ca.receive(0.3) or cb.receive(0.3)
            if m is None:
                break
            got.append(m.text)
        assert sorted(got, key=int) == [str(i) for i in range(10)]


def test_selector(conn):
    s = conn.create_session()
    dest = q()
    p = s.create_producer(dest)
    for i in range(10):
        p.send(pymq.TextMessage(str(i), properties={"n": i, "colour": "red" if i % 2 else "blue"}))
    c = s.create_consumer(dest, selector="colour = 'red' AND n > 4")
    assert [c.receive(5).text for _ in range(3)] == ["5", "7", "9"]
    assert c.receive(0.2) is None


def test_bad_selector_is_refused_with_position(conn):
    s = conn.create_session()
    with pytest.raises(InvalidSelector) as info:
        s.create_consumer(q(), selector="colour = 'red' AND")
    assert "position" in str(info.value)


def test_message_listener(conn):
    s = conn.create_session()
    dest = q()
    got, done = [], threading.Event()

    def on_message(m):
        got.append(m.text)
        if len(got) == 5:
            done.set()

    s.create_consumer(dest).set_message_listener(on_message)
    producer_session = conn.create_session()
    p = producer_session.create_producer(dest)
    for i in range(5):
        p.send(str(i))
    assert done.wait(5)
    assert got == ["0", "1", "2", "3", "4"]


def test_listener_exception_redelivers(conn):
    s = conn.create_session()
    dest = q()
    seen, done = [], threading.Event()

    def flaky(m):
        seen.append((m.text, m.redelivered))
        if not m.redelivered:
            raise RuntimeError("boom")
        done.set()

    s.create_consumer(dest).set_message_listener(flaky)
    conn.create_session().create_producer(dest).send("x")
    assert done.wait(5)
    assert seen == [("x", False), ("x", True)]


def test_stopped_connection_holds_delivery(url):
    factory = pymq.ConnectionFactory(url)
    with factory.create_connection() as conn:    # JMS: created stopped
        s = conn.create_session()
        dest = q()
        s.create_producer(dest).send("wait")
        c = s.create_consumer(dest)
        assert c.receive(0.3) is None
        conn.start()
        assert c.receive(5).text == "wait"


def test_request_reply_over_temporary_queue(url):
    with pymq.connect(url) as server_conn, pymq.connect(url) as client_conn:
        ss = server_conn.create_session()
        service = ss.create_consumer(pymq.Queue("echo"))

        def serve():
            req = service.receive(5)
            pymq.reply(ss, req, req.text.upper())

        t = threading.Thread(target=serve)
        t.start()
        cs = client_conn.create_session()
        reply = pymq.Requestor(cs, pymq.Queue("echo")).request("ping", timeout=5)
        t.join()
        assert reply.text == "PING"


def test_session_is_single_threaded(conn):
    s = conn.create_session()
    queue = q()
    c = s.create_consumer(queue)
    got = []
    t = threading.Thread(target=lambda: got.append(c.receive(10.0)))
    t.start()
    # the other thread is inside the session once it owns it (its receive is waiting there)
    assert wait_for(lambda: s._guard._owner == t.ident)
    with pytest.raises(IllegalStateError, match="another thread"):
        s.create_producer(q()).send("x")
    conn.create_session().create_producer(queue).send("wake")        # the receive returns at once
    t.join(10)
    assert [m.text for m in got] == ["wake"]


def test_closed_objects_raise(conn):
    s = conn.create_session()
    c = s.create_consumer(q())
    c.close()
    with pytest.raises(IllegalStateError, match="consumer is closed"):
        c.receive(0.1)
    s.close()
    with pytest.raises(IllegalStateError, match="session is closed"):
        s.create_producer(q()).send("x")
    conn.close()
    with pytest.raises(IllegalStateError):
        conn.create_session()


def test_bad_message_values_are_refused(conn):
    s = conn.create_session()
    with pytest.raises(MessageFormatError):
        pymq.TextMessage("x", properties={"bad": [1, 2]})
    with pytest.raises(MessageFormatError):
        s.create_producer(q()).send(object())
    with pytest.raises(MessageFormatError, match="priority"):
        s.create_producer(q()).send("x", priority=11)


def test_wrong_credentials_and_unreachable(broker):
    with pytest.raises(AuthenticationFailed, match="wrong username or password"):
        pymq.connect(broker.url, username="guest", password="nope")
    with pytest.raises(ConnectFailed):
        pymq.connect("stomp://127.0.0.1:1", timeout=2)
    with pytest.raises(ConnectFailed, match="unsupported URL"):
        pymq.connect("http://x")


def test_exception_listener_on_broker_loss(broker_factory):
    broker = broker_factory()
    conn = pymq.connect(broker.url)
    errors = []
    conn.exception_listener = errors.append
    s = conn.create_session()
    c = s.create_consumer(q())
    broker.stop()
    assert wait_for(lambda: errors)
    assert isinstance(errors[0], ConnectionClosed)
    with pytest.raises((ConnectionClosed, IllegalStateError)):
        c.receive(1)


def test_message_too_large_is_refused_by_broker(broker_factory):
    broker = broker_factory(max_frame_size=10_000)
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        with pytest.raises(pymq.PymqError, match="exceeds the limit"):
            s.create_producer(q()).send(b"x" * 50_000)


def test_connection_thread_safe_concurrent_sessions(conn):
    dest = q()
    n_threads, per_thread = 4, 50

    def produce():
        s = conn.create_session()
        p = s.create_producer(dest)
        for i in range(per_thread):
            p.send(str(i))
        s.close()

    threads = [threading.Thread(target=produce) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c = conn.create_session().create_consumer(dest)
    got = 0
    while c.receive(0.5) is not None:
        got += 1
    assert got == n_threads * per_thread
