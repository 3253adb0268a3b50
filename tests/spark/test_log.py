"""Retained logs in two forms (spec/spark.md §8): messages sent one by one and bulk segments in one
sequence order; per-message and Arrow reads select the same messages as the range browse's per-message
loop; retention trims rows from the head in both forms, releasing storage as rows leave."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pymq_server.broker import bulk_rows, segments
from pymq_server.broker.log import RetainedLog
from pymq_server.broker.message import BrokerMessage, message_from_request
from pymq_server.broker.requests import parse_send


class Store:
    def __init__(self) -> None:
        self.released: list[tuple[int, str]] = []

    def release(self, message, name: str) -> None:
        self.released.append((message.key, name))


class Broker:
    """What a retained log needs of its host (queue.QueueHost): storage references and memory accounting."""

    def __init__(self) -> None:
        self.store = Store()
        self.gone: list[int] = []

    def release_reference(self, message, name: str) -> None:
        self.store.release(message, name)

    def message_gone(self, message) -> None:
        self.gone.append(message.key)


def one(seq: int, stamp: int, expires: int, size: int) -> BrokerMessage:
    request = parse_send({"destination": "/topic/t", "expires": str(expires), "timestamp": str(stamp)}, b"x" * size)
    return message_from_request(request, key=seq, message_id=f"ID:n-{seq}", seq=seq, destination="/topic/t",
                                now=stamp)


def bulk(first_seq: int, rows: list[tuple[int, int, int]]):
    batch = pa.RecordBatch.from_pydict({
        "body": pa.array([b"y" * size for _, _, size in rows], pa.binary()),
        "timestamp": pa.array([stamp for stamp, _, _ in rows], pa.int64()),
        "expires": pa.array([expires for _, expires, _ in rows], pa.int64())})
    return bulk_rows.complete_bulk(batch, first_seq=first_seq, first_key=first_seq, node_id="n", now=0,
                                  persistent=True, priority=4, ttl=0)


def reference(messages, from_seq, to_seq, max_messages, max_bytes, from_ts, now):
    """The range browse's per-message loop (server broker, spec/stomp.md §9): (seqs sent, last examined)."""
    sent, count, size, last = [], 0, 0, None
    for m in messages:
        if m.seq < from_seq or (to_seq is not None and m.seq >= to_seq):
            continue
        if max_messages is not None and count >= max_messages:
            return sent, last, True
        if max_bytes is not None and count and size >= max_bytes:
            return sent, last, True
        last = m.seq
        if m.expired(now) or (from_ts is not None and m.timestamp < from_ts):
            continue
        sent.append(m.seq)
        count += 1
        size += m.size
    return sent, last, False


row_st = st.tuples(st.integers(0, 100), st.sampled_from([0, 0, 0, 30, 80]), st.integers(0, 9))
ops_st = st.lists(st.one_of(
    st.tuples(st.just("one"), row_st, st.integers(1, 3)),
    st.tuples(st.just("bulk"), st.lists(row_st, min_size=1, max_size=6), st.integers(1, 3)),
), min_size=1, max_size=14)


@settings(max_examples=300, deadline=None)
@given(ops_st, st.integers(0, 60), st.one_of(st.none(), st.integers(0, 80)), st.one_of(st.none(), st.integers(0, 7)),
       st.one_of(st.none(), st.integers(0, 30)), st.one_of(st.none(), st.integers(0, 90)), st.integers(0, 100),
       st.tuples(st.integers(0, 6), st.sampled_from([0, 0, 50])), st.booleans())
def test_both_reads_select_what_the_per_message_loop_selects(ops, from_seq, to_seq, max_messages, max_bytes,
                                                             from_ts, now, retention, small_segments):
    import pymq_server.broker.log as log_module
    if small_segments:
        log_module.SEGMENT_ROWS = 3          # seal often, so reads cross sealed segments and the tail
    try:
        broker = Broker()
        log = RetainedLog(broker, "/topic/t", retention_ms=retention[1], retention_messages=retention[0])
        model: list[BrokerMessage] = []
        seq = 1
        for kind, item, gap in ops:
            seq += gap - 1                   # sequence numbers may have gaps
            if kind == "one":
                m = one(seq, *item)
                log.append(m, True)
                model.append(m)
                seq += 1
            else:
                batch = bulk(seq, item)
                log.append_segment(batch, seq)
                model += segments.materialize(batch, "/topic/t", range(seq, seq + len(item)), BrokerMessage)
                seq += len(item)
        dropped = log.trim(now) if retention != (0, 0) else 0
        model = model[dropped:]              # retention trims from the head, in either form
        assert len(log) == len(model)
        assert log.earliest == (model[0].seq if model else None)

        expected, last, stopped = reference(model, from_seq, to_seq, max_messages, max_bytes, from_ts, now)
        # the per-message read: the same messages, made from rows where needed
        assert [m.seq for m in log.range(from_seq, to_seq)] == \
            [m.seq for m in model if m.seq >= from_seq and (to_seq is None or m.seq < to_seq)]
        batches, count, examined, hit = log.read_arrow(from_seq, to_seq, max_messages, max_bytes, from_ts, now)
        got = [s for b in batches for s in b.column("seq").to_pylist()]
        assert got == expected and count == len(expected)
        assert (examined, hit) == (last, stopped)
        assert all(b.schema == segments.LOG_SCHEMA for b in batches)
    finally:
        log_module.SEGMENT_ROWS = segments.SEGMENT_ROWS


def test_trimming_releases_storage_per_message_and_per_bulk_segment():
    broker = Broker()
    log = RetainedLog(broker, "/topic/t", retention_messages=2)
    holder = one(100, 0, 0, 1)               # a bulk segment's stored record
    log.append(one(1, 0, 0, 1), True)
    log.append_segment(bulk(2, [(0, 0, 1), (0, 0, 1)]), 2, holder)
    log.append(one(4, 0, 0, 1), False)
    assert log.trim(0) == 2                  # message 1 and the first bulk row
    assert broker.store.released == [(1, "log:/topic/t")] and broker.gone == [1]
    assert log.trim(0) == 0 and log.earliest == 3
    log.retention_messages = 1
    assert log.trim(0) == 1                  # the last row of the segment: its record goes too
    assert broker.store.released[-1] == (100, "log:/topic/t") and 100 in broker.gone
    assert [m.seq for m in log.range(0, None)] == [4]
    assert log.clear() == 1 and len(log) == 0 and log.earliest is None


def test_recovery_sorts_what_storage_hands_over():
    broker = Broker()
    log = RetainedLog(broker, "/topic/t")
    log.begin_restore()
    log.append(one(9, 0, 0, 1), True)
    log.append_segment(bulk(5, [(0, 0, 1)] * 3), 5)
    log.append(one(2, 0, 0, 1), True)
    log.end_restore()
    assert [m.seq for m in log.range(0, None)] == [2, 5, 6, 7, 9]
    batches, _, _, _ = log.read_arrow(0, None, None, None, None, 0)
    assert [s for b in batches for s in b.column("seq").to_pylist()] == [2, 5, 6, 7, 9]


def test_a_queue_reads_ranges_from_its_ready_index_in_sequence_order():
    """Priorities and redeliveries put a queue's entries out of sequence order; a range read still
    follows sequence numbers, from the index's sorted runs (hypothesis-free: every case below)."""
    from pymq_server.broker.queue import Entry, ReadyIndex

    class M:
        def __init__(self, seq, priority):
            self.seq, self.priority, self.key = seq, priority, seq

    index = ReadyIndex()
    entries = {}
    for seq, prio in [(1, 4), (2, 9), (3, 0), (4, 4), (5, 9), (6, 4), (7, 0)]:
        e = Entry.__new__(Entry)
        e.message = M(seq, prio)
        entries[seq] = e
        index.push(e)
    index.remove(entries[4])                  # taken by a consumer...
    index.remove(entries[2])
    index.push(entries[2])                    # ...and one comes back below the list's tail (the heap)
    assert [e.message.seq for e in index.by_seq()] == [1, 2, 3, 5, 6, 7]
    assert [e.message.seq for e in index.by_seq(3, 7)] == [3, 5, 6]
    assert index.min_seq() == 1
    index.remove(entries[1])
    assert index.min_seq() == 2 and [e.message.seq for e in index.by_seq(6)] == [6, 7]
