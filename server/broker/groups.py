"""Message groups in a queue (JMSXGroupID): each group is consumed in order by one consumer at a time.

A part of :class:`~pymq_server.broker.queue.MessageQueue` (its base class), kept apart so each file reads
as one concern. A group belongs to the consumer that took its first ready message and stays with it
until the consumer leaves or the producer closes the group (``JMSXGroupSeq: -1``, ActiveMQ's
convention); the first message a consumer gets of a group is flagged ``JMSXGroupFirstForConsumer``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pymq_server.broker.entry import Entry
    from pymq_server.broker.ready import ReadyIndex


class MessageGroups:
    ready: ReadyIndex
    group_owners: dict[str, Any]

    def _acceptor(self, consumer):
        """What ``consumer`` may take: its selector's matches, and no message of a group another
        live consumer owns (so each group is consumed in order by one consumer)."""
        owners = self.group_owners
        selector = consumer.selector

        def accept(entry) -> bool:
            message = entry.message
            group = message.group_id
            if group is not None:
                owner = owners.get(group)
                if owner is not None and owner is not consumer and owner.active:
                    return False
            return selector is None or selector.matches(message.selector_values())
        return accept

    def _assign_group(self, entry: Entry, consumer) -> None:
        group = entry.message.group_id
        assert group is not None            # dispatch assigns only grouped entries
        owner = self.group_owners.get(group)
        if owner is not consumer:
            self.group_owners[group] = consumer
            entry.first_in_group = True
        else:
            entry.first_in_group = False
        if entry.message.headers.get("JMSXGroupSeq") == "-1":
            del self.group_owners[group]       # the producer closed the group (ActiveMQ convention)
            self.ready.epoch += 1

    def _groups_leave(self, consumer) -> None:
        """``consumer`` left: its groups move (the next message of each goes to another consumer, flagged)."""
        if self.group_owners:
            for group in [g for g, c in self.group_owners.items() if c is consumer]:
                del self.group_owners[group]
        self.ready.epoch += 1       # entries other consumers rejected for its groups are open again
