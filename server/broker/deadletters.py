"""Dead-letter queue names, part of the destinations layer: which queue each dead-letter queue serves, and
who may make a name one (spec/admin.md, "Ownership and permissions", "Dead-letter names").

A queue's dead letters go to ``<dead_letter_prefix><queue>``.  Under the broker's default prefix
(``queue_defaults.dead_letter_prefix``, ``DLQ.``) that name space is the broker's: every name in it is
system-owned, and only an administrator makes or drops one.  A queue declared with a prefix of its own
makes a name in the space every user shares, so the name is *reserved* for it when it is declared — as
RabbitMQ checks the declarer's permission on a dead-letter exchange when the queue is declared, not when
the first message dies:

* the name must not be taken: no queue of that name (declared, configured, or made by use), no name
  already reserved for another queue, and no system-owned name (under the default prefix, the expiry
  queue) — ``destination-exists``;
* its declarer must be allowed to create that name (``create``), as if declaring it — ``access-denied``;
* the dead-letter queue is then declared with its source (a catalog record naming the queue it serves),
  system-owned and visible from that moment: a later ``create-queue`` of the name, by anyone, an
  administrator included, is ``destination-exists`` naming the queue it serves, so nobody's new queue can
  silently become another user's dead-letter queue (on landed main, bob declared ``ders`` with prefix
  ``or`` and read ``orders`` once an administrator declared it for carol).

A reservation lasts while its source names that prefix or the dead-letter queue exists: dropping the
source leaves its dead-letter queue system-owned, readable by administrators only, until one drops it.
"""
from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from pymq_server.broker import destination as names
from pymq_server.broker import vhosts
from pymq_server.broker.acl import AccessControl, DestinationAcl
from pymq_server.broker.auth import User
from pymq_server.config import BrokerConfig, QueueConfig

from pymq.errors import DestinationExists

if TYPE_CHECKING:
    from collections.abc import Callable

    from pymq_server.broker.queue import MessageQueue
    from pymq_server.storage.store import HoldingStore

log = logging.getLogger("pymq.broker")

_CACHE_LIMIT = 100_000
#: the catalog record's field naming the queue a reserved dead-letter queue serves
SERVES = "dead_letter_of"

#: the settings of a dead-letter queue: it never dead-letters again
DEAD_LETTER_CONFIG = QueueConfig(max_deliveries=0, dead_letter=False)


def dead_letter_name(name: str, prefix: str) -> str:
    """The dead-letter queue of queue ``name`` (a core name; for a subscription, its dotted key) under
    ``prefix``: inside the queue's vhost (``$vh.shop.work`` -> ``$vh.shop.DLQ.work``), and a vhost
    subscription's without the owner's vhost (``sub.shop/app.feed`` of vhost shop -> ``$vh.shop.DLQ.sub.app.feed``)."""
    vh, local = vhosts.split(name)
    return vh + prefix + local


def subscription_key(source: str) -> str:
    """The dotted subscription key a dead-letter queue's source names, as the subscriptions layer keeps it:
    a vhost's ``$vh.shop.sub.app.feed`` is ``sub.shop/app.feed`` (the owner within its vhost, clients.py)."""
    vh, local = vhosts.split(source)
    if vh and local.startswith("sub."):
        return f"sub.{vh[len(vhosts.PREFIX):-1]}/{local[4:]}"
    return source


class DeadLetterNames:
    """The dead-letter names of :class:`~pymq_server.broker.destinations.Destinations` (a part of it)."""

    config: BrokerConfig
    acl: AccessControl
    queues: dict[str, MessageQueue]
    declared: dict[str, dict]
    #: dead-letter queue names reserved by a prefix other than the default one -> the queue they serve
    dead_letter_sources: dict[str, str]
    #: destinations known not to be system-owned (every SEND asks: a set look-up instead of the name
    #: rules); cleared when a reservation is made or ends
    _not_system: set[str]
    subscription_creator: Callable[[str], str | None]
    store: HoldingStore

    if TYPE_CHECKING:
        def create_queue(self, name: str, config: QueueConfig | None = None) -> MessageQueue: ...

        def configured(self, name: str) -> QueueConfig: ...

    def reserve_configured(self) -> None:
        """The dead-letter names of the queues the configuration file sets up: the operator's choice,
        reserved from the start (their queues are made when the first message dies)."""
        for name in self.config.queues:
            target = self.custom_dead_letter_name(name, self.configured(name))
            if target is not None:
                self.dead_letter_sources.setdefault(target, name)

    def system_source(self, destination: str) -> DestinationAcl | None:
        """The access list a system-owned destination inherits (an empty one when it serves nothing
        that exists), or None when ``destination`` is not system-owned."""
        if destination in self._not_system:
            return None
        if not destination.startswith("/queue/"):
            return None
        name = destination[7:]
        vh, local = vhosts.split(name)           # a vhost's dead-letter and expiry queues are its own
        expiry = self.config.expiry_queue
        if expiry and local == expiry:
            return DestinationAcl()
        source = self.dead_letter_sources.get(name)
        if source is None:
            prefix = self.config.queue_defaults.dead_letter_prefix
            if not prefix or not local.startswith(prefix):
                if len(self._not_system) < _CACHE_LIMIT:
                    self._not_system.add(destination)
                return None
            source = vh + local[len(prefix):]
            creator = self.subscription_creator(subscription_key(source))
            if creator is not None:
                return DestinationAcl(creator)
        if source not in self.queues:
            # a queue that does not exist (yet) has no dead letters: nobody but an administrator reads
            # them, so a consumer attached early cannot collect a queue's dead letters once it exists
            return DestinationAcl()
        own = self.acl.acls.get("/queue/" + source)
        return own if own is not None else self.acl.defaults

    def custom_dead_letter_name(self, name: str, config: QueueConfig) -> str | None:
        """The dead-letter queue name ``config`` gives queue ``name`` when it is not under the default
        prefix (None when it is, or when dead letters are dropped)."""
        if not config.dead_letter or config.dead_letter_prefix == self.config.queue_defaults.dead_letter_prefix:
            return None
        return dead_letter_name(name, config.dead_letter_prefix)

    def check_dead_letter_name(self, name: str, config: QueueConfig, user: User | None, *,
                               create_checked: bool = True) -> str | None:
        """Raise unless queue ``name`` may reserve the dead-letter name ``config`` makes (see the module
        docstring); returns that name (None: no custom one).  ``create_checked`` False: only whether the
        name is free (the declarer's own ``create`` is checked later, once the source is allowed)."""
        target = self.custom_dead_letter_name(name, config)
        if target is None or self.dead_letter_sources.get(target) == name:
            return target
        destination = "/queue/" + target
        names.check_name(target, destination)
        taken = self.dead_letter_sources.get(target)
        if taken is not None:
            why = f"it is reserved as the dead-letter queue of '/queue/{taken}'"
        elif target in self.queues or target in self.declared:
            why = "a queue of that name exists"
        elif self.system_source(destination) is not None:
            why = "that name is system-owned (the default dead-letter prefix, the expiry queue)"
        else:
            why = None
        if why is not None:
            if user is None:        # the catalog at start: a declaration accepted once is not refused now
                log.warning("queue '/queue/%s': its dead-letter queue '%s' is not reserved: %s", name,
                            destination, why)
                return None
            raise DestinationExists(f"queue '/queue/{name}': its dead-letter queue would be '{destination}', but "
                                    f"{why}; choose another dead_letter_prefix", destination=destination)
        if user is not None and create_checked:
            self.acl.check_create(user, destination, claim=False)
        return target

    def check_reserved(self, name: str, user: User | None) -> None:
        """A ``create-queue`` of a reserved dead-letter name is refused for everyone who may see it
        (``destination-exists``, naming what it serves; others: ``access-denied`` as for any existing
        queue they may not see)."""
        source = self.dead_letter_sources.get(name)
        if source is None or user is None:
            return
        destination = "/queue/" + name
        self.acl.check_sees(user, destination)
        raise DestinationExists(f"'{destination}' is the dead-letter queue of '/queue/{source}' (its "
                                f"dead_letter_prefix); it cannot be declared as a queue of its own",
                                destination=destination)

    def reserve_dead_letter_name(self, name: str, target: str, *, persist: bool) -> None:
        """Reserve ``target`` as queue ``name``'s dead-letter queue and declare it, system-owned, with a
        catalog record naming its source (what :meth:`check_dead_letter_name` returned)."""
        self.dead_letter_sources[target] = name
        self._not_system.clear()
        if target in self.declared:
            return
        if target not in self.queues:
            self.create_queue(target, DEAD_LETTER_CONFIG)
        record = {"config": DEAD_LETTER_CONFIG.to_dict(), "acl": None, SERVES: name}
        self.declared[target] = record
        if persist:
            self.store.put_meta("queue:" + target, json.dumps(record).encode())

    def restore_reservation(self, name: str, record: dict) -> None:
        """A reserved dead-letter queue's catalog record, at start: the reservation comes back with it."""
        source = record.get(SERVES)
        if isinstance(source, str):
            self.dead_letter_sources[name] = source
            self._not_system.clear()

    def release_dead_letter_names(self, dropped: str) -> None:
        """Queue ``dropped`` is gone: reservations it held end unless their queue exists (which stays
        system-owned, an administrator's to drop); the reservation of ``dropped`` itself, when it was
        a dead-letter queue, ends unless its source still names it."""
        for target, served in list(self.dead_letter_sources.items()):
            if served == dropped and target not in self.queues:
                del self.dead_letter_sources[target]
                self._not_system.clear()
        source = self.dead_letter_sources.get(dropped)
        if source is not None:
            queue = self.queues.get(source)
            if queue is None or self.custom_dead_letter_name(source, queue.config) != dropped:
                del self.dead_letter_sources[dropped]
                self._not_system.clear()
