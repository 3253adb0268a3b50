"""The file device beyond the shared contract: crashes, space reuse, page kinds, iteration order, damage."""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from pymq.errors import StorageError
from pymq_server.storage import page_alloc
from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice
from pymq_server.storage.file import format as fmt

PAGE = 4096


def msg(key, persistent=True, data=None, seq=None, dest="/queue/a"):
    return StoredMessage(key, dest, key if seq is None else seq, persistent,
                         data if data is not None else b"m%d" % key)


def opened(path, **kw):
    kw.setdefault("fsync", False)
    device = FileDevice("file", path, kw.pop("page_size", PAGE), **kw)
    device.open()
    return device


def state(path, **kw):
    device = opened(path, **kw)
    try:
        return {m.key: (m, sorted(r)) for m, r in device.recover()}, dict(device.iter_meta())
    finally:
        device.close()


def test_clean_close_leaves_an_empty_log_and_reopen_reads_only_directories(tmp_path):
    device = opened(tmp_path)
    for key in range(1, 301):
        device.write(msg(key, data=os.urandom(100)), ["/queue/a"])
    device.close()
    device = opened(tmp_path)
    try:
        recovery = device.status().extra["recovery"]
        assert recovery["frames_replayed"] == 0
        assert recovery["pages_read"] == device.status().extra["pages_persistent"] > 1
        assert [m.key for m, _ in device.recover()] == list(range(1, 301))
    finally:
        device.close()


def test_copies_taken_at_every_point_of_a_run_recover_to_that_point(tmp_path):
    """A copy of the directory after a flush is what a crash at that instant leaves behind."""
    store = tmp_path / "store"
    device = opened(store, checkpoint_bytes=3000)      # several checkpoints happen during the run
    rng = random.Random(11)
    model: dict[int, tuple[StoredMessage, list[str]]] = {}
    live: dict[int, list[str]] = {}
    catalog: dict[str, bytes] = {}
    copies = []
    for step in range(120):
        if rng.random() < 0.55 or not live:
            key = step + 1
            persistent = rng.random() < 0.7
            refs = rng.sample(["q1", "q2", "q3"], rng.randint(1, 2))
            m = msg(key, persistent, os.urandom(rng.choice([10, 300, 5000])))
            device.write(m, refs)
            live[key] = list(refs)
            if persistent:
                model[key] = (m, list(refs))
        elif rng.random() < 0.85:
            key = rng.choice(sorted(live))
            queue = live[key].pop()
            device.remove(key, queue)
            if key in model:
                model[key][1].remove(queue)
            if not live[key]:
                del live[key]
                model.pop(key, None)
        else:
            catalog[f"k{step % 4}"] = b"v%d" % step
            device.put_meta(f"k{step % 4}", catalog[f"k{step % 4}"])
        device.flush()
        if step % 3 == 0:
            device.sync()                             # lets checkpoints run mid-run
        if step % 10 == 9:
            target = tmp_path / f"copy{step}"
            shutil.copytree(store, target)
            copies.append((target, {k: (m, sorted(r)) for k, (m, r) in model.items()}, dict(catalog)))
    assert device.status().extra["checkpoints"] >= 3
    device._simulate_crash()
    for target, expected, expected_catalog in copies:
        assert state(target) == (expected, expected_catalog), target.name


def test_unflushed_writes_are_lost_whole_never_half(tmp_path):
    device = opened(tmp_path)
    device.write(msg(1), ["q"])
    device.flush()
    device.write(msg(2), ["q"])
    device.remove(1, "q")
    device._simulate_crash()                          # nothing after the flush reached the OS
    assert list(state(tmp_path)[0]) == [1]


def test_non_persistent_pages_are_freed_at_recovery_and_reused(tmp_path):
    device = opened(tmp_path)
    for key in range(1, 401):
        device.write(msg(key, persistent=False, data=os.urandom(200)), ["q"])
    device.write(msg(1000), ["q"])
    device.flush()                                    # sealed non-persistent pages reach the file
    device.sync()
    extra = device.status().extra
    assert extra["pages_non_persistent"] > 10
    pages_before = extra["pages"]
    device._simulate_crash()
    device = opened(tmp_path)
    try:
        extra = device.status().extra
        assert extra["pages_non_persistent"] == 0 and extra["pages_persistent"] == 1
        assert [m.key for m, _ in device.recover()] == [1000]
        for key in range(2000, 2300):                 # the freed pages take new messages
            device.write(msg(key, persistent=key % 2 == 0, data=os.urandom(200)), ["q"])
        assert device.status().extra["pages"] <= pages_before + 2
    finally:
        device.close()


def test_removed_space_is_reused_and_the_file_stays_bounded(tmp_path):
    device = opened(tmp_path, checkpoint_bytes=64 * 1024)
    sizes = []
    rng = random.Random(5)
    window: list[int] = []
    for key in range(1, 20001):
        device.write(msg(key, persistent=key % 4 != 0, data=os.urandom(rng.randrange(50, 400))), ["q"])
        window.append(key)
        if len(window) > 40:
            device.remove(window.pop(0), "q")
        if key % 50 == 0:
            device.flush()
            device.sync()
            sizes.append(os.path.getsize(tmp_path / "pages"))
    status = device.status()
    device.close()
    assert status.extra["checkpoints"] > 20
    # 40 live messages of <= 400 bytes need a handful of 4 KiB pages; the file never creeps upward
    assert max(sizes) <= 40 * PAGE, max(sizes)
    assert max(sizes[len(sizes) // 2:]) <= max(sizes[:len(sizes) // 2]) + 4 * PAGE
    assert os.path.getsize(tmp_path / "pages") <= 40 * PAGE
    assert sum(1 for f in os.listdir(tmp_path) if f.startswith("wal.")) == 1


def test_large_message_pages_are_freed_with_the_message(tmp_path):
    device = opened(tmp_path)
    try:
        big = os.urandom(20 * PAGE + 123)
        device.write(msg(1, data=big), ["q"])
        assert device.status().extra["pages_persistent"] >= 22
        device.write(msg(2, persistent=False, data=big), ["q"])
        assert device.status().extra["pages_non_persistent"] >= 22
        device.checkpoint()
        assert device.read(1).data == big and device.read(2).data == big
        device.remove(1, "q")
        device.remove(2, "q")
        device.checkpoint()
        extra = device.status().extra
        assert extra["pages_persistent"] <= 1 and extra["pages_non_persistent"] <= 1
    finally:
        device.close()


def test_removing_a_message_whose_page_left_memory_reads_nothing_back(tmp_path):
    """A checkpoint drops the buffers of the pages it wrote; acknowledging a message on such a page
    afterwards reads nothing from the page file (the index keeps the length and the large flag; it read
    the slot back, one pread per acknowledgement, before issue 16)."""
    from tests.storage.faults import FaultyIO

    io = FaultyIO()
    device = opened(tmp_path, io=io)
    try:
        for key in range(1, 201):
            device.write(msg(key, data=b"x" * 300), ["q"])
        device.checkpoint()
        reads = io.calls["pread"]
        for key in range(1, 201):
            device.remove(key, "q")
        assert io.calls["pread"] == reads
        assert device.status().messages == 0 and device.status().bytes_used == 0
    finally:
        device.close()


def test_lengths_and_large_flags_come_back_with_recovery_so_removals_account_exactly(tmp_path):
    """Entries rebuilt from a checkpoint's directories and from the log carry the length and the large
    flag a write gave them: removing everything after a crash leaves no bytes and no pages behind."""
    device = opened(tmp_path)
    big = os.urandom(3 * PAGE + 17)
    device.write(msg(1, data=big), ["q"])
    device.write(msg(2, data=b"small"), ["q", "r"])
    device.checkpoint()                     # 1 and 2 come back from the checkpoint's directories
    device.write(msg(3, data=big), ["q"])
    device.write(msg(4, data=b"tiny"), ["q"])
    device.flush()                          # 3 and 4 from the log
    device._simulate_crash()
    device = opened(tmp_path)
    try:
        status = device.status()
        assert status.messages == 4 and status.bytes_used == 2 * len(big) + len(b"small") + len(b"tiny")
        for key, queue in ((1, "q"), (2, "q"), (2, "r"), (3, "q"), (4, "q")):
            device.remove(key, queue)
        assert device.status().messages == 0 and device.status().bytes_used == 0
        device.checkpoint()
        assert device.status().extra["pages_persistent"] <= 1, "the large messages' pages were freed"
    finally:
        device.close()


def test_iterate_merges_persistent_and_non_persistent_in_time_sequence(tmp_path):
    device = opened(tmp_path)
    try:
        for key in range(1, 41):
            device.write(msg(key, persistent=key % 3 == 0, seq=key), ["/queue/a"])
        device.write(msg(100, seq=5, dest="/queue/b"), ["/queue/b"])
        device.add_reference(100, "/queue/a")         # lands out of order: seq 5 among 1..40
        for key in (4, 9, 10):
            device.remove(key, "/queue/a")
        got = [(m.seq, m.key) for m in device.iterate("/queue/a")]
        expected = sorted([(k, k) for k in range(1, 41) if k not in (4, 9, 10)] + [(5, 100)])
        assert got == expected
        assert {m.persistent for m in device.iterate("/queue/a")} == {True, False}
        it = device.iterate("/queue/a")
        assert next(it).key == 1
        device.remove(2, "/queue/a")                  # removed while iterating: skipped
        assert next(it).key == 3
        assert list(device.iterate("/queue/none")) == []
        assert device.queue_depth("/queue/a") == 40 - 3 + 1 - 1
    finally:
        device.close()


def test_a_page_holds_one_kind_only(tmp_path):
    device = opened(tmp_path)
    try:
        for key in range(1, 200):
            device.write(msg(key, persistent=key % 2 == 0, data=os.urandom(64)), ["q"])
        kinds = {}
        for key in range(1, 200):
            entry = device.where(key)
            kinds.setdefault(entry.page, set()).add(entry.persistent)
        assert all(len(k) == 1 for k in kinds.values())
        table = device.store.pages.alloc.table()
        for page, k in kinds.items():
            assert table[page] == (page_alloc.PERSISTENT if True in k else page_alloc.NON_PERSISTENT)
    finally:
        device.close()


def test_second_open_is_refused_and_read_only_refuses_writes(tmp_path):
    device = opened(tmp_path)
    device.write(msg(1), ["q"])
    with pytest.raises(StorageError, match="in use"):
        opened(tmp_path)
    device.close()
    reader = opened(tmp_path, read_only=True)
    try:
        assert [m.key for m, _ in reader.recover()] == [1]
        with pytest.raises(StorageError, match="read-only"):
            reader.write(msg(2), ["q"])
    finally:
        reader.close()


def test_damaged_message_bytes_are_reported_not_returned(tmp_path):
    device = opened(tmp_path)
    device.write(msg(1, data=b"A" * 500), ["q"])
    device.close()
    raw = bytearray(open(tmp_path / "pages", "rb").read())
    at = raw.find(b"A" * 500)
    raw[at + 100] ^= 0xFF
    open(tmp_path / "pages", "wb").write(bytes(raw))
    device = opened(tmp_path)
    try:
        with pytest.raises(StorageError, match="corrupt"):
            device.read(1)
        assert device.status().errors == 1
    finally:
        device._simulate_crash()


def test_damaged_directory_fails_recovery_loudly(tmp_path):
    device = opened(tmp_path)
    device.write(msg(1), ["q"])
    page = device.where(1).page
    device.close()
    with open(tmp_path / "pages", "r+b") as fh:
        fh.seek(page * PAGE + fmt.PAGE_HEADER_SIZE + 3)
        fh.write(b"\xee")
    with pytest.raises(StorageError, match="corrupt"):
        opened(tmp_path)


def test_torn_meta_page_falls_back_to_the_other_one(tmp_path):
    """The meta write of checkpoint g tears: recovery uses g-1, whose pages and log are still intact."""
    store, frozen = tmp_path / "store", tmp_path / "frozen"
    device = opened(store)
    for key in range(1, 60):
        device.write(msg(key, persistent=key % 4 != 0, data=os.urandom(150)), ["q"])
    for key in range(1, 30, 3):
        device.remove(key, "q")
    device.flush()
    expected = {k: device.read(k).data for k in range(1, 60) if k % 4 != 0 and k not in range(1, 30, 3)}

    def hook(phase):
        if phase == "after-meta":
            shutil.copytree(store, frozen)

    device.checkpoint_hook = hook
    device.checkpoint()
    generation = device.status().extra["generation"]
    device._simulate_crash()
    newest = fmt.META_PAGES[generation % 2]
    with open(frozen / "pages", "r+b") as fh:         # half of the new meta page made it to disk
        fh.seek(newest * PAGE + 40)
        fh.write(bytes(36))
    device = opened(frozen, read_only=True)
    try:
        assert device.status().extra["generation"] == generation - 1
        assert {m.key: m.data for m, _ in device.recover()} == expected
    finally:
        device.close()


def test_full_device_refuses_allocation(tmp_path):
    device = opened(tmp_path, max_bytes=12 * PAGE)
    try:
        with pytest.raises(StorageError, match="full"):
            for key in range(1, 1000):
                device.allocate(1000, True)
                device.write(msg(key, data=os.urandom(1000)), ["q"])
        assert device.status().bytes_free is not None
        with pytest.raises(StorageError, match="full"):
            device.write(msg(5000, data=os.urandom(10 * PAGE)), ["q"])
    finally:
        device.close()


def test_store_keeps_its_page_size(tmp_path):
    opened(tmp_path, page_size=8192).close()
    device = opened(tmp_path, page_size=65536)
    try:
        assert device.page_size == 8192
    finally:
        device.close()
    with pytest.raises(StorageError):
        FileDevice("file", tmp_path, page_size=5000)


def test_duplicate_key_and_queueless_write_are_refused(tmp_path):
    device = opened(tmp_path)
    try:
        device.write(msg(1), ["q"])
        with pytest.raises(StorageError):
            device.write(msg(1), ["q"])
        with pytest.raises(StorageError):
            device.write(msg(2), [])
    finally:
        device.close()


CHILD = textwrap.dedent("""
    import os, sys
    from pymq_server.storage.device import StoredMessage
    from pymq_server.storage.file import FileDevice
    device = FileDevice("file", sys.argv[1], 4096, checkpoint_bytes=20000)
    device.open()
    key = 0
    while True:
        for _ in range(7):
            key += 1
            device.write(StoredMessage(key, "/queue/k", key, key % 5 != 0, os.urandom(300)), ["/queue/k"])
            if key > 30 and key % 4 == 0:
                device.remove(key - 30, "/queue/k")
        device.flush()
        device.sync()
        print(key, flush=True)           # every persistent key <= this one was durable here
""")


def test_kill_9_keeps_every_synced_message(tmp_path):
    """A real process killed with SIGKILL mid-stream: what it reported synced is recovered exactly."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    synced = 0
    try:
        for line in proc.stdout:
            synced = int(line)
            if synced >= 700:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    device = _open_for(tmp_path)
    try:
        keys = {m.key for m, _ in device.recover()}
    finally:
        device.close()
    persistent = [k for k in range(1, synced + 1) if k % 5 != 0]
    # a remove issued after the last report may have reached the OS (kill -9 keeps the page cache)
    may_go = {k for k in persistent if (k + 30) % 4 == 0 and k + 30 > synced}
    assert {k for k in persistent if not _removed(k, synced)} - may_go <= keys   # durable ones are back
    assert not {k for k in persistent if _removed(k, synced)} & keys      # durable removes stay removed
    assert all(k % 5 != 0 for k in keys)                                  # non-persistent never return


def _open_for(path):
    device = FileDevice("file", path, 4096)
    device.open()
    return device


def _removed(key, synced):
    # key k was removed when key k + 30 was written (k + 30 divisible by 4), which happened by `synced`
    return (key + 30) % 4 == 0 and key + 30 <= synced


def test_a_store_killed_while_being_created_is_created_again(tmp_path):
    from pymq_server.storage.file.pagefile import PageFile
    tmp_path.mkdir(exist_ok=True)
    PageFile(str(tmp_path / "pages"), PAGE, fsync=False).create()    # header written, no checkpoint yet
    device = opened(tmp_path)
    try:
        device.write(msg(1), ["q"])
    finally:
        device.close()
    assert list(state(tmp_path)[0]) == [1]


def test_meta_pages_that_are_damaged_not_blank_are_an_error(tmp_path):
    opened(tmp_path).close()
    with open(tmp_path / "pages", "r+b") as fh:
        for page in fmt.META_PAGES:
            fh.seek(page * PAGE + 8)
            fh.write(b"\x07")
    with pytest.raises(StorageError, match="meta"):
        opened(tmp_path)


def test_log_stays_bounded_when_nobody_syncs(tmp_path):
    device = opened(tmp_path, checkpoint_bytes=20_000)
    try:
        for key in range(1, 3001):
            device.write(msg(key, data=os.urandom(100)), ["q"])
            if key > 100:
                device.remove(key - 100, "q")
            device.flush()                           # policy "never": flush, never sync
            assert device.status().extra["log_bytes"] <= 4 * 20_000 + 1000
        assert device.status().extra["checkpoints"] > 5
    finally:
        device.close()
    assert sorted(state(tmp_path)[0]) == list(range(2901, 3001))
