"""Producer flow control by memory (spec/stomp.md §8), and the broker's estimate of what it holds.

Every message the broker holds in memory counts its body bytes until its last queue entry (or
retained-log reference) is gone, or until its queue pages it out (backlog.py) or its log does (a bulk
segment's record, log.py). *Message memory* adds what the objects around the bodies cost:
:data:`MESSAGE_OVERHEAD` per message and :data:`ENTRY_OVERHEAD` per queue entry in memory (a topic message
held for 20,000 subscriptions is one body and 20,000 entries). Above ``max_memory`` of it (what cannot be
paged: messages shared by several queues, delayed ones, a full disk) the broker stops reading from
connections that SEND; below 80 % of it they resume. Only producers are paused, so consumers keep
acknowledging and memory drains.

What clients hold besides messages (``client_bytes``: subscriptions and their selectors, temporary
destinations, browse ids, open transactions' frames; budgets.py charges them) does not drain that way, so
it never pauses producers: it is bounded instead — per connection, per user, and for all clients together by
:meth:`MemoryFlow.client_limit` (half of ``max_memory``) — and a request over a bound is refused. It counts
in the *resident estimate* (message memory plus ``client_bytes``), whose passing :data:`PAGE_OUT_AT` of
``max_memory`` makes queues page. So the broker holds at most ``max_memory`` of message memory and half as
much again for clients.
"""
from __future__ import annotations

import logging
from typing import Any, TYPE_CHECKING, Protocol
from collections.abc import Callable

from pymq_server.broker.vhosts import PREFIX as VHOST_MARK     # a virtual host's names hold it after their kind

if TYPE_CHECKING:
    from pymq_server.broker.message import BrokerMessage
    from pymq_server.config import BrokerConfig
    from pymq_server.storage.store import HoldingStore

log = logging.getLogger("pymq.broker")


class Producer(Protocol):
    """A connection whose input flow control can pause (a broker session)."""

    def pause_input(self, reason: str) -> None: ...

    def resume_input(self, reason: str) -> None: ...


#: bytes a message held in memory costs besides its body and its queue entries: the message object and its
#: headers (tracemalloc, CPython 3.11: about 0.7 KiB with four application headers)
MESSAGE_OVERHEAD = 768
#: bytes one queue entry in memory costs: the entry, its place in the ready index or a backlog run, its
#: storage reference (tracemalloc, CPython 3.11: 168 bytes for a non-persistent topic message's entry in a
#: subscription, 238-265 for a persistent one's; tests/broker/test_costs.py keeps the figures honest)
ENTRY_OVERHEAD = 320
#: queues page messages out once the resident estimate passes this share of ``max_memory`` ...
PAGE_OUT_AT = 0.75
#: ... and page them back in while it is below this share (a queue whose consumers wait takes one run
#: more whatever the estimate, so a drain always moves)
PAGE_IN_BELOW = 0.6
#: what all clients together may hold besides messages: this share of ``max_memory`` ...
CLIENT_SHARE = 0.5
#: ... but at least this much (a broker given a few hundred KiB of ``max_memory``, in tests, still takes a
#: handful of subscriptions)
CLIENT_FLOOR = 8 * 1024 * 1024


class MemoryFlow:
    __slots__ = ("config", "store", "call_soon", "held_bytes", "held_messages", "entries", "client_bytes", "high",
                 "_blocked", "vhost_memory")

    def __init__(self, config: BrokerConfig, store: HoldingStore,
                 call_soon: Callable[[Callable[[], None]], None]) -> None:
        self.config = config              # max_memory is read live: it may change while the broker runs
        self.store = store
        self.call_soon = call_soon
        self.held_bytes = 0
        self.held_messages = 0
        self.entries = 0                  # queue entries in memory (entry.Entry counts itself; queues uncount)
        self.client_bytes = 0             # what clients hold besides messages (budgets.py)
        self.high = False
        self._blocked: set[Producer] = set()
        #: virtual host -> the message memory its messages hold (bodies + MESSAGE_OVERHEAD each, in memory: as
        #: held_bytes counts them), what its ``max_memory`` bounds (vhosts.py); None on a broker without vhosts
        self.vhost_memory: dict[str, int] | None = {} if config.vhosts else None

    def held(self, message: BrokerMessage) -> None:
        """A message was placed: its bytes count until :meth:`message_gone`."""
        self.held_bytes += message.size
        self.held_messages += 1
        if self.vhost_memory is not None and VHOST_MARK in message.destination:
            self._vhost(message, 1)
        if not self.high and (self.held_bytes + self.held_messages * MESSAGE_OVERHEAD
                              + self.entries * ENTRY_OVERHEAD) > self.config.max_memory:   # messages(), inlined
            self._above_high()

    def entry_freed(self) -> None:
        """While message memory is high, a queue entry ended (acked, expired, dead-lettered, purged) and its
        message is still held by others: the queue uncounted it (``entries``; queue._drop, which calls
        :meth:`message_gone` at the last entry instead), and producers resume below 80 %."""
        if self.high and self.messages() < self.config.max_memory * 0.8:
            self._below_high()      # 19,999 subscriptions of 20,000 read a message: their entries are freed

    # -- what clients hold besides messages (budgets.py) ----------------------------------------------
    def client_limit(self) -> int:
        """What all clients together may hold besides messages."""
        return max(int(self.config.max_memory * CLIENT_SHARE), CLIENT_FLOOR)

    def charge(self, nbytes: int) -> None:
        """A client holds ``nbytes`` more besides messages (checked against :meth:`client_limit` by
        budgets.py first)."""
        self.client_bytes += nbytes

    def release(self, nbytes: int) -> None:
        """A client's holding of ``nbytes`` ended."""
        self.client_bytes -= nbytes

    def _above_high(self) -> None:
        self.high = True
        log.warning("message memory above %d bytes (%d bytes of bodies, %d messages, %d queue entries): "
                    "pausing producers", self.config.max_memory, self.held_bytes, self.held_messages, self.entries)

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
        if self.vhost_memory is not None and VHOST_MARK in message.destination:
            self._vhost(message, -1)
        if self.high and self.messages() < self.config.max_memory * 0.8:
            self._below_high()

    def block_done(self, block: Any) -> None:
        """A bulk block's last row is gone: its record's reference for the queue goes, and the record's
        message object with its last holder (a retained log's segment, other subscriptions' blocks)."""
        self.store.block_done(block)
        holder = block.holder
        holder.refs -= 1
        if not holder.refs:
            self.message_gone(holder)

    def _vhost(self, message: BrokerMessage, sign: int) -> None:
        """``message`` (of a virtual host: its destination is ``/<kind>/$vh.<vhost>.<name>``) entered or
        left memory."""
        destination = message.destination
        start = destination.find(VHOST_MARK) + len(VHOST_MARK)
        vhost = destination[start:destination.find(".", start)]
        memory = self.vhost_memory
        assert memory is not None
        memory[vhost] = memory.get(vhost, 0) + sign * (message.size + MESSAGE_OVERHEAD)

    # -- paging (backlog.py) -------------------------------------------------------------------------
    def messages(self) -> int:
        """Message memory, estimated: what ``max_memory`` bounds by pausing producers."""
        return self.held_bytes + self.held_messages * MESSAGE_OVERHEAD + self.entries * ENTRY_OVERHEAD

    def resident(self) -> int:
        """What the broker holds for messages and clients, estimated (paging starts from it)."""
        return (self.held_bytes + self.held_messages * MESSAGE_OVERHEAD + self.entries * ENTRY_OVERHEAD
                + self.client_bytes)

    def short(self) -> bool:
        """Memory is short: queues page new messages out (asked once per message: resident() inlined)."""
        return (self.held_bytes + self.held_messages * MESSAGE_OVERHEAD + self.entries * ENTRY_OVERHEAD
                + self.client_bytes > self.config.max_memory * PAGE_OUT_AT)

    def room(self) -> bool:
        """Memory has room for messages paged back in."""
        return self.resident() < self.config.max_memory * PAGE_IN_BELOW

    def paged_in(self, message: BrokerMessage) -> None:
        """A paged-out message is in memory again (counted as held, without the warnings of held())."""
        self.held_bytes += message.size
        self.held_messages += 1
        if self.vhost_memory is not None and VHOST_MARK in message.destination:
            self._vhost(message, 1)

    def paged_out(self, message: BrokerMessage) -> None:
        """A message left memory: paged out, or gone."""
        self.held_bytes -= message.size
        self.held_messages -= 1
        if self.vhost_memory is not None and VHOST_MARK in message.destination:
            self._vhost(message, -1)
        if self.high and self.messages() < self.config.max_memory * 0.8:
            self._below_high()

    def _below_high(self) -> None:
        self.high = False
        log.info("message memory back under %d bytes: resuming producers", self.config.max_memory)
        # resume from the loop, not from inside the dispatch/ack that freed the memory
        self.call_soon(self._resume_producers)

    def throttle(self, producer: Producer | None) -> None:
        """A producer's SEND was taken: it pauses if message memory is high (None: the broker's own SEND)."""
        if self.high and producer is not None:
            self.block(producer)

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
