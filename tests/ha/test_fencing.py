"""spec/ha.md §2 at the devices: a former live's writes after a takeover (the file device's page file, log
segments and log appends; the SQL device's transactions) are refused before they touch the store, and its
barriers fail instead of acknowledging.  In one process: the former live's device and the lease medium
that takes over open their own descriptors and sessions, as two processes would."""
from __future__ import annotations

import threading
import time
import uuid

import pytest

from pymq.errors import StorageError
from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice
from pymq_server.storage.ha import record as rec
from pymq_server.storage.ha.arbiter import HaArbiter
from pymq_server.storage.ha.filelease import FileLease
from tests.ha.members import store_digest


def message(key: int, size: int = 100) -> StoredMessage:
    return StoredMessage(key, "/queue/q", key, True, bytes([key % 251]) * size)


def take_over(lease_dir, node="n") -> FileLease:
    other = FileLease(str(lease_dir), node)
    other.open()
    current = other.read()
    assert other.take(current, current.taken(b"\x02" * 16, "new", 2, False), holder_dead=True)
    return other


@pytest.fixture
def held(tmp_path):
    """A file device of the process holding epoch 1 (its arbiter renewing), with messages on its pages."""
    medium = FileLease(str(tmp_path / "ha"), "n")
    medium.open()
    arbiter = HaArbiter(medium, node="n", lease_ms=60_000, renew_ms=1000, poll_ms=20)
    assert arbiter.wait_until_taken(threading.Event())
    device = FileDevice("file", tmp_path / "file", page_size=4096, checkpoint_in_sync=False, fence=medium)
    device.open()
    for key in range(1, 40):
        device.write(message(key), ["/queue/q"])
    device.flush()
    device.sync()
    yield tmp_path, device, arbiter
    device.abandon()
    arbiter.abandon()


def test_rule_2_2_no_page_file_write_or_segment_of_an_old_epoch_after_a_new_one(held):
    tmp_path, device, arbiter = held
    other = take_over(tmp_path / "ha")
    before = store_digest(tmp_path)
    # a checkpoint writes pages, a checkpoint chain, a meta page and a new log segment: each is refused
    with pytest.raises(StorageError, match="fenced"):
        device.checkpoint()
    assert store_digest(tmp_path) == before
    assert arbiter.medium.fenced_reason is not None                 # and the process knows it is fenced
    with pytest.raises(StorageError):
        device.write(message(99), ["/queue/q"])
        device.flush()
    assert store_digest(tmp_path) == before
    other.close()


def test_rule_2_2_a_page_write_of_an_old_epoch_is_refused_even_under_a_fresh_lease(held):
    """Sealed pages of non-persistent messages (paged out, never logged) go to the page file at the next
    flush, with no log append before them: the page write itself reads the epoch under the epoch lock and
    is refused, though the former live's lease still looks fresh by its own clock."""
    tmp_path, device, arbiter = held
    other = take_over(tmp_path / "ha")
    before = store_digest(tmp_path)
    with pytest.raises(StorageError, match="fenced"):
        for key in range(1000, 1040):             # ten 4 KiB pages of them: pages are sealed and written
            device.write(StoredMessage(key, "/queue/q", key, False, b"n" * 1000), ["/queue/q"])
            device.flush()
    assert store_digest(tmp_path) == before
    other.close()


def test_rule_2_3_a_log_append_goes_only_under_a_fresh_lease(held):
    """A former live past its serving window renews before it appends: the renewal finds the new epoch and
    nothing is appended (without the rule the frames would land in its log segment)."""
    tmp_path, device, arbiter = held
    other = take_over(tmp_path / "ha")
    arbiter._serve_until = 0.0                   # it was paused: its lease is no longer fresh by its own clock
    before = store_digest(tmp_path)
    device.write(message(98), ["/queue/q"])       # buffered in memory
    with pytest.raises(StorageError, match="fenced"):
        device.flush()                            # the append is refused before the write
    assert store_digest(tmp_path) == before
    other.close()


def test_rule_2_3_a_barrier_after_a_takeover_fails_instead_of_acknowledging(held):
    """An append that did land (its lease was fresh by its clock a moment before the takeover) is never
    acknowledged: the sync re-reads the epoch after its fsync."""
    tmp_path, device, arbiter = held
    device.write(message(97), ["/queue/q"])
    device.flush()                                 # landed while the lease was fresh
    other = take_over(tmp_path / "ha")
    with pytest.raises(StorageError, match="epoch check"):
        device.sync()
    other.close()


def test_rule_2_2_postgresql_refuses_a_former_live_s_transaction(postgres_url):
    from pymq_server.storage.ha.pglease import PgLease
    from pymq_server.storage.sql import SqlDevice, drop_tables
    prefix = "f" + uuid.uuid4().hex[:10] + "_"
    mine = PgLease(postgres_url, "n", table_prefix=prefix, lease_ms=1000)
    mine.open()
    assert mine.take(None, rec.first("n", b"\x01" * 16, "old", 1, False), holder_dead=True)
    device = SqlDevice("db", postgres_url, broker_id="n", table_prefix=prefix, fence=mine)
    device.open()
    try:
        device.write(message(1), ["/queue/q"])
        device.sync()
        other = PgLease(postgres_url, "n", table_prefix=prefix, lease_ms=1000)
        other.open()
        current = other.read()
        assert other.take(current, current.taken(b"\x02" * 16, "new", 2, False), holder_dead=True)
        device.write(message(2), ["/queue/q"])
        device.remove(1, "/queue/q")
        with pytest.raises(StorageError, match="fenced"):
            device.sync()
        keys = sorted(stored.key for stored, _ in other_device_recover(postgres_url, prefix))
        assert keys == [1]                           # the former live's later work never reached the rows
        assert mine.fenced_reason is not None
        other.close()
    finally:
        device.abandon()
        mine.close()
        import sqlalchemy as sa
        engine = sa.create_engine(postgres_url)
        drop_tables(engine, prefix)
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {prefix}ha"))
        engine.dispose()


def other_device_recover(url: str, prefix: str):
    from pymq_server.storage.sql import SqlDevice
    device = SqlDevice("db", url, broker_id="n", table_prefix=prefix)
    device.open()
    try:
        return list(device.recover())
    finally:
        device.close()


def test_rule_2_2_a_stopped_former_live_s_transaction_cannot_hold_off_a_takeover(postgres_url):
    """A former live stopped inside a write transaction holds the lease row's share lock; the candidate ends
    its sessions (named pymq-ha:<instance>) after lease_ms and takes the store."""
    import sqlalchemy as sa
    from pymq_server.storage.ha.pglease import PgLease, session_name
    prefix = "s" + uuid.uuid4().hex[:10] + "_"
    mine = PgLease(postgres_url, "n", table_prefix=prefix, lease_ms=500)
    mine.open()
    mine.instance = b"\x01" * 16
    assert mine.take(None, rec.first("n", mine.instance, "old", 1, False), holder_dead=True)
    # the SQL device's session of the stopped process, inside a transaction, as its guard left it
    engine = sa.create_engine(postgres_url, connect_args={"application_name": session_name(mine.instance)})
    stuck = engine.connect()
    stuck.begin()
    mine.guard_sql(stuck)
    other = PgLease(postgres_url, "n", table_prefix=prefix, lease_ms=500)
    other.open()
    current = other.read()
    started = time.monotonic()
    assert other.take(current, current.taken(b"\x02" * 16, "new", 2, False), holder_dead=True)
    print(f"\ntaken after {time.monotonic() - started:.2f} s")
    with pytest.raises(sa.exc.DBAPIError):           # its session was ended
        stuck.execute(sa.text("SELECT 1"))
    stuck.close()
    engine.dispose()
    other.close()
    mine.close()
    drop = sa.create_engine(postgres_url)
    with drop.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {prefix}ha"))
    drop.dispose()
