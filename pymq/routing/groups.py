"""Group affinity (seed 003): every message of a group goes to the same one of a set of valid destinations.

Two strategies, both specified in spec/routing.md so that every engine and every client binding picks the
same destination for the same key:

- ``modulo`` (the seed's own): sort the destinations by their UTF-8 bytes and take
  ``group_hash(key) mod N``.  Cheap, but when N changes almost every group moves.
- ``rendezvous`` (highest random weight, the default): every destination scores the key with
  ``murmur3_32(key, seed=murmur3_32(destination))``; the highest score wins, ties go to the destination
  first in UTF-8 byte order.  When a destination leaves only its own groups move; when one joins, only the
  groups it now wins move (to it): about 1/N either way.

The key is a group id, or a message id / correlation id when the destination routes on those instead
(``routing_key_of``: a destination's ``routing_key`` setting and a message's ids give the key).  A router
is immutable; membership changes build a new one (``with_destinations``), which costs one hash per
destination.  Sans-IO: nothing here knows about nodes, links or time.
"""
from __future__ import annotations

from types import ModuleType
from typing import NamedTuple, Union
from collections.abc import Callable, Iterable

from pymq import enums
from pymq.errors import ClusterError, ConfigError
from pymq.routing import bloom as _chosen

Key = Union[str, bytes]


class RoutingStrategy(enums.StrEnum):
    RENDEZVOUS = "rendezvous"
    MODULO = "modulo"


class RoutingKey(enums.StrEnum):
    """Which of a message's identifiers a queue routes on across the cluster (seed 003), per destination.

    ``group`` (the default) routes only grouped messages; ``correlation-id`` and ``message-id`` are the
    seed's "trivial modifications ... for performance rather than functional requirements".
    """

    GROUP = "group"
    CORRELATION_ID = "correlation-id"
    MESSAGE_ID = "message-id"


#: the STOMP header each routing key reads (spec/routing.md section 2.3)
KEY_HEADERS: dict[RoutingKey, str] = {
    RoutingKey.GROUP: "JMSXGroupID",
    RoutingKey.CORRELATION_ID: "correlation-id",
    RoutingKey.MESSAGE_ID: "message-id",
}


class MessageKey(NamedTuple):
    """The key a message routes on and where it came from."""

    source: RoutingKey
    key: str


def parse_routing_key(value: RoutingKey | str) -> RoutingKey:
    """A routing-key setting from configuration or a declaration; anything else is a ``ConfigError``."""
    try:
        return RoutingKey(value)
    except ValueError:
        raise ConfigError(f"routing_key must be one of {', '.join(k.value for k in RoutingKey)}, "
                          f"got {value!r}", routing_key=str(value)) from None


def routing_key_of(routing_key: RoutingKey | str, *, group_id: str | None = None,
                   correlation_id: str | None = None,
                   message_id: str | None = None) -> MessageKey | None:
    """The key a message routes on under a destination's ``routing_key`` setting, or None (unkeyed).

    A grouped message always routes on its group, whatever the setting: a group split over two nodes
    would have two consumers, and ordering within a group is a contract, while routing on the other ids
    is only for performance.  Otherwise the setting's identifier is the key when the message has one
    (present counts, even empty: the same rule as ``JMSXGroupID``).  An unkeyed message is placed by the
    cluster's queue rules (local consumers, else a node with consumers).  ``message_id`` is the id the
    accepting node assigns, not a client-supplied header.
    """
    setting = routing_key if isinstance(routing_key, RoutingKey) else parse_routing_key(routing_key)
    if group_id is not None:
        return MessageKey(RoutingKey.GROUP, group_id)
    if setting is RoutingKey.CORRELATION_ID and correlation_id is not None:
        return MessageKey(RoutingKey.CORRELATION_ID, correlation_id)
    if setting is RoutingKey.MESSAGE_ID and message_id is not None:
        return MessageKey(RoutingKey.MESSAGE_ID, message_id)
    return None


def sort_destinations(destinations: Iterable[str]) -> tuple[str, ...]:
    """The canonical destination list: distinct names, ascending by UTF-8 bytes.

    UTF-8 byte order equals code point order, which is not the UTF-16 order of Java/JavaScript string
    comparison; the spec names the bytes so every binding sorts alike.
    """
    names = set()
    for name in destinations:
        if not isinstance(name, str):
            raise TypeError(f"a destination name is a str, not {type(name).__name__}")
        names.add(name)
    if not names:
        raise ClusterError("no valid destination to route to")
    return tuple(sorted(names, key=lambda n: n.encode("utf-8")))


class GroupRouter:
    """Routes a key to one destination of a fixed set; the same key always gets the same destination.

    ``implementation`` selects the hash module (``pymq.routing.bloom.IMPLEMENTATIONS[...]``) for tests and
    benchmarks; by default the compiled one is used when built.
    """

    __slots__ = ("_destinations", "_strategy", "_impl", "_table", "_hash")

    def __init__(self, destinations: Iterable[str],
                 strategy: RoutingStrategy | str = RoutingStrategy.RENDEZVOUS, *,
                 implementation: ModuleType | None = None) -> None:
        try:
            self._strategy = RoutingStrategy(strategy)
        except ValueError:
            raise ConfigError(f"unknown group routing strategy {strategy!r}; "
                              f"expected one of {[s.value for s in RoutingStrategy]}",
                              strategy=str(strategy)) from None
        self._destinations = sort_destinations(destinations)
        self._impl = implementation if implementation is not None else _chosen.implementation
        self._hash: Callable[[Key], int] = self._impl.group_hash
        # Destination hashes are computed once here, so routing a key costs N hashes of the key only.
        self._table: _chosen.RendezvousTable = self._impl.RendezvousTable([self._hash(d) for d in self._destinations])

    @property
    def destinations(self) -> tuple[str, ...]:
        """The valid destinations, distinct and in UTF-8 byte order (the order ``modulo`` indexes)."""
        return self._destinations

    @property
    def strategy(self) -> RoutingStrategy:
        return self._strategy

    def index(self, key: Key) -> int:
        """Position in ``destinations`` of the destination for ``key``."""
        if self._strategy is RoutingStrategy.RENDEZVOUS:
            return self._table.best(key)
        return self._hash(key) % len(self._destinations)

    def route(self, key: Key) -> str:
        """The destination for ``key`` (a group id, message id or correlation id)."""
        if self._strategy is RoutingStrategy.RENDEZVOUS:
            return self._destinations[self._table.best(key)]
        return self._destinations[self._hash(key) % len(self._destinations)]

    def ranking(self, key: Key) -> list[str]:
        """Every destination in order of preference for ``key``; the first is ``route(key)``.

        Rendezvous: descending score, ties by name; the second entry is where the group goes if the
        first leaves.  Modulo: the sorted list rotated to start at the routed index.
        """
        dests = self._destinations
        if self._strategy is RoutingStrategy.RENDEZVOUS:
            scores = self._table.scores(key)
            order = sorted(range(len(dests)), key=lambda i: (-scores[i], i))
            return [dests[i] for i in order]
        start = self._hash(key) % len(dests)
        return list(dests[start:] + dests[:start])

    def scores(self, key: Key) -> dict[str, int]:
        """Rendezvous score of ``key`` at every destination (whatever the strategy)."""
        return dict(zip(self._destinations, self._table.scores(key), strict=True))

    def with_destinations(self, destinations: Iterable[str]) -> GroupRouter:
        """A router over a new destination set (a node joined or left), same strategy and hash module."""
        return GroupRouter(destinations, self._strategy, implementation=self._impl)

    def __len__(self) -> int:
        return len(self._destinations)

    def __contains__(self, destination: object) -> bool:
        return destination in self._destinations

    def __repr__(self) -> str:
        return f"GroupRouter({list(self._destinations)!r}, strategy={self._strategy.value!r})"


def rendezvous_score(destination: str, key: Key) -> int:
    """score(destination, key) = murmur3_32(key, seed=murmur3_32(UTF-8(destination), 0))."""
    return _chosen.murmur3_32(key, _chosen.group_hash(destination))


def route_modulo(key: Key, destinations: Iterable[str]) -> str:
    """One-off ``modulo`` routing (build a GroupRouter to route many keys over the same set)."""
    return GroupRouter(destinations, RoutingStrategy.MODULO).route(key)


def route_rendezvous(key: Key, destinations: Iterable[str]) -> str:
    """One-off ``rendezvous`` routing (build a GroupRouter to route many keys over the same set)."""
    return GroupRouter(destinations, RoutingStrategy.RENDEZVOUS).route(key)
