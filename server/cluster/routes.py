"""Where a queue message goes in a cluster (spec/cluster.md §4): routing keys, peers' consumers: sans-IO.

* The **routing key** of a queue (spec/routing.md §2.3) is the cluster-wide one when a node declared it
  (the store's map, read with every heartbeat; a local declaration counts at once), else this node's own
  setting for the queue.
* A **keyed** message goes to the node the group router names for its key; an **unkeyed** one stays here
  while the queue has local consumers, or when no peer has any, else goes to a peer with consumers,
  round-robin over the peers whose link is up.
* **Redistribution**: a queue with no local consumer, a peer with consumers for it and a routing key other
  than ``message-id`` (whose messages are all keyed) wants a redistributor (redistribution.py).

Peers tell their consumer counts in a ``/pymq/cluster/consumers`` control message; a dead peer's counts go.
"""
from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

from pymq.errors import PymqError
from pymq.routing.groups import RoutingKey, parse_routing_key, routing_key_of

if TYPE_CHECKING:
    from pymq_server.cluster.members import Membership

log = logging.getLogger("pymq.cluster")

#: a queue's own routing-key setting by its text (read per message: a look-up, not an Enum call)
_SETTINGS: Final = {key.value: key for key in RoutingKey}


class QueueRoutes:
    def __init__(self, node_id: str, local_key: Callable[[str], RoutingKey], membership: Membership,
                 ready: set[str]) -> None:
        self.node_id = node_id
        self.local_key = local_key                      # this node's own setting for a queue (by name)
        self.membership = membership                    # its group router names a keyed message's node
        self.ready = ready                              # peers whose link is up (the state's set, kept current)
        self.routing_keys: dict[str, RoutingKey] = {}   # queue -> routing key, cluster-wide (the store's map)
        self.remote_consumers: dict[str, dict[str, int]] = {}   # queue destination -> peer -> consumers
        self._rr = itertools.count()

    # -- routing keys ------------------------------------------------------------------------------
    def key_for(self, name: str, local: str | None = None) -> RoutingKey:
        """Which id queue ``name`` routes on: the cluster-wide setting if one was declared, else this node's
        (``local``, the queue's own setting when the caller holds the queue: per message, no look-up by name)."""
        key = self.routing_keys.get(name)
        if key is not None:
            return key
        return self.local_key(name) if local is None else _SETTINGS[local]

    def declare(self, name: str, routing_key: str) -> RoutingKey:
        """Queue ``name`` was declared here with an explicit routing key (raises ConfigError if unknown)."""
        key = self.routing_keys[name] = parse_routing_key(routing_key)
        return key

    def apply(self, raw: Mapping[str, str]) -> set[str]:
        """The store's map, read again: the queues whose routing key changed."""
        keys = {}
        for queue, value in raw.items():
            try:
                keys[queue] = parse_routing_key(value)
            except PymqError:
                log.error("cluster store: queue %s has an unknown routing key %r; routing on groups", queue, value)
        changed = {q for q in set(keys) | set(self.routing_keys) if keys.get(q) != self.routing_keys.get(q)}
        self.routing_keys = keys
        return changed

    def message_key(self, name: str, group_id: str | None, correlation_id: str | None,
                    message_id: str | None) -> str | None:
        picked = routing_key_of(self.key_for(name), group_id=group_id, correlation_id=correlation_id,
                                message_id=message_id)
        return None if picked is None else picked.key

    # -- where a message goes ---------------------------------------------------------------------------
    def route(self, name: str, destination: str, headers: Mapping[str, str], message_id: str,
              has_local_consumer: Callable[[], bool], local: str | None = None) -> str | None:
        """The peer a new message for queue ``name`` goes to, or None to keep it here.
        ``has_local_consumer`` is asked only for an unkeyed message (it looks at the queue's consumers);
        ``local``: the queue's own routing key setting (see :meth:`key_for`). Alone, every key's node is this
        one and no peer has consumers: None, without a test here (the driver asks ``alone`` first, per
        message)."""
        key = routing_key_of(self.key_for(name, local), group_id=headers.get("JMSXGroupID"),
                             correlation_id=headers.get("correlation-id"), message_id=message_id)
        if key is not None:
            target = self.membership.router.route(key.key)
            return None if target == self.node_id else target
        if has_local_consumer():
            return None
        return self.consumer_peer(destination)

    def consumer_peer(self, destination: str) -> str | None:
        """A peer whose link is up with consumers for this queue, round-robin; None when there is none."""
        per_peer = self.remote_consumers.get(destination)
        if not per_peer:
            return None
        peers = sorted(p for p, n in per_peer.items() if n > 0 and p in self.ready)
        if not peers:
            return None
        return peers[next(self._rr) % len(peers)]

    def wants_redistributor(self, name: str, destination: str, local_consumers: int) -> bool:
        return self.key_for(name) is not RoutingKey.MESSAGE_ID and not local_consumers \
            and self.consumer_peer(destination) is not None

    # -- what peers tell -------------------------------------------------------------------------------
    def consumers_of(self, peer: str, counts: Mapping[str, int]) -> None:
        """``peer``'s consumer counts, replacing what it said before."""
        self.drop_peer(peer)
        for destination, n in counts.items():
            self.remote_consumers.setdefault(destination, {})[peer] = int(n)

    def drop_peer(self, peer: str) -> None:
        for per_peer in self.remote_consumers.values():
            per_peer.pop(peer, None)
