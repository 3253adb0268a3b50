"""What a client may make the broker hold besides messages (server/broker/budgets.py, spec/stomp.md §10).

Each limit is met by a client over real TCP: the request over it gets ``resource-limit`` naming the limit,
nothing of it is made, what was held is released with the connection, and another client is served on.
The budgets' own arithmetic is tested without a broker first.
"""
from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import pytest

import pymq
from pymq.errors import ResourceLimit
from pymq_server.broker.budgets import BROWSE_IDS_KEPT, CONNECTION_ALLOWANCE, Budget, Budgets
from pymq_server.broker.flow import MemoryFlow
from pymq_server.config import BrokerConfig
from tests.conftest import RawStomp, wait_for

KiB, MiB = 1024, 1024 * 1024


def _flow(max_memory: int = 64 * MiB) -> MemoryFlow:
    return MemoryFlow(SimpleNamespace(max_memory=max_memory, vhosts={}), None, lambda fn: None)   # type: ignore[arg-type]


def test_a_refused_charge_holds_nothing_anywhere():
    flow = _flow()
    user = Budget("user 'u'", 100 * KiB, "max_memory_per_user", flow)
    conn = Budget("connection c1", 80 * KiB, "max_memory_per_connection", flow, user)
    other = Budget("connection c2", 80 * KiB, "max_memory_per_connection", flow, user)
    conn.charge("a", 70 * KiB)
    with pytest.raises(ResourceLimit) as refused:
        conn.charge("b", 20 * KiB)                 # over the connection's budget
    assert refused.value.limit == "max_memory_per_connection" and refused.value.held == 70 * KiB
    with pytest.raises(ResourceLimit) as refused:
        other.charge("c", 40 * KiB)                # under its own, over the user's
    assert refused.value.limit == "max_memory_per_user"
    assert (conn.held, other.held, user.held, flow.client_bytes) == (70 * KiB, 0, 70 * KiB, 70 * KiB)
    conn.release(70 * KiB)
    assert (conn.held, user.held, flow.client_bytes) == (0, 0, 0)


def test_what_all_clients_hold_is_half_of_max_memory_past_each_connection_allowance():
    flow = _flow(max_memory=32 * MiB)                    # all clients: 16 MiB
    assert flow.client_limit() == 16 * MiB
    users = [Budget(f"user 'u{i}'", 64 * MiB, "max_memory_per_user", flow) for i in range(3)]
    conns = [Budget(f"connection c{i}", 64 * MiB, "max_memory_per_connection", flow, users[i],
                    CONNECTION_ALLOWANCE) for i in range(3)]
    conns[0].charge("big", 16 * MiB - 8 * KiB)
    with pytest.raises(ResourceLimit) as refused:
        conns[1].charge("more", CONNECTION_ALLOWANCE + 1)
    assert refused.value.limit == "max_memory"
    # a connection's first 64 KiB are granted whatever the others hold (an admin tool still logs in)
    conns[2].charge("a subscription", 8 * KiB)
    conns[2].charge("a temporary queue", CONNECTION_ALLOWANCE - 8 * KiB)
    with pytest.raises(ResourceLimit):
        conns[2].charge("one byte more", 1)
    assert flow.client_bytes == 16 * MiB - 8 * KiB + CONNECTION_ALLOWANCE
    # the floor: a broker given little memory still takes a handful of subscriptions
    assert _flow(max_memory=256 * KiB).client_limit() == 8 * MiB


def test_user_budgets_live_while_they_hold_something_or_have_a_connection():
    flow = _flow()
    budgets = Budgets(BrokerConfig.from_dict({"max_memory_per_user": "1MiB", "max_memory_per_connection": "1MiB",
                                              "max_transaction_bytes": "64KiB"}), flow)
    conn = budgets.connection("alice", "c1")
    conn.charge("x", 10 * KiB)
    budgets.charge_user("alice", "a durable subscription", 5 * KiB)
    budgets.connection_closed("alice", conn)
    assert budgets.users["alice"].held == 5 * KiB and flow.client_bytes == 5 * KiB
    budgets.release_user("alice", 5 * KiB)
    assert "alice" not in budgets.users and flow.client_bytes == 0
    with pytest.raises(ResourceLimit):
        budgets.charge_user("bob", "too big", 2 * MiB)
    assert "bob" not in budgets.users                 # a refusal leaves no budget behind either


def _read_until(client: RawStomp, receipt: str, timeout: float = 30.0):
    while True:
        frame = client.read(timeout)
        if frame.command == "ERROR" or (frame.command == "RECEIPT" and frame.headers["receipt-id"] == receipt):
            return frame


def _client_bytes(rb) -> int:
    return rb.call(lambda: rb.broker.flow.client_bytes)


def test_a_transaction_is_bounded_by_max_transaction_bytes_and_nothing_of_it_is_applied(broker_factory):
    rb = broker_factory(max_transaction_bytes="2MiB")
    client = RawStomp(rb.port)
    client.connect()
    client.send("BEGIN", {"transaction": "t"})
    for i in range(3):
        client.send("SEND", {"destination": "/queue/txb", "transaction": "t", "receipt": f"r{i}"}, b"x" * MiB)
        frame = _read_until(client, f"r{i}")
        if frame.command == "ERROR":
            break
    assert i == 1 and frame.headers["pymq-code"] == "resource-limit", frame
    assert frame.headers["pymq-field-limit"] == "max_transaction_bytes"
    assert frame.headers["pymq-field-transaction"] == "t"
    client.close()
    assert wait_for(lambda: _client_bytes(rb) == 0)
    assert "txb" not in rb.call(lambda: list(rb.broker.queues))


def test_a_committed_or_aborted_transaction_releases_its_bytes(broker_factory):
    rb = broker_factory()
    client = RawStomp(rb.port)
    client.connect()
    client.send("BEGIN", {"transaction": "t"})
    client.send("SEND", {"destination": "/queue/txc", "transaction": "t"}, b"x" * 100 * KiB)
    client.send("BEGIN", {"transaction": "u", "receipt": "held"})
    assert _read_until(client, "held").command == "RECEIPT"
    assert _client_bytes(rb) > 100 * KiB
    client.send("COMMIT", {"transaction": "t"})
    client.send("ABORT", {"transaction": "u", "receipt": "done"})
    assert _read_until(client, "done").command == "RECEIPT"
    assert _client_bytes(rb) == 0


def test_selectors_are_charged_to_the_connection_and_the_user_before_they_compile(broker_factory):
    rb = broker_factory(max_memory_per_connection="4MiB", max_memory_per_user="6MiB",
                        max_transaction_bytes="1MiB")
    text = " OR ".join(f"a + b * {n} > c" for n in range(500))       # 9,386 characters: ~600 KiB charged
    first = RawStomp(rb.port)
    first.connect()
    made = 0
    for i in range(20):
        first.send("SUBSCRIBE", {"destination": "/topic/s", "id": f"s{i}", "selector": text, "receipt": f"s{i}"})
        frame = _read_until(first, f"s{i}")
        if frame.command == "ERROR":
            break
        made += 1
    assert made == 6 and frame.headers["pymq-field-limit"] == "max_memory_per_connection", frame
    assert "selector of 9386 characters" in frame.headers["message"]
    subscribed = rb.call(lambda: sorted(sub.name for sub in rb.broker.topics["s"].subscriptions.values()))
    assert len(subscribed) == 0           # the connection closed after its ERROR: nothing of it is left
    # the user's budget spans connections: two of them share 6 MiB
    a, b = RawStomp(rb.port), RawStomp(rb.port)
    a.connect()
    b.connect()
    for i in range(6):
        a.send("SUBSCRIBE", {"destination": "/topic/s", "id": f"a{i}", "selector": text, "receipt": f"a{i}"})
        assert _read_until(a, f"a{i}").command == "RECEIPT"
    for i in range(6):
        b.send("SUBSCRIBE", {"destination": "/topic/s", "id": f"b{i}", "selector": text, "receipt": f"b{i}"})
        frame = _read_until(b, f"b{i}")
        if frame.command == "ERROR":
            break
    assert i == 4 and frame.headers["pymq-field-limit"] == "max_memory_per_user", frame    # 6 MiB: 10 in all
    # an UNSUBSCRIBE gives its charge back
    held = _client_bytes(rb)
    a.send("UNSUBSCRIBE", {"id": "a0", "receipt": "u"})
    assert _read_until(a, "u").command == "RECEIPT"
    assert held - _client_bytes(rb) > 600_000


def test_temporary_destinations_are_capped_per_connection_and_per_user(broker_factory):
    rb = broker_factory(max_temporary_destinations_per_connection=100, max_memory_per_connection="1MiB",
                        max_memory_per_user="1MiB", max_transaction_bytes="64KiB")
    client = RawStomp(rb.port)
    client.connect()
    for i in range(101):
        client.send("SEND", {"destination": f"/temp-queue/t{i}", "persistent": "false"}, b"")
    client.send("SEND", {"destination": "/temp-topic/over", "receipt": "r"}, b"")
    frame = _read_until(client, "r")
    assert frame.command == "ERROR" and frame.headers["pymq-field-limit"] == "max_temporary_destinations_per_connection"
    assert wait_for(lambda: rb.call(lambda: len(rb.broker.destinations.temp_queues)) == 0)
    # per user: 1 MiB over all its connections (each temporary ~4 KiB); a connection's first 64 KiB always fit
    clients = [RawStomp(rb.port) for _ in range(3)]
    refused = None
    for n, c in enumerate(clients):
        c.connect()
        for i in range(99):
            c.send("SEND", {"destination": f"/temp-queue/c{n}-{i}", "persistent": "false"}, b"")
        c.send("BEGIN", {"transaction": "x", "receipt": "r"})
        frame = _read_until(c, "r")
        if frame.command == "ERROR":
            refused = frame
            break
    assert refused is not None and n == 2, (n, refused)
    assert refused.headers["pymq-field-limit"] == "max_memory_per_user"
    # refused once the user held its 1 MiB over the three connections (the third's went with it)
    held, cost = int(refused.headers["pymq-field-held"]), int(refused.headers["pymq-field-cost"])
    assert held + cost > MiB and held > MiB - 2 * cost, (held, cost)
    assert wait_for(lambda: rb.call(lambda: len(rb.broker.destinations.temp_queues)) == 99 + 99)


def test_durable_subscriptions_are_charged_to_their_creator_while_they_exist(broker_factory):
    rb = broker_factory(max_memory_per_user="1MiB", max_memory_per_connection="1MiB", max_transaction_bytes="64KiB")
    client = RawStomp(rb.port)
    client.connect(**{"client-id": "keeper"})
    made = 0
    for i in range(400):
        client.send("SUBSCRIBE", {"destination": "/topic/d", "id": f"s{i}", "durable-subscription-name": f"d{i}"})
        client.send("UNSUBSCRIBE", {"id": f"s{i}", "receipt": f"u{i}"})      # the subscription stays
        frame = _read_until(client, f"u{i}")
        if frame.command == "ERROR":
            break
        made += 1
    assert 200 <= made < 256 and frame.headers["pymq-field-limit"] == "max_memory_per_user", (made, frame)
    durable = rb.call(lambda: sorted(rb.broker.subscriptions.durable))
    assert len(durable) == made and f"sub:keeper:d{made}" not in durable        # the refused one: nothing
    # they outlive the connection, still charged; deleting one makes room for one
    assert wait_for(lambda: rb.call(lambda: rb.broker.budgets.users["guest"].held) > made * 4 * KiB)
    again = RawStomp(rb.port)
    again.connect(**{"client-id": "keeper"})
    again.send("UNSUBSCRIBE", {"id": "x", "pymq-durable-name": "d0"})
    again.send("SUBSCRIBE", {"destination": "/topic/d", "id": "n", "durable-subscription-name": "new",
                             "receipt": "n"})
    assert _read_until(again, "n").command == "RECEIPT"


@pytest.mark.own_process      # a heap figure from tracemalloc: the broker's alone (tests/conftest.py)
def test_a_connection_remembers_its_last_finished_browses_only(broker_factory):
    """Landed main: every browse id a connection ever used was kept (300,000: +49 MiB)."""
    rb = broker_factory()
    client = RawStomp(rb.port)
    client.connect()
    client.send("SEND", {"destination": "/queue/b", "receipt": "m"}, b"one")
    assert _read_until(client, "m").command == "RECEIPT"
    session = rb.call(lambda: list(rb.broker.sessions.values())[-1])
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for start in range(0, 20_000, 1000):
            client.send_raw(b"".join(client.encode("SUBSCRIBE", {"destination": "/queue/b", "id": f"browse-{i}",
                                                                 "browser": "true"})
                                     for i in range(start, start + 1000)))
            client.send("BEGIN", {"transaction": "t", "receipt": f"r{start}"})
            client.send("ABORT", {"transaction": "t"})
            assert _read_until(client, f"r{start}").command == "RECEIPT"
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < MiB, f"{grown} bytes kept for 20,000 finished browses"   # main: 3.3 MB
    assert rb.call(lambda: len(session.holdings.browse_ids)) == BROWSE_IDS_KEPT
    client.send("UNSUBSCRIBE", {"id": "browse-19999", "receipt": "late"})      # a recent one: accepted
    assert _read_until(client, "late").command == "RECEIPT"
    client.send("UNSUBSCRIBE", {"id": "browse-0", "receipt": "old"})           # long forgotten
    assert _read_until(client, "old").headers["pymq-code"] == "unknown-subscription"


def test_queue_entries_are_counted_while_they_live(broker_factory):
    """The memory flow's count of queue entries follows every way an entry ends: acks, NACKs to the
    dead-letter queue, purges, paging out and back, subscriptions dropped; once all is consumed it is 0."""
    rb = broker_factory(max_memory="1MiB", queue_defaults={"max_deliveries": 1},
                        storage={"devices": {"memory": {}, "file": {"fsync": False}}})
    flow = rb.broker.flow
    with pymq.connect(rb.url, client_id="entries") as conn:
        session = conn.create_session()
        durable = session.create_durable_consumer(pymq.Topic("e"), "keep")
        live = session.create_consumer(pymq.Topic("e"))
        producer = session.create_producer(pymq.Topic("e"))
        for i in range(50):
            producer.send(pymq.BytesMessage(b"x" * 100))
        assert rb.call(lambda: flow.entries) >= 50
        for _ in range(50):
            assert live.receive(timeout=10) is not None
        durable.close()
        queue_producer = session.create_producer(pymq.Queue("eq"))
        for i in range(3000):                                   # ~3 MiB: paged out and back in
            queue_producer.send(pymq.BytesMessage(b"q" * 1000))
        client = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        consumer = client.create_consumer(pymq.Queue("eq"))
        for i in range(3000):
            message = consumer.receive(timeout=10)
            assert message is not None
            if i % 100 == 49 and i < 2900:
                message.acknowledge()
        client.recover()                        # the last 150 unacknowledged: to the dead-letter queue
        consumer.close()
        conn.queue_manager().purge("DLQ.eq")
        conn.queue_manager().purge("DLQ.sub.entries.keep")   # what the durable consumer had prefetched
        session.unsubscribe("keep")
        live.close()
    assert wait_for(lambda: rb.call(lambda: (flow.entries, flow.held_messages, flow.client_bytes)) == (0, 0, 0)), \
        rb.call(lambda: (flow.entries, flow.held_messages, flow.client_bytes))
