"""What the drain of a paged persistent backlog costs the file device per message, counted (issue 25: the
drain's broker CPU was 1.15x ccb5094's).

* A page that left memory is read back whole, once for every message read from it in a row (two preads a
  message before: the slot, then the record, each asking the ``page_file`` property); the page kept is
  forgotten when it is freed or comes back to memory, so a read never sees bytes the page no longer has.
* The log's appends reach the current segment without the ``current`` property (twice a message before:
  the PUT and the REMOVE).
* A write's check that its key is not held yet does not search the cold arrays (keys increase as messages
  are placed: a new key is above every cold one).
* A read and the delivery counts asked with it reach the open store without the device's layers."""
from __future__ import annotations


import pytest

from pymq.errors import StorageError
from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice
from pymq_server.storage.file.index import ColdRun
from tests.calls import python_calls
from tests.storage.faults import FaultyIO

Q = "/queue/a"


def _body(key: int) -> bytes:
    return b"m%05d" % key + b"." * 300


def _calls(fn) -> list[str]:
    return python_calls(fn)[1]


def _paged_device(path, count: int, **kw) -> FileDevice:
    device = FileDevice("file", str(path), 4096, fsync=False, index_hot=4, **kw)
    device.open()
    for key in range(1, count + 1):
        device.write(StoredMessage(key, Q, key, True, _body(key)), [Q])
    device.checkpoint()                      # every page but the tail leaves memory
    return device


def test_a_drain_reads_each_page_that_left_memory_once(tmp_path):
    n = 60
    device = _paged_device(tmp_path, n)
    io = FaultyIO()
    device.set_io(io)
    try:
        pages = device.store.pages
        out = [k for k in range(1, n + 1) if pages.pages[device.where(k).page].buf is None]
        out_pages = {device.where(k).page for k in out}
        assert len(out) > 40 and len(out_pages) >= 4
        before = io.calls["pread"]
        calls = _calls(lambda: [(device.read(k), device.deliveries(k)) for k in out])
        # one pread and one ``page_file`` per page (2 preads and 2 ``page_file`` a message before)
        assert io.calls["pread"] - before == len(out_pages)
        # what the backlog asks per message read back (the message, its recovered delivery counts) goes to
        # the open store's parts without the device's ``store`` property or ``_parts``
        assert "FileDevice.store" not in calls and "FileDevice._parts" not in calls, calls
        assert calls.count("OpenStore.page_file") == len(out_pages)
        assert calls.count("PageFile.read_at") == len(out_pages)
        for k in out:                        # the bytes are the message's, and the delivery removes it
            assert device.read(k).data == _body(k)
            device.record_delivery(k, Q, 1)
            device.flush()
            device.remove(k, Q)
        assert pages.reading is None         # the last page read was freed with its last message: forgotten
        assert [m.key for m in device.iterate(Q)] == [k for k in range(1, n + 1) if k not in out]
    finally:
        device.close()


def test_a_page_read_back_is_forgotten_when_freed_or_written_again(tmp_path):
    """The page kept for reading never serves bytes the page no longer has: a freed page's number comes back
    with other messages, and a page written again (the tail a reopened store inherits) is read from memory."""
    device = _paged_device(tmp_path, 30)
    try:
        pages = device.store.pages
        first = device.where(1).page
        on_first = [k for k in range(1, 31) if device.where(k).page == first]
        assert device.read(1).data == _body(1) and pages.reading is pages.pages[first]
        for k in on_first:
            device.remove(k, Q)
        assert first not in pages.pages and pages.reading is None
        device.checkpoint()                  # the freed page is reusable once a checkpoint is durable
        for key in range(100, 140):
            device.write(StoredMessage(key, Q, key, True, _body(key)), [Q])
        device.checkpoint()
        reused = [k for k in range(100, 140) if device.where(k).page == first]
        assert reused, "the freed page was taken again"
        assert all(device.read(k).data == _body(k) for k in reused)
    finally:
        device.close()

    device = FileDevice("file", str(tmp_path), 4096, fsync=False, index_hot=4)
    device.open()                            # reopened: every page out of memory, the tail among them
    try:
        pages = device.store.pages
        last = max(k for k, *_ in device.store.index.entries())
        tail = pages.pages[device.where(last).page]
        assert tail.buf is None and device.read(last).data == _body(last) and pages.reading is tail
        device.write(StoredMessage(500, Q, 500, True, _body(500)), [Q])   # onto the inherited tail
        assert device.where(500).page == tail.number and tail.buf is not None and pages.reading is None
        assert device.read(500).data == _body(500) and device.read(last).data == _body(last)
    finally:
        device.close()


def test_a_failed_page_read_keeps_nothing(tmp_path):
    device = _paged_device(tmp_path, 20)
    try:
        pages = device.store.pages
        io = FaultyIO()
        device.set_io(io)
        io.fail("pread")
        with pytest.raises(StorageError):
            device.read(1)
        assert pages.reading is None
        io.heal()
        assert device.read(1).data == _body(1)
    finally:
        device.close()


def test_log_appends_and_a_new_write_ask_no_property_and_search_no_cold_array(tmp_path, monkeypatch):
    device = _paged_device(tmp_path, 40)
    finds = []
    find = ColdRun.find
    monkeypatch.setattr(ColdRun, "find", lambda self, key: finds.append(key) or find(self, key))
    try:
        assert len(device.store.index.cold) > 20
        calls = _calls(lambda: device.write(StoredMessage(41, Q, 41, True, _body(41)), [Q]))
        assert finds == []                   # the duplicate check: 41 is above every cold key
        assert "LogWriter.current" not in calls and "LogWriter.append" in calls, calls
        calls = _calls(lambda: device.remove(41, Q))
        assert "LogWriter.current" not in calls and "LogWriter.append" in calls, calls
        with pytest.raises(StorageError, match="already held"):
            device.write(StoredMessage(3, Q, 3, True, _body(3)), [Q])     # a cold key is still found
        assert finds == [3]
    finally:
        device.close()



def test_the_device_calls_of_a_paged_message_from_its_write_to_its_removal(tmp_path):
    """Each step of a paged persistent message at the device, call by call: its write, its read back for
    delivery with its recovered counts, the delivery's note, the flush that logs it, the acknowledgement.
    The helpers the steps reached for one call each (``unpack_place`` on a read and a removal, ``owed`` per
    noted delivery at the flush, ``note_delivery``, ``delivery_counts``, ``fill_for`` with no punched page,
    ``resident`` for a page in memory) are written out where they ran once a message."""
    n = 64
    device = FileDevice("file", str(tmp_path), 4096, fsync=False, index_hot=4)
    device.open()
    try:
        written = _calls(lambda: [device.write(StoredMessage(k, Q, k, True, _body(k)), [Q]) for k in range(1, n + 1)])
        pages_written = len(device.store.pages.pages)
        device.checkpoint()
        keys = [k for k in range(1, n + 1) if device.store.pages.pages[device.where(k).page].buf is None]
        read_pages = {device.where(k).page for k in keys}

        def delivered() -> None:
            for k in keys:
                device.read(k)
                device.deliveries(k)
                device.record_delivery(k, Q, 1)

        read = _calls(delivered)
        flushed = _calls(device.flush)                      # one flush logs every noted count
        removed = _calls(lambda: [device.remove(k, Q) for k in keys])
        gone = {"unpack_place", "MessageIndex.owed", "MessageIndex.note_delivery", "MessageIndex.delivery_counts",
                "PageStore.fill_for", "PageStore.resident", "LogWriter.current", "OpenStore.page_file",
                "FileDevice.store", "FileDevice._parts", "OpenStore.check_open"}
        assert sorted(gone & set(written)) == ["OpenStore.page_file"]      # a new page's reservation only
        assert written.count("OpenStore.page_file") <= pages_written < n // 4
        assert sorted(gone & set(read)) == ["OpenStore.page_file"]         # once per page read back
        assert read.count("OpenStore.page_file") == len(read_pages) < len(keys) // 4
        assert not gone & set(removed) and "MessageIndex.owed" not in flushed
        # one look-up of the cold arrays a step: the read, the flush's check of the noted count, the removal
        assert read.count("ColdRun.find") == flushed.count("ColdRun.find") == removed.count("ColdRun.find") \
            == len(keys)
        assert [m.key for m in device.iterate(Q)] == [k for k in range(1, n + 1) if k not in keys]
        assert all(device.deliveries(k) == {} for k in keys)
    finally:
        device.close()


@pytest.mark.own_process
def test_a_checkpoint_writes_the_dirty_pages_from_their_own_bytes(tmp_path):
    """The peak of a checkpoint is the dirty pages once, not twice: their new regions are written from views
    of the pages' buffers (a copy of each was made before: a quarter of ``max_memory`` more with the default
    ``checkpoint_bytes``, bench_paging's persistent peak), and what the file holds afterwards is the same."""
    import tracemalloc

    device = FileDevice("file", str(tmp_path), 4096, fsync=False)
    device.open()
    try:
        n = 600
        for key in range(1, n + 1):
            device.write(StoredMessage(key, Q, key, True, _body(key)), [Q])
        device.flush()                       # the log's buffered frames go first (their join is the log's)
        pages = device.store.pages
        dirty = len(pages.dirty) * 4096
        assert dirty >= 50 * 4096
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            device.checkpoint()
            grew = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
        # the checkpoint's payload and bookkeeping, and a view object per region (a copy of the dirty bytes
        # would add about ``dirty``)
        assert grew < dirty // 3, (grew, dirty)
        for key in range(n + 1, n + 41):     # appends to the tail after its regions were handed out
            device.write(StoredMessage(key, Q, key, True, _body(key)), [Q])
        device.checkpoint()
    finally:
        device.close()
    device = FileDevice("file", str(tmp_path), 4096, fsync=False)
    device.open()
    try:
        assert [(m.key, m.data) for m in device.iterate(Q)] == [(k, _body(k)) for k in range(1, n + 41)]
    finally:
        device.close()
