"""The queue-entry state table guards: every change goes through it, and a change it does not list raises
before the queue changes anything (server/broker/states.py)."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from pymq_server.broker.message import BrokerMessage, now_ms
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.states import (
    ACQUIRED,
    FINAL,
    READY,
    TRANSITIONS,
    EntryState,
    Event,
    IllegalTransition,
    transition,
)
from pymq_server.config import QueueConfig


@pytest.mark.parametrize("state, event", [(s, e) for s in EntryState for e in Event if (s, e) not in TRANSITIONS])
def test_a_change_the_table_lacks_raises_naming_it(state, event):
    """(That the table is the specified lifecycle, and that each row does what a client expects, is
    tests/broker/test_entry_lifecycle.py.)"""
    with pytest.raises(IllegalTransition) as info:
        transition(state, event)
    assert (info.value.state, info.value.event) == (state, event)


def test_final_states_have_no_way_out_and_every_other_state_has_one():
    sources = {state for state, _ in TRANSITIONS}
    assert not sources & FINAL
    assert sources | FINAL == set(EntryState)
    assert str(READY) == "ready" and str(Event.ACK) == "ack"       # what the admin interface shows


class Host:
    clock = staticmethod(time.monotonic)
    now_ms = staticmethod(now_ms)
    pager = None                 # no paging: every message stays in memory

    def __init__(self) -> None:
        self.events: list[str] = []
        # the memory flow's count of entries, never high (flow.MemoryFlow: queue._drop uncounts an entry)
        self.flow = SimpleNamespace(entries=0, high=False)

    def schedule_at_ms(self, when_ms, fn, *args) -> None:
        self.events.append("scheduled")

    def call_soon(self, fn, *args) -> None:
        pass

    def release_reference(self, message, queue) -> None:
        self.events.append("released")

    def message_gone(self, message) -> None:
        self.events.append("gone")

    def on_expired(self, entry) -> None:
        self.events.append("expired")

    def dead_letter(self, entry, reason) -> None:
        self.events.append("dead")


class Taker:
    """A consumer that takes one message and keeps it (unacknowledged)."""

    selector = None
    ack_mode = "client-individual"   # keeps what it takes until told
    passes = False
    active = True
    exclusive = False
    scan = [0, [-1] * 10]

    def __init__(self) -> None:
        self.taken: list = []

    def can_take(self) -> bool:
        return not self.taken

    def deliver(self, entry) -> None:
        self.taken.append(entry)


def _queue() -> tuple[MessageQueue, Host]:
    host = Host()
    return MessageQueue(host, "q", "/queue/q", config=QueueConfig()), host


def _message(seq: int) -> BrokerMessage:
    return BrokerMessage(seq, f"ID:t-{seq}", "/queue/q", seq, {}, b"x", False, 4, 0, 0)


def test_releasing_an_entry_nobody_holds_raises_and_changes_nothing():
    queue, host = _queue()
    entry = queue.enqueue(_message(1))
    with pytest.raises(IllegalTransition):
        queue.release(entry)                       # NACK of something never delivered
    assert entry.state is READY and queue.ready.count == 1 and queue.acquired == 0 and queue.depth == 1
    assert list(queue.ready) == [entry] and not host.events


def test_acknowledging_twice_raises_and_counts_once():
    queue, host = _queue()
    taker = Taker()
    queue.enqueue(_message(1))
    queue.add_consumer(taker)
    entry = taker.taken[0]
    assert entry.state is ACQUIRED
    queue.complete(entry)
    with pytest.raises(IllegalTransition):
        queue.complete(entry)
    assert queue.acquired == 0 and queue.stats.removed == 1 and queue.depth == 0


def test_an_acquired_entry_is_not_purged_as_if_ready():
    queue, _ = _queue()
    taker = Taker()
    queue.enqueue(_message(1))
    queue.add_consumer(taker)
    entry = taker.taken[0]
    with pytest.raises(IllegalTransition):
        queue.remove_ready([entry])               # ack-upto must only touch ready entries
    assert entry.state is ACQUIRED and queue.acquired == 1
