"""Virtual hosts: several applications on one broker, each with its own destinations and grants
(spec/stomp.md §1 "Virtual hosts").

A connection's vhost is chosen at CONNECT by the ``host`` header (RabbitMQ's rule, with one difference that
keeps today's clients working: a ``host`` that is a network host name, as stomp.py and most STOMP clients
send, means the default vhost ``/``):

* no ``host``, ``/``, or a value that does not start with ``/`` and is no configured vhost's name (a host
  name such as ``localhost`` or ``127.0.0.1``): the default vhost ``/``, the broker as it always was;
* ``/<name>`` or ``<name>`` of a vhost in the broker's ``vhosts`` setting: that vhost, if the user is
  one of its principals (an administrator always is), else ``access-denied``;
* ``/<name>`` of no configured vhost: ``access-denied`` ("unknown virtual host"), as RabbitMQ refuses one.

Inside the core a vhost's destination is the same destination with the name ``$vh.<vhost>.<name>``
(``/queue/orders`` of vhost ``shop`` is ``/queue/$vh.shop.orders``): the session maps the names a client
sends and the MESSAGE header maps them back, so everything the core keeps by name — queues and topics,
their access lists, durable subscriptions, stored messages and catalog records, sequence numbers, cluster
routes — is apart per vhost and stays apart across restarts and between nodes, and a topic pattern of
one vhost (``$vh.shop.#``) can only match its own vhost's topics. A client never names ``$`` destinations
itself (refused as reserved, in every vhost), so no client reaches another vhost's names.
"""
from __future__ import annotations

import re

import copy

from typing import TYPE_CHECKING, Any
from collections.abc import Iterable, Mapping

from pymq.errors import AccessDenied, DestinationError, PymqError, ResourceLimit

if TYPE_CHECKING:
    from pymq_server.config import VhostConfig

DEFAULT = "/"
#: the first word of a vhost's internal destination names
WORD = "$vh"
PREFIX = WORD + "."
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KINDS = ("/queue/", "/topic/")


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise ValueError(f"virtual host name {name!r} must be 1-64 letters, digits, '_' or '-'")
    return name


def select(host: str | None, configured: Mapping[str, Any]) -> str:
    """The vhost a CONNECT's ``host`` header names (see the module's docstring); AccessDenied for a
    ``/name`` that names no configured vhost."""
    if host is None or host == DEFAULT:
        return DEFAULT
    if host.startswith("/"):
        name = host[1:]
        if name in configured:
            return name
        raise AccessDenied(f"unknown virtual host {host[:80]!r} (spec/stomp.md §1: a host header starting with "
                           f"'/' names a virtual host)", destination="vhost:" + host[:80], permission="connect")
    return host if host in configured else DEFAULT


def check_access(user, vhost: str, principals: list[str]) -> None:
    """AccessDenied unless ``user`` is one of the vhost's principals or an administrator."""
    if "admin" in user.roles:
        return
    mine = {"*", "user:" + user.name, *("role:" + role for role in user.roles)}
    if not mine.intersection(principals):
        raise AccessDenied(f"user '{user.name}' may not connect to virtual host '/{vhost}': not one of its "
                           f"principals", user=user.name, destination="vhost:/" + vhost, permission="connect")


# -- limits (spec/stomp.md §1 "Limits"): each refuses before anything is made ----------------------------

def check_connections(vhost: str, entry: VhostConfig, sessions: Iterable[Any], me: object) -> None:
    """ResourceLimit when ``vhost`` has its ``max_connections`` already (``me`` is the one connecting)."""
    limit = entry.max_connections
    if limit is None:
        return
    held = sum(1 for s in sessions if s is not me and getattr(s, "vhost", DEFAULT) == vhost)
    if held >= limit:
        raise ResourceLimit(f"virtual host '/{vhost}' already has {held} connections (its max_connections is "
                            f"{limit}); try again later", limit="max_connections", vhost=vhost, held=held)


def check_queues(name: str, configured: dict[str, VhostConfig], queues: Iterable[str]) -> None:
    """ResourceLimit when queue ``name`` (a core name) would be one more than its vhost's ``max_queues``.
    Counted when a queue is made, not kept: making a queue is rare, and a count taken from the queues
    themselves cannot drift from them whichever way a queue goes."""
    if not name.startswith(PREFIX):
        return
    dot = name.find(".", len(PREFIX))
    vhost = name[len(PREFIX):dot]
    entry = configured.get(vhost)
    if entry is None or entry.max_queues is None:
        return
    start = name[:dot + 1]
    held = sum(1 for queue in queues if queue.startswith(start))
    if held >= entry.max_queues:
        raise ResourceLimit(f"virtual host '/{vhost}' holds {held} queues (its max_queues is {entry.max_queues}): "
                            f"queue '/queue/{name}' is not made", limit="max_queues", vhost=vhost, held=held,
                            destination="/queue/" + name)


def check_memory(vhost: str, limit: int, held: int, cost: int) -> None:
    """ResourceLimit when a message costing ``cost`` would take ``vhost``'s message memory past its
    ``max_memory`` (``held``: what its messages hold now, MemoryFlow.vhost_memory)."""
    if held + cost > limit:
        raise ResourceLimit(f"virtual host '/{vhost}' holds {held} bytes of message memory (its max_memory is "
                            f"{limit}): a message costing {cost} bytes is refused; consume some first",
                            limit="max_memory", vhost=vhost, held=held)


def same_vhost(client: Any, owner: Any) -> bool:
    """Whether ``client`` may reach a temporary destination of ``owner``'s by its global name: only from the
    owner's vhost (the global name is unique broker-wide, the reach is not); the broker's own SEND (None) and
    a peer node's always."""
    return (client is None or getattr(client, "is_cluster", False)
            or getattr(client, "vhost", DEFAULT) == getattr(owner, "vhost", DEFAULT))


def split(name: str) -> tuple[str, str]:
    """A core queue or topic name as (its vhost's prefix, the name inside the vhost): ``$vh.shop.orders`` is
    (``$vh.shop.``, ``orders``), a default vhost's name ('', name). The broker's names derived from a queue's
    (its dead-letter queue, the expiry queue) are made inside the vhost from the second part."""
    if name.startswith(PREFIX):
        dot = name.find(".", len(PREFIX))
        if dot >= 0:
            return name[:dot + 1], name[dot + 1:]
    return "", name


def prefix(vhost: str) -> str:
    """What a vhost's destination names start with inside the core ('' for the default vhost)."""
    return "" if vhost == DEFAULT else f"{PREFIX}{vhost}."


def check_client_destination(destination: str) -> None:
    """A name a client sends may not start with '$' (the broker's, and every vhost's internal names)."""
    if "$" not in destination:      # every SEND asks: one substring search, not a startswith per kind
        return
    for kind in _KINDS:
        if destination.startswith(kind) and destination.startswith("$", len(kind)):
            raise DestinationError(f"destination {destination!r}: names starting with '$' are reserved for the "
                                   f"broker", destination=destination)


def core_name(destination: str, vh_prefix: str, cluster: bool) -> str:
    """A destination a client sent, checked, as the core names it in the client's vhost (``vh_prefix``),
    or '' when that is the name as sent (the default vhost, the broker's /pymq/ names, temporary ones).
    A cluster node's link (``cluster``) forwards a vhost's messages under their core names already."""
    if destination.startswith("/pymq/"):
        return ""
    if not cluster:
        check_client_destination(destination)
    if vh_prefix:
        core = inside(destination, vh_prefix)
        if core != destination:
            return core
    return ""


def inside(destination: str, vh_prefix: str) -> str:
    """A client's destination in its vhost as the core names it (queues and topics; temporary ones belong to
    their connection, and /pymq/ is the broker's)."""
    for kind in _KINDS:
        if destination.startswith(kind):
            return kind + vh_prefix + destination[len(kind):]
    return destination


def outside(destination: str) -> str:
    """The destination as a client of its vhost names it (the core's name without the vhost's prefix)."""
    for kind in _KINDS:
        if destination.startswith(kind) and destination.startswith(PREFIX, len(kind)):
            rest = destination[len(kind) + len(PREFIX):]
            dot = rest.find(".")
            return kind + rest[dot + 1:] if dot >= 0 else destination
    return destination


def vhost_of(destination: str) -> str:
    """The vhost a core destination belongs to."""
    for kind in _KINDS:
        if destination.startswith(kind) and destination.startswith(PREFIX, len(kind)):
            rest = destination[len(kind) + len(PREFIX):]
            dot = rest.find(".")
            return rest[:dot] if dot >= 0 else DEFAULT
    return DEFAULT


def as_seen_in(exc: PymqError, vh_prefix: str) -> PymqError:
    """``exc`` with the vhost's destinations named as its clients name them (message and fields; a copy)."""
    out = copy.copy(exc)
    for key, value in vars(exc).items():
        if isinstance(value, str) and vh_prefix in value:
            for kind in _KINDS:
                value = value.replace(kind + vh_prefix, kind)
            setattr(out, key, value)
    return out
