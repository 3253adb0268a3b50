"""How many times the file device's index looks a message up between its delivery and its removal.

A paged persistent message lives in the index's cold arrays (``index.py``: found by bisection, an ``Entry``
built from the arrays when it must change). Its delivery reads it, notes the delivery (a flush logs the
count) and its acknowledgement removes it: each of those locates it once. Only a removal that leaves other
references builds an ``Entry`` (a cold message of two queues comes hot once, its references changing); a
last reference goes straight from the cold arrays (no ``Entry``, no hot slot), in the write path and in
recovery's replay of the REMOVE alike. Messages not touched stay cold: the cold tier's memory bound."""
from __future__ import annotations

import pytest

from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice
from pymq_server.storage.file.index import ColdRun
from tests.storage.test_removal_path import _calls

Q = "/queue/a"


@pytest.fixture
def counted(monkeypatch):
    calls = {"find": 0, "entry": 0}
    find, entry = ColdRun.find, ColdRun.entry

    def counting_find(self, key):
        calls["find"] += 1
        return find(self, key)

    def counting_entry(self, i, refs):
        calls["entry"] += 1
        return entry(self, i, refs)

    monkeypatch.setattr(ColdRun, "find", counting_find)
    monkeypatch.setattr(ColdRun, "entry", counting_entry)
    return calls


def _body(key: int, pad: int = 0) -> bytes:
    return b"m%d" % key + b"." * pad


def _cold_device(path, count: int, queues=(Q,), pad: int = 0) -> FileDevice:
    device = FileDevice("file", str(path), 4096, fsync=False, index_hot=2)
    device.open()
    for key in range(1, count + 1):
        device.write(StoredMessage(key, Q, key, True, _body(key, pad)), list(queues))
    device.flush()
    return device


def test_a_delivered_and_removed_cold_message_is_looked_up_once_per_step_and_copied_once(tmp_path, counted):
    n = 40
    device = _cold_device(tmp_path, n)
    index = device.store.index
    try:
        first_hot = min(index.hot)
        cold_keys = list(range(1, first_hot))
        assert len(cold_keys) >= n - 2
        for key in cold_keys:
            assert key not in index.hot
        hot_before, bytes_before = set(index.hot), index.bytes_used
        counted["find"] = counted["entry"] = 0
        for key in cold_keys:
            assert device.read(key).data == b"m%d" % key      # the delivery reads it ...
            device.record_delivery(key, Q, 1)                 # ... counts it ...
            device.flush()                                    # ... and a flush logs the count
            assert device.deliveries(key) == {Q: 1}
            device.remove(key, Q)                             # the acknowledgement
            assert key not in device
        # read, the flush's check of the noted delivery, the removal: one bisection each (4 before session 36:
        # the read asked "held?" and then for the entry), and no Entry at all: the last reference dies in the
        # cold arrays (3 Entries before session 36, 1 before session 37: the removal brought it hot first)
        assert counted["find"] == 4 * len(cold_keys)         # 3 + the `in` asserted above
        assert counted["entry"] == 0
        assert set(index.hot) == hot_before                  # no hot slot taken, even for a moment
        assert len(index.cold) == 0
        assert index.bytes_used == bytes_before - sum(len(b"m%d" % key) for key in cold_keys)
        assert index.deliveries == {} and index.unlogged == {}
    finally:
        device.close()


def test_cold_removals_free_their_pages_and_recovery_replays_them_cold_after_a_kill_9(tmp_path, counted):
    """Removals of cold messages logged after a checkpoint (recovery loads the checkpoint's messages cold),
    then a kill -9: the replay removes them from the cold arrays as the write path did, and both agree."""
    n = 60
    device = _cold_device(tmp_path, n, pad=200)               # 4-5 pages of 4 KiB
    device.checkpoint()
    device.close()
    device = FileDevice("file", str(tmp_path), 4096, fsync=False, index_hot=2)
    device.open()
    index = device.store.index
    assert len(index.cold) == n and not index.hot            # all cold after the reopen
    pages_before = device.status().extra["pages_persistent"]
    gone = list(range(1, n - 4))
    for key in gone:
        device.record_delivery(key, Q, 1)
    device.flush()
    counted["entry"] = 0
    for key in gone:
        device.remove(key, Q)
    assert counted["entry"] == 0 and not index.hot
    assert device.status().extra["pages_persistent"] < pages_before       # emptied pages were freed
    kept = [(m.key, m.data) for m in device.iterate(Q)]
    used = index.bytes_used
    device.flush()
    device._simulate_crash()                                  # kill -9: the log's REMOVEs are replayed
    device = FileDevice("file", str(tmp_path), 4096, fsync=False, index_hot=2)
    device.open()
    try:
        index = device.store.index
        assert counted["entry"] == 0 and not index.hot        # replayed cold too
        assert [(m.key, m.data) for m in device.iterate(Q)] == kept == [(k, _body(k, 200)) for k in range(n - 4, n + 1)]
        assert index.bytes_used == used and len(device.store.index) == 5
        assert all(device.deliveries(key) == {} for key in gone)
        for key, _ in kept:                                   # and the survivors still go, cold
            device.remove(key, Q)
        assert len(device.store.index) == 0 and index.bytes_used == 0
    finally:
        device.close()


def test_a_removal_for_a_queue_that_does_not_owe_a_cold_message_changes_nothing(tmp_path):
    device = _cold_device(tmp_path, 10)
    index = device.store.index
    try:
        assert 1 not in index.hot
        with pytest.raises(KeyError):
            device.remove(1, "/queue/other")
        with pytest.raises(KeyError):
            device.remove(10_000, Q)
        assert 1 not in index.hot and index.cold.find(1) >= 0 and device.references(1) == [Q]
    finally:
        device.close()


def test_reading_and_noting_a_delivery_leave_a_cold_message_cold(tmp_path, counted):
    device = _cold_device(tmp_path, 30)
    index = device.store.index
    try:
        cold = [key for key in range(1, 31) if key not in index.hot]
        hot_before = len(index.hot)
        for key in cold:
            device.read(key)
            device.record_delivery(key, Q, 2)
        device.flush()
        assert device.references(cold[0]) == [Q]
        assert [m.key for m in device.iterate(Q)] == list(range(1, 31))
        assert len(index.hot) == hot_before                  # nothing promoted: the cold tier's bound holds
        assert counted["entry"] == 0
        assert all(device.deliveries(key) == {Q: 2} for key in cold)
    finally:
        device.close()


def test_a_cold_message_of_two_queues_comes_hot_once(tmp_path, counted):
    device = _cold_device(tmp_path, 10, queues=(Q, "/queue/b"))
    index = device.store.index
    try:
        key = 1
        assert key not in index.hot
        counted["find"] = counted["entry"] = 0
        device.remove(key, Q)                 # changes: comes hot, once
        assert key in index.hot
        device.remove(key, "/queue/b")        # found hot: no bisection, no copy
        assert counted == {"find": 1, "entry": 1}
        assert key not in device
    finally:
        device.close()


def test_a_cold_run_finds_every_live_key_with_and_without_gaps():
    from array import array

    run = ColdRun()
    keys = [3, 4, 5, 9, 10, 40, 41, 42, 43, 100]
    run.load(array("Q", keys), array("Q", [7 + i for i in range(len(keys))]), array("I", [0] * len(keys)),
             array("I", [1] * len(keys)), array("Q", keys))
    assert [run.find(k) for k in keys] == list(range(len(keys)))
    assert [run.find(k) for k in (0, 1, 2, 6, 8, 11, 39, 44, 99, 101, 2 ** 63)] == [-1] * 11
    run.kill(run.find(9))                          # a dead slot is not found, its neighbours still are
    assert run.find(9) == -1 and run.find(10) == 4 and run.find(5) == 2


def test_a_fold_moves_hot_entries_to_the_cold_arrays_with_one_call_per_entry(tmp_path):
    """A fold (the hot tier past ``index_hot``) extends each cold array once: per entry only ``pack_place``
    runs in Python (before: a ``ColdRun.append`` call per entry, five array appends each). What it builds is
    what the entries said: every moved message is read back with its page, slot, seq, flags and length."""

    from pymq_server.storage.file.index import unpack_place

    device = FileDevice("file", str(tmp_path), 4096, fsync=False, index_hot=64)
    device.open()
    index = device.store.index
    try:
        for key in range(1, 64):
            device.write(StoredMessage(key, Q, key * 10, key % 2 == 0, _body(key, key % 7)), [Q])
        assert not len(index.cold)
        expected = {key: (e.page, e.slot, e.persistent, e.large, e.length, e.seq, e.refset)
                    for key, e in index.hot.items()}
        folded: list[int] = []
        calls = _calls(lambda: folded.append(index.fold()))[1:]       # (the lambda's own call first)
        moved = folded[0]
        assert moved == 63 - 32 and len(index.cold) == moved
        assert calls.count("index.py:pack_place") == moved
        assert len(calls) <= moved + 4, calls[:12]       # fold, extend, the list comprehension, pack_place each
        cold = index.cold
        for i, key in enumerate(cold.keys):
            page, slot, persistent, large = unpack_place(cold.places[i])
            assert (page, slot, persistent, large, cold.lengths[i], cold.seqs[i], cold.refsets[i]) == expected[key]
            assert key not in index.hot and device.read(key).data == _body(key, key % 7)
    finally:
        device.close()
