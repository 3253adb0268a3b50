"""The file store's status and its one write gate (server/storage/file/status.py, fileio.WriteGate).

A store is closed, open or in fault, and moves only as the table in status.py allows; every write of an
open store passes one gate, so a store that must stop writing (closed; later, one that lost the files to a
newer owner) refuses in one place, whichever part of it tries to write.
"""
from __future__ import annotations

import errno

import pytest

from pymq.errors import StorageError
from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice
from pymq_server.storage.file.fileio import StoreClosedForWrites
from pymq_server.storage.file.status import IllegalMove, StoreStatus, move

from .faults import FaultyIO


def msg(key: int) -> StoredMessage:
    return StoredMessage(key, "/queue/a", key, True, b"x" * 100)


def test_the_table_allows_only_its_moves():
    assert move(StoreStatus.CLOSED, StoreStatus.OPEN) is StoreStatus.OPEN
    assert move(StoreStatus.OPEN, StoreStatus.FAULT) is StoreStatus.FAULT
    assert move(StoreStatus.FAULT, StoreStatus.OPEN) is StoreStatus.OPEN
    for current, wanted in [(StoreStatus.CLOSED, StoreStatus.FAULT), (StoreStatus.OPEN, StoreStatus.OPEN),
                            (StoreStatus.CLOSED, StoreStatus.CLOSED)]:
        with pytest.raises(IllegalMove):
            move(current, wanted)


def test_a_device_goes_closed_open_fault_open_closed(tmp_path):
    io = FaultyIO()
    device = FileDevice("file", tmp_path, 4096, io=io)
    assert device.store_status is StoreStatus.CLOSED
    assert device.status().online is False and device.status().extra["status"] == "closed"
    device.open()
    assert device.store_status is StoreStatus.OPEN
    device.write(msg(1), ["/queue/a"])
    io.fail("write", err=errno.EIO)
    with pytest.raises(StorageError):
        device.flush()
    assert device.store_status is StoreStatus.FAULT and device.fault is not None
    assert device.status().extra["status"] == "fault"
    io.heal()
    assert device.repair()
    assert device.store_status is StoreStatus.OPEN and device.fault is None
    device.close()
    assert device.store_status is StoreStatus.CLOSED
    with pytest.raises(StorageError, match="not open"):
        device.write(msg(2), ["/queue/a"])


def test_a_closed_store_refuses_every_write_at_its_gate(tmp_path):
    """A part still holding the store after close (a worker thread's sync, a segment) cannot write: the
    gate refuses before the system call, whichever file it is."""
    device = FileDevice("file", tmp_path, 4096, fsync=True)
    device.open()
    device.write(msg(1), ["/queue/a"])
    store = device.store
    segment = store.log.current
    device.close()
    assert store.status is StoreStatus.CLOSED
    with pytest.raises(StoreClosedForWrites):
        store.io.pwrite(0, memoryview(b"x"), 0)
    with pytest.raises(StoreClosedForWrites):
        store.io.datasync(0)
    with pytest.raises(StoreClosedForWrites):
        store.io.unlink(str(tmp_path / "pages"))
    segment.append(1, b"late", True)
    with pytest.raises(StoreClosedForWrites):
        segment.flush()
    assert (tmp_path / "pages").exists()
    reopened = FileDevice("file", tmp_path, 4096)
    reopened.open()
    try:
        assert [m.key for m, _ in reopened.recover()] == [1]
    finally:
        reopened.close()


def test_a_gate_closed_on_an_open_store_puts_it_in_fault_and_changes_nothing_on_disk(tmp_path):
    """The seam high availability's fencing closes: every part's next write fails as a failed system call
    does (fault: new messages refused, reads served), and the disk keeps only what was synced before."""
    device = FileDevice("file", tmp_path, 4096)
    device.open()
    device.write(msg(1), ["/queue/a"])
    device.flush()
    device.sync()
    device.store.io.closed_for = "test: fenced"
    device.write(msg(2), ["/queue/a"])                 # buffered in memory only
    with pytest.raises(StorageError, match="takes no more writes"):
        device.flush()
    assert device.store_status is StoreStatus.FAULT
    with pytest.raises(StorageError, match="refuses new messages"):
        device.write(msg(3), ["/queue/a"])
    assert device.read(1).key == 1
    assert not device.repair()                          # a repair writes too: refused at the gate
    device._simulate_crash()
    reopened = FileDevice("file", tmp_path, 4096)
    reopened.open()
    try:
        assert [m.key for m, _ in reopened.recover()] == [1]
    finally:
        reopened.close()
