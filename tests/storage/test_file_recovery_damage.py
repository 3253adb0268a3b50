"""File-store recovery fed what a disk can leave behind (spec/storage.md §2; issue 31): a damaged message
body, a page that is not where the checkpoint says, and an empty persistent tail page.

Issue 31 found three mutants of server/storage/file/recovery.py that nothing noticed: recovery's fast read
without its body checksum, the page-number check of the directory load, and the sweep that must spare the
persistent tail (and continuation pages).  Each test below fails with its check gone: damaged bytes come
back as a message, a page's messages are indexed twice, or a page still written to is handed out again and
acknowledged messages are lost.

What comes back is asserted exactly; what does not decode at the broker level is quarantined
(tests/storage/test_quarantine.py) — a body whose *storage* checksum fails is the device's, reported as a
StorageError naming it and never returned.
"""
from __future__ import annotations

import os

import pytest

from pymq.errors import StorageError
from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice
from pymq_server.storage.file import format as fmt

PAGE = 4096


def _msg(key: int, size: int = 500) -> StoredMessage:
    return StoredMessage(key, "/queue/a", key, True, bytes([key % 251]) * size)


def _opened(path, **kw) -> FileDevice:
    device = FileDevice("file", path, PAGE, fsync=False, **kw)
    device.open()
    return device


def _recovered(path) -> dict[int, bytes]:
    device = _opened(path)
    try:
        return {m.key: m.data for m, _ in device.recover()}
    finally:
        device.close()


def test_a_damaged_body_is_reported_by_recovery_never_returned(tmp_path):
    device = _opened(tmp_path)
    for key in (1, 2, 3):
        device.write(_msg(key), ["q"])
    device.close()
    raw = bytearray((tmp_path / "pages").read_bytes())
    at = raw.find(bytes([2]) * 500)
    assert at > 0
    raw[at + 250] ^= 0x5A
    (tmp_path / "pages").write_bytes(bytes(raw))

    device = _opened(tmp_path)              # bodies are not read to open: the store opens
    try:
        got: dict[int, bytes] = {}
        with pytest.raises(StorageError, match="corrupt"):
            for message, _refs in device.recover():
                got[message.key] = message.data
        assert got == {1: _msg(1).data}     # what came before the damaged one, intact; nothing after it
        with pytest.raises(StorageError):
            device.read(2)
        assert device.read(3).data == _msg(3).data
    finally:
        device._simulate_crash()


def _two_full_pages(tmp_path) -> tuple[FileDevice, int, int]:
    device = _opened(tmp_path)
    key = 0
    while True:
        key += 1
        device.write(_msg(key, 300), ["q"])
        pages = {device.where(k).page for k in range(1, key + 1)}
        if len(pages) == 3:
            break
    first, second = sorted(pages)[:2]
    return device, first, second


def test_a_page_found_where_another_belongs_fails_recovery(tmp_path):
    """A persistent page's image at another persistent page's place (a misdirected write): its header is
    sealed and its slots checksum, so only the page number tells it is misplaced."""
    device, first, second = _two_full_pages(tmp_path)
    device.close()
    with open(tmp_path / "pages", "r+b") as fh:
        fh.seek(first * PAGE)
        image = fh.read(PAGE)
        fh.seek(second * PAGE)
        fh.write(image)
    with pytest.raises(StorageError, match="not the persistent page the checkpoint names"):
        _opened(tmp_path)


def test_a_page_of_the_wrong_kind_fails_recovery(tmp_path):
    device, first, _ = _two_full_pages(tmp_path)
    device.close()
    with open(tmp_path / "pages", "r+b") as fh:
        fh.seek(first * PAGE)
        head = bytearray(fh.read(fmt.PAGE_HEADER_SIZE))
        magic, kind, number, generation = fmt.PAGE_HEADER.unpack_from(head)
        sealed = fmt.PAGE_HEADER.pack(magic, 2, number, generation)        # 2: non-persistent
        from pymq_server.storage.file.crc import crc32c
        fh.seek(first * PAGE)
        fh.write(sealed + fmt.U32.pack(crc32c(sealed)))
    with pytest.raises(StorageError, match="not the persistent page the checkpoint names"):
        _opened(tmp_path)


@pytest.mark.parametrize("ending", ["clean", "crash"])
def test_an_empty_tail_page_is_kept_and_written_on_after_recovery(tmp_path, ending):
    """Every message of the persistent tail page consumed, then a restart: the empty tail stays the tail
    (spec §2 step 7/8), is written on, and no page is handed out twice — every message written after the
    restart comes back after the next one."""
    device = _opened(tmp_path)
    for key in range(1, 6):
        device.write(_msg(key), ["q"])
    device.flush()
    device.sync()
    for key in range(1, 6):
        device.remove(key, "q")
    device.flush()
    device.sync()
    if ending == "clean":
        device.close()
    else:
        device._simulate_crash()
    device = _opened(tmp_path)
    assert list(device.recover()) == []
    written = {}
    for key in range(100, 140):                      # several pages' worth: new pages are allocated
        message = _msg(key, 700)
        device.write(message, ["q"])
        written[key] = message.data
    device.flush()
    device.sync()
    device._simulate_crash()
    assert _recovered(tmp_path) == written
    assert _recovered(tmp_path) == written            # and once more after a clean recovery's checkpoint


def test_continuation_pages_of_a_large_message_survive_recovery_and_later_writes(tmp_path):
    device = _opened(tmp_path)
    big = os.urandom(3 * PAGE + 123)
    device.write(StoredMessage(1, "/queue/a", 1, True, big), ["q"])
    device.write(_msg(2), ["q"])
    device.close()
    device = _opened(tmp_path)
    written = {1: big, 2: _msg(2).data}
    for key in range(3, 40):
        device.write(_msg(key, 700), ["q"])
        written[key] = _msg(key, 700).data
    device.flush()
    device.sync()
    device._simulate_crash()
    assert _recovered(tmp_path) == written


@pytest.mark.parametrize("lost", ["the end frame", "the end frame's last byte"])
def test_a_unit_whose_end_never_reached_the_log_comes_back_as_if_never_begun(tmp_path, lost):
    """A unit (a transaction's COMMIT, a bulk batch: spec/storage.md) is all or nothing: its frames are
    committed by one end frame; with that frame torn away by a crash, recovery brings back none of the
    unit's writes and undoes none of its removes — the messages as they were before the unit began."""
    from pymq_server.storage.file.wal import list_segments, segment_path
    device = _opened(tmp_path, checkpoint_bytes=1 << 30)
    for key in (1, 2):
        device.write(_msg(key), ["q"])
    device.flush()
    segment = device._store.log.current
    before = segment.size
    device.begin_unit()
    device.write(_msg(3), ["q"])
    device.write(_msg(4), ["q", "r"])
    device.remove(1, "q")
    device.end_unit()
    device.flush()
    after = segment.size
    device._simulate_crash()
    assert _recovered_and_crashed(tmp_path) == {2: _msg(2).data, 3: _msg(3).data, 4: _msg(4).data}
    cut = after - fmt.FRAME_SIZE if lost == "the end frame" else after - 1     # the end frame has no payload
    assert before < cut and list_segments(tmp_path)[-1] == segment.number
    os.truncate(segment_path(tmp_path, segment.number), cut)
    assert _recovered(tmp_path) == {1: _msg(1).data, 2: _msg(2).data}


def _recovered_and_crashed(path) -> dict[int, bytes]:
    """What recovery brings back, leaving the log as it was (read-only: nothing checkpointed)."""
    device = FileDevice("file", path, PAGE, read_only=True)
    device.open()
    try:
        return {m.key: m.data for m, _ in device.recover()}
    finally:
        device.close()
