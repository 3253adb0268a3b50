"""A retained log larger than message memory (log.py "paging"): its oldest bulk segments leave memory
and are read back from their stored records, so producers are not paused until retention trims it, every
row reads back the same (per message and in Arrow, whole and from inside a paged segment), a restart
brings them back, and trimming a paged segment leaves the memory figures at zero."""
from __future__ import annotations

import pytest

import pymq
from tests.arrow_rows import ipc
from tests.conftest import wait_for

pa = pytest.importorskip("pyarrow")

SEGMENTS, ROWS, BODY = 30, 1000, 400         # 12 MB of bodies against 2 MiB of message memory
MEMORY = 2 * 1024 * 1024


def _rows(start: int) -> bytes:
    return ipc(body=pa.array([f"{i:08d}".encode().ljust(BODY, b"x") for i in range(start, start + ROWS)]),
               body_type=pa.array(["bytes"] * ROWS))


def _state(b, name="/topic/big"):
    def read():
        log = b.broker.logs.get(name)
        flow = b.broker.flow
        segs = log._segments[log._first:]
        resident = sum(seg.stored.size for seg in segs if not seg.paged)
        return ([seg.paged for seg in segs], flow.held_bytes, flow.held_messages, flow.high,
                b.broker.store.persistent_device.status().messages, resident)
    return b.call(read)


def _bodies_per_message(s, **kw) -> list[bytes]:
    got: list[bytes] = []
    frm = kw.pop("from_seq", None)
    while True:
        r = s.read_range(pymq.Topic("big"), from_seq=frm, max_messages=700, **kw)
        got += [m.body for m in r.messages]
        if not r.messages:
            return got
        frm = r.next_seq


def _bodies_arrow(s, **kw) -> list[bytes]:
    got: list[bytes] = []
    frm = kw.pop("from_seq", None)
    while True:
        r = s.read_range(pymq.Topic("big"), from_seq=frm, max_messages=1700, arrow=True, **kw)
        assert r.arrow is not None
        table = pa.ipc.open_stream(r.arrow).read_all()
        got += table.column("body").to_pylist()
        if not table.num_rows:
            return got
        frm = r.next_seq


def _expected(lo: int = 0, hi: int = SEGMENTS * ROWS) -> list[bytes]:
    return [f"{i:08d}".encode().ljust(BODY, b"x") for i in range(lo, hi)]


def test_a_log_longer_than_memory_pages_out_and_reads_back_every_row(broker_factory):
    b = broker_factory(max_memory=MEMORY, retention={"/topic/big": {"ms": 3_600_000}})
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        firsts = []
        for k in range(SEGMENTS):
            receipt = s.send_arrow("/topic/big", _rows(k * ROWS))     # waits for its receipt: never paused
            firsts.append(int(receipt["pymq-first-seq"]))
        paged, held, messages, high, records, resident = _state(b)
        assert len(paged) == SEGMENTS and records == SEGMENTS and held == resident
        assert sum(paged) >= SEGMENTS - 6 and not paged[-1]            # the oldest left; the newest stayed
        assert held <= MEMORY and not high, (held, high)
        assert messages == SEGMENTS - sum(paged)
        # every row, per message and in Arrow, from the start and from inside a paged segment
        assert _bodies_per_message(s) == _expected()
        assert _bodies_arrow(s) == _expected()
        middle = firsts[3] + 517
        assert _bodies_per_message(s, from_seq=middle, to_seq=firsts[5] + 3) == _expected(3 * ROWS + 517, 5 * ROWS + 3)
        assert _bodies_arrow(s, from_seq=middle) == _expected(3 * ROWS + 517)
        assert _state(b)[1] <= MEMORY                                   # reading back does not count them again


def test_paged_segments_come_back_after_a_restart_and_go_with_retention(broker_factory, tmp_path):
    data = str(tmp_path / "data")
    b = broker_factory(max_memory=MEMORY, data_dir=data, retention={"/topic/big": {"ms": 3_600_000}})
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        for k in range(SEGMENTS):
            s.send_arrow("/topic/big", _rows(k * ROWS))
    assert sum(_state(b)[0]) > 0
    b.stop()
    b = broker_factory(max_memory=MEMORY, data_dir=data, retention={"/topic/big": {"messages": 2 * ROWS}})
    paged, held, _, high, _, resident = _state(b)
    assert sum(paged) > 0 and held <= MEMORY and not high and held == resident              # recovery pages out as it goes too
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        assert _bodies_arrow(s) == _expected()[-len(_bodies_arrow(s)):]  # retention may have trimmed already
        # retention by count trims paged segments: their records go and the figures come back to the
        # newest two segments' alone
        b.call(lambda: b.broker.logs.trim(0))
        assert wait_for(lambda: _state(b)[4] == 2), _state(b)
        paged, held, messages, _, _, resident = _state(b)
        assert len(paged) == 2 and messages == 2 - sum(paged) and held == resident
        assert _bodies_per_message(s) == _expected((SEGMENTS - 2) * ROWS)
        assert _bodies_arrow(s) == _expected((SEGMENTS - 2) * ROWS)


def test_a_paged_segment_whose_device_fails_is_an_error_for_that_read_not_for_the_broker(broker_factory):
    from pymq.errors import PymqError, StorageError

    b = broker_factory(max_memory=MEMORY, retention={"/topic/big": {"ms": 3_600_000}})
    with pymq.connect(b.url) as conn:
        s = conn.create_session()
        firsts = [int(s.send_arrow("/topic/big", _rows(k * ROWS))["pymq-first-seq"]) for k in range(SEGMENTS)]
        assert _state(b)[0][0]                                          # the oldest is paged out
        device = b.call(lambda: b.broker.store.persistent_device)

        def dead(key):
            raise StorageError("device gone (test)")
        b.call(lambda: setattr(device, "read", dead))
    for arrow in (True, False):
        with pymq.connect(b.url) as conn:
            s = conn.create_session()
            with pytest.raises(PymqError, match="device gone"):
                s.read_range(pymq.Topic("big"), from_seq=firsts[0], max_messages=10, arrow=arrow, timeout=5)
    with pymq.connect(b.url) as conn:                                   # the broker still serves
        s = conn.create_session()
        r = s.read_range(pymq.Topic("big"), from_seq=firsts[-1], max_messages=3)
        assert [m.body for m in r.messages] == _expected((SEGMENTS - 1) * ROWS, (SEGMENTS - 1) * ROWS + 3)
        s.send_arrow("/topic/big", _rows(SEGMENTS * ROWS))
