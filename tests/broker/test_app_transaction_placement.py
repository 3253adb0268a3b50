"""A message an application writes in its own database transaction goes through the same placement as a
SEND (spec/placement.md): the queue's defaults, schema, depth limit, duplicates, the retained log — and the
broker's own store may be the same SQLite database the application writes to."""
from __future__ import annotations

import uuid

import sqlalchemy as sa
from pymq_server.storage.sql import send_in_transaction

from pymq.protocol.scanner import encode_frame
from tests.conftest import RawStomp, wait_for


def _storage(url: str, store_in_db: bool = False) -> dict:
    return {"devices": {"memory": {"kind": "memory"}, "file": {"kind": "file"},
                        "db": {"kind": "sql", "url": url}},
            "persistent_device": "db" if store_in_db else "file"}


def _pending(engine, destination: str, body: bytes = b"x", **headers: str) -> None:
    """What ``producer.send(..., transaction=db)`` writes, with exactly these SEND headers."""
    data = encode_frame("SEND", {"destination": destination, **headers}, body, "1.2")
    with engine.begin() as db:
        send_in_transaction(db, destination, data, persistent=True)


def _consumer(broker, destination: str) -> RawStomp:
    client = RawStomp(broker.port)
    client.connect()
    client.send("SUBSCRIBE", {"destination": destination, "id": "s", "receipt": "r"})
    assert client.read().command == "RECEIPT"
    return client


def _nothing(client: RawStomp, timeout: float = 0.5) -> bool:
    try:
        frame = client.read(timeout)
    except TimeoutError:
        return True
    raise AssertionError(f"unexpected frame {frame}")


def test_queue_defaults_apply(broker_factory, tmp_path):
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    name = f"defaults-{uuid.uuid4().hex[:6]}"
    broker = broker_factory(storage=_storage(url),
                            queues={name: {"default_priority": 7, "default_expiration_ms": 600_000}})
    consumer = _consumer(broker, f"/queue/{name}")
    _pending(sa.create_engine(url), f"/queue/{name}")
    message = consumer.read(5)
    assert message.headers["priority"] == "7"
    assert int(message.headers["expires"]) > int(message.headers["timestamp"])


def test_schema_refuses_and_the_next_message_still_arrives(broker_factory, tmp_path):
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    name = f"schema-{uuid.uuid4().hex[:6]}"
    broker = broker_factory(storage=_storage(url),
                            queues={name: {"schema": {"order": {"type": "int", "required": True}}}})
    consumer = _consumer(broker, f"/queue/{name}")
    engine = sa.create_engine(url)
    _pending(engine, f"/queue/{name}", b"no order")
    _pending(engine, f"/queue/{name}", b"order 7", order="7")
    message = consumer.read(5)
    assert message.body == b"order 7"                # the one without 'order' was discarded
    assert _nothing(consumer)


def test_a_full_queue_that_rejects_keeps_its_limit(broker_factory, tmp_path):
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    name = f"full-{uuid.uuid4().hex[:6]}"
    broker = broker_factory(storage=_storage(url), queues={name: {"max_depth": 1, "overflow": "reject"}})
    engine = sa.create_engine(url)
    _pending(engine, f"/queue/{name}", b"first")
    assert wait_for(lambda: broker.call(lambda: name in broker.broker.queues
                                        and broker.broker.queues[name].depth == 1))
    _pending(engine, f"/queue/{name}", b"second")
    _pending(engine, f"/queue/{name}", b"third")
    assert wait_for(lambda: broker.call(lambda: sum(c.discarded for c in broker.server.claimers)) == 2)
    consumer = RawStomp(broker.port)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "s"})
    assert consumer.read(5).body == b"first"
    assert _nothing(consumer)


def test_duplicates_are_dropped(broker_factory, tmp_path):
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    name = f"dups-{uuid.uuid4().hex[:6]}"
    broker = broker_factory(storage=_storage(url))
    consumer = _consumer(broker, f"/queue/{name}")
    engine = sa.create_engine(url)
    for _ in range(2):
        _pending(engine, f"/queue/{name}", b"once", **{"pymq-dedup-id": "order-1"})
    assert consumer.read(5).body == b"once"
    assert _nothing(consumer)


def test_the_retained_log_keeps_it(broker_factory, tmp_path):
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    topic = f"/topic/logged-{uuid.uuid4().hex[:6]}"
    broker = broker_factory(storage=_storage(url), retention={topic: {"ms": 600_000}})
    _pending(sa.create_engine(url), topic, b"kept")         # no subscriber: only the log holds it
    reader = RawStomp(broker.port)
    reader.connect()

    def browsed():
        reader.send("SUBSCRIBE", {"destination": topic, "id": f"b{uuid.uuid4().hex[:4]}", "browser": "true",
                                  "pymq-from-seq": "0"})
        frames = [reader.read()]
        while frames[-1].headers.get("browser") != "end":
            frames.append(reader.read())
        return [f.body for f in frames[:-1]]
    assert wait_for(lambda: browsed() == [b"kept"])


def test_sqlite_as_the_brokers_own_store(broker_factory, tmp_path):
    """The claim runs in a transaction on the database the broker also stores in: nothing inside it may
    wait for the store (a sequence reservation did: 'database is locked' after 10 s, message lost)."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    name = f"own-store-{uuid.uuid4().hex[:6]}"
    broker = broker_factory(storage=_storage(url, store_in_db=True))
    consumer = _consumer(broker, f"/queue/{name}")
    engine = sa.create_engine(url)
    for i in range(3):
        _pending(engine, f"/queue/{name}", f"m{i}".encode())
    got = [consumer.read(5).body for _ in range(3)]
    assert got == [b"m0", b"m1", b"m2"]
    assert broker.call(lambda: sum(c.discarded for c in broker.server.claimers)) == 0
