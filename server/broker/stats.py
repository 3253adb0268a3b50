"""A queue's figures (the nine metrics of seed 001), kept as they change: reading them never scans."""
from __future__ import annotations


class QueueStats:
    """The nine queue metrics of seed 001, kept incrementally (no scans). The queue updates the depth
    area and the waiting times itself (MessageQueue._depth_delta, _count_delivery): once or twice per message,
    a method call here would cost more than the arithmetic."""

    __slots__ = ("added", "removed", "failed", "expired", "peak_depth", "wait_total", "wait_max",
                 "wait_count", "_depth_area", "_depth_since", "_started", "delivered", "dead_lettered",
                 "dropped", "acknowledged", "acked_upto", "replaced")

    def __init__(self, now: float) -> None:
        self.added = 0
        self.removed = 0
        self.failed = 0
        self.expired = 0
        self.peak_depth = 0
        self.wait_total = 0.0
        self.wait_max = 0.0
        self.wait_count = 0
        self.delivered = 0
        self.dead_lettered = 0
        self.dropped = 0
        self.acknowledged = 0       # completed by a consumer's ack (auto acks included); purges are not
        self.acked_upto = 0         # the last pymq-ack-upto position: a range reader's committed offset
        self.replaced = 0           # last-value queue: waiting messages a newer one of their key replaced
        self._depth_area = 0.0      # integral of depth over time, for the time-weighted average
        self._depth_since = now
        self._started = now

    def average_depth(self, depth: int, now: float) -> float:
        span = now - self._started
        if span <= 0:
            return float(depth)
        return (self._depth_area + depth * (now - self._depth_since)) / span
