"""A message's place in one queue (:class:`Entry`), and what a queue needs from the broker around it
(:class:`QueueHost`). Kept apart from queue.py so that the queue's module holds its behaviour only."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol
from collections.abc import Callable

from pymq_server.broker.states import READY, EntryState

if TYPE_CHECKING:
    from pymq_server.broker.backlog import Pager
    from pymq_server.broker.consumer import QueueReader
    from pymq_server.broker.flow import MemoryFlow
    from pymq_server.broker.message import BrokerMessage
    from pymq_server.broker.queue import MessageQueue


class Entry:
    """One message's place in one queue."""

    __slots__ = ("message", "queue", "state", "deliveries", "consumer", "token", "enqueued_at",
                 "acquired_at", "stored", "first_in_group")

    def __init__(self, message: BrokerMessage, queue: MessageQueue, now: float, stored: bool = False,
                 deliveries: int = 0) -> None:
        # each field set once, here: a topic message makes one entry per subscription
        self.message = message
        self.queue = queue
        self.state: EntryState = READY
        self.deliveries = deliveries  # deliveries before a restart (recovery, a paged message read back)
        self.consumer: QueueReader | None = None
        self.token: str | None = None     # what the consumer's ACK names (client modes), while acquired
        self.enqueued_at, self.acquired_at = now, 0.0
        self.stored = stored         # holds a storage reference that must be removed when done
        self.first_in_group = False  # the first delivery of its group to a new owner (JMSXGroupFirstForConsumer)
        # counted in the memory flow while it lives (flow.ENTRY_OVERHEAD each): the queue uncounts it when it
        # ends (queue._drop) or pages it out (backlog.Pager)
        queue.flow.entries += 1

    def __repr__(self) -> str:
        return f"<Entry {self.message.message_id} {self.state} in {self.queue.name}>"


class QueueHost(Protocol):
    """What a queue needs from the broker around it: time and timers, its storage references, and what
    happens to a message that leaves it without being acknowledged (the router's moves)."""

    clock: Callable[[], float]                 # monotonic seconds (queue statistics, timeouts)
    now_ms: Callable[[], int]                  # wall-clock milliseconds (expiry, delivery times)

    def schedule_at_ms(self, when_ms: int, fn: Callable[..., None], *args: Any) -> None: ...

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None: ...

    def release_reference(self, message: BrokerMessage, queue: str) -> None: ...     # an entry is done

    def message_gone(self, message: BrokerMessage) -> None: ...     # its last entry or log reference is done


    def on_expired(self, entry: Entry) -> None: ...

    def dead_letter(self, entry: Entry, reason: str) -> None: ...

    def delivered(self, message: BrokerMessage, queue: str, count: int) -> None: ...  # to keep across restarts

    pager: Pager | None                        # paging (backlog.py); None: queues keep every message in memory
    max_decoded: int                           # bytes a stored bulk record may decompress to (max_frame_size)
    flow: MemoryFlow                           # the memory accounting (flow.py): entries count there
