"""The removal of a written persistent message's last reference, call by call (issue 25: the file device's
removal path cost 177 bytecodes a message against 136 before it was cut into parts).

The holding store's ``release`` reaches the index in one call chain: the write path asks the index to
remove the reference (one look-up, hot or cold; the slot and its page freed there), logs the REMOVE, and the
device is marked dirty through the commit driver's dirty set itself. The test lists the Python functions
the removal runs, so a layer that comes back between them (a ``take`` then a ``drop_reference``, a
``mark_dirty`` method) fails it, and checks that what the removal must do still happened."""
from __future__ import annotations


from tests.calls import file_and_name, python_calls
from tests.storage.test_write_behind import Msg, barrier, make_store

Q = "/queue/a"


def _calls(fn) -> list[str]:
    return python_calls(fn, file_and_name)[1]


def test_the_removal_of_a_last_reference_runs_one_chain_and_marks_the_device_dirty(tmp_path):
    store, device = make_store(tmp_path)
    try:
        m = Msg(1)
        store.hold(m, [Q])
        store.write_waiting()                       # on the device now: the removal reaches it
        assert barrier(store) is None and not store.commits.dirty
        frames = device.store.log.current.frames
        calls = _calls(lambda: store.release(m, Q))
        storage = [c for c in calls if c.split(":")[0] in ("store.py", "syncing.py", "behind.py", "device.py",
                                                           "writing.py", "index.py", "pages.py")]
        assert storage == ["store.py:release", "writing.py:remove", "index.py:remove", "pages.py:free_slot"], calls
        assert store.commits.dirty == {device}      # marked, without a call of ours
        assert device.store.log.current.frames == frames + 1 and 1 not in device
    finally:
        store.close()


def test_a_read_of_a_page_that_left_memory_reaches_the_os_through_no_gate_call_and_faults_still_inject(tmp_path):
    """The open store's write gate checks writes; reads go through it unchanged, and without a call of its own
    (its ``pread`` is the inner layer's). A page that left memory is read back whole, once for the messages
    read from it in a row (tests/storage/test_paged_reads.py). A fault layer put under an open store
    (``set_io``) still sees every read."""
    from pymq_server.storage.device import StoredMessage
    from pymq_server.storage.file import FileDevice
    from tests.storage.faults import FaultyIO

    device = FileDevice("file", str(tmp_path), 4096, fsync=False)
    device.open()
    try:
        for key in range(1, 41):
            device.write(StoredMessage(key, Q, key, True, b"m%03d" % key + b"." * 300), [Q])
        device.checkpoint()                             # the pages written leave memory
        assert device.store.pages.pages[device.where(1).page].buf is None
        read, calls = python_calls(lambda: device.read(1))
        data = read.data
        assert data == b"m001" + b"." * 300
        assert calls.count("FileIO.pread") == 1, calls           # the page, once
        assert "WriteGate.pread" not in calls, calls
        io = FaultyIO()
        device.set_io(io)
        before = io.calls["pread"]
        assert device.read(2).data == b"m002" + b"." * 300     # the same page: read already
        assert io.calls["pread"] == before
        other = next(k for k in range(3, 41) if device.where(k).page != device.where(1).page)
        assert device.read(other).data == b"m%03d" % other + b"." * 300
        assert io.calls["pread"] == before + 1                   # the fault layer sees the reads
    finally:
        device.close()
