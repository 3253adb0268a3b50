"""Message (queue entry) states and every transition between them — the one table (seed 001).

    SCHEDULED ──due──▶ READY ──acquire──▶ ACQUIRED ──ack──▶ COMPLETED (removed)
                         ▲                   │
                         └──────release──────┤  (NACK / consumer gone / delivery timeout,
                                             │   while deliveries < maximum; count goes up)
                                             └──dead──▶ DEAD (moved to the dead-letter queue)
    READY ──expire──▶ EXPIRED   READY ──purge──▶ COMPLETED   SCHEDULED ──purge──▶ COMPLETED
    ACQUIRED ──expire──▶ EXPIRED (an expired message coming back is not redelivered)

Anything not in the table is a bug in the broker, raised as ``IllegalTransition`` at once instead of
leaving an entry in two places.
"""
from __future__ import annotations

SCHEDULED = "scheduled"
READY = "ready"
ACQUIRED = "acquired"
COMPLETED = "completed"
DEAD = "dead"
EXPIRED = "expired"

TRANSITIONS: dict[tuple[str, str], str] = {
    (SCHEDULED, "due"): READY,
    (SCHEDULED, "purge"): COMPLETED,
    (SCHEDULED, "expire"): EXPIRED,
    (READY, "acquire"): ACQUIRED,
    (READY, "expire"): EXPIRED,
    (READY, "purge"): COMPLETED,
    (READY, "delay"): SCHEDULED,       # a redelivery delay parks a released entry
    (READY, "dead"): DEAD,             # moved by an administrator, or a schema change
    (ACQUIRED, "ack"): COMPLETED,
    (ACQUIRED, "release"): READY,
    (ACQUIRED, "dead"): DEAD,
    (ACQUIRED, "expire"): EXPIRED,
}


class IllegalTransition(RuntimeError):
    pass


def transition(state: str, event: str) -> str:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(f"no transition from {state!r} on {event!r}") from None
