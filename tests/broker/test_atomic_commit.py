"""COMMIT is all or nothing (issue 11 item 2): every SEND of a transaction is checked before the first is
applied, and the ERROR names the failing operation (its position and receipt). Over raw STOMP, stomp.py,
the blocking SDK and pymq.aio.

On the landed main (792990a) a COMMIT applied the operations before the failing one and dropped the rest.
"""
from __future__ import annotations

import asyncio
import queue as queue_mod
import uuid

import pytest
import stomp

import pymq
import pymq.aio
from pymq.errors import AccessDenied, QueueFull, SchemaViolation, UnknownDestination
from pymq_server.broker.auth import hash_password

from tests.conftest import RawStomp, wait_for

QUEUES = {
    "typed": {"schema": {"amount": {"type": "int", "required": True}}},
    "small": {"max_depth": 2, "overflow": "reject"},
}


@pytest.fixture
def txbroker(broker_factory, tmp_path):
    users = tmp_path / "users.yaml"
    # cheap hashes: these tests log in often; the scrypt cost is not what they test
    import yaml
    users.write_text(yaml.safe_dump({"users": {
        "root": {"password": hash_password("rootpw", n=2), "roles": ["admin"]},
        "app": {"password": hash_password("apppw", n=2), "roles": ["app"]},
    }}))
    return broker_factory(users_file=str(users), queues=QUEUES,
                          default_permissions={"role:app": ["produce", "consume", "browse", "create"]})


def _depths(txbroker, *names: str) -> dict[str, int]:
    def read():
        return {n: (txbroker.broker.queues[n].depth if n in txbroker.broker.queues else None) for n in names}
    return txbroker.call(read)


def _raw(txbroker, user="app") -> RawStomp:
    c = RawStomp(txbroker.port)
    assert c.connect(user, f"{user}pw").command == "CONNECTED"
    return c


def _commit_refused(c: RawStomp, tx: str) -> object:
    c.send("COMMIT", {"transaction": tx, "receipt": "commit-1"})
    frames = c.read_until_closed()
    # a SEND's receipt inside a transaction says the frame was taken, not applied
    assert [f.command for f in frames][-1:] == ["ERROR"] and {f.command for f in frames[:-1]} <= {"RECEIPT"}
    err = frames[-1]
    assert err.headers["receipt-id"] == "commit-1"
    assert "nothing was applied" in err.headers["message"]
    return err


def test_priority_out_of_range_in_the_middle_applies_nothing(txbroker):
    """The issue's sequence: BEGIN; SEND ok; SEND priority:99; SEND ok; COMMIT."""
    name = f"prio-{uuid.uuid4().hex[:6]}"
    c = _raw(txbroker)
    # one write: the broker refuses the second SEND as it arrives and closes; frames written after that close
    # would draw a reset that can discard the ERROR before this client reads it
    c.send_raw(c.encode("BEGIN", {"transaction": "t1"})
               + c.encode("SEND", {"destination": f"/queue/{name}", "transaction": "t1"}, b"one")
               + c.encode("SEND", {"destination": f"/queue/{name}", "transaction": "t1", "priority": "99",
                                   "receipt": "bad-send"}, b"two")
               + c.encode("SEND", {"destination": f"/queue/{name}", "transaction": "t1"}, b"three")
               + c.encode("COMMIT", {"transaction": "t1"}))
    frames = c.read_until_closed()
    assert [f.command for f in frames] == ["ERROR"]
    err = frames[0]
    assert err.headers["pymq-code"] == "invalid-header" and err.headers["receipt-id"] == "bad-send"
    assert "priority" in err.headers["message"]
    assert "Transaction 't1' is rolled back: nothing of it was applied" in err.body.decode()
    assert _depths(txbroker, name) == {name: None}        # not a message, not even the queue


def test_a_refused_permission_in_the_middle_applies_nothing_and_names_the_operation(txbroker):
    ok, private = f"ok-{uuid.uuid4().hex[:6]}", f"private-{uuid.uuid4().hex[:6]}"
    with pymq.connect(txbroker.url, username="root", password="rootpw") as root:
        root.queue_manager().create(private)           # owned by root: app may not produce there
    c = _raw(txbroker)
    c.send("BEGIN", {"transaction": "t2"})
    c.send("SEND", {"destination": f"/queue/{ok}", "transaction": "t2", "receipt": "r1"}, b"one")
    c.send("SEND", {"destination": f"/queue/{private}", "transaction": "t2", "receipt": "r2"}, b"two")
    c.send("SEND", {"destination": f"/queue/{ok}", "transaction": "t2", "receipt": "r3"}, b"three")
    err = _commit_refused(c, "t2")
    assert err.headers["pymq-code"] == "access-denied"
    assert "operation 2 of 3 (SEND to /queue/" + private + ", receipt 'r2')" in err.headers["message"]
    assert err.headers["pymq-field-operation"] == "2" and err.headers["pymq-field-operation-receipt"] == "r2"
    assert err.headers["pymq-field-transaction"] == "t2"
    assert _depths(txbroker, ok, private) == {ok: None, private: 0}


def test_schema_violation_applies_nothing(txbroker):
    ok = f"ok-{uuid.uuid4().hex[:6]}"
    c = _raw(txbroker)
    c.send("BEGIN", {"transaction": "t3"})
    c.send("SEND", {"destination": "/queue/typed", "transaction": "t3", "amount": "5"}, b"fits")
    c.send("SEND", {"destination": f"/queue/{ok}", "transaction": "t3"}, b"fits")
    c.send("SEND", {"destination": "/queue/typed", "transaction": "t3", "amount": "five"}, b"does not")
    err = _commit_refused(c, "t3")
    assert err.headers["pymq-code"] == "schema-violation" and err.headers["pymq-field-operation"] == "3"
    assert _depths(txbroker, "typed", ok) == {"typed": None, ok: None}


def test_queue_full_counts_the_transactions_own_sends(txbroker):
    """max_depth 2 with reject: one message waits, a transaction of two would make three."""
    with pymq.connect(txbroker.url, username="app", password="apppw") as conn:
        conn.create_session().create_producer(pymq.Queue("small")).send("already there")
    c = _raw(txbroker)
    c.send("BEGIN", {"transaction": "t4"})
    c.send("SEND", {"destination": "/queue/small", "transaction": "t4"}, b"second")
    c.send("SEND", {"destination": "/queue/small", "transaction": "t4", "receipt": "third"}, b"third")
    err = _commit_refused(c, "t4")
    assert err.headers["pymq-code"] == "queue-full" and err.headers["pymq-field-operation"] == "2"
    assert err.headers["pymq-field-operation-receipt"] == "third"
    assert _depths(txbroker, "small") == {"small": 1}
    # one more fits: the same transaction with a single SEND commits
    c = _raw(txbroker)
    c.send("BEGIN", {"transaction": "t5"})
    c.send("SEND", {"destination": "/queue/small", "transaction": "t5"}, b"second")
    c.send("COMMIT", {"transaction": "t5", "receipt": "ok"})
    assert c.read().headers["receipt-id"] == "ok"
    assert _depths(txbroker, "small") == {"small": 2}
    c.close()


def test_a_temporary_queue_that_is_gone_applies_nothing(txbroker):
    ok = f"ok-{uuid.uuid4().hex[:6]}"
    other = _raw(txbroker)
    other.send("SUBSCRIBE", {"destination": "/temp-queue/replies", "id": "1", "receipt": "s"})
    assert other.read().command == "RECEIPT"
    temp = txbroker.call(lambda: next(iter(txbroker.broker.destinations.temp_queues)))
    c = _raw(txbroker)
    c.send("BEGIN", {"transaction": "t6"})
    c.send("SEND", {"destination": f"/queue/{ok}", "transaction": "t6"}, b"one")
    c.send("SEND", {"destination": f"/temp-queue/{temp}", "transaction": "t6"}, b"reply")
    other.send("DISCONNECT", {"receipt": "bye"})         # the temporary queue goes with its connection (a lost
    assert other.read().command == "RECEIPT"             # link would leave it for a re-claim: spec/ha.md §4.7)
    other.close()
    # the DISCONNECT's receipt comes before the connection's end is handled: wait for the queue to be gone
    assert wait_for(lambda: txbroker.call(lambda: temp not in txbroker.broker.destinations.temp_queues))
    err = _commit_refused(c, "t6")
    assert err.headers["pymq-code"] == "unknown-destination" and err.headers["pymq-field-operation"] == "2"
    assert _depths(txbroker, ok) == {ok: None}


def test_a_transaction_that_passes_applies_everything_in_order(txbroker):
    name = f"all-{uuid.uuid4().hex[:6]}"
    c = _raw(txbroker)
    c.send("BEGIN", {"transaction": "t7"})
    for i in range(5):
        c.send("SEND", {"destination": f"/queue/{name}", "transaction": "t7"}, str(i).encode())
    c.send("COMMIT", {"transaction": "t7", "receipt": "done"})
    assert c.read().headers["receipt-id"] == "done"
    c.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "s"})
    assert [c.read().body for _ in range(5)] == [b"0", b"1", b"2", b"3", b"4"]
    c.close()


# -- stomp.py ---------------------------------------------------------------------------------------------

class _Errors(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.errors: queue_mod.Queue = queue_mod.Queue()

    def on_error(self, frame):
        self.errors.put(frame)


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_stomp_py_commit_is_atomic(txbroker, version):
    ok = f"ok-{uuid.uuid4().hex[:6]}"
    cls = stomp.Connection12 if version == "1.2" else stomp.Connection11
    c = cls([("127.0.0.1", txbroker.port)], heartbeats=(0, 0))
    listener = _Errors()
    c.set_listener("errors", listener)
    c.connect("app", "apppw", wait=True)
    try:
        tx = c.begin()
        c.send(f"/queue/{ok}", "one", transaction=tx)
        c.send("/queue/typed", "bad", transaction=tx, headers={"amount": "not a number"})
        c.send(f"/queue/{ok}", "three", transaction=tx)
        c.commit(tx)
        err = listener.errors.get(timeout=5)
        assert err.headers["pymq-code"] == "schema-violation"
        assert err.headers["pymq-field-operation"] == "2" and "nothing was applied" in err.headers["message"]
    finally:
        try:
            c.disconnect()
        except Exception:
            pass
    assert _depths(txbroker, ok, "typed") == {ok: None, "typed": None}


# -- the SDKs -------------------------------------------------------------------------------------------------

def test_sdk_commit_raises_the_refusal_and_applies_nothing(txbroker):
    ok = f"ok-{uuid.uuid4().hex[:6]}"
    with pymq.connect(txbroker.url, username="app", password="apppw") as conn:
        session = conn.create_session(transacted=True)
        session.create_producer(pymq.Queue(ok)).send("one")
        session.create_producer(pymq.Queue("typed")).send(session.create_text_message(
            "bad", properties={"amount": "lots"}))
        session.create_producer(pymq.Queue(ok)).send("three")
        with pytest.raises(SchemaViolation) as info:
            session.commit()
        assert str(info.value.operation) == "2" and "nothing was applied" in str(info.value)
    assert _depths(txbroker, ok, "typed") == {ok: None, "typed": None}


def test_sdk_commit_refused_for_permission(txbroker):
    ok, private = f"ok-{uuid.uuid4().hex[:6]}", f"private-{uuid.uuid4().hex[:6]}"
    with pymq.connect(txbroker.url, username="root", password="rootpw") as root:
        root.queue_manager().create(private)
    with pymq.connect(txbroker.url, username="app", password="apppw") as conn:
        session = conn.create_session(transacted=True)
        session.create_producer(pymq.Queue(ok)).send("one")
        session.create_producer(pymq.Queue(private)).send("two")
        with pytest.raises(AccessDenied) as info:
            session.commit()
        assert str(info.value.operation) == "2"
    assert _depths(txbroker, ok, private) == {ok: None, private: 0}


def test_aio_commit_raises_the_refusal_and_applies_nothing(txbroker):
    ok = f"ok-{uuid.uuid4().hex[:6]}"

    async def main():
        async with pymq.aio.connect(txbroker.url, username="app", password="apppw") as conn:
            session = conn.create_session(transacted=True)
            producer = session.create_producer(pymq.Queue("small"))
            for text in ("one", "two", "three"):                  # max_depth 2, reject
                await producer.send(text)
            await session.create_producer(pymq.Queue(ok)).send("other")
            with pytest.raises(QueueFull) as info:
                await session.commit()
            assert str(info.value.operation) == "3"
    asyncio.run(main())
    assert _depths(txbroker, ok, "small") == {ok: None, "small": None}


def test_auto_create_off_refuses_the_commit(broker_factory):
    b = broker_factory(auto_create=False)
    c = RawStomp(b.port)
    assert c.connect().command == "CONNECTED"
    with pymq.connect(b.url) as conn:
        conn.queue_manager().create("exists")
    c.send("BEGIN", {"transaction": "t"})
    c.send("SEND", {"destination": "/queue/exists", "transaction": "t"}, b"one")
    c.send("SEND", {"destination": "/queue/missing", "transaction": "t"}, b"two")
    c.send("COMMIT", {"transaction": "t"})
    err = c.read_until_closed()[-1]
    assert err.command == "ERROR" and err.headers["pymq-code"] == "unknown-destination"
    assert err.headers["pymq-field-operation"] == "2"
    assert b.call(lambda: (b.broker.queues["exists"].depth, "missing" in b.broker.queues)) == (0, False)
    with pytest.raises(UnknownDestination):
        raise pymq.errors.error_from_headers(err.headers)
