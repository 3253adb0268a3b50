"""The cluster's broker-side parts in process (server/cluster/outboxes.py, redistribution.py): a real broker
core with a cluster node attached whose state is driven by a fake clock and a fake store — no event loop
runs, no link, no store server. What a dead peer's outbox becomes (its queue messages re-routed, its topic
messages held, then sent on to the node that adopts a subscription), the hold cap and the purge, and when a
queue gets a redistributor."""
from __future__ import annotations

import asyncio

import pytest

from pymq_server.cluster.actions import Connect
from pymq_server.cluster.node import ClusterNode
from pymq_server.cluster.records import Hosted, Member
from pymq_server.cluster.registry import ClusterRegistry
from pymq_server.cluster.redistribution import Redistributor
from pymq_server.config import ClusterConfig

from pymq.errors import IllegalStateError
from pymq.routing import GroupRouter
from tests.broker.core_harness import Core
from tests.cluster.test_state import FakeClock, Store


class StoreRegistry(ClusterRegistry):
    """The fake store (test_state.Store) as the node's registry: what the node writes lands in it."""

    def __init__(self, store: Store) -> None:
        super().__init__("test")
        self.store = store

    def beat(self, member: Member) -> None:
        self.store.beats[member.node] = member.beat

    def members(self) -> list[Member]:
        return self.store.members()

    def leave(self, node: str) -> None:
        self.store.beats.pop(node, None)

    def assign(self, subscription: str, node: str | None, record: dict | None = None) -> None:
        if node is None:
            self.store.hosted.pop(subscription, None)
        else:
            self.store.hosted[subscription] = Hosted(node, record)

    def subscriptions(self) -> dict[str, Hosted]:
        return dict(self.store.hosted)

    def set_routing_key(self, queue: str, routing_key: str) -> None:
        self.store.routing_keys[queue] = routing_key

    def routing_keys(self) -> dict[str, str]:
        return dict(self.store.routing_keys)


class Node:
    """A broker core and its cluster node n0, in process; ``read()`` is one heartbeat's read of ``store``."""

    def __init__(self, tmp_path, **config) -> None:
        self.core = Core(tmp_path, node_id="n0")
        self.clock = FakeClock()
        self.store = Store(self.clock)
        self.loop = asyncio.new_event_loop()
        settings = {"store": "redis://unused", "secret": "s", "heartbeat_ms": 100, "dead_after_ms": 300}
        settings.update(config)
        self.node = ClusterNode(self.core.broker, ClusterConfig(**settings), self.loop, "n0", "127.0.0.1:1",
                                clock=self.clock)
        self.node._registry = StoreRegistry(self.store)
        self.core.broker.attach_cluster(self.node)

    def read(self) -> None:
        actions = self.node.state.read(self.store.members(), dict(self.store.hosted), {})
        self.node._act([a for a in actions if not isinstance(a, Connect)])     # no links here

    def settle(self) -> None:
        """Let the store writes the node made in worker threads finish and their callbacks run."""
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.run_until_complete(self.loop.shutdown_default_executor())

    def close(self) -> None:
        self.settle()
        self.core.close()
        self.loop.close()

    def texts(self, queue) -> list[str]:
        return [e.message.body.decode() for e in queue.ready]


@pytest.fixture
def n(tmp_path):
    node = Node(tmp_path)
    yield node
    node.close()


def test_a_dead_peers_queue_messages_are_rerouted_by_their_key_and_its_topic_messages_held(n):
    n.store.beat("n0", "n1", "n2")
    n.store.hosted["sub:w:inbox"] = Hosted("n2", {"topic": "alerts"})
    n.read()
    router3 = GroupRouter(["n0", "n1", "n2"])
    groups = [g for g in (f"g{i}" for i in range(200)) if router3.route(g) == "n2"][:6]
    ids = {g: n.core.send("/queue/orders", {"JMSXGroupID": g}) for g in groups}   # for n2: in its outbox
    n.core.send("/topic/alerts", {"n": "1"})                                      # for n2's durable subscriber
    outbox = n.node.outbox("n2")
    assert len(outbox.ready) == len(groups) + 1
    n.clock.advance(400)
    n.store.beat("n0", "n1")
    n.read()                                                                        # n2 is dead
    router2 = GroupRouter(["n0", "n1"])
    local = {e.message.group_id: e.message.message_id for e in n.core.queue("orders").ready}
    to_n1 = {e.message.group_id: e.message.message_id for e in n.node.outbox("n1").ready
             if e.message.destination == "/queue/orders"}                     # (n1 is match-all for topics)
    assert local.keys() == {g for g in groups if router2.route(g) == "n0"}
    assert to_n1.keys() == {g for g in groups if router2.route(g) == "n1"}
    assert {**local, **to_n1} == ids                                  # each once, under the id it was given
    assert [e.message.destination for e in outbox.ready] == ["/topic/alerts"]     # held for n2's subscriber
    assert n.node.state.figures.rerouted == len(groups)
    assert n.core.send("/topic/alerts", {"n": "2"}) and len(outbox.ready) == 2    # still held for it
    assert n.node.state.figures.held == 1


def test_held_messages_go_on_to_the_adopter_with_the_subscriptions_selector_and_are_released(n):
    n.store.beat("n0", "n1", "n2")
    n.store.hosted["sub:w:inbox"] = Hosted("n2", {"topic": "alerts", "selector": "n > 1"})
    n.store.hosted["sub:v:inbox"] = Hosted("n2", {"topic": "alerts"})
    n.read()
    n.clock.advance(400)
    n.store.beat("n0", "n1")
    n.read()
    ids = [n.core.send("/topic/alerts", {"n": str(i), "pymq-types": "n=i"}) for i in range(4)]
    outbox = n.node.outbox("n2")
    assert len(outbox.ready) == 4
    n.store.hosted["sub:w:inbox"] = Hosted("n1", {"topic": "alerts", "selector": "n > 1"})    # adopted by n1
    n.read()
    copies = [e.message for e in n.node.outbox("n1").ready if "pymq-subscription" in e.message.headers]
    assert [m.message_id for m in copies] == ids[2:]                   # those its selector takes, same ids
    assert all(m.headers["pymq-subscription"] == "sub:w:inbox" for m in copies)
    assert len(outbox.ready) == 4                                      # n2's other subscription wants them
    assert n.node.state.figures.held_transferred == 2
    n.store.hosted["sub:v:inbox"] = Hosted("n0", {"topic": "alerts"})  # adopted here: no subscription here
    n.read()                                                           # (it was dropped meanwhile): nothing
    assert len(outbox.ready) == 0                                      # to copy; nothing of n2's wants alerts


def test_the_hold_cap_refuses_and_counts_and_a_purge_is_only_for_a_node_that_is_not_alive(tmp_path):
    n = Node(tmp_path, held_max_messages=2)
    try:
        n.store.beat("n0", "n1", "n2")
        n.store.hosted["sub:w:inbox"] = Hosted("n2", {"topic": "alerts"})
        n.read()
        n.clock.advance(400)
        n.store.beat("n0", "n1")
        n.read()
        for i in range(5):
            n.core.send("/topic/alerts", {"i": str(i)})
        assert len(n.node.outbox("n2").ready) == 2 and n.node.state.figures.held_refused == 3
        listing = {o["node"]: o for o in n.node.list_outboxes()}
        assert listing["n2"]["state"] == "dead" and listing["n2"]["subscriptions"] == ["sub:w:inbox"]
        with pytest.raises(IllegalStateError):
            n.node.outboxes.purge("n1")                                # alive: it drains to it
        with pytest.raises(IllegalStateError):
            n.node.outboxes.purge("n0")
        assert n.node.outboxes.purge("n2") == 2 and n.node.outbox("n2").depth == 0
    finally:
        n.close()


def test_a_queue_with_no_local_consumer_gets_a_redistributor_while_a_ready_peer_has_consumers(n):
    n.store.beat("n0", "n1")
    n.read()
    queue = n.core.queue("work")
    keyed = next(g for g in (f"g{i}" for i in range(99)) if GroupRouter(["n0", "n1"]).route(g) == "n0")
    n.core.send("/queue/work", {"JMSXGroupID": keyed})
    mid = n.core.send("/queue/work", {})                              # nobody consumes anywhere: stays
    assert len(queue.ready) == 2
    n.node._act(n.node.state.control("n1", "consumers", {}, b'{"/queue/work": 1}'))
    assert not any(isinstance(c, Redistributor) for c in queue.consumers)      # its link is not up
    n.node._act(n.node.state.link_up("n1")[:2])                                # (no outbox reader: no link)
    n.node.redistribution.refresh(None)
    assert any(isinstance(c, Redistributor) for c in queue.consumers)
    assert [e.message.message_id for e in n.node.outbox("n1").ready] == [mid]   # the unkeyed one moved
    assert [e.message.group_id for e in queue.ready] == [keyed]                  # the keyed one stays
    assert n.node.state.figures.redistributed == 1
    n.node._act(n.node.state.control("n1", "consumers", {}, b"{}"))
    assert not any(isinstance(c, Redistributor) for c in queue.consumers)


class FakeLink:
    """A link whose peer confirms every SEND asking for a receipt at once (or, ``confirm`` False, never)."""

    def __init__(self, peer: str, confirm: bool = True, on_send=None) -> None:
        self.peer = peer
        self.ready = True
        self.confirm = confirm
        self.on_send = on_send
        self.sent: list[dict] = []

    def send(self, headers: dict, body: bytes = b"", on_receipt=None) -> None:
        self.sent.append(dict(headers))
        if self.on_send is not None:
            self.on_send(headers)
        if on_receipt is not None and self.confirm:
            on_receipt()

    def close(self) -> None:
        self.ready = False


def _durable(n: Node, key: str, topic: str):
    return n.core.broker.subscriptions.create_durable(n.core.broker.destinations.topic(topic), key, None, False,
                                                      key.split(":")[1], False, key.split(":")[2])


def _moves(link: FakeLink) -> list[str]:
    """The control messages a link carried, but the filter announcements (a new subscription's topic joins
    the filter, announced on the next loop turn)."""
    return [h["destination"] for h in link.sent if h["destination"] != "/pymq/cluster/filter"]


def _copies(n: Node, peer: str) -> list:
    """The hand-over copies (addressed to a subscription) in ``peer``'s outbox; the topic's own messages
    travel there too while the peer has not announced a filter (match-all)."""
    return [e.message for e in n.node.outbox(peer).ready if "pymq-subscription" in e.message.headers]


def _transfer(n: Node, key: str, to: str, drop: bool = True) -> bool:
    assigned = []

    async def assign(key, node, record=None):
        assigned.append((key, node))
    n.node.moves.assign = assign
    done = n.loop.run_until_complete(n.node.moves.transfer(key, to, drop))
    n.assigned = assigned
    return done


def test_an_idle_subscription_moves_with_its_messages_after_the_target_adopted_it(n):
    n.store.beat("n0", "n1")
    n.read()
    sub = _durable(n, "sub:o:inbox", "feed")
    ids = [n.core.send("/topic/feed", {"i": str(i)}) for i in range(3)]
    link = n.node.links["n1"] = FakeLink("n1")
    n.node.state.link_up("n1")
    assert _transfer(n, "sub:o:inbox", "n1")
    assert _moves(link) == ["/pymq/cluster/subscription"]                          # the record first
    assert [m.message_id for m in _copies(n, "n1")] == ids                 # then the messages
    assert n.core.broker.subscriptions.find("sub:o:inbox") is None and sub.queue.depth == 0
    assert n.assigned == [("sub:o:inbox", "n1")] and n.node.state.hosting.assignments["sub:o:inbox"] == "n1"
    assert n.node.state.figures.moved_out == 1 and not n.node.state.hosting.transfers


def test_a_subscription_is_not_moved_while_a_consumer_is_attached_before_or_during_the_adoption(n):
    n.store.beat("n0", "n1")
    n.read()
    sub = _durable(n, "sub:o:inbox", "feed")
    n.core.send("/topic/feed", {})
    n.node.state.link_up("n1")

    class Reader:                     # a consumer of the subscription (enough of one for the checks)
        remote = False
    attach = lambda headers: sub.queue.consumers.append(Reader()) \
        if headers["destination"].endswith("/subscription") else None      # noqa: E731
    link = n.node.links["n1"] = FakeLink("n1", on_send=attach)
    assert not _transfer(n, "sub:o:inbox", "n1")                               # attached during the adoption
    assert _moves(link) == ["/pymq/cluster/subscription", "/pymq/cluster/drop-subscription"]
    assert not _transfer(n, "sub:o:inbox", "n1")                               # attached before: refused
    assert len(_moves(link)) == 2 and n.node.state.figures.moves_refused == 2
    assert n.core.broker.subscriptions.find("sub:o:inbox") is sub and sub.queue.depth == 1
    assert n.assigned == [] and _copies(n, "n1") == []


def test_a_transfer_the_target_never_confirms_changes_nothing(tmp_path):
    n = Node(tmp_path, handover_timeout_s=0.05)
    try:
        n.store.beat("n0", "n1")
        n.read()
        sub = _durable(n, "sub:o:inbox", "feed")
        n.core.send("/topic/feed", {})
        n.node.links["n1"] = FakeLink("n1", confirm=False)
        n.node.state.link_up("n1")
        assert not _transfer(n, "sub:o:inbox", "n1")
        assert n.core.broker.subscriptions.find("sub:o:inbox") is sub and sub.queue.depth == 1
        assert _copies(n, "n1") == [] and not n.node.state.hosting.transfers
    finally:
        n.close()


def test_a_subscription_follows_its_consumer_and_an_adoption_is_announced_at_once(n):
    n.store.beat("n0", "n1")
    n.read()
    _durable(n, "sub:o:inbox", "feed")
    ids = [n.core.send("/topic/feed", {}) for _ in range(2)]
    n.node._act(n.node.state.control("n1", "move-subscription", {"pymq-subscription": "sub:o:inbox"}, b""))
    assert n.core.broker.subscriptions.find("sub:o:inbox") is None
    assert [e.message.message_id for e in n.node.outbox("n1").ready if "pymq-subscription" in e.message.headers] \
        == ids
    link = n.node.links["n1"] = FakeLink("n1")
    n.node.state.link_up("n1")
    serial = n.node.state.topics.serial
    record = {"key": "sub:p:inbox", "topic": "news", "owner": "p", "name": "inbox"}
    n.node._act(n.node.state.control("n1", "subscription", {}, __import__("json").dumps(record).encode()))
    assert n.core.broker.subscriptions.find("sub:p:inbox") is not None
    assert not n.node.state.hosting.ours("sub:p:inbox")                      # the sender records the host
    assert n.node.state.topics.serial == serial + 1 and "news" in n.node.state.topics.filter
    assert link.sent[-1]["destination"] == "/pymq/cluster/filter"             # announced before any receipt
    n.node._act(n.node.state.control("n1", "drop-subscription", {"pymq-subscription": "sub:p:inbox"}, b""))
    assert n.core.broker.subscriptions.find("sub:p:inbox") is None
