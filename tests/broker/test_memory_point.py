"""The point where message memory pauses producers and where they resume (spec/stomp.md §8), to the message.

Message memory is every held body plus flow.MESSAGE_OVERHEAD per message and flow.ENTRY_OVERHEAD per queue
entry in memory; a SEND whose message takes it above ``max_memory`` (its own entry not yet counted) pauses
its producer, and memory falling under 80 % of the limit as entries end resumes producers. The accounting is
spread over the flow, the entry and the queue's end of an entry (queue._drop); counting an entry once too often
or too seldom, or a message's figures at the wrong time, moves one of these points, and these tests see it."""
from __future__ import annotations

from pymq_server.broker.flow import ENTRY_OVERHEAD, MESSAGE_OVERHEAD

from pymq_server.broker.requests import SubscribeRequest

from tests.broker.core_harness import Core, FakeClient

LIMIT = 64 * 1024


def _first_over(size: int) -> int:
    """The first k whose placing takes memory above LIMIT: k bodies and messages, k - 1 entries."""
    k = 1
    while k * (size + MESSAGE_OVERHEAD) + (k - 1) * ENTRY_OVERHEAD <= LIMIT:
        k += 1
    return k


def test_a_producer_pauses_at_the_message_that_passes_max_memory_and_resumes_under_80_percent(tmp_path):
    core = Core(tmp_path, memory_only=True, max_memory=LIMIT)     # nothing to page to: memory fills
    try:
        queue = core.queue("full")
        flow = core.broker.flow
        core.send("/queue/full", {})
        size = flow.held_bytes
        k = _first_over(size)
        for _ in range(k - 2):
            core.send("/queue/full", {})
        assert (core.client.paused, flow.high) == ([], False), "paused before the limit"
        core.send("/queue/full", {})                            # the k-th
        assert (core.client.paused, flow.high) == (["memory"], True)
        assert (flow.held_messages, flow.entries) == (k, k)
        # drop the oldest one at a time: producers resume at the first drop that takes memory under 80 %
        freed = 0
        while flow.high and freed < k:
            queue.drop_oldest()
            freed += 1
        left = k - freed
        assert left * (size + MESSAGE_OVERHEAD + ENTRY_OVERHEAD) < LIMIT * 0.8 <= \
            (left + 1) * (size + MESSAGE_OVERHEAD + ENTRY_OVERHEAD)
        assert (flow.held_messages, flow.entries, queue.depth) == (left, left, left)
    finally:
        core.close()


class _Holder(FakeClient):
    """A consumer's connection that keeps what it is given (never acknowledges)."""

    def deliver(self, consumer, entry) -> None:
        pass


def test_a_topic_messages_entries_freed_one_by_one_resume_producers_at_80_percent(tmp_path):
    """Fan-out: one message, one entry per subscription. An entry that ends while the message is still held by
    another subscription frees its ENTRY_OVERHEAD at once (19,999 of 20,000 subscriptions read it)."""
    core = Core(tmp_path, memory_only=True, max_memory=LIMIT)
    try:
        reader = _Holder(name="reader")
        subs = [core.broker.subscribe(reader, SubscribeRequest("/topic/fan", f"s{i}", ack="client", prefetch=1))
                for i in range(2)]
        flow = core.broker.flow
        core.send("/topic/fan", {})
        size = flow.held_bytes
        k = 1
        while k * (size + MESSAGE_OVERHEAD) + 2 * (k - 1) * ENTRY_OVERHEAD <= LIMIT:
            k += 1
        for _ in range(k - 2):
            core.send("/topic/fan", {})
        assert (core.client.paused, flow.high) == ([], False), "paused before the limit"
        core.send("/topic/fan", {})                             # the k-th
        assert (core.client.paused, flow.high, flow.held_messages, flow.entries) == (["memory"], True, k, 2 * k)
        queue = subs[0].queue
        freed = 0
        while flow.high and freed < k:
            queue.drop_oldest()                                 # the message stays: the other subscription has it
            freed += 1
        assert (flow.held_messages, flow.entries) == (k, 2 * k - freed)
        memory = k * (size + MESSAGE_OVERHEAD) + (2 * k - freed) * ENTRY_OVERHEAD
        assert memory < LIMIT * 0.8 <= memory + ENTRY_OVERHEAD
    finally:
        core.close()
