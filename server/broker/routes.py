"""What a connection's SENDs to one destination decided, kept until something it depends on changes.

The entry rules of a SEND (router.py: the name resolved, a topic's name publishable, the ``produce``
permission, the entry path, the queue or topic it goes to, made on first use) give the same answer for
every SEND of one connection to one destination as long as the destinations, their access lists, the
default permissions and the owners of temporary queues stay as they are. The router applies the rules to
the first SEND and keeps the outcome (a *route*) in the connection's :class:`Routes`; a later SEND to the
same destination reaches that outcome by one look-up. The rules are written once (router.py): a kept
route is their answer reached sooner, not a second copy of them.

Invalidation is by one :class:`Generation` shared by the owners of what a route depends on; each owner
bumps it on every change, and a connection's :class:`Routes` that is behind it is emptied before it
answers (so a revoked permission refuses the very next SEND, a deleted queue is never written to):

* the destinations layer's names (queues, topics, temporary queues and topics, reserved dead-letter
  names) and the subscriptions layer's durable subscriptions' creators, each a :class:`Watched` dict: any
  change to it bumps;
* the access control (access lists, grants, revokes, the default permissions of a reload: acl.py);
* the owner of a temporary queue (a lost link's queue kept for a re-claim, adopted again: temporary.py).

A connection keeps at most :data:`MAX_ROUTES` routes, each for a name of at most :data:`MAX_NAME` characters
(a client naming ever new or very long destinations holds no more: at most about 100 KiB a connection; a
name not kept is decided by the rules each time, with the same answer).
"""
from __future__ import annotations

from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")

#: routes one connection keeps; past it they are all dropped and made again as SENDs come
MAX_ROUTES = 256
#: the longest destination name a route (or the session's vhost name step) is kept for
MAX_NAME = 200


class Generation:
    """A number that moves whenever a decision a route keeps may have changed."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def bump(self) -> None:
        self.value += 1


class Watched(dict[K, V]):
    """A dict whose every change bumps ``generation`` (reads are the plain dict's, at C speed)."""

    __slots__ = ("generation",)

    def __init__(self, generation: Generation) -> None:
        super().__init__()
        self.generation = generation

    def __setitem__(self, key: K, value: V) -> None:
        self.generation.value += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: K) -> None:
        self.generation.value += 1
        super().__delitem__(key)

    def pop(self, key: K, *default: Any) -> Any:
        self.generation.value += 1
        return super().pop(key, *default)

    def popitem(self) -> tuple[K, V]:
        self.generation.value += 1
        return super().popitem()

    def setdefault(self, key: K, default: Any = None) -> Any:
        self.generation.value += 1
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.generation.value += 1
        super().update(*args, **kwargs)

    def clear(self) -> None:
        self.generation.value += 1
        super().clear()


class Routes(dict[str | tuple[str], Any]):
    """One connection's routes: destination (a peer's forwarded SENDs: ``(destination,)``) -> what the router
    decided for it, valid while ``generation`` is the shared one's value (the router checks, and empties it
    when behind)."""

    __slots__ = ("generation",)

    def __init__(self) -> None:
        super().__init__()
        self.generation = -1

    def renew(self, generation: int) -> None:
        """Forget every route: what they depend on changed (or they are too many)."""
        self.clear()
        self.generation = generation
