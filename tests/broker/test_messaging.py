"""Queue and topic semantics over STOMP, checked with a raw client (no SDK in between)."""
from __future__ import annotations

import time

import pytest

from tests.conftest import RawStomp, wait_for


def drain(client: RawStomp, timeout: float = 0.5) -> list:
    out = []
    while True:
        try:
            out.append(client.read(timeout))
        except TimeoutError:
            return out


def send(client, dest, body, **headers):
    h = {"destination": dest}
    h.update(headers)
    client.send("SEND", h, body if isinstance(body, bytes) else body.encode())


def test_competing_consumers_round_robin(raw):
    a, b, p = raw(), raw(), raw()
    for c in (a, b):
        c.send("SUBSCRIBE", {"destination": "/queue/rr", "id": "s", "ack": "auto", "receipt": "x"})
        assert c.read().command == "RECEIPT"
    for i in range(10):
        send(p, "/queue/rr", f"m{i}")
    got_a, got_b = drain(a), drain(b)
    assert len(got_a) == 5 and len(got_b) == 5
    assert sorted(f.body for f in got_a + got_b) == sorted(f"m{i}".encode() for i in range(10))


def test_prefetch_credit_limits_unacked(raw):
    p, c = raw(), raw()
    for i in range(10):
        send(p, "/queue/credit", f"m{i}")
    c.send("SUBSCRIBE", {"destination": "/queue/credit", "id": "1", "ack": "client-individual",
                         "prefetch-count": "3"})
    first = drain(c)
    assert [f.body for f in first] == [b"m0", b"m1", b"m2"]
    c.send("ACK", {"id": first[0].headers["ack"]})
    more = drain(c)
    assert [f.body for f in more] == [b"m3"]


def test_client_ack_is_cumulative(broker, raw):
    p, c = raw(), raw()
    for i in range(5):
        send(p, "/queue/cum", f"m{i}")
    c.send("SUBSCRIBE", {"destination": "/queue/cum", "id": "1", "ack": "client"})
    frames = drain(c)
    assert len(frames) == 5
    c.send("ACK", {"id": frames[2].headers["ack"], "receipt": "a"})
    assert c.read().command == "RECEIPT"
    q = broker.broker.queues["cum"]
    assert broker.call(lambda: (q.acquired, q.stats.removed)) == (2, 3)
    # acking an already-covered message is an error (it is no longer outstanding)
    c.send("ACK", {"id": frames[1].headers["ack"]})
    err = c.read_until_closed()[-1]
    assert err.command == "ERROR" and err.headers["pymq-code"] == "unknown-message"
    # the two unacked ones come back for the next consumer
    d = raw()
    d.send("SUBSCRIBE", {"destination": "/queue/cum", "id": "1", "ack": "auto"})
    assert [f.body for f in drain(d)] == [b"m3", b"m4"]


def test_nack_redelivers_then_dead_letters(broker_factory):
    from pymq_server.config import QueueConfig
    broker = broker_factory(queue_defaults={"max_deliveries": 3})
    c = RawStomp(broker.port)
    c.connect()
    send(c, "/queue/poison", "bad", **{"x-app": "1"})
    c.send("SUBSCRIBE", {"destination": "/queue/poison", "id": "1", "ack": "client-individual"})
    counts = []
    for attempt in range(3):
        f = c.read()
        counts.append((f.headers.get("redelivered"), f.headers.get("JMSXDeliveryCount")))
        c.send("NACK", {"id": f.headers["ack"]})
    assert counts == [(None, None), ("true", "2"), ("true", "3")]
    assert drain(c, 0.3) == []      # not looped forever
    c.send("SUBSCRIBE", {"destination": "/queue/DLQ.poison", "id": "2", "ack": "auto"})
    dead = c.read()
    assert dead.body == b"bad"
    assert dead.headers["pymq-original-destination"] == "/queue/poison"
    assert "delivered 3 times" in dead.headers["pymq-dead-letter-reason"]
    assert dead.headers["x-app"] == "1"


def test_nack_requeue_false_dead_letters_at_once(raw):
    c = raw()
    send(c, "/queue/rq", "x")
    c.send("SUBSCRIBE", {"destination": "/queue/rq", "id": "1", "ack": "client-individual"})
    f = c.read()
    c.send("NACK", {"id": f.headers["ack"], "requeue": "false"})
    c.send("SUBSCRIBE", {"destination": "/queue/DLQ.rq", "id": "2", "ack": "auto"})
    assert c.read().headers["pymq-dead-letter-reason"] == "rejected"


def test_priority_then_creation_order(raw):
    p, c = raw(), raw()
    for i, prio in enumerate([1, 9, 4, 9, 1, 4]):
        send(p, "/queue/prio", f"m{i}", priority=str(prio))
    p.send("SEND", {"destination": "/queue/prio", "receipt": "done"}, b"last")
    assert p.read().command == "RECEIPT"
    c.send("SUBSCRIBE", {"destination": "/queue/prio", "id": "1", "ack": "auto"})
    order = [f.body.decode() for f in drain(c)]
    assert order == ["m1", "m3", "m2", "m5", "last", "m0", "m4"]


def test_sequence_numbers_increase_per_destination(raw):
    p, c = raw(), raw()
    for i in range(5):
        send(p, "/queue/seqa", "a")
        send(p, "/queue/seqb", "b")
    c.send("SUBSCRIBE", {"destination": "/queue/seqa", "id": "1"})
    c.send("SUBSCRIBE", {"destination": "/queue/seqb", "id": "2"})
    frames = drain(c)
    for dest in ("/queue/seqa", "/queue/seqb"):
        seqs = [int(f.headers["pymq-seq"]) for f in frames if f.headers["destination"] == dest]
        assert len(seqs) == 5 and seqs == sorted(seqs) and len(set(seqs)) == 5


def test_expired_messages_are_never_delivered(broker, raw):
    p = raw()
    now = int(time.time() * 1000)
    send(p, "/queue/exp", "old", expires=str(now - 1000))
    send(p, "/queue/exp", "soon", expiration="100")
    send(p, "/queue/exp", "fresh", expiration="60000")
    p.send("SEND", {"destination": "/queue/other", "receipt": "sent"}, b"")
    assert p.read().command == "RECEIPT"      # the three arrived before this: "soon" expires before now + 100
    sent = time.time() * 1000
    assert wait_for(lambda: time.time() * 1000 > sent + 100, timeout=10)
    c = raw()
    c.send("SUBSCRIBE", {"destination": "/queue/exp", "id": "1"})
    assert [f.body for f in drain(c)] == [b"fresh"]
    assert broker.call(lambda: broker.broker.queues["exp"].stats.expired) == 2


def test_topic_every_subscriber_gets_a_copy(raw):
    subs = [raw() for _ in range(3)]
    for i, s in enumerate(subs):
        s.send("SUBSCRIBE", {"destination": "/topic/t", "id": str(i), "receipt": "r"})
        assert s.read().command == "RECEIPT"
    p = raw()
    send(p, "/topic/t", "hello")
    for s in subs:
        f = s.read()
        assert f.body == b"hello" and f.headers["destination"] == "/topic/t"


def test_topic_message_without_subscribers_is_dropped(broker, raw):
    p = raw()
    p.send("SEND", {"destination": "/topic/nobody", "receipt": "r"}, b"x")
    assert p.read().command == "RECEIPT"
    late = raw()
    late.send("SUBSCRIBE", {"destination": "/topic/nobody", "id": "1"})
    assert drain(late, 0.3) == []


def test_durable_subscription_keeps_messages_while_away(raw):
    c = raw(**{"client-id": "app1"})
    c.send("SUBSCRIBE", {"destination": "/topic/news", "id": "1", "durable-subscription-name": "feed",
                         "receipt": "r"})
    assert c.read().command == "RECEIPT"
    c.send("DISCONNECT", {"receipt": "bye"})
    assert c.read().command == "RECEIPT"
    p = raw()
    for i in range(3):
        send(p, "/topic/news", f"n{i}")
    back = raw(**{"client-id": "app1"})
    back.send("SUBSCRIBE", {"destination": "/topic/news", "id": "9", "activemq.subscriptionName": "feed"})
    assert [f.body for f in drain(back)] == [b"n0", b"n1", b"n2"]


def test_no_local_skips_own_messages(raw):
    c = raw()
    c.send("SUBSCRIBE", {"destination": "/topic/chat", "id": "1", "no-local": "true", "receipt": "r"})
    assert c.read().command == "RECEIPT"
    send(c, "/topic/chat", "mine")
    other = raw()
    send(other, "/topic/chat", "theirs")
    assert [f.body for f in drain(c)] == [b"theirs"]


def test_receipt_confirms_earlier_frames_in_order(raw):
    p = raw()
    for i in range(50):
        p.send("SEND", {"destination": "/queue/rc", "receipt": f"r{i}"}, b"x")
    ids = [p.read().headers["receipt-id"] for _ in range(50)]
    assert ids == [f"r{i}" for i in range(50)]
    c = raw()
    c.send("SUBSCRIBE", {"destination": "/queue/rc", "id": "1"})
    assert len(drain(c)) == 50


def test_transaction_send_and_ack(raw):
    p, c = raw(), raw()
    p.send("BEGIN", {"transaction": "t1"})
    send(p, "/queue/tx", "a", transaction="t1")
    send(p, "/queue/tx", "b", transaction="t1")
    c.send("SUBSCRIBE", {"destination": "/queue/tx", "id": "1", "ack": "client-individual"})
    assert drain(c, 0.3) == []               # nothing visible before COMMIT
    p.send("COMMIT", {"transaction": "t1", "receipt": "c"})
    assert p.read().command == "RECEIPT"
    frames = drain(c)
    assert [f.body for f in frames] == [b"a", b"b"]
    c.send("BEGIN", {"transaction": "t2"})
    for f in frames:
        c.send("ACK", {"id": f.headers["ack"], "transaction": "t2"})
    c.send("ABORT", {"transaction": "t2", "receipt": "ab"})
    assert c.read().command == "RECEIPT"
    # acks were aborted: the messages are still this consumer's, unacknowledged
    c.send("BEGIN", {"transaction": "t3"})
    for f in frames:
        c.send("ACK", {"id": f.headers["ack"], "transaction": "t3"})
    c.send("COMMIT", {"transaction": "t3", "receipt": "cm"})
    assert c.read().command == "RECEIPT"
    c.send("DISCONNECT", {"receipt": "d"})
    assert c.read().command == "RECEIPT"
    again = raw()
    again.send("SUBSCRIBE", {"destination": "/queue/tx", "id": "1"})
    assert drain(again, 0.3) == []           # acked for good


def test_abort_discards_sends(raw):
    p = raw()
    p.send("BEGIN", {"transaction": "t"})
    send(p, "/queue/ab", "never", transaction="t")
    p.send("ABORT", {"transaction": "t"})
    c = raw()
    c.send("SUBSCRIBE", {"destination": "/queue/ab", "id": "1"})
    assert drain(c, 0.3) == []


def test_disconnect_aborts_open_transaction(raw):
    p = raw()
    p.send("BEGIN", {"transaction": "t"})
    send(p, "/queue/dab", "never", transaction="t")
    p.send("DISCONNECT", {"receipt": "d"})
    assert p.read().command == "RECEIPT"
    c = raw()
    c.send("SUBSCRIBE", {"destination": "/queue/dab", "id": "1"})
    assert drain(c, 0.3) == []


def test_temp_queue_request_reply(broker, raw):
    requester, service = raw(), raw()
    service.send("SUBSCRIBE", {"destination": "/queue/svc", "id": "1", "receipt": "r"})
    assert service.read().command == "RECEIPT"
    requester.send("SUBSCRIBE", {"destination": "/temp-queue/replies", "id": "t"})
    send(requester, "/queue/svc", "ping", **{"reply-to": "/temp-queue/replies"})
    req = service.read()
    reply_to = req.headers["reply-to"]
    assert reply_to.startswith("/temp-queue/tmp.")
    send(service, reply_to, "pong")
    assert requester.read().body == b"pong"
    # another connection cannot consume the private queue
    thief = raw()
    thief.send("SUBSCRIBE", {"destination": reply_to, "id": "x"})
    err = thief.read_until_closed()[-1]
    assert err.headers["pymq-code"] == "access-denied"
    # when its connection closes the temporary queue is gone
    requester.send("DISCONNECT", {"receipt": "d"})
    requester.read()
    name = reply_to[len("/temp-queue/"):]
    assert wait_for(lambda: broker.call(lambda: name not in broker.broker.destinations.temp_queues))
    late = raw()
    send(late, reply_to, "too late")
    err = late.read_until_closed()[-1]
    assert err.headers["pymq-code"] == "unknown-destination"


def test_scheduled_delay(raw):
    p, c = raw(), raw()
    c.send("SUBSCRIBE", {"destination": "/queue/later", "id": "1", "receipt": "r"})
    assert c.read().command == "RECEIPT"
    send(p, "/queue/later", "late", AMQ_SCHEDULED_DELAY="400")
    send(p, "/queue/later", "now")
    assert c.read().body == b"now"
    with pytest.raises(TimeoutError):
        c.read(0.2)
    assert c.read(2).body == b"late"


def test_queue_browser_does_not_remove(raw):
    p = raw()
    for i in range(3):
        send(p, "/queue/br", f"m{i}")
    b = raw()
    b.send("SUBSCRIBE", {"destination": "/queue/br", "id": "1", "browser": "true"})
    frames = drain(b)
    assert [f.body for f in frames[:3]] == [b"m0", b"m1", b"m2"]
    assert frames[-1].headers.get("browser") == "end"
    c = raw()
    c.send("SUBSCRIBE", {"destination": "/queue/br", "id": "1"})
    assert len(drain(c)) == 3


def test_server_heartbeats_and_dead_client_detection(broker_factory):
    broker = broker_factory(heartbeat_send_ms=200, heartbeat_recv_ms=200, heartbeat_grace=1.5)
    c = RawStomp(broker.port)
    frame = c.connect(**{"heart-beat": "200,200"})
    assert frame.headers["heart-beat"] == "200,200"
    # keep beating for a second and collect what the idle broker sends meanwhile: only EOLs
    received = b""
    c.sock.settimeout(0.1)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        c.send_raw(b"\n")
        try:
            received += c.sock.recv(100)
        except OSError:
            pass
    assert received and received.strip(b"\n") == b"", received
    # now stay silent: after about 200 ms × 1.5 the broker declares us dead
    frames = c.read_until_closed(timeout=5)
    assert frames and frames[-1].command == "ERROR"
    assert frames[-1].headers["pymq-code"] == "heartbeat-timeout"


def test_heartbeat_keeps_a_quiet_client_alive(broker_factory):
    broker = broker_factory(heartbeat_send_ms=200, heartbeat_recv_ms=200, heartbeat_grace=1.5)
    c = RawStomp(broker.port)
    c.connect(**{"heart-beat": "200,200"})
    for _ in range(8):
        time.sleep(0.15)        # a client beating every 150 ms is what is tested: the pace, not a wait
        c.send_raw(b"\n")
    c.send("SEND", {"destination": "/queue/hb", "receipt": "r"}, b"x")
    frames = []
    while True:
        f = c.read(2)
        if f.command == "RECEIPT":
            break
    assert f.headers["receipt-id"] == "r"


def test_slow_consumer_is_bounded_by_backpressure(broker_factory):
    """A consumer that stops reading holds the broker to its write buffer (plus what the kernel's socket
    buffers take); the rest of the backlog stays queued instead of piling up in broker memory."""
    broker = broker_factory(write_buffer_high=64 * 1024, write_buffer_low=16 * 1024)
    p = RawStomp(broker.port)
    p.connect()
    body = b"x" * 1024
    total = 20_000
    for i in range(total - 1):
        p.send("SEND", {"destination": "/queue/slow", "persistent": "false"}, body)
    p.send("SEND", {"destination": "/queue/slow", "receipt": "done", "persistent": "false"}, body)
    while p.read(10).command != "RECEIPT":
        pass
    c = RawStomp(broker.port, rcvbuf=4096)
    c.connect()
    c.send("SUBSCRIBE", {"destination": "/queue/slow", "id": "1", "ack": "auto"})
    q = broker.broker.queues["slow"]
    # the consumer reads nothing; dispatch must stall with most of the backlog still queued
    assert wait_for(lambda: broker.call(lambda: not broker.broker.sessions[
        [k for k in broker.broker.sessions][-1]].writable), timeout=5)
    broker.call(lambda: None)   # a turn of the broker's loop since the pause: a dispatch past it would be done
    waiting = broker.call(lambda: q.ready.count)
    assert waiting > total // 2, waiting
    got = 0
    while got < total:
        c.read(10)
        got += 1
    assert broker.call(lambda: q.ready.count) == 0


def test_producer_flow_control_pauses_senders_once_the_disk_limit_is_reached(broker_factory):
    """Above max_memory messages page out to the file device (tests/broker/test_paging.py); only when it
    refuses them (here: its 256 KiB bound is reached) do they stay in memory and producers pause."""
    broker = broker_factory(max_memory=200 * 1024, storage={"devices": {"memory": {}, "file": {
        "page_size": 4096, "max_bytes": 256 * 1024}}})
    p = RawStomp(broker.port)
    p.connect()
    for i in range(800):
        p.send("SEND", {"destination": "/queue/mem", "persistent": "false"}, b"y" * 1024)
    assert wait_for(lambda: broker.call(lambda: broker.broker.memory_high))
    broker.call(lambda: None)   # a turn of the broker's loop since the pause: a read past it would be done
    held = broker.call(lambda: broker.broker.held_bytes)
    # the broker stops at the limit (plus the frame that crossed it): the rest waits in the socket
    assert held <= 200 * 1024 + 1024, held
    assert broker.call(lambda: broker.broker.flow.resident()) > 0
    c = RawStomp(broker.port)
    c.connect()
    c.send("SUBSCRIBE", {"destination": "/queue/mem", "id": "1", "ack": "auto"})
    bodies = [c.read(10).body for _ in range(800)]
    assert bodies == [b"y" * 1024] * 800
    assert broker.call(lambda: broker.broker.memory_high) is False


def test_version_10_and_11_clients(raw):
    for version in ("1.0", "1.1"):
        c = raw(version=version)
        dest = f"/queue/v{version}"
        c.send("SEND", {"destination": dest}, b"hi")
        sub = {"destination": dest, "ack": "client"}
        if version == "1.1":
            sub["id"] = "x"
        c.send("SUBSCRIBE", sub)
        f = c.read()
        assert f.body == b"hi"
        ack = {"message-id": f.headers["message-id"], "receipt": "r"}
        if version == "1.1":
            ack["subscription"] = "x"
        c.send("ACK", ack)
        assert c.read().command == "RECEIPT"


def test_acks_and_disconnect_in_one_write_are_all_honoured(raw):
    """ACKs followed by DISCONNECT in the same packet: every ACK counts and the RECEIPT comes (the
    state change of DISCONNECT must not apply before the ACKs before it are handled)."""
    p = raw()
    for i in range(20):
        send(p, "/queue/ackdisc", f"m{i}")
    c = raw()
    c.send("SUBSCRIBE", {"destination": "/queue/ackdisc", "id": "1", "ack": "client-individual",
                         "prefetch-count": "5"})
    got = [c.read() for _ in range(5)]
    data = b"".join(c.encode("ACK", {"id": f.headers["ack"]}) for f in got)
    data += c.encode("DISCONNECT", {"receipt": "bye"})
    c.send_raw(data)
    frames = c.read_until_closed()
    assert [f.command for f in frames if f.command != "MESSAGE"] == ["RECEIPT"], frames
    d = raw()
    d.send("SUBSCRIBE", {"destination": "/queue/ackdisc", "id": "1"})
    rest = [f.body for f in drain(d)]
    assert rest == [f"m{i}".encode() for i in range(5, 20)]      # m0-m4 were acknowledged for good
