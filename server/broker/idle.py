"""Auto-delete: which queues and topics created by use have been idle and empty long enough to go.

A queue is idle while it has no consumer and no message and nothing is added to it or delivered from it; a
topic while it has no subscription, no retained log and nothing is published to it. The watch is told what
the broker has at each housekeeping round (every second) and answers with the names whose idle time reached
the limit (``auto_delete_idle_ms``): activity between two rounds counts, so a busy queue that happens to be
empty at each round is not deleted. What is kept (declared queues, those under ``queues:``) the caller says.
"""
from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Callable, Mapping

if TYPE_CHECKING:
    from pymq_server.broker.queue import MessageQueue
    from pymq_server.broker.topic import Topic


class IdleWatch:
    """("q" | "t", name) -> (idle since, in ms; the activity counter seen then), for idle destinations only."""

    __slots__ = ("_idle",)

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str], tuple[int, int]] = {}

    def due(self, queues: Mapping[str, MessageQueue], topics: Mapping[str, Topic], kept: Callable[[str], bool],
            keeps_log: Callable[[str], bool], now_ms: int, limit_ms: int) -> tuple[list[str], list[str]]:
        """The queue and topic names to delete now (none when ``limit_ms`` is 0: auto-delete is off)."""
        if not limit_ms:
            self._idle.clear()
            return [], []
        seen: dict[tuple[str, str], tuple[int, int]] = {}
        gone_queues = [name for name, queue in queues.items()
                       if not (queue.consumers or queue.depth or kept(name))
                       and self._idle_for(("q", name), queue.stats.added + queue.stats.delivered, now_ms, seen)
                       >= limit_ms]
        gone_topics = [name for name, topic in topics.items()
                       if not (topic.subscriptions or keeps_log(topic.destination))
                       and self._idle_for(("t", name), topic.published, now_ms, seen) >= limit_ms]
        for key in ([("q", n) for n in gone_queues] + [("t", n) for n in gone_topics]):
            del seen[key]
        self._idle = seen          # what is busy again, or gone, is forgotten
        return gone_queues, gone_topics

    def _idle_for(self, key: tuple[str, str], activity: int, now_ms: int,
                  seen: dict[tuple[str, str], tuple[int, int]]) -> int:
        since, before = self._idle.get(key, (now_ms, activity))
        if before != activity:
            since = now_ms
        seen[key] = (since, activity)
        return now_ms - since
