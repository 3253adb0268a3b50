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

from pymq.errors import AccessDenied, DestinationError, PymqError

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


def select(host: str | None, configured: dict[str, list[str]]) -> str:
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


def prefix(vhost: str) -> str:
    """What a vhost's destination names start with inside the core ('' for the default vhost)."""
    return "" if vhost == DEFAULT else f"{PREFIX}{vhost}."


def check_client_destination(destination: str) -> None:
    """A name a client sends may not start with '$' (the broker's, and every vhost's internal names)."""
    for kind in _KINDS:
        if destination.startswith(kind) and destination.startswith("$", len(kind)):
            raise DestinationError(f"destination {destination!r}: names starting with '$' are reserved for the "
                                   f"broker", destination=destination)


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
