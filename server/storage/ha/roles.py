"""The roles of a process of a high-availability group and the one table of moves between them
(spec/ha.md §1.1).  Every change of role goes through :func:`move`; a move the table does not list is a
bug that raises, never a silent state."""
from __future__ import annotations

import enum


class Role(enum.Enum):
    BACKUP = "backup"           # waits; the candidate among backups watches the lease
    ACTIVATING = "activating"   # took the store (new epoch written): recovery runs, no STOMP listener yet
    LIVE = "live"               # serves clients, renews the lease
    FENCED = "fenced"           # found its epoch stale: writes nothing, sends nothing, stops
    STOPPED = "stopped"         # a clean stop


MOVES: dict[Role, frozenset[Role]] = {
    Role.BACKUP: frozenset({Role.ACTIVATING, Role.STOPPED}),
    Role.ACTIVATING: frozenset({Role.LIVE, Role.FENCED, Role.STOPPED}),
    Role.LIVE: frozenset({Role.FENCED, Role.STOPPED}),
    Role.FENCED: frozenset({Role.BACKUP, Role.STOPPED}),
    Role.STOPPED: frozenset(),
}


class IllegalRoleMove(RuntimeError):
    def __init__(self, current: Role, wanted: Role) -> None:
        super().__init__(f"a {current.value} cannot become {wanted.value}")
        self.current = current
        self.wanted = wanted


def move(current: Role, wanted: Role) -> Role:
    """``wanted`` when the table allows it from ``current``; IllegalRoleMove otherwise."""
    if wanted not in MOVES[current]:
        raise IllegalRoleMove(current, wanted)
    return wanted
