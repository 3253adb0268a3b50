"""The file device meets a full or failing disk (spec/storage.md §8), through the fault layer.

Every test checks both halves: what the device answers at the moment of the fault (a refusal, or fault
with writes refused and reads served), and what a crash at that moment would leave — nothing that was
synced before the fault is lost, whatever happens after it.  On the landed main each of these either
raised an OSError out of the device or left it failed for good ("failed earlier; reopen it").
"""
from __future__ import annotations

import errno
import shutil

import pytest

from pymq.errors import StorageError
from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice

from .faults import FaultyIO

PAGE = 4096


def msg(key, persistent=True, size=100, dest="/queue/a"):
    return StoredMessage(key, dest, key, persistent, bytes([key % 251]) * size)


def device_at(path, io=None, **kw):
    kw.setdefault("fsync", True)
    device = FileDevice("file", path, kw.pop("page_size", PAGE), io=io, **kw)
    device.open()
    return device


def recovered(path):
    """What a restart finds in ``path`` (a copy of the directory is what a crash leaves)."""
    device = device_at(path)
    try:
        return {m.key: (m.data, sorted(r)) for m, r in device.recover()}
    finally:
        device.close()


def crash_image(path, tmp_path, name="crash"):
    image = tmp_path / name
    shutil.copytree(path, image, ignore=shutil.ignore_patterns("LOCK"))
    return image


def test_a_full_disk_refuses_the_message_and_changes_nothing(tmp_path):
    io = FaultyIO()
    device = device_at(tmp_path / "s", io)
    for key in range(1, 11):
        device.write(msg(key), ["/queue/a"])
    device.flush()
    device.sync()
    before = device.status()
    io.disk_full()
    with pytest.raises(StorageError, match="full"):
        device.write(msg(11, size=200_000), ["/queue/a"])   # needs new pages and log space
    status = device.status()
    assert status.online and device.fault is None, "a refusal is not a fault"
    assert status.messages == before.messages and status.bytes_used == before.bytes_used
    assert status.errors > before.errors and status.extra["refusals"] >= 1
    with pytest.raises(KeyError):
        device.read(11)
    # what it holds is still readable and removable; the disk coming back is enough
    assert device.read(3).data == msg(3).data
    device.remove(3, "/queue/a")
    io.heal()
    device.write(msg(11, size=200_000), ["/queue/a"])
    device.flush()
    device.sync()
    device.close()
    state = recovered(tmp_path / "s")
    assert sorted(state) == [1, 2, 4, 5, 6, 7, 8, 9, 10, 11]


def test_a_failed_log_write_is_a_fault_that_refuses_writes_serves_reads_and_is_repaired(tmp_path):
    io = FaultyIO()
    path = tmp_path / "s"
    device = device_at(path, io)
    for key in range(1, 6):
        device.write(msg(key), ["/queue/a"])
    device.flush()
    device.sync()                                           # 1..5 are acknowledged
    device.write(msg(6), ["/queue/a"])
    io.fail("write", err=errno.EIO)
    with pytest.raises(StorageError, match="Input/output error"):
        device.flush()
    assert device.fault is not None and not device.status().online
    with pytest.raises(StorageError, match="refuses new messages"):
        device.write(msg(7), ["/queue/a"])
    with pytest.raises(StorageError, match="cannot make writes durable"):
        device.sync()
    # consumers can drain: reads and removals work in fault
    assert device.read(2).data == msg(2).data
    device.remove(1, "/queue/a")
    device.put_meta("queue:x", b"declared in fault")
    # a crash now keeps everything acknowledged (the removal in fault may come back: at least once)
    assert set(recovered(crash_image(path, tmp_path))) >= {1, 2, 3, 4, 5}
    assert not device.repair(), "the disk still fails: the repair must not claim success"
    assert device.fault is not None
    io.heal()
    assert device.repair()
    assert device.fault is None and device.status().online
    device.write(msg(7), ["/queue/a"])
    device.flush()
    device.sync()
    # a crash after the repair: the repair's checkpoint holds the removal, the catalog record and
    # message 6 (held when the fault came), and the log since holds message 7
    image = crash_image(path, tmp_path, "after-repair")
    state = recovered(image)
    assert sorted(state) == [2, 3, 4, 5, 6, 7]
    check = device_at(image)
    try:
        assert dict(check.iter_meta())["queue:x"] == b"declared in fault"
    finally:
        check.close()
    device.close()


def test_a_failed_fsync_is_never_retried_into_a_false_success(tmp_path):
    """After a failed fsync the kernel may have dropped the pages: the device must not sync the same
    log again and report success; it repairs by rewriting the state in a checkpoint."""
    io = FaultyIO()
    path = tmp_path / "s"
    device = device_at(path, io)
    device.write(msg(1), ["/queue/a"])
    device.flush()
    io.fail("datasync", err=errno.EIO)
    with pytest.raises(StorageError, match="fsync of the log"):
        device.sync()
    io.heal()
    with pytest.raises(StorageError):
        device.sync()                 # still in fault: the log that failed is not trusted again
    assert device.repair()
    device.sync()
    assert sorted(recovered(crash_image(path, tmp_path))) == [1]
    device.close()


def test_a_failed_checkpoint_changes_nothing_and_is_retried(tmp_path):
    io = FaultyIO()
    path = tmp_path / "s"
    device = device_at(path, io, checkpoint_in_sync=False)
    for key in range(1, 40):
        device.write(msg(key, size=500), ["/queue/a"])
    device.flush()
    device.sync()
    for attempt in range(3):          # the same pages are freed once, not once per attempt
        io.fail("pwrite", err=errno.ENOSPC)
        with pytest.raises(StorageError, match="checkpoint failed"):
            device.checkpoint()
        io.heal()
        assert device.fault is None, "a failed checkpoint is not a fault: the log is intact"
        device.write(msg(100 + attempt), ["/queue/a"])
        device.remove(attempt + 1, "/queue/a")
        device.flush()
        device.sync()
        # a crash between failed checkpoints replays the whole chain
        state = recovered(crash_image(path, tmp_path, f"crash{attempt}"))
        assert sorted(state) == sorted([k for k in range(attempt + 2, 40)] + [100 + a for a in range(attempt + 1)])
    device.checkpoint()
    device.close()
    state = recovered(path)
    assert sorted(state) == list(range(4, 40)) + [100, 101, 102]
    assert all(data == msg(k, size=500 if k < 100 else 100).data for k, (data, _) in state.items())


def test_a_crash_during_the_repair_keeps_what_was_acknowledged(tmp_path):
    io = FaultyIO()
    path = tmp_path / "s"
    device = device_at(path, io)
    for key in range(1, 4):
        device.write(msg(key), ["/queue/a"])
    device.flush()
    device.sync()
    io.fail("datasync", err=errno.EIO)
    with pytest.raises(StorageError):
        device.write(msg(4), ["/queue/a"]) or device.flush() or device.sync()
    io.heal()
    images = {}

    def hook(phase):
        images[phase] = crash_image(path, tmp_path, phase)

    device.checkpoint_hook = hook
    assert device.repair()
    device.checkpoint_hook = None
    for phase in ("switched", "before-meta"):
        assert set(recovered(images[phase])) >= {1, 2, 3}, phase
    assert sorted(recovered(images["after-meta"])) == [1, 2, 3, 4]
    device.close()


def test_a_store_opened_on_a_full_disk_recovers_read_only_and_says_so(tmp_path, caplog):
    path = tmp_path / "s"
    device = device_at(path)
    for key in range(1, 21):
        device.write(msg(key), ["/queue/a"])
    device.put_meta("queue:a", b"x")
    device.flush()
    device.sync()
    device._simulate_crash()
    io = FaultyIO().disk_full()
    with caplog.at_level("WARNING", logger="pymq.storage"):
        device = device_at(path, io)
    assert "READ-ONLY" in caplog.text and "No space left on device" in caplog.text
    assert device.fault is not None
    assert [m.key for m, _ in device.recover()] == list(range(1, 21))
    assert dict(device.iter_meta()) == {"queue:a": b"x"}
    with pytest.raises(StorageError, match="refuses new messages"):
        device.write(msg(21), ["/queue/a"])
    device.remove(1, "/queue/a")                  # draining works
    assert not device.repair()
    io.heal()
    assert device.repair()
    device.write(msg(21), ["/queue/a"])
    device.flush()
    device.sync()
    device.close()
    assert sorted(recovered(path)) == list(range(2, 22))


def test_closing_in_fault_releases_the_files_and_says_what_was_not_saved(tmp_path):
    io = FaultyIO()
    path = tmp_path / "s"
    device = device_at(path, io)
    device.write(msg(1), ["/queue/a"])
    device.flush()
    device.sync()
    io.fail("write", "datasync", "pwrite", "open", err=errno.EIO)
    device.write(msg(2), ["/queue/a"])
    with pytest.raises(StorageError):
        device.flush()
    with pytest.raises(StorageError, match="closed in fault"):
        device.close()
    io.heal()
    assert sorted(recovered(path)) == [1]          # the lock was released: it opens again


def test_non_persistent_pages_that_fail_to_reach_disk_stay_readable(tmp_path):
    io = FaultyIO()
    device = device_at(tmp_path / "s", io)
    for key in range(1, 200):                       # several sealed non-persistent pages
        device.write(msg(key, persistent=False, size=300), ["/queue/a"])
    io.fail("pwrite", err=errno.EIO)
    with pytest.raises(StorageError):
        device.flush()
    assert all(device.read(k).data == msg(k, size=300).data for k in range(1, 200))
    for key in range(1, 200):
        device.remove(key, "/queue/a")
    io.heal()
    assert device.repair()
    assert device.status().messages == 0
    device.close()
