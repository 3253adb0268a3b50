"""spec/ha.md §1: roles, the lease record, the lease, the OS lock, the candidate, taking the store — over both
media (a shared directory, PostgreSQL), in one process (each medium opens its own descriptors and sessions,
so two of them lock each other as two processes would).  Each test names the rule it checks."""
from __future__ import annotations

import os
import threading
import uuid

import pytest

from pymq_server.storage.ha import record as rec
from pymq_server.storage.ha.arbiter import HaArbiter
from pymq_server.storage.ha.filelease import FileLease
from pymq_server.storage.ha.record import LeaseRecord
from pymq_server.storage.ha.roles import MOVES, IllegalRoleMove, Role, move
from pymq_server.storage.ha.watch import LeaseWatch, Verdict
from tests.conftest import wait_for
from tests.storage.services import postgres_url  # noqa: F401 - a fixture

INSTANCE = bytes(range(16))


# -- 1.1 roles -----------------------------------------------------------------------------------------------
def test_rule_1_1_roles_move_only_as_the_table_says():
    assert move(Role.BACKUP, Role.ACTIVATING) is Role.ACTIVATING
    assert move(Role.LIVE, Role.FENCED) is Role.FENCED
    for current, allowed in MOVES.items():
        for wanted in Role:
            if wanted not in allowed:
                with pytest.raises(IllegalRoleMove):
                    move(current, wanted)
    # a backup never becomes live without activating, a fenced process never live again (a new start is a backup)
    assert Role.LIVE not in MOVES[Role.BACKUP] and Role.LIVE not in MOVES[Role.FENCED]


# -- 1.3 the record --------------------------------------------------------------------------------------------
def test_rule_1_3_a_torn_copy_never_loses_the_record():
    first = rec.first("orders", INSTANCE, "host-a", 42, True)
    second = first.renewed(True)
    image = bytearray(rec.FILE_SIZE)
    image[0:rec.RECORD_SIZE] = rec.encode(first)
    image[512:512 + rec.RECORD_SIZE] = rec.encode(second)
    assert rec.newest(bytes(image)) == (second, 0)          # the newer copy wins; the next write goes over the older
    for cut in (1, 100, rec.RECORD_SIZE - 1):               # the newer copy torn at any byte: the older one stands
        torn = bytearray(image)
        torn[512 + cut:512 + rec.RECORD_SIZE] = bytes(rec.RECORD_SIZE - cut)
        assert rec.newest(bytes(torn))[0] == first
    flipped = bytearray(image)
    flipped[512 + 30] ^= 1
    assert rec.newest(bytes(flipped))[0] == first
    assert rec.newest(bytes(rec.FILE_SIZE)) == (None, 0)
    # names longer than the field are cut on a character boundary, never mid-character
    long = rec.LeaseRecord(1, 1, 0, INSTANCE, "n", "é" * 40, 1)
    assert rec.decode(rec.encode(long)).host == "é" * 32


# -- 1.4 / 1.5 what a candidate concludes ---------------------------------------------------------------------
def test_rule_1_4_a_lease_ends_after_lease_ms_without_a_change_of_the_record():
    watch = LeaseWatch(1000)
    record = rec.first("n", INSTANCE, "h", 1, False)
    assert watch.observe(record, 10.0, False) is Verdict.WAIT
    assert watch.observe(record, 10.9, False) is Verdict.WAIT
    renewed = record.renewed(False)
    assert watch.observe(renewed, 10.95, False) is Verdict.WAIT          # a renewal restarts the count
    assert watch.observe(renewed, 11.9, False) is Verdict.WAIT
    assert watch.observe(renewed, 11.96, False) is Verdict.TAKE
    # PostgreSQL: the database's clock judges, whatever the local one says
    assert LeaseWatch(1000).observe(renewed, 0.0, False, expired=True) is Verdict.TAKE
    assert LeaseWatch(1000).observe(renewed, 99.0, False, expired=False) is Verdict.WAIT


def test_rule_1_5_the_os_lock_of_a_holder_that_held_it_means_it_is_gone():
    held = rec.first("n", INSTANCE, "h", 1, os_locked=True)
    assert LeaseWatch(1000).observe(held, 0.0, True) is Verdict.TAKE
    # its holder never had it (took over by lease while a stopped former live held it): give it back, wait
    not_held = rec.first("n", INSTANCE, "h", 1, os_locked=False)
    watch = LeaseWatch(1000)
    assert watch.observe(not_held, 0.0, True) is Verdict.RELEASE_OS_LOCK
    assert watch.observe(not_held, 0.5, True) is Verdict.RELEASE_OS_LOCK
    assert watch.observe(not_held, 1.0, True) is Verdict.TAKE            # ... until its lease ends
    assert LeaseWatch(1000).observe(None, 0.0, True) is Verdict.TAKE     # a new store
    assert LeaseWatch(1000).observe(None, 0.0, False) is Verdict.WAIT


# -- the media ----------------------------------------------------------------------------------------------
@pytest.fixture(params=["file", "postgresql"])
def media(request, tmp_path):
    """``make()`` -> an open lease medium over one shared store (a directory, or a table of its own)."""
    made: list = []
    if request.param == "file":
        def make():
            medium = FileLease(str(tmp_path / "ha"), "orders")
            medium.open()
            made.append(medium)
            return medium
    else:
        url = request.getfixturevalue("postgres_url")
        from pymq_server.storage.ha.pglease import PgLease
        prefix = "t" + uuid.uuid4().hex[:10] + "_"

        def make():
            medium = PgLease(url, "orders", table_prefix=prefix, lease_ms=1000)
            medium.open()
            made.append(medium)
            return medium
    yield make
    for medium in made:
        medium.close()
    if request.param == "postgresql" and made:
        import sqlalchemy as sa
        engine = sa.create_engine(request.getfixturevalue("postgres_url"))
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {made[0].table_name}"))
        engine.dispose()


def arbiter(medium, lease_ms=1000) -> HaArbiter:
    return HaArbiter(medium, node="orders", lease_ms=lease_ms, renew_ms=max(10, lease_ms // 4), poll_ms=20)


class Loop:
    """The event loop's liveness ticks (the server's timer), until ``hang()``."""

    def __init__(self, arbiter: HaArbiter) -> None:
        self.hung = threading.Event()
        arbiter.activated()
        self.thread = threading.Thread(target=self._run, args=(arbiter,), daemon=True)
        self.thread.start()

    def _run(self, arbiter: HaArbiter) -> None:
        while not self.hung.wait(arbiter.renew_s / 2):
            arbiter.loop_tick()

    def hang(self) -> None:
        self.hung.set()


def test_rule_1_5_os_lock_is_exclusive_and_dropped_with_its_holder(media):
    a, b = media(), media()
    assert a.try_os_lock() and not b.try_os_lock()
    assert a.os_lock_intact()
    a.close()                                   # the process ends: its lock goes
    assert wait_for(b.try_os_lock, 5)


def test_rule_1_6_one_candidate_at_a_time(media):
    a, b = media(), media()
    assert a.try_candidate() and not b.try_candidate()
    a.release_candidate()
    assert b.try_candidate() and not a.try_candidate()


def test_rule_1_7_taking_writes_the_next_epoch_only_over_the_record_it_decided_on(media):
    a, b = media(), media()
    assert a.take(None, rec.first("orders", b"a" * 16, "a", 1, False), holder_dead=True)
    first = a.read()
    assert first is not None and first.epoch == 1 and a.mine == first
    assert not b.take(None, rec.first("orders", b"b" * 16, "b", 2, False), holder_dead=True)   # not new any more
    renewed = a.renew(False)
    assert renewed is not None and renewed.seq == first.seq + 1
    # b decided on the record before the renewal: the holder is slow, not gone
    assert not b.take(first, first.taken(b"b" * 16, "b", 2, False), holder_dead=True)
    current = b.read()
    assert b.take(current, current.taken(b"b" * 16, "b", 2, False), holder_dead=True)
    assert b.read().epoch == 2 and b.epoch == 2
    # the former holder's next renewal finds the epoch stale: fenced, and says so once
    heard: list[str] = []
    a.on_fenced = heard.append
    assert a.renew(False) is None and a.fenced_reason is not None and len(heard) == 1
    with pytest.raises(OSError):
        a.check()
    assert b.read().epoch == 2                # the stale renewal changed nothing


def test_rule_1_4_to_1_7_a_backup_takes_over_a_stopped_live_by_lease_and_a_dead_one_at_once(media):
    live, backup = arbiter(media(), 400), arbiter(media(), 400)
    stop = threading.Event()
    assert live.wait_until_taken(stop)
    loop = Loop(live)
    taken: list[bool] = []
    watcher = threading.Thread(target=lambda: taken.append(backup.wait_until_taken(stop)))
    watcher.start()
    assert wait_for(lambda: live.renewals >= 4, 10)
    assert not taken and backup.role is Role.BACKUP and backup.candidate      # the live renews: no takeover
    # the live "hangs": its loop does not run, so it stops renewing; the lease ends, the backup takes epoch 2
    loop.hang()
    watcher.join(15)
    assert taken == [True] and backup.medium.epoch == 2 and "lease" in backup.take_reason
    assert backup.seen.os_locked is False                   # the hung live still holds the OS lock
    # the hung live's next check finds itself fenced
    assert wait_for(lambda: live.role is Role.FENCED, 10) and live.may_send() is False
    live.abandon()                                          # it lets the OS lock go: the new live takes it
    assert wait_for(lambda: backup.medium.holds_os_lock and backup.seen.os_locked, 10)
    # a third process: the holder dies (its OS lock goes) -> taken at once, without waiting for the lease
    third = arbiter(media(), 60_000)
    Loop(backup)
    thread = threading.Thread(target=lambda: taken.append(third.wait_until_taken(stop)))
    thread.start()
    assert wait_for(lambda: third.candidate, 10)
    backup.abandon()
    thread.join(15)
    assert taken == [True, True] and third.medium.epoch == 3 and "OS lock" in third.take_reason
    third.stop()
    stop.set()


def test_rule_1_7_a_store_of_another_node_is_refused(tmp_path):
    from pymq.errors import ConfigError
    medium = FileLease(str(tmp_path / "ha"), "orders")
    medium.open()
    assert medium.take(None, rec.first("orders", INSTANCE, "h", 1, False), holder_dead=True)
    other = HaArbiter(FileLease(str(tmp_path / "ha"), "billing"), node="billing", lease_ms=1000, renew_ms=250,
                      poll_ms=20)
    other.medium.open()
    with pytest.raises(ConfigError, match="belongs to node 'orders'"):
        other.wait_until_taken(threading.Event())
    other.medium.close()
    medium.close()


def test_rule_2_1_a_live_serves_only_under_a_fresh_lease(media):
    live = arbiter(media(), 300)
    assert live.wait_until_taken(threading.Event())
    Loop(live)
    assert live.may_send() is True
    live._stop.set()                                         # renewals stop (the renewing thread's view of a pause)
    live._renewer.join(5)
    assert wait_for(lambda: live.clock() > live.serve_until, 5)
    assert live.may_send() is True                           # past the window: a synchronous renewal first
    assert live.serve_until > live.clock()
    # another process took the store meanwhile: the renewal finds the epoch stale and nothing may be sent, ever
    other = media()
    current = other.read()
    assert other.take(current, current.taken(b"z" * 16, "z", 9, False), holder_dead=True)
    live._serve_until = 0.0
    assert live.may_send() is False and live.role is Role.FENCED
    assert live.may_send() is False
    live.abandon()


def test_a_live_stopping_cleanly_lets_the_os_lock_go_last(media):
    """1.9: after a clean stop the candidate takes over at once (the OS lock), not after the lease."""
    live, backup = arbiter(media(), 60_000), arbiter(media(), 60_000)
    stop = threading.Event()
    assert live.wait_until_taken(stop)
    Loop(live)
    taken: list[bool] = []
    thread = threading.Thread(target=lambda: taken.append(backup.wait_until_taken(stop)))
    thread.start()
    assert wait_for(lambda: backup.candidate, 10)
    live.stop()
    thread.join(15)
    assert taken == [True] and "OS lock" in backup.take_reason and live.role is Role.STOPPED
    backup.stop()


def test_lease_file_holds_two_copies(tmp_path):
    medium = FileLease(str(tmp_path / "ha"), "orders")
    medium.open()
    medium.take(None, rec.first("orders", INSTANCE, "h", 1, True), holder_dead=True)
    for _ in range(3):
        medium.renew(True)
    image = (tmp_path / "ha" / "lease").read_bytes()
    copies = [rec.decode(image[at:at + rec.RECORD_SIZE]) for at in rec.SLOT_OFFSETS]
    assert all(isinstance(c, LeaseRecord) for c in copies)
    assert sorted(c.seq for c in copies) == [3, 4]
    assert os.path.exists(tmp_path / "ha" / "live.lock") and os.path.exists(tmp_path / "ha" / "epoch.lock")
    medium.close()


def test_rule_1_8_a_backup_says_it_waits_only_once_it_read_the_lease(tmp_path):
    """The command line announces a backup (and the tests and operators then read its admin port) from
    ``wait_until_live``'s ``waiting`` call: by then the lease was read, so the status names the holder and its
    epoch (a backup announced before its first read showed epoch 0 to /readyz under load)."""
    import asyncio
    from types import SimpleNamespace

    from pymq_server.ha_role import HaRole

    medium = FileLease(str(tmp_path / "ha"), "orders")
    medium.open()
    live = arbiter(medium)
    stop = threading.Event()
    assert live.wait_until_taken(stop)
    Loop(live)
    config = SimpleNamespace(ha=SimpleNamespace(lease_ms=1000, renew_every_ms=250, poll_ms=20), node_id="orders",
                             ha_store=lambda: ("file", str(tmp_path)))
    role = HaRole(SimpleNamespace(config=config))
    announced: list[dict] = []

    async def backup() -> bool:
        waiting = asyncio.ensure_future(role.wait_until_live(lambda: announced.append(role.status())))
        while not announced:
            await asyncio.sleep(0.01)
        role.stop_waiting()
        return await asyncio.wait_for(waiting, 10)

    assert asyncio.run(backup()) is False
    assert [(s["role"], s["epoch"], s["holder"]["pid"]) for s in announced] == [("backup", 1, os.getpid())]
    role.medium.close()
    live.stop()
