"""The status of a file store, and the one table of the moves between statuses.

A store is **closed** (no files held), **open** (taking messages), or in **fault** (a write or an fsync
failed: it refuses new messages, stops logging, keeps serving reads and applies removals in memory until
a repair's checkpoint brings it back; spec/storage.md §8).  Every change of status goes through
:func:`move`, so a status the table does not list is a bug that raises, never a silent state.  The
status lives on the open store (``state.OpenStore``): a closed device has no open store at all.
"""
from __future__ import annotations

import enum


class StoreStatus(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    FAULT = "fault"


#: status -> the statuses it may move to.  Opening on a full disk is CLOSED -> OPEN -> FAULT (recovery read
#: what it could; the writes after it failed); a repair is FAULT -> OPEN; closing is allowed from either.
MOVES: dict[StoreStatus, frozenset[StoreStatus]] = {
    StoreStatus.CLOSED: frozenset({StoreStatus.OPEN}),
    StoreStatus.OPEN: frozenset({StoreStatus.FAULT, StoreStatus.CLOSED}),
    StoreStatus.FAULT: frozenset({StoreStatus.OPEN, StoreStatus.CLOSED}),
}


class IllegalMove(RuntimeError):
    def __init__(self, current: StoreStatus, wanted: StoreStatus) -> None:
        super().__init__(f"a file store cannot go from {current.value} to {wanted.value}")
        self.current = current
        self.wanted = wanted


def move(current: StoreStatus, wanted: StoreStatus) -> StoreStatus:
    """``wanted`` when the table allows it from ``current``; IllegalMove otherwise."""
    if wanted not in MOVES[current]:
        raise IllegalMove(current, wanted)
    return wanted
