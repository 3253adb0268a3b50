"""Producer flow control by message memory (spec/stomp.md §8).

Every message the broker holds in memory counts its body bytes until its last queue entry (or
retained-log reference) is gone, or until its queue pages it out (backlog.py) or its log does (a bulk
segment's record, log.py). Paging starts when the
*resident estimate* — those bytes plus :data:`MESSAGE_OVERHEAD` per message, what the objects around a
body cost — passes :data:`PAGE_OUT_AT` of ``max_memory``, so with paging the bytes stay below the limit;
above ``max_memory`` (messages that cannot be paged: shared by several queues, delayed, or refused by a
full disk) the broker stops reading from connections that SEND; below 80 % of it they resume. Only
producers are paused, so consumers keep acknowledging and memory drains.
"""
from __future__ import annotations

import logging
from typing import Any, TYPE_CHECKING, Protocol
from collections.abc import Callable

if TYPE_CHECKING:
    from pymq_server.broker.message import BrokerMessage
    from pymq_server.config import BrokerConfig
    from pymq_server.storage.store import HoldingStore

log = logging.getLogger("pymq.broker")


class Producer(Protocol):
    """A connection whose input flow control can pause (a broker session)."""

    def pause_input(self, reason: str) -> None: ...

    def resume_input(self, reason: str) -> None: ...


#: bytes a message held in memory costs besides its body: the message object and its headers, its queue
#: entry and its place in the ready index (tracemalloc, CPython 3.11: about 1 KiB with four application
#: headers, 0.7 KiB with none)
MESSAGE_OVERHEAD = 1024
#: queues page messages out once the resident estimate passes this share of ``max_memory`` ...
PAGE_OUT_AT = 0.75
#: ... and page them back in while it is below this share (a queue whose consumers wait takes one run
#: more whatever the estimate, so a drain always moves)
PAGE_IN_BELOW = 0.6


class MemoryFlow:
    __slots__ = ("config", "store", "call_soon", "held_bytes", "held_messages", "high", "_blocked")

    def __init__(self, config: BrokerConfig, store: HoldingStore,
                 call_soon: Callable[[Callable[[], None]], None]) -> None:
        self.config = config              # max_memory is read live: it may change while the broker runs
        self.store = store
        self.call_soon = call_soon
        self.held_bytes = 0
        self.held_messages = 0
        self.high = False
        self._blocked: set[Producer] = set()

    def held(self, message: BrokerMessage) -> None:
        """A message was placed: its bytes count until :meth:`message_gone`."""
        self.held_bytes += message.size
        self.held_messages += 1
        if not self.high and self.held_bytes > self.config.max_memory:
            self.high = True
            log.warning("message memory above %d bytes: pausing producers", self.config.max_memory)

    def message_gone(self, message: BrokerMessage) -> None:
        """The last entry of ``message`` finished (acked, expired, dead-lettered or purged)."""
        bulk = message.bulk
        if bulk is not None:
            # a row of a bulk block: the block's record carries the figures, and goes with its last row
            if bulk.settle(message):
                self.block_done(bulk)
            elif bulk.stored:
                self.store.block_changed(bulk)
            if message.device is None:
                return
            # a row placed again on its own (a cluster's move to a peer's outbox): its own figures too
        self.store.forget(message)
        # paged_out(), inlined: this runs once per message
        self.held_bytes -= message.size
        self.held_messages -= 1
        if self.high and self.held_bytes < self.config.max_memory * 0.8:
            self._below_high()

    def block_done(self, block: Any) -> None:
        """A bulk block's last row is gone: its record's reference for the queue goes, and the record's
        message object with its last holder (a retained log's segment, other subscriptions' blocks)."""
        self.store.block_done(block)
        holder = block.holder
        holder.refs -= 1
        if not holder.refs:
            self.message_gone(holder)

    # -- paging (backlog.py) -------------------------------------------------------------------------
    def resident(self) -> int:
        """What the messages held in memory cost, estimated."""
        return self.held_bytes + self.held_messages * MESSAGE_OVERHEAD

    def short(self) -> bool:
        """Memory is short: queues page new messages out (asked once per message: resident() inlined)."""
        return self.held_bytes + self.held_messages * MESSAGE_OVERHEAD > self.config.max_memory * PAGE_OUT_AT

    def room(self) -> bool:
        """Memory has room for messages paged back in."""
        return self.resident() < self.config.max_memory * PAGE_IN_BELOW

    def paged_in(self, message: BrokerMessage) -> None:
        """A paged-out message is in memory again (counted as held, without the warnings of held())."""
        self.held_bytes += message.size
        self.held_messages += 1

    def paged_out(self, message: BrokerMessage) -> None:
        """A message left memory: paged out, or gone."""
        self.held_bytes -= message.size
        self.held_messages -= 1
        if self.high and self.held_bytes < self.config.max_memory * 0.8:
            self._below_high()

    def _below_high(self) -> None:
        self.high = False
        log.info("message memory back under %d bytes: resuming producers", self.config.max_memory)
        # resume from the loop, not from inside the dispatch/ack that freed the memory
        self.call_soon(self._resume_producers)

    def block(self, producer: Producer) -> None:
        """Stop taking frames from a producer while message memory is high."""
        if producer not in self._blocked:
            self._blocked.add(producer)
            producer.pause_input("memory")

    def forget(self, producer: Producer) -> None:
        """The producer's connection closed."""
        self._blocked.discard(producer)

    def _resume_producers(self) -> None:
        blocked, self._blocked = self._blocked, set()
        for producer in blocked:
            if self.high:
                self._blocked.add(producer)
            else:
                producer.resume_input("memory")
