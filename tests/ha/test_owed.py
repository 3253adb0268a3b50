"""spec/ha.md §3, what the new live owes failing-over clients: a duplicate window that survives a takeover
(with the ids of messages already consumed), redelivered flags after an unclean end (tests/ha/test_pair.py
checks them across a real takeover), messages visible only once durable, transactions as one unit."""
from __future__ import annotations

import threading
import uuid

import pytest

from pymq_server.broker.dedup import DedupJournal
from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice
from pymq_server.storage.memory import MemoryDevice
from pymq_server.storage.store import RUN_MARKER, HoldingStore
from tests.broker.core_harness import Core
from tests.conftest import RawStomp


# -- 3.1 the duplicate window ---------------------------------------------------------------------------------
def test_rule_3_1_a_consumed_message_s_id_survives_a_takeover(group):
    """A message consumed and acknowledged before the loss is gone from the store; its producer, failing
    over, sends it again with the same id: the new live drops it."""
    live = group.start("A")
    port = live.wait_live()
    backup = group.start("B")
    backup.wait_backup()
    client = RawStomp(port)
    assert client.connect().command == "CONNECTED"
    client.send("SUBSCRIBE", {"destination": "/queue/pay", "id": "s", "ack": "client-individual"})
    client.send("SEND", {"destination": "/queue/pay", "persistent": "true", "pymq-dedup-id": "conn-1:7",
                         "receipt": "sent"}, b"pay 7")
    frames = [client.read(10), client.read(10)]
    message = next(f for f in frames if f.command == "MESSAGE")
    client.send("ACK", {"id": message.headers["ack"]})
    # an ACK's receipt does not wait for a sync (a lost acknowledgement is a flagged redelivery); the next
    # persistent SEND's receipt does, and its barrier covers the acknowledgement before it
    client.send("SEND", {"destination": "/queue/other", "persistent": "true", "receipt": "synced"}, b"x")
    assert client.read(10).command == "RECEIPT"
    live.kill()
    new_port = backup.wait_live(timeout=60)
    again = RawStomp(new_port)
    assert again.connect().command == "CONNECTED"
    again.send("SUBSCRIBE", {"destination": "/queue/pay", "id": "s", "ack": "client-individual"})
    again.send("SEND", {"destination": "/queue/pay", "persistent": "true", "pymq-dedup-id": "conn-1:7",
                        "receipt": "resent"}, b"pay 7")
    again.send("SEND", {"destination": "/queue/pay", "persistent": "true", "pymq-dedup-id": "conn-1:8",
                        "receipt": "new"}, b"pay 8")
    got = []
    for _ in range(3):
        frame = again.read(10)
        if frame.command == "MESSAGE":
            got.append(frame.body)
    assert got == [b"pay 8"]                      # "pay 7" again would be a second copy


def test_rule_3_1_the_journal_is_bounded_and_expires():
    class Catalog:
        def __init__(self):
            self.meta: dict[str, bytes] = {}

        def put_meta(self, key, value):
            if value is None:
                self.meta.pop(key, None)
            else:
                self.meta[key] = value

    now = [1_000_000]
    store = Catalog()
    journal = DedupJournal(store, window_ms=10_000, max_ids=5, now_ms=lambda: now[0])
    for batch in range(4):
        for i in range(2):
            journal.note("/queue/q", f"{batch}-{i}")
        journal.write()
    assert journal.ids <= 6 and len(store.meta) == journal.records          # the oldest records went
    restored = DedupJournal(Catalog(), 10_000, 5, lambda: now[0])
    alive = [entry for key in sorted(store.meta) for entry in restored.restore(key, store.meta[key])]
    assert {dedup_id for _, dedup_id, _ in alive} == {"2-0", "2-1", "3-0", "3-1"} - set() or len(alive) >= 4
    now[0] += 10_001                             # the window passed: every record goes
    journal.expire()
    assert store.meta == {} and journal.records == 0
    with pytest.raises((ValueError, TypeError)):
        restored.restore("dedup:0000000000000009", b'{"not": "a list"}')


# -- 3.2 possibly delivered means flagged -----------------------------------------------------------------------
def test_rule_3_2_the_store_knows_whether_its_last_owner_closed_it(tmp_path):
    def open_store():
        store = HoldingStore([MemoryDevice("memory"), FileDevice("file", tmp_path / "f", page_size=4096)],
                             persistent_device="file", sync_policy="never")
        store.open()
        return store
    store = open_store()
    assert not store.unclean
    store.close()                                 # clean: the record goes
    store = open_store()
    assert not store.unclean
    assert any(key == RUN_MARKER for key, _ in store.catalog.iter_meta())
    store.devices["file"]._simulate_crash()       # the owner ends without closing
    store = open_store()
    assert store.unclean
    store.close()


# -- 3.3 visible once durable --------------------------------------------------------------------------------
def test_rule_3_3_under_ha_a_persistent_message_is_visible_only_once_durable(tmp_path):
    core = Core(tmp_path, ha={})
    try:
        waiting: list = []
        core.store.barrier = waiting.append          # the sync has not completed
        queue = core.queue("orders")
        core.send("/queue/orders", {"persistent": "true"})
        core.broker.placement._durable_barrier()    # the loop turn ends: its one barrier is asked for
        assert queue.depth == 0 and len(waiting) == 1
        waiting[0](None)                              # durable now: it reaches its queue
        assert queue.depth == 1
        core.send("/queue/orders", {"persistent": "false"})
        assert queue.depth == 2                       # a non-persistent message is visible at once
    finally:
        core.close()


def test_without_ha_a_message_is_visible_at_once(tmp_path):
    core = Core(tmp_path)
    try:
        core.store.barrier = lambda callback: None
        core.send("/queue/orders", {"persistent": "true"})
        assert core.queue("orders").depth == 1
    finally:
        core.close()


# -- 3.4 transactions as one unit ------------------------------------------------------------------------------
def test_rule_3_4_a_unit_s_frames_are_recovered_all_or_none(tmp_path):
    def device():
        d = FileDevice("file", tmp_path / "f", page_size=4096, checkpoint_in_sync=False)
        d.open()
        return d
    d = device()
    d.begin_unit()
    for key in (1, 2, 3):
        d.write(StoredMessage(key, "/queue/q", key, True, b"x" * 900), ["/queue/q"])
    d.flush()                                     # the frames are in the log, but not their commit
    generation = d.store.generation
    d.checkpoint()                                # put off while the unit is open
    assert d.store.generation == generation
    d._simulate_crash()
    d = device()
    assert [stored.key for stored, _ in d.recover()] == []
    d.begin_unit()
    for key in (4, 5, 6):
        d.write(StoredMessage(key, "/queue/q", key, True, b"y" * 900), ["/queue/q"])
    d.end_unit()
    d.flush()
    d._simulate_crash()
    d = device()
    assert sorted(stored.key for stored, _ in d.recover()) == [4, 5, 6]
    d.close()


def test_rule_3_4_a_commit_cut_by_a_crash_leaves_none_of_its_messages(broker_factory, tmp_path):
    """A COMMIT of three large messages (the log hands the first two to the OS on its own before the third is
    placed) and a crash before the third: recovery finds none of them, where each of its frames committing
    on its own would have left two."""
    running = broker_factory(data_dir=str(tmp_path / "data"))
    device = running.call(lambda: running.broker.store.devices["file"])

    def no_write_behind():
        running.broker.store.write_behind = False          # as with storage rules: written at placement
    running.call(no_write_behind)
    broker = running.broker
    real_send = broker.send
    sent = [0]

    def send(client, request, admitted=False):
        if admitted:
            sent[0] += 1
            if sent[0] == 3:
                device._simulate_crash()           # the process dies here: nothing more reaches the disk
                raise SystemExit("crash")
        return real_send(client, request, admitted)
    broker.send = send
    client = RawStomp(running.port)
    assert client.connect().command == "CONNECTED"
    client.send("BEGIN", {"transaction": "t"})
    for i in range(3):
        client.send("SEND", {"destination": "/queue/tx", "transaction": "t", "persistent": "true"},
                    bytes([65 + i]) * 700_000)
    client.send("COMMIT", {"transaction": "t", "receipt": "c"})
    try:
        client.read_until_closed(10)
    except TimeoutError:
        pass
    client.close()
    recovered = FileDevice("file", tmp_path / "data" / "file", checkpoint_in_sync=False)
    recovered.open()
    keys = [stored.key for stored, _ in recovered.recover() if stored.destination == "/queue/tx"]
    recovered.close()
    assert keys == []


def test_rule_3_4_the_sql_device_commits_a_unit_in_one_transaction(postgres_url):
    from pymq_server.storage.sql import SqlDevice, drop_tables
    prefix = "u" + uuid.uuid4().hex[:10] + "_"
    device = SqlDevice("db", postgres_url, broker_id="n", table_prefix=prefix)
    device.open()
    try:
        device.begin_unit()
        device.write(StoredMessage(1, "/queue/q", 1, True, b"a"), ["/queue/q"])
        syncing = threading.Thread(target=device.sync)      # the commit driver's worker, mid-unit
        syncing.start()
        syncing.join(0.5)
        assert syncing.is_alive()                           # it waits for the unit's end
        device.write(StoredMessage(2, "/queue/q", 2, True, b"b"), ["/queue/q"])
        device.end_unit()
        syncing.join(10)
        check = SqlDevice("db", postgres_url, broker_id="n", table_prefix=prefix)
        check.open()
        assert sorted(stored.key for stored, _ in check.recover()) == [1, 2]
        check.close()
    finally:
        device.close()
        import sqlalchemy as sa
        engine = sa.create_engine(postgres_url)
        drop_tables(engine, prefix)
        engine.dispose()
