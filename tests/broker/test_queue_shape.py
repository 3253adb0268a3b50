"""What a fresh queue holds: only what every queue uses; a table a queue may never need is made when first needed.

A temporary queue is made for every request/reply exchange and a client may hold thousands (the temporaries
scenario of bench/bench_client_memory.py: 5,000 of them). Each empty table made eagerly is paid by every one
of them: a backlog's deque is 760 bytes (CPython gives a deque its first 64-slot block when it is made), the
producers paused by ``max_depth`` an empty set of 216, the scheduled entries an empty dict of 64, the message
groups an object and a dict of 112, and a queue's ``__dict__`` 56 more than its slots. These tests pin the
shape of a fresh queue, that each lazy table appears when it is needed (and the backlog's goes again once
drained), and the heap a temporary queue costs.
"""
from __future__ import annotations

import gc
import tracemalloc
from collections import deque

import pytest

from pymq_server.broker.backlog import NO_RUNS
from pymq_server.broker.upkeep import NOT_BLOCKED, NOT_TIMED
from tests.broker.core_harness import Core, FakeClient


@pytest.fixture
def core(tmp_path):
    made = Core(tmp_path, memory_only=True)
    yield made
    made.close()


def test_a_fresh_temporary_queue_makes_no_table_it_has_not_needed(core):
    queue = core.broker.destinations.create_temp_queue(FakeClient(), "answers")
    assert queue.backlog.runs is NO_RUNS and not isinstance(queue.backlog.runs, deque)
    assert queue.upkeep.blocked is NOT_BLOCKED
    assert queue.timed is NOT_TIMED
    assert queue.dispatcher.groups is None and queue.group_owners == {}
    assert queue.name is queue.destination          # one string for both
    assert not hasattr(queue, "__dict__")           # slotted: a queue's fields, no dict beside them
    for part in (queue, queue.ready, queue.backlog, queue.dispatcher, queue.upkeep, queue.stats):
        assert not hasattr(part, "__dict__"), type(part)
    assert queue.depth == 0 and queue.scheduled == 0


def test_the_shared_empty_tables_cannot_be_filled():
    # (a queue that wrote into a shared sentinel would write into every queue's)
    with pytest.raises(TypeError):
        NOT_TIMED["x"] = None                     # type: ignore[index]
    with pytest.raises(AttributeError):
        NOT_BLOCKED.add("x")
    with pytest.raises(AttributeError):
        NO_RUNS.append(["held"])
    assert not NOT_TIMED and not NOT_BLOCKED and not NO_RUNS


def test_each_lazy_table_is_made_when_first_needed(core):
    client = FakeClient()
    core.queue("q")
    queue = core.queue("q")
    # a scheduled message: the queue's own dict of scheduled entries, the shared one untouched
    core.send("/queue/q", {"AMQ_SCHEDULED_DELAY": "60000"})
    assert queue.timed is not NOT_TIMED and len(queue.timed) == 1 and not NOT_TIMED
    assert queue.scheduled == 1 and queue.depth == 1
    assert queue.upkeep.purge() == 1 and queue.depth == 0
    # a producer paused by max_depth: a set of its own, back to the shared empty one when it resumes
    queue.upkeep.block_producer(client)
    assert queue.upkeep.blocked == {client} and not NOT_BLOCKED
    queue.upkeep.maybe_unblock()
    assert queue.upkeep.blocked is NOT_BLOCKED


def test_a_backlog_has_its_own_runs_while_it_holds_something(core, monkeypatch):
    queue = core.queue("paged")
    backlog = queue.backlog
    assert backlog.pager is not None and backlog.runs is NO_RUNS
    monkeypatch.setattr(type(backlog.pager.flow), "short", lambda self: True)     # memory short: they page
    for i in range(3):
        core.send("/queue/paged", {"n": str(i)})
    assert backlog.count == 3 and isinstance(backlog.runs, deque) and not NO_RUNS
    monkeypatch.undo()
    queue._page_in()
    assert backlog.count == 0 and backlog.runs is NO_RUNS             # drained: its deque is gone
    assert [e.message.headers["n"] for e in queue.ready] == ["0", "1", "2"]


def test_a_temporary_queue_costs_less_heap_than_at_ccb5094(core):
    """The heap one temporary queue takes (its name, its registry entry, the queue and its parts), by
    tracemalloc over 500 of them. At ccb5094 the queue alone took 2,521 bytes (bench_client_memory's
    temporaries, tracemalloc by traceback in a pymq-server; 2,793 before these tables were lazy); now
    about 1,470 with its name (1,586 with the registry entry)."""
    destinations, client = core.broker.destinations, FakeClient()
    destinations.create_temp_queue(client, "warm")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        made = [destinations.create_temp_queue(client, f"t{i:04d}") for i in range(500)]
        gc.collect()
        each = (tracemalloc.get_traced_memory()[0] - before) / len(made)
    finally:
        tracemalloc.stop()
    assert each <= 2_048, each
