"""The cluster's state without I/O (server/cluster/state.py and its parts), driven by a fake clock: each
event's actions, for membership (join, expiry, leave, return), queue routing, the filter exchange between
two nodes' states, where durable subscriptions live (held messages on adoption, successors, the
coordinator's rounds). No broker, no store, no socket: the multi-node runs are the other files here."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pymq_server.cluster.actions import (
    Adopt,
    Announce,
    AttachOutbox,
    CheckRedistribution,
    Connect,
    DropAdopted,
    FollowConsumer,
    HeldTransfer,
    MoveOrder,
    PeerDead,
    Reroute,
    SendConsumers,
)
from pymq_server.cluster.records import Hosted, Member
from pymq_server.cluster.state import ClusterState
from pymq_server.config import ClusterConfig

from pymq.errors import ConfigError, PymqError
from pymq.routing import GroupRouter
from pymq.routing.groups import RoutingKey


class FakeClock:
    def __init__(self) -> None:
        self.wall = 1_700_000_000_000
        self.mono = 5_000.0

    def now_ms(self) -> int:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, ms: int) -> None:
        self.wall += ms
        self.mono += ms / 1000


@dataclass
class Store:
    """What the cluster store holds: every node's last beat, the assignment map, the routing keys."""

    clock: FakeClock
    beats: dict[str, int] = field(default_factory=dict)
    hosted: dict[str, Hosted] = field(default_factory=dict)
    routing_keys: dict[str, str] = field(default_factory=dict)
    alive: set[str] = field(default_factory=set)         # nodes that beat before every read

    def beat(self, *nodes: str) -> None:
        for node in nodes:
            self.beats[node] = self.clock.wall

    def members(self) -> list[Member]:
        self.beat(*self.alive)
        return [Member(n, f"127.0.0.1:{6000 + i}", 0, b) for i, (n, b) in enumerate(sorted(self.beats.items()))]


def _state(node: str, clock: FakeClock, local: dict[str, RoutingKey] | None = None,
           hosts: set[str] | None = None, **config) -> ClusterState:
    settings = {"store": "redis://unused", "secret": "s", "heartbeat_ms": 100, "dead_after_ms": 300}
    settings.update(config)
    return ClusterState(node, ClusterConfig(**settings), clock,
                        local_key=lambda name: (local or {}).get(name, RoutingKey.GROUP),
                        hosts_here=lambda key: key in (hosts or set()))


def _read(state: ClusterState, store: Store) -> list:
    return state.read(store.members(), dict(store.hosted), dict(store.routing_keys))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# -- membership ------------------------------------------------------------------------------------------

def test_a_peer_that_beats_is_joined_and_connected_to_and_one_that_stops_is_dead_after_dead_after_ms(clock):
    store = Store(clock)
    n0 = _state("n0", clock)
    store.beat("n0", "n1")
    actions = _read(n0, store)
    assert Connect("n1", "127.0.0.1:6001") in actions
    assert n0.membership.peers == ["n1"] and n0.membership.router.destinations == ("n0", "n1")
    assert n0.topics.peers.targets("anything") == ["n1"]          # match-all until it announces
    n0.link_up("n1")
    for _ in range(2):                                            # n1 stops beating: alive until 300 ms
        clock.advance(100)
        store.beat("n0")
        assert not any(isinstance(a, PeerDead) for a in _read(n0, store))
    clock.advance(100)
    store.beat("n0")
    actions = _read(n0, store)
    assert PeerDead("n1") in actions
    assert n0.membership.dead == {"n1"} and n0.membership.peers == []
    assert n0.ready == set() and n0.topics.peers.peers == ()
    assert n0.membership.router.destinations == ("n0",)
    assert n0.route_queue("q", "/queue/q", {"JMSXGroupID": "g"}, "ID:n0-1", lambda: 0) is None   # alone: local
    clock.advance(100)
    store.beat("n0", "n1")                                        # n1 returns under its id
    actions = _read(n0, store)
    assert Connect("n1", "127.0.0.1:6001") in actions and n0.membership.dead == set()


def test_a_node_that_leaves_is_gone_not_dead_and_only_the_first_read_reroutes_recovered_outboxes(clock):
    store = Store(clock)
    store.beat("n0", "n1", "n2")
    clock.advance(1000)
    store.beat("n0", "n1")                                        # n2 died while n0 was away
    n0 = _state("n0", clock)
    first = _read(n0, store)
    assert Reroute("n2") in first and n0.membership.dead == {"n2"}
    assert Reroute("n2") not in _read(n0, store)                  # only at the first read
    del store.beats["n1"]                                         # n1 left cleanly: its record is gone
    actions = _read(n0, store)
    assert PeerDead("n1") in actions and n0.membership.dead == {"n2"}
    n0.membership.forget("n2")                                    # purge-outbox with forget
    assert n0.membership.dead == set()


def test_a_link_is_ready_between_up_and_down_and_hears_the_filter_and_consumers_first(clock):
    n0 = _state("n0", clock)
    assert n0.link_up("n1") == [Announce(("n1",)), SendConsumers(("n1",)), AttachOutbox("n1")]
    assert n0.ready_peers() == ("n1",)
    n0.link_down("n1")
    assert n0.ready_peers() == ()


def test_the_coordinator_is_the_first_live_node_in_utf8_order(clock):
    store = Store(clock)
    store.beat("b", "a", "\u00e9")
    states = {n: _state(n, clock) for n in ("a", "b", "\u00e9")}
    for state in states.values():
        _read(state, store)
    assert {n: s.membership.coordinator for n, s in states.items()} == {n: "a" for n in states}
    del store.beats["a"]
    _read(states["b"], store)
    assert states["b"].membership.coordinator == "b"


# -- queue routing ------------------------------------------------------------------------------------

def test_keyed_messages_go_to_their_keys_node_and_unkeyed_ones_to_consumers_round_robin(clock):
    store = Store(clock)
    store.beat("n0", "n1", "n2")
    n0 = _state("n0", clock, local={"conv": RoutingKey.CORRELATION_ID, "spread": RoutingKey.MESSAGE_ID})
    _read(n0, store)
    router = GroupRouter(["n0", "n1", "n2"])

    def route(name, headers, mid="ID:n0-1", local=0):
        return n0.route_queue(name, "/queue/" + name, headers, mid, lambda: local)
    for g in (f"g{i}" for i in range(30)):
        expected = router.route(g)
        assert route("q", {"JMSXGroupID": g}) == (None if expected == "n0" else expected)
        assert route("conv", {"JMSXGroupID": g, "correlation-id": "c"}) == route("q", {"JMSXGroupID": g})
    assert route("conv", {"correlation-id": "c7"}) == (None if router.route("c7") == "n0" else router.route("c7"))
    for mid in (f"ID:n0-{i}" for i in range(30)):                 # the id the message is given
        assert route("spread", {}, mid) == (None if router.route(mid) == "n0" else router.route(mid))
    assert route("q", {}) is None                                 # unkeyed, nobody consumes anywhere: here
    n0.control("n1", "consumers", {}, b'{"/queue/q": 2}')
    n0.control("n2", "consumers", {}, b'{"/queue/q": 1}')
    assert route("q", {}) is None                                 # their links are not up yet
    n0.link_up("n1")
    n0.link_up("n2")
    assert [route("q", {}) for _ in range(4)] == ["n1", "n2", "n1", "n2"]
    assert route("q", {}, local=1) is None                        # a local consumer keeps it here
    n0.control("n2", "consumers", {}, b"{}")                      # n2's consumers left
    assert {route("q", {}) for _ in range(4)} == {"n1"}
    assert n0.routes.wants_redistributor("q", "/queue/q", 0)
    assert not n0.routes.wants_redistributor("spread", "/queue/spread", 0)   # all keyed


def test_a_queues_own_routing_key_given_with_the_message_is_taken_without_a_look_up_by_name(clock):
    """The driver holds the queue and passes its own setting (per message: no call back by name); the
    cluster-wide setting declared in the store still wins over it."""
    store = Store(clock, routing_keys={"declared": "message-id"})
    store.beat("n0", "n1", "n2")

    def unasked(name: str) -> RoutingKey:
        raise AssertionError(f"looked up {name} by name")

    n0 = _state("n0", clock)
    n0.routes.local_key = unasked
    _read(n0, store)
    router = GroupRouter(["n0", "n1", "n2"])

    def expected(key: str) -> str | None:
        return None if router.route(key) == "n0" else router.route(key)

    for c in (f"c{i}" for i in range(20)):
        assert n0.route_queue("conv", "/queue/conv", {"correlation-id": c}, "ID:n0-1", lambda: 1,
                              "correlation-id") == expected(c)
        assert n0.route_queue("plain", "/queue/plain", {"correlation-id": c}, "ID:n0-1", lambda: 1, "group") is None
        mid = "ID:n0-" + c
        assert n0.route_queue("declared", "/queue/declared", {"correlation-id": c}, mid, lambda: 1,
                              "correlation-id") == expected(mid)


def test_a_routing_key_declared_anywhere_wins_over_the_local_setting_and_an_unknown_one_is_ignored(clock):
    store = Store(clock, routing_keys={"orders": "correlation-id", "bad": "JMSXGroupID"})
    store.beat("n0", "n1")
    n0 = _state("n0", clock)
    actions = _read(n0, store)
    assert CheckRedistribution(("bad", "orders")) not in actions   # an unknown value counts as not declared
    assert CheckRedistribution(("orders",)) in actions
    assert n0.routes.key_for("orders") is RoutingKey.CORRELATION_ID
    assert n0.routes.key_for("bad") is RoutingKey.GROUP
    assert not any(isinstance(a, CheckRedistribution) for a in _read(n0, store))   # nothing changed
    n0.routes.declare("local", "message-id")
    assert n0.routes.key_for("local") is RoutingKey.MESSAGE_ID
    with pytest.raises(ConfigError):
        n0.routes.declare("worse", "group-id")


# -- the filter exchange -----------------------------------------------------------------------------------

def _exchange(sender: ClusterState, receiver: ClusterState, actions: list) -> None:
    """Deliver ``sender``'s announcement to ``receiver`` if its actions say to announce to it."""
    for action in actions:
        if isinstance(action, Announce) and receiver.node_id in action.peers:
            headers, body = sender.topics.announcement()
            receiver.control(sender.node_id, "filter", headers, body)


def test_two_nodes_exchange_filters_and_forward_only_what_the_other_wants(clock):
    store = Store(clock)
    store.beat("n0", "n1")
    n0, n1 = _state("n0", clock), _state("n1", clock, popular_fraction=1.0)
    _read(n0, store)
    _read(n1, store)
    _exchange(n0, n1, n0.link_up("n1"))
    _exchange(n1, n0, n1.link_up("n0"))
    assert n1.topic_changed("prices.eu", True) and not n1.topic_changed("prices.eu", True)
    actions = n1.announce()
    assert actions == [Announce(("n0",))] and n1.announce() == []      # once per batch of changes
    _exchange(n1, n0, actions)
    assert n0.topic_targets("prices.eu") == (["n1"], [])
    assert n0.topic_targets("prices.us") == ([], [])
    assert n0.figures.forwarded_topic_messages == 1
    stale = n1.topics.announcement()
    n1.topic_changed("prices.eu", False)
    _exchange(n1, n0, n1.announce())
    assert n0.topic_targets("prices.eu") == ([], [])
    n0.control("n1", "filter", *stale)                                 # an older announcement: ignored
    assert n0.topic_targets("prices.eu") == ([], [])
    n0.control("n1", "drop-filter", {}, b"")                           # still a member: match-all again
    assert n0.topic_targets("prices.us") == (["n1"], [])


@pytest.mark.parametrize("lists_patterns", [True, False], ids=["patterns-announced", "earlier-version"])
def test_a_pattern_subscription_is_announced_and_matched_at_the_sender_or_match_all(clock, lists_patterns):
    """spec/routing.md §3.5: a node announces its patterns with its match-all digest; a peer that reads the
    list forwards it only the topics they match (and its topics' bits still count); a node of an earlier
    version, which sends the match-all digest alone, gets every topic message as before."""
    store = Store(clock)
    store.beat("n0", "n1")
    n0, n1 = _state("n0", clock), _state("n1", clock, popular_fraction=1.0)
    n1.topics.announce_patterns = lists_patterns
    _read(n0, store)
    _read(n1, store)
    _exchange(n0, n1, n0.link_up("n1"))
    _exchange(n1, n0, n1.link_up("n0"))
    assert n0.topic_targets("stocks.ibm") == ([], [])                  # n1 wants nothing yet
    assert n1.topic_changed("stocks.*", True, pattern=True) and not n1.topic_changed("stocks.*", True, pattern=True)
    assert n1.topic_changed("bonds.ibm", True)
    _exchange(n1, n0, n1.announce())
    assert n1.status()["filter_patterns"] == ["stocks.*"] and n1.status()["filter_topics"] == ["bonds.ibm"]
    assert n0.topic_targets("stocks.ibm") == (["n1"], [])              # n1 matches the pattern itself
    assert n0.topic_targets("bonds.ibm") == (["n1"], [])               # its topics' bits
    if lists_patterns:
        assert n0.topic_targets("bonds.x") == ([], []) and n0.topic_targets("stocks.a.b") == ([], [])
        assert n0.status()["peer_filters"]["n1"] == {**n0.status()["peer_filters"]["n1"], "match_all": False,
                                                     "patterns": ["stocks.*"]}
    else:
        assert n0.topic_targets("bonds.x") == (["n1"], [])              # match-all, as before
    assert n1.topic_changed("stocks.*", False, pattern=True)
    _exchange(n1, n0, n1.announce())
    assert n0.topic_targets("stocks.ibm") == ([], []) and n1.status()["filter_patterns"] == []
    assert not n0.topics.peer_patterns and n0.topics.peer_patterns.index.patterns() == []


def test_an_announced_pattern_list_that_is_not_one_leaves_the_peer_match_all(clock):
    """Hostile or broken lists: a peer's announcement whose pattern list is not JSON, not a list, holds
    a name that is no pattern, or is over the bounds, is read as match-all (never as wanting nothing)."""
    from pymq_server.cluster.topics import MAX_ANNOUNCED_PATTERNS, PATTERNS_HEADER
    n0 = _state("n0", clock)
    n1 = _state("n1", clock)
    n1.topic_changed("stocks.*", True, pattern=True)
    n1.topics.renew()
    headers, body = n1.topics.announcement()
    assert headers[PATTERNS_HEADER] == '["stocks.*"]'
    n0.topics.peer_joined("n1")
    bad = ["stocks.*", '"stocks.*"', '["stocks.ibm"]', "[1]", '[""]', "{}", "[" * 10_000,
           "[" + ",".join(['"a.*"'] * (MAX_ANNOUNCED_PATTERNS + 1)) + "]"]
    for serial, value in enumerate(bad, start=10):
        assert n0.topics.announced("n1", {**headers, PATTERNS_HEADER: value, "pymq-filter-serial": str(serial)},
                                   body)
        assert n0.topics.targets("bonds.x", {"n0", "n1"}) == ["n1"], value
    # past the bounds a node announces no list at all (the match-all digest alone)
    for i in range(MAX_ANNOUNCED_PATTERNS):
        n1.topic_changed(f"p{i}.*", True, pattern=True)
    n1.topics.renew()
    assert PATTERNS_HEADER not in n1.topics.announcement()[0]


def test_an_overfull_filter_is_regenerated_before_it_is_announced(clock):
    n0 = _state("n0", clock, filter_capacity=50, filter_fpr=0.01)
    n0.link_up("n1")
    for i in range(2000):
        n0.topic_changed(f"t{i}", True)
    assert n0.announce() == [Announce(("n1",))]
    headers, _ = n0.topics.announcement()
    assert int(headers["pymq-filter-epoch"]) >= 1 and int(headers["pymq-filter-serial"]) == 1
    assert n0.topics.filter.measured_fpr() <= 0.02


def test_a_topic_message_goes_to_live_hosts_of_durable_subscriptions_and_is_held_for_dead_ones(clock):
    store = Store(clock, hosted={"sub:a:x": Hosted("n1", {"topic": "news"}),
                                 "sub:b:x": Hosted("n2", {"topic": "news"})})
    store.beat("n0", "n1", "n2")
    n0 = _state("n0", clock)
    _read(n0, store)
    n0.control("n1", "filter", {"pymq-filter-serial": "1"}, _empty_digest())
    n0.control("n2", "filter", {"pymq-filter-serial": "1"}, _empty_digest())
    assert n0.topic_targets("news") == (["n1", "n2"], [])             # named by the map, before any digest
    clock.advance(400)
    store.beat("n0", "n1")
    _read(n0, store)
    assert n0.topic_targets("news") == (["n1"], ["n2"])               # n2 is dead: held for it
    assert n0.topic_targets("sports") == ([], [])



def test_a_topic_message_in_broadcast_mode_goes_to_every_live_peer_and_sorts_nothing_without_hosts(clock):
    """Per topic message (broadcast: ``topic_filtering: false``): every live peer, and no sorting of durable
    hosts when the topic has none (the common case: the C calls made are counted)."""
    import sys
    store = Store(clock, hosted={"sub:a:x": Hosted("n3", {"topic": "news"})})
    store.beat("n0", "n1", "n2", "n3")
    n0 = _state("n0", clock, topic_filtering=False)
    _read(n0, store)
    calls: list[str] = []

    def profile(frame, event, arg) -> None:
        if event == "c_call":
            calls.append(arg.__name__)

    sys.setprofile(profile)
    try:
        answer = n0.topic_targets("prices")
    finally:
        sys.setprofile(None)
    assert answer == (["n1", "n2", "n3"], []) and "sorted" not in calls
    clock.advance(400)
    store.beat("n0", "n1", "n2")
    _read(n0, store)                                                   # n3, a durable host, is dead
    assert n0.topic_targets("news") == (["n1", "n2"], ["n3"]) and n0.topic_targets("prices") == (["n1", "n2"], [])


def _empty_digest() -> bytes:
    from pymq.routing.interest import InterestFilter
    return InterestFilter(100, 0.01).digest().to_bytes()


# -- durable subscriptions ------------------------------------------------------------------------------------

def test_held_messages_follow_a_dead_hosts_subscription_to_its_adopter(clock):
    store = Store(clock, hosted={"sub:a:x": Hosted("n2", {"topic": "news", "selector": "p > 1"}),
                                 "sub:b:x": Hosted("n2", {"topic": "news"}),
                                 "sub:c:x": Hosted("n2", {"topic": "alerts"})})
    store.beat("n0", "n1", "n2")
    n0 = _state("n0", clock)
    _read(n0, store)
    clock.advance(400)
    store.beat("n0", "n1")
    assert not any(isinstance(a, HeldTransfer) for a in _read(n0, store))
    store.hosted["sub:a:x"] = Hosted("n1", {"topic": "news", "selector": "p > 1"})   # adopted by n1
    store.hosted["sub:c:x"] = Hosted("n0", {"topic": "alerts"})                    # and one by n0 itself
    transfers = [a for a in _read(n0, store) if isinstance(a, HeldTransfer)]
    assert transfers == [HeldTransfer("n2", "sub:a:x", "news", "p > 1", "n1", release=False),   # b still wants news
                         HeldTransfer("n2", "sub:c:x", "alerts", None, "n0", release=True)]
    assert not any(isinstance(a, HeldTransfer) for a in _read(n0, store))         # once
    store.hosted["sub:b:x"] = Hosted("n1", {"topic": "news"})                    # n1 adopts a live host's? no:
    store.beat("n2")                                                              # n2 is back first
    assert not any(isinstance(a, HeldTransfer) for a in _read(n0, store))         # a live host's move: not held


def test_a_subscription_claimed_here_is_ours_until_the_store_says_otherwise(clock):
    store = Store(clock)
    store.beat("n0", "n1")
    hosts = {"sub:a:x"}
    n0 = _state("n0", clock, hosts=hosts)
    assert n0.hosting.created_here("sub:a:x") and n0.hosting.ours("sub:a:x")
    _read(n0, store)                                             # the store write is still on its way
    assert n0.hosting.ours("sub:a:x")
    hosts.clear()
    _read(n0, store)                                             # gone here and not in the store: forgotten
    assert not n0.hosting.ours("sub:a:x")
    n0.hosting.quiet.add("sub:b:x")                              # adopting at another node's request
    assert not n0.hosting.created_here("sub:b:x") and not n0.hosting.ours("sub:b:x")
    assert n0.control("n1", "drop-subscription", {"pymq-subscription": "sub:b:x"}, b"") == [DropAdopted("sub:b:x")]
    n0.hosting.created_here("sub:c:x")
    assert n0.control("n1", "drop-subscription", {"pymq-subscription": "sub:c:x"}, b"") == []   # ours: kept
    assert n0.hosting.removed_here("sub:c:x") and not n0.hosting.removed_here("sub:c:x")


@pytest.mark.parametrize("policy", ["balance", "hash", "similar"])
def test_a_leaving_nodes_subscriptions_go_to_the_successor_its_policy_names(clock, policy):
    store = Store(clock, hosted={"sub:o0:x": Hosted("n1", {"topic": "t0"}), "sub:o1:x": Hosted("n1", {"topic": "t0"}),
                                 "sub:o2:x": Hosted("n0", {"topic": "t0"}),
                                 "sub:p0:x": Hosted("n2", {"topic": "t9"}), "sub:p1:x": Hosted("n2", {"topic": "t9"})})
    store.beat("n0", "n1", "n2")
    n0 = _state("n0", clock, assignment=policy)
    _read(n0, store)
    assert n0.hosting.successor("sub:me:x", "t9", []) is None
    successor = n0.hosting.successor("sub:me:x", "t9", ["n1", "n2"])
    if policy == "balance":
        assert successor == "n1"                                  # hosting the fewest (2 each: name order)
    elif policy == "hash":
        assert successor == GroupRouter(["n1", "n2"]).route("me")
    else:
        assert successor == "n2"                                  # the node that stores t9 already


def test_the_coordinator_orders_idle_subscriptions_to_their_policys_node_once_per_interval(clock):
    owners = [f"o{i}" for i in range(12)]
    store = Store(clock, hosted={f"sub:{o}:x": Hosted("n0", {"topic": f"feed.{o}"}) for o in owners},
                  alive={"n0", "n1", "n2"})
    n0 = _state("n0", clock, assignment="hash", rebalance_interval_ms=1000, rebalance_max_moves=100)
    n1 = _state("n1", clock, assignment="hash", rebalance_interval_ms=1000)
    _read(n1, store)
    assert not any(isinstance(a, MoveOrder) for a in _read(n1, store))      # not the coordinator
    assert not any(isinstance(a, MoveOrder) for a in _read(n0, store))      # no link up: alone in placement
    n0.link_up("n1")
    n0.link_up("n2")
    orders = [a for a in _read(n0, store) if isinstance(a, MoveOrder)]
    router = GroupRouter(["n0", "n1", "n2"])
    assert sorted(orders, key=lambda o: o.key) == sorted(
        (MoveOrder(f"sub:{o}:x", "n0", router.route(o)) for o in owners if router.route(o) != "n0"),
        key=lambda o: o.key)
    assert n0.figures.moves_ordered == len(orders) > 0
    clock.advance(500)
    late = next(o for o in (f"late{i}" for i in range(99)) if router.route(o) != "n0")
    store.hosted[f"sub:{late}:x"] = Hosted("n0", {"topic": "feed.late"})
    assert not any(isinstance(a, MoveOrder) for a in _read(n0, store))      # within the interval: no round
    clock.advance(600)
    assert [a for a in _read(n0, store) if isinstance(a, MoveOrder)] == \
        [MoveOrder(f"sub:{late}:x", "n0", router.route(late))]             # the next round: only the new one
    del store.hosted[f"sub:{late}:x"]
    clock.advance(600)
    assert not any(isinstance(a, MoveOrder) for a in _read(n0, store))      # ordered: quiet for 10 intervals
    clock.advance(10_000)
    again = [a for a in _read(n0, store) if isinstance(a, MoveOrder)]
    assert sorted(again, key=lambda o: o.key) == sorted(orders, key=lambda o: o.key)   # not done: once more
    for order in orders:                                                     # done: the map names the targets
        store.hosted[order.key] = Hosted(order.target, store.hosted[order.key].record)
    clock.advance(20_000)
    assert not any(isinstance(a, MoveOrder) for a in _read(n0, store))


def test_max_moves_bounds_a_round_and_stopping_ends_them(clock):
    owners = [f"o{i}" for i in range(40)]
    store = Store(clock, hosted={f"sub:{o}:x": Hosted("n0", {"topic": f"feed.{o}"}) for o in owners},
                  alive={"n0", "n1"})
    n0 = _state("n0", clock, assignment="hash", rebalance_interval_ms=1000, rebalance_max_moves=5)
    n0.link_up("n1")
    assert len([a for a in _read(n0, store) if isinstance(a, MoveOrder)]) == 5
    n0.stopping = True
    clock.advance(2000)
    assert not any(isinstance(a, MoveOrder) for a in _read(n0, store))


# -- control messages ---------------------------------------------------------------------------------------

def test_control_messages_become_actions_and_an_unknown_one_is_refused(clock):
    n0 = _state("n0", clock)
    assert n0.control("n1", "move-subscription", {"pymq-subscription": "sub:a:x"}, b"") == \
        [FollowConsumer("sub:a:x", "n1")]
    assert n0.control("n1", "subscription", {}, b'{"key": "sub:a:x", "topic": "t"}') == \
        [Adopt({"key": "sub:a:x", "topic": "t"})]
    assert n0.control("n1", "move-to", {"pymq-subscription": "sub:a:x", "pymq-target": "n2"}, b"") == \
        [MoveOrder("sub:a:x", "n0", "n2")]
    assert n0.control("n1", "consumers", {}, b'{"/queue/q": 1}') == [CheckRedistribution(None)]
    with pytest.raises(PymqError, match="unknown cluster control destination"):
        n0.control("n1", "promote-me", {}, b"")
