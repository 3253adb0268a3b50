"""The ready index against a naive model: delivery order (priority, then sequence) for pops, removals
and selective takes with resumable per-consumer cursors (hypothesis state machine)."""
from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pymq_server.broker.queue import Entry, ReadyIndex


class _Msg:
    __slots__ = ("seq", "key", "priority", "tag")

    def __init__(self, seq, priority, tag):
        self.seq = seq
        self.key = seq
        self.priority = priority
        self.tag = tag


def _entry(seq, priority, tag):
    e = Entry.__new__(Entry)
    e.message = _Msg(seq, priority, tag)
    return e


def _order(e):
    return (-e.message.priority, e.message.seq)


# consumer i accepts messages whose tag is in its set: fixed predicates, as selectors are
PREDICATES = [frozenset({0}), frozenset({1, 2}), frozenset({3}), frozenset(range(5))]


class ReadyIndexMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.index = ReadyIndex()
        self.model: list = []
        self.next_seq = 1000
        self.cursors = [[0, [-1] * 10] for _ in PREDICATES]
        self.sent: dict = {}

    @rule(priority=st.integers(0, 9), tag=st.integers(0, 4))
    def push(self, priority, tag):
        """A new message: the next sequence number."""
        self.next_seq += 1
        e = _entry(self.next_seq, priority, tag)
        self.sent[e.message.seq] = e
        self.index.push(e)
        self.model.append(e)

    @rule(pick=st.integers(0, 10_000))
    def redeliver(self, pick):
        """A message that left the index comes back (NACK, lost consumer): same message, same sequence
        number, usually out of order — a sequence number identifies one message in a queue."""
        gone = [e for seq, e in self.sent.items() if e not in self.model]
        if not gone:
            return
        e = gone[pick % len(gone)]
        self.index.push(e)
        self.model.append(e)

    @precondition(lambda self: self.model)
    @rule()
    def pop(self):
        expected = min(self.model, key=_order)
        got = self.index.pop()
        assert got is expected
        self.model.remove(expected)

    @rule(which=st.integers(0, len(PREDICATES) - 1))
    def take(self, which):
        tags = PREDICATES[which]
        accepted = [e for e in self.model if e.message.tag in tags]
        expected = min(accepted, key=_order) if accepted else None
        got = self.index.take_first(lambda e: e.message.tag in tags, self.cursors[which])
        assert got is expected
        if expected is not None:
            self.model.remove(expected)

    @precondition(lambda self: self.model)
    @rule(pick=st.integers(0, 10_000))
    def remove(self, pick):
        e = self.model[pick % len(self.model)]
        self.index.remove(e)
        self.model.remove(e)

    @rule()
    def release_a_group(self):
        self.index.epoch += 1

    @invariant()
    def same_contents_in_order(self):
        assert len(self.index) == len(self.model)
        assert list(self.index) == sorted(self.model, key=_order)


TestReadyIndex = ReadyIndexMachine.TestCase
TestReadyIndex.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


def test_an_entry_back_below_a_consumers_cursor_is_still_found():
    """A redelivered entry whose sequence number is below where a selective consumer's scan resumes is
    not skipped, even when it arrives while the level's list is empty."""
    index = ReadyIndex()
    a, b = _entry(1001, 0, 0), _entry(1002, 0, 1)
    index.push(a)
    index.push(b)
    assert index.pop() is a
    cursor = [0, [-1] * 10]
    assert index.take_first(lambda e: e.message.tag == 0, cursor) is None     # b rejected: the scan moves on
    assert index.pop() is b
    index.push(a)                                                             # a comes back (NACK)
    assert index.take_first(lambda e: e.message.tag == 0, cursor) is a
