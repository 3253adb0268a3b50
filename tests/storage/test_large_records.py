"""Large persistent messages (a bulk SEND's stored segment: megabytes) are written from their own bytes.

The PUT frame of a large message is logged as pieces (its head, then the message bytes, never joined) and
its continuation pages are views of the message bytes until the checkpoint writes them; none of this may
change a byte on disk (spec/storage.md: the format is unchanged): the frames are the bytes a joined
payload gives, the last continuation page is zero-padded even over a reused page's old bytes, and
recovery — from the whole log, from a copy taken after the sync (a crash), or from the log cut anywhere
inside the large frame — keeps exactly the committed prefix.
"""
from __future__ import annotations

import os
import shutil

from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice
from pymq_server.storage.memory import MemoryDevice
from pymq_server.storage.file import format as fmt
from pymq_server.storage.file.wal import WRITE_ALONE, Segment, list_segments, read_frames, segment_path

PAGE = 4096
FILE_ID = b"F" * 16


def _message(key: int, size: int, fill: int | None = None) -> StoredMessage:
    data = bytes([fill]) * size if fill is not None else bytes((key * 7 + i) % 251 for i in range(size))
    return StoredMessage(key, "/topic/log", key, True, data)


def test_a_frame_logged_as_pieces_is_the_frame_of_the_joined_payload(tmp_path):
    """Byte for byte the same segment file, whether the payload is joined or given as pieces (one of
    them large enough to be written on its own between small frames)."""
    big = bytes(range(256)) * (WRITE_ALONE // 256 + 3)
    frames = [(fmt.F_META, (b"catalog record",), True), (fmt.F_PUT, (b"head" * 9, big), True),
              (fmt.F_REMOVE, (b"12345678abcd",), False), (fmt.F_PUT, (b"h", b"", b"tail bytes"), True)]
    paths = []
    for way in ("joined", "pieces"):
        directory = tmp_path / way
        directory.mkdir()
        seg = Segment(str(directory), 1, PAGE, FILE_ID, salt=77, prev_checksum=5)
        for ftype, pieces, commit in frames:
            if way == "joined":
                seg.append(ftype, b"".join(pieces), commit)
            else:
                seg.append_pieces(ftype, pieces, commit)
        size, checksum = seg.size, seg.checksum
        seg.flush()
        seg.close()
        assert os.path.getsize(seg.path) == size
        paths.append((seg.path, checksum))
    (joined, c1), (pieces, c2) = paths
    assert c1 == c2
    with open(joined, "rb") as a, open(pieces, "rb") as b:
        assert a.read() == b.read()
    got = [(f.ftype, f.payload, f.commit) for f in read_frames(str(tmp_path / "pieces"), 1, 77, PAGE, FILE_ID)]
    assert got == [(t, b"".join(p), c) for t, p, c in frames]


def test_a_large_message_is_held_as_views_of_its_bytes_and_its_last_page_is_zero_padded(tmp_path):
    device = FileDevice("file", str(tmp_path), PAGE)
    device.open()
    try:
        # pages filled with 0xFF first, then freed: the next large message reuses them
        old = _message(1, 6 * PAGE, fill=0xFF)
        device.write(old, ["/topic/log"])
        device.checkpoint()
        old_pages = {n for n, p in device.store.pages.pages.items() if p.cont}
        device.remove(1, "/topic/log")
        device.checkpoint()
        device.checkpoint()                   # freed pages are reusable once a checkpoint without them is durable
        message = _message(2, 3 * PAGE + 100)
        device.write(message, ["/topic/log"])
        cont = sorted((n, p) for n, p in device.store.pages.pages.items() if p.cont)
        assert len(cont) == 4
        # no copy: each page is a view of the message's own bytes, the last one shorter than a page
        assert all(isinstance(p.buf, memoryview) and p.buf.obj is message.data for _, p in cont)
        assert [len(p.buf) for _, p in cont] == [PAGE, PAGE, PAGE, 100]
        assert {n for n, _ in cont} & old_pages, "the test needs a reused page"
        device.checkpoint()
        assert all(p.buf is None for _, p in cont)          # written, then dropped from memory
        with open(tmp_path / "pages", "rb") as fh:
            raw = fh.read()
        image = b"".join(raw[n * PAGE:(n + 1) * PAGE] for n, _ in cont)
        assert image == message.data + bytes(4 * PAGE - len(message.data))
        assert device.read(2).data == message.data
    finally:
        device.close()
    device = FileDevice("file", str(tmp_path), PAGE)
    device.open()
    try:
        assert [(m.key, m.data == message.data, refs) for m, refs in device.recover()] == [(2, True, ["/topic/log"])]
    finally:
        device.close()


def test_a_large_record_survives_a_crash_after_its_sync_and_a_cut_log_keeps_the_committed_prefix(tmp_path):
    live = tmp_path / "live"
    device = FileDevice("file", str(live), PAGE)
    device.open()
    first = _message(1, 200)
    device.write(first, ["/topic/log"])
    device.flush()
    mark = os.path.getsize(segment_path(str(live), list_segments(str(live))[-1]))
    big = _message(2, 20 * PAGE + 3)                 # over WRITE_ALONE: written alone, from its own bytes
    assert len(big.data) >= WRITE_ALONE
    device.write(big, ["/topic/log", "/queue/copy"])
    device.flush()
    device.sync()
    # the crash: the files as they are now, the device never closed
    crashed = tmp_path / "crashed"
    shutil.copytree(live, crashed)
    segment = segment_path(str(crashed), list_segments(str(crashed))[-1])
    end = os.path.getsize(segment)
    device.close()

    def recovered(directory) -> dict:
        dev = FileDevice("file", str(directory), PAGE, read_only=True)
        dev.open()
        try:
            return {m.key: (m.data, sorted(refs)) for m, refs in dev.recover()}
        finally:
            dev.close()

    whole = recovered(crashed)
    assert whole == {1: (first.data, ["/topic/log"]), 2: (big.data, ["/queue/copy", "/topic/log"])}
    with open(segment, "rb") as fh:
        log = fh.read()
    cuts = sorted({mark, mark + 1, mark + 15, mark + 16, end - 1, *range(mark + 17, end - 1, 4099)})
    for cut in cuts:
        directory = tmp_path / f"cut{cut}"
        shutil.copytree(crashed, directory)
        with open(segment_path(str(directory), list_segments(str(directory))[-1]), "wb") as fh:
            fh.write(log[:cut])
        assert recovered(directory) == {1: (first.data, ["/topic/log"])}, cut
        shutil.rmtree(directory)


def test_a_message_given_as_parts_is_stored_as_its_joined_bytes_are(tmp_path):
    """``write_parts`` (the holding store's way for a bulk SEND's stored form: header block, body, NUL)
    logs and stores the bytes ``write`` of the joined message does; pages inside the body are views of it,
    a page spanning two parts a copy; a small message given as parts is joined; another device joins."""
    head, body, tail = b"MESSAGE\nk:v\n\n" * 7, bytes(range(256)) * 60 + b"end", b"\0"
    parts = (head, body, tail)
    whole = b"".join(parts)
    stores = {}
    for way in ("joined", "parts"):
        device = FileDevice("file", str(tmp_path / way), PAGE)
        device.open()
        small = StoredMessage(1, "/topic/log", 1, True, b"")
        big = StoredMessage(2, "/topic/log", 2, True, whole if way == "joined" else b"")
        if way == "joined":
            device.write(StoredMessage(1, "/topic/log", 1, True, b"small one"), ["/topic/log"])
            device.write(big, ["/topic/log"])
        else:
            device.write_parts(small, (b"small", b" one"), ["/topic/log"])
            device.write_parts(big, parts, ["/topic/log"])
            cont = [p for _, p in sorted(device.store.pages.pages.items()) if p.cont]
            assert b"".join(bytes(p.buf) for p in cont) == whole
            assert sum(1 for p in cont if p.buf.obj is body) == len(whole) // PAGE - 1   # all but two pages
        device.checkpoint()
        assert device.read(2).data == whole and device.read(1).data == b"small one"
        device.close()
        device = FileDevice("file", str(tmp_path / way), PAGE)
        device.open()
        stores[way] = sorted((m.key, m.data) for m, _ in device.recover())
        device.close()
    assert stores["parts"] == stores["joined"] == [(1, b"small one"), (2, whole)]
    other = MemoryDevice("memory")
    other.write_parts(StoredMessage(3, "/topic/log", 3, True, b""), parts, ["/topic/log"])
    assert other.read(3).data == whole
