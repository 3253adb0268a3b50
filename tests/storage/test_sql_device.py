"""The SQL device on SQLite (embedded) and on a real PostgreSQL (shared between brokers).

PostgreSQL comes from PYMQ_TEST_POSTGRES_URL (see tests/storage/services.py).  Each test gets its own
table prefix there, dropped afterwards, so runs do not see each other's rows.
"""
from __future__ import annotations

import itertools
import json
import threading
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from pymq.errors import ConfigError, StorageError
from pymq_server.storage.device import StoredMessage
from pymq_server.storage.sql import (PendingMessage, SqlDevice, create_tables, drop_tables,
                                     notification_wakes, send_in_transaction)
from tests.storage import contract
from tests.storage.services import TcpProxy, postgres_url  # noqa: F401  (fixture)


class Backend:
    """One database (a SQLite file or a table prefix on PostgreSQL) and devices opened on it."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.engine = sa.create_engine(url)     # the *application's* engine, separate from the device's
        self.dialect = self.engine.dialect.name

    def device(self, broker_id: str = "b1", name: str = "db", url: str | None = None) -> SqlDevice:
        return SqlDevice(name, url or self.url, broker_id=broker_id, table_prefix=self.prefix)

    def opened(self, broker_id: str = "b1") -> SqlDevice:
        device = self.device(broker_id)
        device.open()
        return device

    def count(self, table: str) -> int:
        with self.engine.connect() as conn:
            return conn.execute(sa.text(f"SELECT count(*) FROM {self.prefix}{table}")).scalar_one()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request, tmp_path):
    if request.param == "sqlite":
        found = Backend(f"sqlite:///{tmp_path / 'pymq.db'}", "pymq_")
        yield found
        found.engine.dispose()
        return
    url = request.getfixturevalue("postgres_url")
    found = Backend(url, f"t{uuid.uuid4().hex[:10]}_")
    try:
        yield found
    finally:
        drop_tables(found.engine, found.prefix)
        found.engine.dispose()


def msg(key: int, seq: int | None = None, persistent: bool = True, data: bytes | None = None,
        destination: str = "/queue/a") -> StoredMessage:
    return StoredMessage(key, destination, key if seq is None else seq, persistent,
                         data if data is not None else f"body-{key}".encode())


# -- the shared device contract -----------------------------------------------------------------------

@pytest.mark.parametrize("check", contract.CHECKS, ids=lambda f: f.__name__)
def test_contract(check, backend):
    check(lambda: backend.device())


# -- buffering, failures and retries ------------------------------------------------------------------

def test_message_written_and_consumed_between_syncs_never_reaches_the_database(backend):
    device = backend.opened()
    try:
        device.write(msg(1), ["/queue/a"])
        device.write(msg(2), ["/queue/a"])
        device.remove(1, "/queue/a")
        device.sync()
        assert backend.count("message") == 1
        assert backend.count("reference") == 1
        assert device.read(2) == msg(2)
    finally:
        device.close()


def test_failed_commit_keeps_the_batch_and_the_writes_made_meanwhile(backend, monkeypatch):
    device = backend.opened()
    real_commit = device._commit
    try:
        device.write(msg(1), ["q1", "q2"])
        device.write(msg(2), ["q1"])
        device.put_meta("config", b"v1")

        def failing_commit(batch):
            # the broker thread keeps going while the commit runs, then the server fails us
            device.write(msg(3), ["q1"])
            device.remove(1, "q1")
            device.remove(2, "q1")
            device.put_meta("config", b"v2")
            raise sa.exc.OperationalError("COMMIT", {}, Exception("server closed the connection"))

        monkeypatch.setattr(device, "_commit", failing_commit)
        with pytest.raises(StorageError, match="commit failed: .*server closed the connection"):
            device.sync()
        status = device.status()
        assert status.errors == 1
        assert status.messages == 2                       # 1 (still on q2) and 3
        assert device.read(1) == msg(1) and device.read(3) == msg(3)
        with pytest.raises(KeyError):
            device.read(2)
        monkeypatch.setattr(device, "_commit", real_commit)
        device.sync()
        assert device.status().online
    finally:
        device.close()
    device = backend.opened()
    try:
        assert [(m.key, refs) for m, refs in device.recover()] == [(1, ["q2"]), (3, ["q1"])]
        assert dict(device.iter_meta()) == {"config": b"v2"}
    finally:
        device.close()


def test_commit_whose_reply_was_lost_is_retried_without_leaks(backend, monkeypatch):
    device = backend.opened()
    real_commit = device._commit
    try:
        device.write(msg(1), ["q1", "q2"])
        device.sync()
        device.write(msg(2), ["q1", "q2"])
        device.remove(1, "q1")

        def commit_then_lose_reply(batch):
            real_commit(batch)
            raise sa.exc.OperationalError("COMMIT", {}, Exception("connection lost before the reply"))

        monkeypatch.setattr(device, "_commit", commit_then_lose_reply)
        with pytest.raises(StorageError):
            device.sync()
        monkeypatch.setattr(device, "_commit", real_commit)
        device.remove(2, "q1")          # message 2 is in the database although the commit "failed"
        device.add_reference(1, "q1")
        device.remove(1, "q2")
        device.sync()
        assert backend.count("message") == 2 and backend.count("reference") == 2
        device.remove(2, "q2")
        device.sync()
        assert backend.count("message") == 1
    finally:
        device.close()
    device = backend.opened()
    try:
        assert [(m.key, refs) for m, refs in device.recover()] == [(1, ["q1"])]
    finally:
        device.close()


def test_unreachable_database_is_a_storage_error_and_the_device_recovers(postgres_url):
    url = sa.make_url(postgres_url)
    proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432)
    backend = Backend(postgres_url, f"t{uuid.uuid4().hex[:10]}_")
    device = backend.device(url=url.set(port=proxy.port))
    try:
        device.open()
        device.write(msg(1), ["/queue/a"])
        device.sync()
        proxy.cut()
        device.write(msg(2), ["/queue/a"])
        with pytest.raises(StorageError, match="sql device 'db'"):
            device.sync()
        status = device.status()
        assert not status.online and status.errors >= 1
        assert "error" in status.extra
        proxy.restore()
        device.sync()                                    # the failed batch goes through now
        assert device.status().online
        device.close()
        device = backend.opened()
        assert [m.key for m, _ in device.recover()] == [1, 2]
    finally:
        device.close()
        proxy.close()
        drop_tables(backend.engine, backend.prefix)
        backend.engine.dispose()


def test_open_on_a_server_that_is_not_there_is_a_storage_error(postgres_url):
    url = sa.make_url(postgres_url)
    proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432)
    proxy.cut()
    device = SqlDevice("db", url.set(port=proxy.port), broker_id="b1")
    try:
        with pytest.raises(StorageError, match="open failed"):
            device.open()
        assert device.status().online is False
    finally:
        proxy.close()


def test_configuration_errors():
    with pytest.raises(ConfigError, match="SQLite file"):
        SqlDevice("db", "sqlite://")
    with pytest.raises(ConfigError, match="broker id"):
        SqlDevice("db", "sqlite:////tmp/x.db", broker_id="a b")
    with pytest.raises(ConfigError, match="table prefix"):
        SqlDevice("db", "sqlite:////tmp/x.db", table_prefix="Robert'); DROP TABLE students;--")
    with pytest.raises(ConfigError, match="sqlite and postgresql"):
        SqlDevice("db", "mysql://u@h/db")


def test_write_of_a_held_key_is_refused(backend):
    device = backend.opened()
    try:
        device.write(msg(1), ["q"])
        with pytest.raises(StorageError, match="already held"):
            device.write(msg(1), ["q"])
    finally:
        device.close()


# -- a store shared between brokers -------------------------------------------------------------------

def test_brokers_sharing_a_database_each_recover_their_own_rows(backend):
    one, two = backend.opened("b1"), backend.opened("b2")
    try:
        # the same keys on both brokers: key spaces are per broker
        one.write(msg(1, data=b"one-1"), ["/queue/a"])
        one.write(msg(2, data=b"one-2", persistent=False), ["/queue/a"])
        two.write(msg(1, data=b"two-1"), ["/queue/a"])
        two.write(msg(2, data=b"two-2", persistent=False), ["/queue/a"])
        one.put_meta("name", b"one")
        two.put_meta("name", b"two")
        one.sync()
        two.sync()
        assert one.brokers() == {"b1": 2, "b2": 2}
        one.close()
        one = backend.opened("b1")                       # drops b1's non-persistent rows only
        assert [(m.data, refs) for m, refs in one.recover()] == [(b"one-1", ["/queue/a"])]
        assert dict(one.iter_meta()) == {"name": b"one"}
        assert two.read(2).data == b"two-2"
        assert [m.data for m, _ in two.recover()] == [b"two-1"]
        assert dict(two.iter_meta()) == {"name": b"two"}
        assert [m.data for m, _ in two.recover(broker_id="b1")] == [b"one-1"]    # read-only look
        assert [m.data for m, _ in one.recover()] == [b"one-1"]
    finally:
        one.close()
        two.close()


def test_take_over_moves_another_brokers_messages_with_new_keys(backend):
    dead = backend.opened("dead")
    for key in range(1, 8):
        dead.write(msg(key, seq=key, destination="/queue/a"), ["/queue/a", "/queue/audit"] if key == 3 else ["/queue/a"])
    dead.sync()
    dead.close()
    heir = backend.opened("heir")
    try:
        heir.write(msg(1, data=b"heir's own"), ["/queue/b"])
        heir.sync()
        new_keys = itertools.count(100)
        moved = list(heir.take_over("dead", lambda old: StoredMessage(
            next(new_keys), old.destination, old.seq, True, old.data), chunk=3))
        assert [(m.key, m.data, refs) for m, refs in moved] == [
            (100 + i, f"body-{i + 1}".encode(), ["/queue/a", "/queue/audit"] if i == 2 else ["/queue/a"])
            for i in range(7)]
        assert list(heir.take_over("dead", lambda old: pytest.fail("nothing left to move"))) == []
        assert heir.brokers() == {"heir": 8}
        assert heir.read(102).data == b"body-3"
        heir.remove(102, "/queue/audit")
        heir.sync()
        with pytest.raises(ConfigError):
            list(heir.take_over("heir", lambda old: old))
    finally:
        heir.close()
    heir = backend.opened("heir")
    try:
        got = [(m.key, refs) for m, refs in heir.recover()]
        assert got == [(1, ["/queue/b"]), (100, ["/queue/a"]), (101, ["/queue/a"]), (102, ["/queue/a"]),
                       (103, ["/queue/a"]), (104, ["/queue/a"]), (105, ["/queue/a"]), (106, ["/queue/a"])]
        assert list(heir.recover(broker_id="dead")) == []
    finally:
        heir.close()


# -- the application's own transaction ----------------------------------------------------------------

class Assigner:
    """What the broker does when it claims: allocate keys and route to queues."""

    def __init__(self, first_key: int = 1000) -> None:
        self.keys = itertools.count(first_key)
        self.seen: list[PendingMessage] = []

    def __call__(self, pending: PendingMessage):
        self.seen.append(pending)
        key = next(self.keys)
        return StoredMessage(key, pending.destination, key, pending.persistent, pending.data), [pending.destination]


def _orders_table(backend: Backend) -> sa.Table:
    table = sa.Table(f"{backend.prefix}app_orders", sa.MetaData(),
                     sa.Column("id", sa.Integer, primary_key=True), sa.Column("item", sa.Text))
    table.create(backend.engine, checkfirst=True)
    return table


@pytest.mark.parametrize("style", ["connection", "session"])
def test_message_commits_with_the_applications_data(backend, style):
    device = backend.opened()
    orders = _orders_table(backend)
    listener = device.pending_listener()
    try:
        assert device.claim_pending(Assigner()) == []     # the broker's first claim after listening
        if style == "connection":
            with backend.engine.begin() as conn:
                conn.execute(orders.insert().values(id=1, item="book"))
                send_in_transaction(conn, "/queue/orders", b"order 1 placed", table_prefix=backend.prefix)
        else:
            with Session(backend.engine) as session, session.begin():
                session.execute(orders.insert().values(id=1, item="book"))
                send_in_transaction(session, "/queue/orders", b"order 1 placed", table_prefix=backend.prefix)
        assert listener.wait(timeout=30), "the broker was not woken by the commit"
        assigner = Assigner()
        claimed = device.claim_pending(assigner)
        assert [(m.key, m.destination, m.data, refs) for m, refs in claimed] == [
            (1000, "/queue/orders", b"order 1 placed", ["/queue/orders"])]
        assert assigner.seen[0].broker_id is None and assigner.seen[0].persistent
        assert device.read(1000).data == b"order 1 placed"
        assert backend.count("pending") == 0
        assert device.claim_pending(Assigner()) == []    # claimed exactly once
    finally:
        listener.close()
        device.close()
    device = backend.opened()
    try:
        assert [(m.key, m.data) for m, _ in device.recover()] == [(1000, b"order 1 placed")]
    finally:
        device.close()


@pytest.mark.parametrize("style", ["connection", "session"])
def test_rolled_back_transaction_leaves_no_message(backend, style):
    device = backend.opened()
    orders = _orders_table(backend)
    listener = device.pending_listener()
    try:
        if style == "connection":
            with backend.engine.connect() as conn:
                conn.execute(orders.insert().values(id=1, item="book"))
                send_in_transaction(conn, "/queue/orders", b"rolled back", table_prefix=backend.prefix)
                conn.rollback()
                conn.execute(orders.insert().values(id=2, item="pen"))
                send_in_transaction(conn, "/queue/orders", b"committed", table_prefix=backend.prefix)
                conn.commit()
        else:
            with Session(backend.engine) as session:
                session.execute(orders.insert().values(id=1, item="book"))
                send_in_transaction(session, "/queue/orders", b"rolled back", table_prefix=backend.prefix)
                session.rollback()
                session.execute(orders.insert().values(id=2, item="pen"))
                send_in_transaction(session, "/queue/orders", b"committed", table_prefix=backend.prefix)
                session.commit()
        assert listener.wait(timeout=30)
        claimed = device.claim_pending(Assigner())
        assert [m.data for m, _ in claimed] == [b"committed"]
        with backend.engine.connect() as conn:
            assert conn.execute(sa.select(orders.c.item)).scalars().all() == ["pen"]
    finally:
        listener.close()
        device.close()


def test_listener_works_from_an_event_loop_file_descriptor(backend):
    import select

    device = backend.opened()
    listener = device.pending_listener()
    try:
        assert listener.drain() is False
        with backend.engine.begin() as conn:
            send_in_transaction(conn, "/queue/a", b"x", table_prefix=backend.prefix)
        readable, _, _ = select.select([listener.fileno()], [], [], 30)
        assert readable == [listener.fileno()]
        woke = listener.drain()
        if not woke and backend.dialect == "postgresql":
            woke = listener.wait(timeout=30)    # the socket may wake before the whole message is in
        assert woke
        assert [m.data for m, _ in device.claim_pending(Assigner())] == [b"x"]
    finally:
        listener.close()
        device.close()


def test_pending_rows_addressed_to_a_broker_go_to_that_broker_only(backend):
    one, two = backend.opened("b1"), backend.opened("b2")
    listener_one, listener_two = one.pending_listener(), two.pending_listener()
    try:
        with backend.engine.begin() as conn:
            send_in_transaction(conn, "/queue/a", b"for b2", broker_id="b2", table_prefix=backend.prefix)
        assert listener_two.wait(timeout=30)
        assert one.claim_pending(Assigner()) == []
        assert [m.data for m, _ in two.claim_pending(Assigner())] == [b"for b2"]
        with backend.engine.begin() as conn:
            send_in_transaction(conn, "/queue/a", b"for anyone", table_prefix=backend.prefix)
        assert listener_one.wait(timeout=30)
        assert [m.data for m, _ in one.claim_pending(Assigner())] == [b"for anyone"]
        assert two.claim_pending(Assigner()) == []
    finally:
        listener_one.close()
        listener_two.close()
        one.close()
        two.close()


def test_claim_is_all_or_nothing_when_the_broker_fails_half_way(backend):
    device = backend.opened()
    try:
        with backend.engine.begin() as conn:
            for i in range(3):
                send_in_transaction(conn, "/queue/a", b"m%d" % i, table_prefix=backend.prefix)

        def assign_then_fail(pending):
            if pending.data == b"m1":
                raise RuntimeError("routing failed")
            return StoredMessage(pending.id, pending.destination, 1, True, pending.data), ["/queue/a"]

        with pytest.raises(RuntimeError, match="routing failed"):
            device.claim_pending(assign_then_fail)
        assert backend.count("pending") == 3 and backend.count("message") == 0
        assert device.status().messages == 0
        claimed = device.claim_pending(Assigner(), limit=2)
        assert [m.data for m, _ in claimed] == [b"m0", b"m1"]
        assert [m.data for m, _ in device.claim_pending(Assigner(2000), limit=2)] == [b"m2"]
        assert device.status().messages == 3
    finally:
        device.close()


def test_discarded_pending_message_is_consumed_without_a_message(backend):
    device = backend.opened()
    try:
        with backend.engine.begin() as conn:
            send_in_transaction(conn, "/topic/nobody", b"x", table_prefix=backend.prefix)
        assert device.claim_pending(lambda pending: None) == []
        assert backend.count("pending") == 0 and device.status().messages == 0
    finally:
        device.close()


def test_two_brokers_claiming_at_once_split_the_pending_rows(backend):
    one, two = backend.opened("b1"), backend.opened("b2")
    try:
        with backend.engine.begin() as conn:
            for i in range(60):
                send_in_transaction(conn, "/queue/a", b"%d" % i, table_prefix=backend.prefix)
        claimed = {"b1": [], "b2": []}
        errors = []

        def drain(device, first_key):
            try:
                assigner = Assigner(first_key)
                while batch := device.claim_pending(assigner, limit=7):
                    claimed[device.broker_id] += [m.data for m, _ in batch]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=drain, args=(one, 0)), threading.Thread(target=drain, args=(two, 10_000))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        everything = claimed["b1"] + claimed["b2"]
        assert sorted(everything) == sorted(b"%d" % i for i in range(60))   # each exactly once
        assert one.status().messages + two.status().messages == 60
    finally:
        one.close()
        two.close()


def test_send_in_transaction_before_any_broker_created_the_tables(tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    try:
        with pytest.raises(StorageError, match="create_tables"):
            with engine.begin() as conn:
                send_in_transaction(conn, "/queue/a", b"x")
        create_tables(engine)
        with engine.begin() as conn:
            assert send_in_transaction(conn, "/queue/a", b"x") == 1
        with pytest.raises(TypeError, match="bytes"):
            with engine.begin() as conn:
                send_in_transaction(conn, "/queue/a", "not encoded")
    finally:
        engine.dispose()


# -- language-neutral vectors (spec/vectors/storage_sql.json) -----------------------------------------

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "spec" / "vectors" / "storage_sql.json").read_text())


def _vector_table(backend: Backend, name: str) -> str:
    return backend.prefix + name[len(VECTORS["table_prefix"]):]


def test_vector_table_layout(backend):
    backend.opened().close()
    inspector = sa.inspect(backend.engine)
    for table, columns in VECTORS["tables"].items():
        name = _vector_table(backend, table)
        assert [column["name"] for column in inspector.get_columns(name)] == columns
        assert inspector.get_pk_constraint(name)["constrained_columns"] == VECTORS["primary_keys"][table]


@pytest.mark.parametrize("case", VECTORS["claim_cases"], ids=lambda case: case["name"])
def test_vector_claims_of_rows_written_with_plain_sql(backend, case):
    """Pending rows written the way another language's binding would: plain SQL in its own transaction."""
    devices: dict[str, SqlDevice] = {}
    pending = _vector_table(backend, "pymq_pending")
    create_tables(backend.engine, backend.prefix)
    try:
        for step in case["steps"]:
            if step["op"] == "pending":
                row = step["row"]
                with backend.engine.connect() as conn:
                    conn.execute(sa.text(f"INSERT INTO {pending} (broker_id, destination, persistent, data, created_ms) "
                                         f"VALUES (:broker_id, :destination, :persistent, :data, :created_ms)"),
                                 dict(broker_id=row["broker_id"], destination=row["destination"],
                                      persistent=row["persistent"], data=bytes.fromhex(row["data_hex"]),
                                      created_ms=row["created_ms"]))
                    if backend.dialect == "postgresql":
                        conn.execute(sa.text("SELECT pg_notify(:channel, :payload)"),
                                     dict(channel=f"{backend.prefix}pending", payload=row["broker_id"] or ""))
                    conn.commit() if step["outcome"] == "commit" else conn.rollback()
            elif step["op"] == "claim":
                if step["broker"] not in devices:
                    devices[step["broker"]] = backend.opened(step["broker"])
                assigner = Assigner()
                devices[step["broker"]].claim_pending(assigner, limit=step["limit"])
                got = [dict(destination=p.destination, persistent=p.persistent, data_hex=p.data.hex(),
                            created_ms=p.created_ms, target=p.broker_id) for p in assigner.seen]
                assert got == step["expect"]
            elif step["op"] == "pending_rows":
                assert backend.count("pending") == step["expect"]
            else:
                raise AssertionError(f"unknown vector op {step['op']!r}")
    finally:
        for device in devices.values():
            device.close()


@pytest.mark.parametrize("case", VECTORS["notify"]["listener_wakes"], ids=lambda c: f"{c['listener']}<-{c['payload']!r}")
def test_vector_which_notifications_wake_a_broker(case):
    assert notification_wakes(case["payload"], case["listener"]) is case["wakes"]


@pytest.mark.parametrize("case", VECTORS["notify"]["payload_for_target"], ids=lambda c: str(c["target_broker_id"]))
def test_vector_notify_payload_sent_with_the_pending_row(postgres_url, case):
    import psycopg

    backend = Backend(postgres_url, f"t{uuid.uuid4().hex[:10]}_")
    create_tables(backend.engine, backend.prefix)
    raw = psycopg.connect(sa.make_url(postgres_url).set(drivername="postgresql").render_as_string(hide_password=False),
                          autocommit=True)
    try:
        raw.execute(f'LISTEN "{backend.prefix}pending"')
        with backend.engine.begin() as conn:
            send_in_transaction(conn, "/queue/a", b"x", broker_id=case["target_broker_id"],
                                table_prefix=backend.prefix)
        [note] = list(raw.notifies(timeout=30, stop_after=1))
        assert (note.channel, note.payload) == (f"{backend.prefix}pending", case["payload"])
    finally:
        raw.close()
        drop_tables(backend.engine, backend.prefix)
        backend.engine.dispose()
