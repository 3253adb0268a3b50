"""Message groups in a queue (JMSXGroupID): each group is consumed in order by one consumer at a time.

A group belongs to the consumer that took its first message and stays with it until the consumer leaves or
the producer closes the group (``JMSXGroupSeq: -1``, ActiveMQ's convention); the first message a consumer
gets of a group is flagged ``JMSXGroupFirstForConsumer``. Composed into the queue's dispatcher
(dispatch.py), whose one consumer choice asks :meth:`MessageGroups.allows`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pymq_server.broker.consumer import QueueReader
    from pymq_server.broker.entry import Entry
    from pymq_server.broker.ready import ReadyIndex


class MessageGroups:
    """JMSXGroupID -> the consumer that owns the group (no limit: ActiveMQ's 1024 is a trap)."""

    __slots__ = ("owners", "ready")

    def __init__(self, ready: ReadyIndex) -> None:
        self.owners: dict[str, QueueReader] = {}
        self.ready = ready                  # whose selective scans restart when a group is released

    def allows(self, consumer: QueueReader, group: str) -> bool:
        """Whether ``consumer`` may take a message of ``group``: no other live consumer owns it."""
        owner = self.owners.get(group)
        return owner is None or owner is consumer or not owner.active

    def assign(self, entry: Entry, consumer: QueueReader) -> None:
        """``consumer`` takes ``entry``, a message of a group: it owns the group (flagged when new to it)."""
        group = entry.message.group_id
        assert group is not None            # only grouped entries are assigned
        owner = self.owners.get(group)
        if owner is not consumer:
            self.owners[group] = consumer
            entry.first_in_group = True
        else:
            entry.first_in_group = False
        if entry.message.headers.get("JMSXGroupSeq") == "-1":
            del self.owners[group]          # the producer closed the group (ActiveMQ convention)
            self.ready.epoch += 1

    def leave(self, consumer: QueueReader) -> None:
        """``consumer`` left: its groups move (the next message of each goes to another consumer, flagged)."""
        if self.owners:
            for group in [g for g, c in self.owners.items() if c is consumer]:
                del self.owners[group]
        self.ready.epoch += 1       # entries other consumers rejected for its groups are open again
