"""Message rates and a short history of broker figures, for the console's charts and the CLI's lists.

Counters only grow, so a rate is the difference of two samples over the time between them.  The
sampler is sans-IO: :meth:`RateSampler.sample` takes the time and the counters read from the broker,
and the admin layer calls it from a timer.  Rates are computed per counter key and summed, so a queue
that is dropped (its counters gone) or created between two samples never produces a negative rate.
Memory is bounded: the last sample per key, and ``keep`` history points.
"""
from __future__ import annotations

import os
import resource
import sys
import time
from collections import deque
from collections.abc import Mapping

#: seconds between samples, and how many history points are kept (10 minutes)
PERIOD_S = 2.0
KEEP = 300


class RateSampler:
    def __init__(self, keep: int = KEEP) -> None:
        self._last: dict[str, tuple[int, int, int]] = {}      # key -> (in, delivered, acknowledged)
        self._last_at: float | None = None
        self.rates: dict[str, tuple[float, float, float]] = {}   # key -> per-second rates
        self.history: deque[dict] = deque(maxlen=keep)

    def sample(self, now: float, counters: Mapping[str, tuple[int, int, int]], figures: dict,
               wall_ms: int) -> dict:
        """Record one sample: ``counters`` maps a queue/subscription/topic key to its (in, delivered,
        acknowledged) totals; ``figures`` are point-in-time values (depth, connections, memory).
        Returns the history point it appended."""
        rates: dict[str, tuple[float, float, float]] = {}
        totals = [0.0, 0.0, 0.0]
        elapsed = now - self._last_at if self._last_at is not None else 0.0
        if elapsed > 0:
            last = self._last
            for key, values in counters.items():
                before = last.get(key)
                if before is None:
                    continue
                r = tuple(max(0, v - b) / elapsed for v, b in zip(values, before, strict=True))
                rates[key] = r  # type: ignore[assignment]
                for i in range(3):
                    totals[i] += r[i]
        self._last = dict(counters)
        self._last_at = now
        self.rates = rates
        point = {"t": wall_ms, "rate_in": round(totals[0], 3), "rate_out": round(totals[1], 3),
                 "rate_ack": round(totals[2], 3), **figures}
        self.history.append(point)
        return point

    def rate(self, key: str) -> dict:
        r = self.rates.get(key, (0.0, 0.0, 0.0))
        return {"rate_in": round(r[0], 3), "rate_out": round(r[1], 3), "rate_ack": round(r[2], 3)}

    def latest(self) -> dict | None:
        return self.history[-1] if self.history else None


def process_rss() -> int:
    """Resident set size of this process in bytes (Linux: current; elsewhere: the peak)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def wall_ms() -> int:
    return int(time.time() * 1000)
