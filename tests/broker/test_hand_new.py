"""A new message for an idle consumer goes to it without passing through the ready index
(Dispatcher.offer, dispatch.py): the shortcut must choose exactly what dispatch would have chosen.

Random runs of sends (grouped or not, expired or not, of any priority), acknowledgements, consumers
arriving (with selectors, exclusive) and leaving are played on two queues, one with the shortcut and one
with it turned off; the deliveries (which consumer got which message, in which order, flagged how) and the
queue's figures must be the same.
"""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pymq_server.broker.dispatch import Dispatcher
from pymq_server.broker.message import BrokerMessage, now_ms
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.states import ACQUIRED
from pymq_server.config import QueueConfig


class Host:
    clock = staticmethod(time.monotonic)
    now_ms = staticmethod(now_ms)
    pager = None

    def __init__(self) -> None:
        # the memory flow's count of entries, never high (flow.MemoryFlow: queue._drop uncounts an entry)
        self.flow = SimpleNamespace(entries=0, high=False)

    def schedule_at_ms(self, when_ms, fn, *args) -> None:
        pass

    def call_soon(self, fn, *args) -> None:
        pass

    def release_reference(self, message, queue) -> None:
        pass

    def message_gone(self, message) -> None:
        pass

    def on_expired(self, entry) -> None:
        pass

    def dead_letter(self, entry, reason) -> None:
        pass

    def delivered(self, message, queue, deliveries) -> None:
        pass


class Odd:
    """A selector taking messages with an odd sequence number."""

    def matches(self, values) -> bool:
        return int(values["n"]) % 2 == 1


class Consumer:
    active = True
    ack_mode = "client-individual"
    passes = False

    def __init__(self, name: str, prefetch: int, selector, exclusive: bool, log: list) -> None:
        self.name = name
        self.prefetch = prefetch
        self.selector = selector
        self.exclusive = exclusive
        self.scan = [0, [-1] * 10]
        self.held: list = []
        self.log = log

    def can_take(self) -> bool:
        return len(self.held) < self.prefetch

    def deliver(self, entry) -> None:
        self.held.append(entry)
        self.log.append((self.name, entry.message.seq, entry.first_in_group, entry.deliveries))


def _message(n: int, group: str | None, expired: bool, priority: int) -> BrokerMessage:
    headers = {"n": str(n)}
    if group is not None:
        headers["JMSXGroupID"] = group
    expires = now_ms() - 1000 if expired else 0
    return BrokerMessage(n, f"ID:t-{n}", "/queue/q", n, headers, b"x", False, priority, 0, expires)


operations = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from([None, None, None, "g1", "g2"]),
              st.sampled_from([False, False, False, True]), st.integers(0, 9)),
    st.tuples(st.just("ack"), st.integers(0, 3)),
    st.tuples(st.just("add"), st.integers(1, 3), st.sampled_from([False, False, False, True]),
              st.sampled_from([False] * 5 + [True])),
    st.tuples(st.just("leave"), st.integers(0, 3)),
), max_size=60)


def play_consumers(queue: MessageQueue, op: tuple, consumers: list, log: list) -> None:
    """The consumers' side of a run: ``ack`` or ``nack`` the oldest message a consumer holds, ``add`` a
    consumer (prefetch, Odd selector or not, exclusive or not), or one ``leave`` (what it held released)."""
    if op[0] in ("ack", "nack") and consumers:
        consumer = consumers[op[1] % len(consumers)]
        if consumer.held:
            entry = consumer.held.pop(0)
            if op[0] == "ack":
                queue.complete(entry)
            else:
                queue.release(entry)
            queue.dispatch()
    elif op[0] == "add":
        consumer = Consumer(f"c{len(log)}-{len(consumers)}", op[1], Odd() if op[2] else None, op[3], log)
        consumers.append(consumer)
        queue.add_consumer(consumer)
    elif op[0] == "leave" and consumers:
        consumer = consumers.pop(op[1] % len(consumers))
        queue.remove_consumer(consumer)
        for entry in consumer.held:
            queue.release(entry, failed=False, dispatch=False)
        queue.dispatch()


class WithoutOffer(Dispatcher):
    """Every new entry goes through the ready index and dispatch."""

    __slots__ = ()

    def offer(self, entry, now) -> bool:
        return False


def _play(ops, shortcut: bool) -> tuple[list, tuple]:
    queue = MessageQueue(Host(), "q", "/queue/q", config=QueueConfig())
    if not shortcut:
        queue.dispatcher.__class__ = WithoutOffer
    log: list = []
    consumers: list[Consumer] = []
    n = 0
    for op in ops:
        if op[0] == "send":
            n += 1
            queue.enqueue(_message(n, op[1], op[2], op[3]))
        else:
            play_consumers(queue, op, consumers, log)
    stats = queue.stats
    figures = (queue.depth, queue.acquired, queue.ready.count, stats.added, stats.delivered, stats.expired,
               stats.peak_depth, stats.acknowledged, dict((g, c.name) for g, c in queue.group_owners.items()))
    return log, figures


@settings(max_examples=400, deadline=None)
@given(operations)
def test_the_shortcut_delivers_what_dispatch_would(ops):
    assert _play(ops, shortcut=True) == _play(ops, shortcut=False)


def test_new_messages_go_round_robin_as_dispatch_sends_them():
    ops = [("add", 3, False, False), ("add", 3, False, False), ("add", 1, False, False)] + \
        [("send", None, False, 4)] * 6 + [("ack", 1), ("send", None, False, 4)]
    log, _ = _play(ops, shortcut=True)
    assert [name[-1] for name, *_ in log] == ["0", "1", "2", "0", "1", "0", "1"]
    assert _play(ops, shortcut=False)[0] == log


class WatchedQueue(MessageQueue):
    """A queue that notes each entry entering its ready index (a queue is slotted: no method set on one)."""

    __slots__ = ("pushed",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pushed: list = []

    def _push_ready(self, entry: Any) -> None:
        self.pushed.append(entry)
        super()._push_ready(entry)


def test_a_message_for_an_idle_consumer_never_enters_the_ready_index():
    queue = WatchedQueue(Host(), "q", "/queue/q", config=QueueConfig())
    log: list = []
    consumer = Consumer("c", 10, None, False, log)
    queue.add_consumer(consumer)
    entry = queue.enqueue(_message(1, None, False, 4))
    assert entry.state is ACQUIRED and consumer.held == [entry] and not queue.pushed
    # counted while it is out: depth 1, and the peak saw it
    assert queue.depth == 1 and queue.stats.peak_depth == 1 and queue.stats.delivered == 1


def test_the_shortcut_is_dispatch_s_rule_for_groups_selectors_and_exclusive_consumers():
    """One rule reached two ways: a grouped message, a selector's consumer, an exclusive consumer get the
    new message without the ready index too, when dispatch's rule would give it to them; a message the
    selector refuses, and an expired one, wait in the ready index for dispatch (which expires the latter)."""
    cases = ((_message(1, "g", False, 4), None, False, True),
             (_message(1, None, False, 4), Odd(), False, True),          # seq 1 is odd: the selector takes it
             (_message(2, None, False, 4), Odd(), False, False),         # seq 2 is not: it waits
             (_message(1, None, False, 4), None, True, True),
             (_message(1, None, True, 4), None, False, False))          # expired: dispatch expires it
    for message, selector, exclusive, direct in cases:
        queue = WatchedQueue(Host(), "q", "/queue/q", config=QueueConfig())
        consumer = Consumer("c", 10, selector, exclusive, [])
        queue.add_consumer(consumer)
        queue.enqueue(message)
        assert len(queue.pushed) == (0 if direct else 1), (message.headers, selector, exclusive)
        assert len(consumer.held) == (1 if direct else 0)
