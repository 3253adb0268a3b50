"""Routing primitives of the cluster: the specified group hash, group routing and subscription filters.

- ``group_hash`` / ``murmur3_32``: MurmurHash3 x86_32, the one hash every engine and binding uses.
- ``GroupRouter``: group affinity (seed 003) by ``rendezvous`` (default) or ``modulo``; ``routing_key_of``
  says which of a message's ids (group, correlation id, message id) a destination routes on.
- ``SubscriptionFilter`` / ``BloomDigest``: the counting bloom filter of a node's subscribed topics and
  the bit digest peers exchange (seed 004); ``PeerFilters`` makes the forwarding decision from them.

All of it is sans-IO and specified byte for byte in spec/routing.md, with vectors in spec/vectors/.
"""
from pymq.routing.bloom import (
    HASH_VERSION,
    IMPLEMENTATIONS,
    BloomDigest,
    SubscriptionFilter,
    bloom_indexes,
    group_hash,
    hash_pair,
    murmur3_32,
    optimal_parameters,
)
from pymq.routing.forwarding import PeerFilters
from pymq.routing.groups import (
    KEY_HEADERS,
    GroupRouter,
    MessageKey,
    RoutingKey,
    RoutingStrategy,
    parse_routing_key,
    rendezvous_score,
    route_modulo,
    route_rendezvous,
    routing_key_of,
    sort_destinations,
)

__all__ = [
    "HASH_VERSION", "IMPLEMENTATIONS", "BloomDigest", "SubscriptionFilter", "bloom_indexes", "group_hash",
    "hash_pair", "murmur3_32", "optimal_parameters", "PeerFilters", "GroupRouter", "RoutingStrategy",
    "RoutingKey", "MessageKey", "KEY_HEADERS", "parse_routing_key", "routing_key_of",
    "rendezvous_score", "route_modulo", "route_rendezvous", "sort_destinations",
]
