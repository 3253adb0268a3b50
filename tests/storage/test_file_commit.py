"""Group commit: the sans-IO policy (server/storage/commit.py) and the broker's driver of it, the holding
store's ``barrier`` on an asyncio runtime (server/storage/store.py, server/net/runtime.py)."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from pymq.errors import StorageError
from pymq_server.storage.commit import CommitPolicy, GroupCommit
from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice
from pymq_server.net.runtime import AsyncioRuntime
from pymq_server.storage.store import HoldingStore


def recorder():
    fired: list = []
    return fired, (lambda name: (lambda error: fired.append((name, error))))


def test_never_fires_at_once_and_never_syncs():
    policy = GroupCommit("never")
    fired, cb = recorder()
    policy.on_commit(cb("a"))
    assert fired == [("a", None)]
    assert policy.next_sync_at(0.0) is None and policy.pending == 0


def test_always_syncs_immediately_and_late_waiters_wait_for_the_next_sync():
    policy = GroupCommit(CommitPolicy.ALWAYS)
    fired, cb = recorder()
    assert policy.next_sync_at(1.0) is None
    policy.on_commit(cb("a"))
    assert policy.next_sync_at(1.0) == 1.0
    assert policy.sync_started(1.0) == 1
    policy.on_commit(cb("b"))                 # its writes may postdate the fsync in flight
    assert policy.next_sync_at(1.1) is None   # one sync at a time
    assert policy.sync_done() == 1
    assert fired == [("a", None)]
    assert policy.next_sync_at(1.2) == 1.2
    policy.sync_started(1.2)
    policy.sync_done()
    assert fired == [("a", None), ("b", None)]
    assert policy.syncs == 2 and policy.commits == 2


def test_join_waits_for_the_last_sync_asked_for_and_asks_for_none():
    """``join`` (a barrier with nothing new to sync) rides on the sync already asked for: the next one when
    commits wait for it, else the one in flight, else none at all — it never makes the driver start one."""
    policy = GroupCommit("always")
    fired, cb = recorder()
    policy.join(cb("idle"))
    assert fired == [("idle", None)] and policy.next_sync_at(0.0) is None
    policy.on_commit(cb("a"))
    policy.sync_started(1.0)
    policy.join(cb("rides on the sync in flight"))
    assert policy.next_sync_at(1.1) is None
    policy.on_commit(cb("b"))
    policy.join(cb("rides on the next sync"))
    assert policy.sync_done() == 2
    assert [name for name, _ in fired] == ["idle", "a", "rides on the sync in flight"]
    policy.sync_started(1.2)
    assert policy.sync_failed(OSError("disk")) == 2
    assert [name for name, _ in fired[-2:]] == ["b", "rides on the next sync"]
    assert isinstance(fired[-1][1], OSError), "a failed sync fails the barriers that joined it too"
    assert policy.next_sync_at(1.3) is None and policy.syncs == 2


def test_grouped_starts_at_most_one_sync_per_interval():
    policy = GroupCommit("grouped", interval_ms=10)
    fired, cb = recorder()
    policy.on_commit(cb(1))
    assert policy.next_sync_at(5.0) == 5.0    # idle until now: no reason to wait
    policy.sync_started(5.0)
    policy.sync_done()
    for name in range(2, 50):
        policy.on_commit(cb(name))
    assert policy.next_sync_at(5.002) == pytest.approx(5.010)
    assert policy.next_sync_at(5.020) == 5.020
    assert policy.sync_started(5.020) == 48   # one fsync for 48 commits
    policy.sync_done()
    assert [name for name, _ in fired] == list(range(1, 50))


def test_failed_sync_reports_the_error_to_covered_waiters_only():
    policy = GroupCommit("always")
    fired, cb = recorder()
    policy.on_commit(cb("a"))
    policy.sync_started(0.0)
    policy.on_commit(cb("b"))
    boom = OSError("disk on fire")
    assert policy.sync_failed(boom) == 1
    assert fired == [("a", boom)] and policy.pending == 1


def test_misuse_raises():
    policy = GroupCommit("always")
    with pytest.raises(RuntimeError):
        policy.sync_done()
    policy.sync_started(0.0)
    with pytest.raises(RuntimeError):
        policy.sync_started(0.0)
    with pytest.raises(ValueError):
        GroupCommit("sometimes")
    with pytest.raises(ValueError):
        GroupCommit("grouped", interval_ms=-1)


@settings(max_examples=200, deadline=None)
@given(policy_name=st.sampled_from(["always", "grouped"]),
       steps=st.lists(st.sampled_from(["commit", "start", "done", "fail", "tick"]), max_size=60))
def test_a_waiter_fires_only_after_a_sync_that_started_after_it(policy_name, steps):
    policy = GroupCommit(policy_name, interval_ms=3)
    now = 0.0
    registered_at: dict[int, int] = {}       # waiter -> index of the sync epoch when it registered
    fired_after: dict[int, tuple] = {}
    started = 0                               # syncs started so far
    current_start = None
    counter = [0]
    for step in steps:
        if step == "commit":
            name = counter[0]
            counter[0] += 1
            registered_at[name] = started
            policy.on_commit(lambda error, name=name: fired_after.setdefault(name, (current_start, error)))
        elif step == "start":
            when = policy.next_sync_at(now)
            if when is not None and when <= now:
                started += 1
                current_start = started
                policy.sync_started(now)
        elif step in ("done", "fail") and policy.in_flight:
            policy.sync_done() if step == "done" else policy.sync_failed(RuntimeError("x"))
        elif step == "tick":
            now += 0.001
    for name, (sync_index, _error) in fired_after.items():
        assert sync_index is not None and sync_index > registered_at[name]
    assert policy.pending == len(registered_at) - len(fired_after)


class CountingDevice:
    """Stands in for a device: counts flushes and syncs, optionally slow or failing."""

    def __init__(self, sync_seconds=0.0, fail=False):
        self.flushes = 0
        self.syncs = 0
        self.synced_flushes = 0          # flushes covered by the last finished sync
        self.sync_seconds = sync_seconds
        self.fail = fail
        self.checkpoint_due = False
        self.checkpoints = 0
        self.threads = set()
        #: set: each sync waits for it (a sync held in flight for as long as a test needs)
        self.hold: threading.Event | None = None

    def flush(self):
        self.flushes += 1

    def sync(self):
        seen = self.flushes
        self.threads.add(threading.get_ident())
        if self.hold is not None:
            assert self.hold.wait(10), "the test never let the sync finish"
        if self.sync_seconds:
            time.sleep(self.sync_seconds)   # a slow disk is what is simulated here
        if self.fail:
            raise OSError("fsync failed")
        self.syncs += 1
        self.synced_flushes = seen

    def checkpoint(self):
        self.checkpoints += 1
        self.checkpoint_due = False


class Committer:
    """A device driven the way the broker drives it: a holding store on an asyncio runtime, ``barrier``
    being what a persistent SEND's receipt waits for."""

    def __init__(self, device, policy: str, window_ms: float = 2.0) -> None:
        self.runtime = AsyncioRuntime(asyncio.get_running_loop())
        device.name = getattr(device, "name", "dev")
        self.device = device
        self.store = HoldingStore([device], persistent_device=device.name, sync_policy=policy,
                                  sync_window_ms=window_ms, call_later=self.runtime.call_later,
                                  run_in_thread=self.runtime.run_in_thread)

    async def commit(self) -> None:
        done = asyncio.get_running_loop().create_future()
        self.store.mark_dirty(self.device)        # what hold()/release() record for the broker
        self.store.barrier(lambda error: done.set_result(error))
        error = await done
        if error is not None:
            raise error

    def close(self) -> None:
        self.runtime.shutdown()


def test_store_sequential_commits_sync_each_under_always():
    async def main():
        device = CountingDevice()
        committer = Committer(device, "always")
        for _ in range(5):
            await committer.commit()
            assert device.synced_flushes == device.flushes   # durable before commit() returned
        committer.close()
        return device
    device = asyncio.run(main())
    assert device.syncs == 5 and threading.get_ident() not in device.threads


def test_store_groups_concurrent_commits():
    async def main():
        device = CountingDevice(sync_seconds=0.01)
        committer = Committer(device, "grouped", window_ms=5)
        await asyncio.gather(*(committer.commit() for _ in range(100)))
        committer.close()
        return device
    device = asyncio.run(main())
    assert device.flushes == 100 and 1 <= device.syncs <= 2


def test_store_a_barrier_with_nothing_new_waits_for_the_sync_in_flight_and_starts_no_other():
    """Receipts whose messages were all consumed unwritten (issue 16's `qp` row) reach the barrier with
    nothing to flush while an earlier receipt's sync runs: they wait for that sync and start no other (they
    used to register a commit of their own, a second fsync per sync in flight)."""
    async def main():
        device = CountingDevice()
        device.hold = threading.Event()
        committer = Committer(device, "always")
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(committer.commit())
        deadline = loop.time() + 10
        while not device.threads and loop.time() < deadline:      # its sync is in flight now (held)
            await asyncio.sleep(0.005)
        assert device.threads and device.syncs == 0
        joined = loop.create_future()
        committer.store.barrier(lambda error: joined.set_result(error))   # nothing dirty
        device.hold.set()
        assert await joined is None
        assert device.syncs == 1, "answered by the sync in flight"
        await first
        await committer.commit()        # one more commit, one more sync: no third was started meanwhile
        committer.close()
        return device
    device = asyncio.run(main())
    assert device.syncs == 2


def test_store_reports_sync_failure_to_the_committer():
    async def main():
        committer = Committer(CountingDevice(fail=True), "always")
        with pytest.raises(StorageError, match="fsync failed"):
            await committer.commit()
        committer.close()
    asyncio.run(main())


def test_store_on_a_file_device_receipted_writes_survive_a_crash(tmp_path):
    async def main():
        device = FileDevice("file", tmp_path / "s")
        device.open()
        committer = Committer(device, "grouped", window_ms=2)

        async def send(key):
            device.write(StoredMessage(key, "/queue/a", key, True, b"m%d" % key), ["/queue/a"])
            await committer.commit()
            return key

        receipted = await asyncio.gather(*(send(k) for k in range(1, 201)))
        committer.close()
        device._simulate_crash()          # no close: only what sync made durable may count
        return receipted
    receipted = asyncio.run(main())
    device = FileDevice("file", tmp_path / "s")
    device.open()
    try:
        assert [m.key for m, _ in device.recover()] == sorted(receipted)
    finally:
        device.close()


def test_store_checkpoints_outside_sync_when_the_device_leaves_it_to_the_store(tmp_path):
    async def main():
        device = FileDevice("file", tmp_path / "s", 4096, fsync=False, checkpoint_bytes=30_000,
                            checkpoint_in_sync=False)
        device.open()
        committer = Committer(device, "always")
        for key in range(1, 601):
            device.write(StoredMessage(key, "/queue/a", key, True, bytes(200)), ["/queue/a"])
            await committer.commit()
        for _ in range(200):                  # the last checkpoint runs in a worker after its sync
            if not device.checkpoint_due:
                break
            await asyncio.sleep(0.005)
        committer.close()
        checkpoints = device.status().extra["checkpoints"]
        device.close()
        return checkpoints
    assert asyncio.run(main()) >= 3
