"""A queue's bulk block (blocks.py) delivers what the same messages sent one by one would.

Random runs of sends — single messages, and runs of consecutive rows sent as one bulk block — with groups,
expired rows, selectors and exclusive consumers, acknowledgements, NACKs and consumers leaving, are played
on two queues: one gets every message one by one (a run's messages placed together, then dispatched: they
arrive at once, as a block's rows do), the other gets the runs as blocks. Which consumer gets which
message, in which order, with which delivery count and flags, and the queue's figures must be the same; and
every block is settled exactly when its last row is. (One priority for all: a block's rows wait behind
messages already ready, spec/spark.md §7.1, which is where the two may differ by design.)
"""
from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq_server.broker import bulk_rows
from pymq_server.broker.blocks import BulkBlock
from pymq_server.broker.message import BrokerMessage, now_ms
from pymq_server.broker.queue import MessageQueue
from pymq_server.config import QueueConfig
from tests.broker.test_hand_new import Consumer, play_consumers
from tests.broker.test_hand_new import Host as HandNewHost

pa = pytest.importorskip("pyarrow")


class Flow:
    def room(self) -> bool:
        return True

    def short(self) -> bool:
        return False


class Pager:
    flow = Flow()


class Host(HandNewHost):
    """A queue's host with a pager (so the queue keeps a backlog) that settles blocks' rows as they go."""

    def __init__(self) -> None:
        super().__init__()
        self.pager = Pager()
        self.settled: list = []           # blocks whose last row went, in order
        self.gone = 0

    def message_gone(self, message) -> None:
        self.gone += 1
        if message.bulk is not None and message.bulk.settle(message):
            self.settled.append(message.bulk.first_seq)


def _single(n: int, group: str | None, expired: bool) -> BrokerMessage:
    headers = {"n": str(n)}
    if group is not None:
        headers["JMSXGroupID"] = group
    return BrokerMessage(n, f"ID:t-{n}", "/queue/q", n, headers, b"x", False, 4, 0,
                         now_ms() - 1000 if expired else 0)


def _block(first: int, specs: list) -> BulkBlock:
    """Rows ``first...`` as one block; ``specs``: (group, expired) per row."""
    n = len(specs)
    batch = pa.RecordBatch.from_pydict({
        "body": pa.array([b"x"] * n),
        "group": pa.array([g for g, _ in specs], pa.string()),
        "expires": pa.array([now_ms() - 1000 if e else 0 for _, e in specs], pa.int64()),
        "delivery_mode": pa.array([1] * n, pa.int32()),
        "properties": pa.array([[("n", str(first + i))] for i in range(n)], pa.map_(pa.string(), pa.string())),
    })
    rows = bulk_rows.complete_bulk(batch, first_seq=first, first_key=first, node_id="t", now=now_ms(),
                                   persistent=False, priority=4, ttl=0)
    holder = BrokerMessage(0, "ID:t-holder", "/queue/q", first, {}, b"", False, 4, 0, 0)
    return BulkBlock(rows, holder, "q", first, False)


row = st.tuples(st.sampled_from([None, None, None, "g1", "g2"]), st.sampled_from([False] * 5 + [True]))
operations = st.lists(st.one_of(
    st.tuples(st.just("send"), row),
    st.tuples(st.just("bulk"), st.lists(row, min_size=1, max_size=12)),
    st.tuples(st.just("ack"), st.integers(0, 3)),
    st.tuples(st.just("nack"), st.integers(0, 3)),
    st.tuples(st.just("add"), st.integers(1, 3), st.sampled_from([False, False, False, True]),
              st.sampled_from([False] * 5 + [True])),
    st.tuples(st.just("leave"), st.integers(0, 3)),
), max_size=50)


def _play(ops, as_blocks: bool) -> tuple:
    host = Host()
    queue = MessageQueue(host, "q", "/queue/q", config=QueueConfig())  # type: ignore[arg-type]
    log: list = []
    consumers: list[Consumer] = []
    n = 0
    blocks = []
    for op in ops:
        if op[0] == "send":
            n += 1
            queue.enqueue(_single(n, *op[1]))
        elif op[0] == "bulk":
            first = n + 1
            n += len(op[1])
            if as_blocks:
                block = _block(first, op[1])
                blocks.append(first)
                queue.enqueue_block(block)
            else:
                # the same messages arriving together: all placed, then one dispatch (as a block's rows are)
                queue.dispatcher.running = True
                for i, spec in enumerate(op[1]):
                    queue.enqueue(_single(first + i, *spec))
                queue.dispatcher.running = False
                queue.dispatch()
        else:
            play_consumers(queue, op, consumers, log)
    stats = queue.stats
    figures = (queue.depth, queue.acquired, stats.added, stats.delivered, stats.expired, stats.peak_depth,
               stats.acknowledged, stats.failed, host.gone)
    return log, figures, host.settled, blocks


@settings(max_examples=300, deadline=None)
@given(operations)
def test_blocks_deliver_what_the_same_messages_sent_one_by_one_would(ops):
    log, figures, settled, blocks = _play(ops, as_blocks=True)
    assert (log, figures) == _play(ops, as_blocks=False)[:2]
    # a block is settled once, when its last row is gone; and every row of it is gone by then
    assert len(settled) == len(set(settled)) and set(settled) <= set(blocks)


def test_a_block_behind_ready_messages_and_before_later_ones():
    ops = [("add", 2, False, False), ("send", (None, False)), ("send", (None, False)), ("send", (None, False)),
           ("bulk", [(None, False)] * 4), ("send", (None, False)), ("ack", 0), ("ack", 0), ("ack", 0), ("ack", 0),
           ("ack", 0), ("ack", 0), ("ack", 0), ("ack", 0)]
    log, figures, settled, blocks = _play(ops, as_blocks=True)
    assert [seq for _, seq, *_ in log] == [1, 2, 3, 4, 5, 6, 7, 8]     # one consumer: all in order
    assert settled == blocks == [4]
    assert figures[0] == 0


def _settle(block, offsets):
    made = {m.seq - block.first_seq: m for m, _ in block.take(block.waiting)}
    for offset in offsets:
        block.settle(made[offset])
    return made


def test_the_catalog_record_brings_back_exactly_the_rows_not_settled():
    block = _block(100, [(None, False)] * 10)
    made = _settle(block, [0, 1, 2, 5, 7, 8])
    block.delivered(made[3], 2)
    block.delivered(made[4], 1)
    state = block.state()
    assert state == b'{"below":3,"done":[[5,6],[7,9]],"counts":[[3,2],[4,1]]}'
    again = _block(100, [(None, False)] * 10)
    again.restore(state)
    assert [(m.seq, n) for m, n in again.take(10)] == [(103, 2), (104, 1), (106, 0), (109, 0)]
    assert again.left == 4 and again.recorded


@pytest.mark.parametrize("state", [b"", b"not json", b"[]", b'{"below": "x", "done": [], "counts": []}',
                                   b'{"below": 0, "done": [[1, 2, 3]], "counts": []}',
                                   b'{"below": 0, "done": [], "counts": [["a", 1]]}', b'{"done": []}',
                                   b"\xff\xfe", b'{"below": 0, "done": 7, "counts": []}'])
def test_an_unreadable_record_brings_every_row_back(state):
    block = _block(7, [(None, False)] * 3)
    block.restore(state)
    assert [(m.seq, n) for m, n in block.take(10)] == [(7, 0), (8, 0), (9, 0)] and block.left == 3


def test_settled_offsets_past_the_rows_and_huge_numbers_are_harmless():
    block = _block(7, [(None, False)] * 3)
    block.restore(b'{"below": 99999999999999999999, "done": [], "counts": [[1, 5]]}')
    assert block.left == 0 and block.take(10) == []
    block = _block(7, [(None, False)] * 3)
    block.restore(b'{"below": 1, "done": [[-5, 0], [2, 99999999999999999999]], "counts": [[1, 5], [2, 9]]}')
    assert [(m.seq, n) for m, n in block.take(10)] == [(8, 5)]
