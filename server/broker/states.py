"""Queue-entry states and every transition between them — the one table (seed 001).

    SCHEDULED ──due──▶ READY ──acquire──▶ ACQUIRED ──ack──▶ COMPLETED (removed)
                       READY ──pass──▶ COMPLETED     (acquire and ack in one step: a new message taken as it
                                                      arrives by a consumer that acknowledges as it is written)
        ▲                ▲ │                 │
        └────delay───────┼─┘                 ├──release──▶ READY   (NACK / consumer gone / delivery timeout,
                         │                   │                      while deliveries < maximum; count goes up)
                         │                   └──dead──▶ DEAD      (moved to the dead-letter queue)
    READY, SCHEDULED, ACQUIRED ──expire──▶ EXPIRED   (an expired message coming back is not redelivered)
    READY, SCHEDULED ──purge──▶ COMPLETED            (purge, ack up to a sequence number, drop-oldest)
    READY ──dead──▶ DEAD                             (moved by an administrator, or a schema change)
    READY, SCHEDULED ──replace──▶ COMPLETED          (last-value queue: a newer message of the same key)

Every change of an entry's state is ``entry.state = transition(entry.state, event)``: anything not in the
table is a bug in the broker, raised as :class:`IllegalTransition` at once instead of leaving an entry in
two places (a message acknowledged twice, or delivered after it expired). States and events are string
enums: they print as their names and hash as strings, in C (pymq.enums), so a lookup costs what a
string key costs.
"""
from __future__ import annotations

from typing import Final
from collections.abc import Mapping

from pymq import enums


class EntryState(enums.StrEnum):
    SCHEDULED = "scheduled"      # waiting for its delivery time (AMQ_SCHEDULED_*, redelivery delay)
    READY = "ready"              # in the ready index, deliverable
    ACQUIRED = "acquired"        # delivered, waiting for its ACK or NACK
    COMPLETED = "completed"      # acknowledged or purged: gone
    DEAD = "dead"                # moved to its dead-letter queue: gone from this one
    EXPIRED = "expired"          # its time passed: gone (moved to the expiry queue if one is set)

    def __str__(self) -> str:
        return self.value


class Event(enums.StrEnum):
    DUE = "due"
    ACQUIRE = "acquire"
    PASS = "pass"                # the pass-through: acquired and acknowledged at once (queue._pass)
    ACK = "ack"
    RELEASE = "release"
    DELAY = "delay"
    DEAD = "dead"
    EXPIRE = "expire"
    PURGE = "purge"
    REPLACE = "replace"

    def __str__(self) -> str:
        return self.value


SCHEDULED, READY, ACQUIRED = EntryState.SCHEDULED, EntryState.READY, EntryState.ACQUIRED
COMPLETED, DEAD, EXPIRED = EntryState.COMPLETED, EntryState.DEAD, EntryState.EXPIRED
#: states an entry never leaves
FINAL: Final = frozenset({COMPLETED, DEAD, EXPIRED})

TRANSITIONS: Final[Mapping[tuple[EntryState, Event], EntryState]] = {
    (SCHEDULED, Event.DUE): READY,
    (SCHEDULED, Event.PURGE): COMPLETED,
    (SCHEDULED, Event.EXPIRE): EXPIRED,
    (READY, Event.ACQUIRE): ACQUIRED,
    (READY, Event.PASS): COMPLETED,        # a client's auto-ack consumer takes a new message as it arrives
    (READY, Event.EXPIRE): EXPIRED,
    (READY, Event.PURGE): COMPLETED,
    (READY, Event.DELAY): SCHEDULED,       # a redelivery delay parks a released entry
    (READY, Event.DEAD): DEAD,
    (READY, Event.REPLACE): COMPLETED,     # last-value queue: a newer message of its key arrived
    (SCHEDULED, Event.REPLACE): COMPLETED,
    (ACQUIRED, Event.ACK): COMPLETED,
    (ACQUIRED, Event.RELEASE): READY,
    (ACQUIRED, Event.DEAD): DEAD,
    (ACQUIRED, Event.EXPIRE): EXPIRED,
}

# the same table by event, so a transition is two string-keyed lookups and no tuple
_BY_EVENT: dict[Event, dict[EntryState, EntryState]] = {event: {} for event in Event}
for (_state, _event), _next in TRANSITIONS.items():
    _BY_EVENT[_event][_state] = _next
del _state, _event, _next


class IllegalTransition(RuntimeError):
    def __init__(self, state: EntryState, event: Event) -> None:
        super().__init__(f"no transition from {state} on {event}")
        self.state = state
        self.event = event


def transition(state: EntryState, event: Event) -> EntryState:
    """The state after ``event`` in ``state``; IllegalTransition when the table has no such change."""
    try:
        return _BY_EVENT[event][state]
    except KeyError:
        raise IllegalTransition(state, event) from None
