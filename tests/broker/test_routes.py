"""A connection's kept SEND decisions (routes.py) are dropped when what they depend on changes: a revoked
permission refuses the very next SEND and places nothing, a deleted queue is never written to (the next SEND
makes it again, under the vhost's limits), and every owner of a decision moves the generation."""
from __future__ import annotations

import pytest

from pymq.errors import AccessDenied, ResourceLimit
from pymq_server.broker.acl import DestinationAcl
from pymq_server.broker.auth import User
from pymq_server.broker.routes import MAX_NAME, MAX_ROUTES

from tests.broker.core_harness import Core, FakeClient

ADMIN = User("root", "", frozenset({"admin"}))


def _bob(core: Core) -> FakeClient:
    client = FakeClient(name="bob")
    client.user = User("bob", "", frozenset())          # no role: what the access lists say, nothing more
    core.client = client
    return client


def _waiting(core: Core, name: str) -> int:
    queue = core.broker.destinations.queues.get(name)
    return 0 if queue is None else queue.depth


def test_a_revoked_grant_refuses_the_next_send_and_places_nothing(tmp_path):
    core = Core(tmp_path, memory_only=True, default_permissions={"*": ["create"]})
    try:
        bob = _bob(core)
        acl = core.broker.destinations.acl
        core.queue("orders")
        acl.grant(ADMIN, "/queue/orders", "user:bob", ["produce"])
        core.send("/queue/orders", {})
        core.send("/queue/orders", {})
        assert "/queue/orders" in bob.routes            # the decision is kept ...
        acl.revoke(ADMIN, "/queue/orders", "user:bob", ["produce"])
        with pytest.raises(AccessDenied):
            core.send("/queue/orders", {})              # ... and dropped with the grant
        assert _waiting(core, "orders") == 2
    finally:
        core.close()


def test_a_reload_of_the_default_permissions_refuses_the_next_send(tmp_path):
    core = Core(tmp_path, memory_only=True)            # everyone may produce anywhere (the open defaults)
    try:
        _bob(core)
        core.send("/queue/orders", {})
        core.send("/topic/prices", {})
        # what reloading.py does with a users file's new default_permissions
        core.broker.destinations.acl.defaults = DestinationAcl(None, {"*": {"consume"}})
        for destination in ("/queue/orders", "/topic/prices"):
            with pytest.raises(AccessDenied):
                core.send(destination, {})
        assert _waiting(core, "orders") == 1
    finally:
        core.close()


def test_a_dropped_queue_is_made_again_by_the_next_send_not_written_to(tmp_path):
    core = Core(tmp_path, memory_only=True)
    try:
        core.send("/queue/orders", {"n": "1"})
        destinations = core.broker.destinations
        dropped = destinations.queues["orders"]
        assert destinations.drop_queue("orders", ADMIN) == 1
        core.send("/queue/orders", {"n": "2"})
        again = destinations.queues["orders"]
        assert again is not dropped and dropped.depth == 0
        assert [e.message.headers["n"] for e in again.ready] == ["2"]
    finally:
        core.close()


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_a_destination_deleted_while_idle_is_made_again_by_the_next_send(tmp_path, kind):
    core = Core(tmp_path, memory_only=True, auto_delete_idle_ms=1000)
    try:
        destinations = core.broker.destinations
        made = destinations.queues if kind == "queue" else destinations.topics
        core.send(f"/{kind}/prices", {"n": "1"})        # (a topic nobody subscribes to keeps nothing)
        old = made["prices"]
        if kind == "queue":
            old.purge()
        for now in (0, 1000):                           # idle and empty for auto_delete_idle_ms: deleted
            destinations.reclaim_idle(now, lambda destination: False)
        assert "prices" not in made
        core.send(f"/{kind}/prices", {"n": "2"})
        assert made["prices"] is not old
        if kind == "queue":
            assert [e.message.headers["n"] for e in made["prices"].ready] == ["2"] and old.depth == 0
        else:
            assert made["prices"].published == 1 and old.published == 1
    finally:
        core.close()


def test_a_dropped_queue_of_a_full_vhost_is_refused_by_its_max_queues(tmp_path):
    core = Core(tmp_path, memory_only=True, vhosts={"shop": {"principals": ["*"], "max_queues": 1}})
    try:
        core.send("/queue/$vh.shop.a", {})              # (a session maps /queue/a of vhost shop to this)
        destinations = core.broker.destinations
        destinations.drop_queue("$vh.shop.a", ADMIN)
        core.queue("$vh.shop.b")                        # the vhost's one queue now
        with pytest.raises(ResourceLimit) as refused:
            core.send("/queue/$vh.shop.a", {})
        assert refused.value.limit == "max_queues"
        assert "$vh.shop.a" not in destinations.queues
    finally:
        core.close()


def test_every_owner_of_a_kept_decision_moves_the_generation(tmp_path):
    core = Core(tmp_path, memory_only=True)
    try:
        destinations = core.broker.destinations
        acl = destinations.acl
        generation = core.broker.router.generation
        assert generation is acl.generation is destinations.generation

        def moves(change) -> None:
            before = generation.value
            change()
            assert generation.value > before, change

        moves(lambda: core.queue("orders"))
        moves(lambda: destinations.topic("prices"))
        moves(lambda: acl.grant(ADMIN, "/queue/orders", "user:bob", ["produce"]))
        moves(lambda: acl.revoke(ADMIN, "/queue/orders", "user:bob", ["produce"]))
        moves(lambda: acl.own("/queue/orders", "bob"))
        moves(lambda: acl.forget("/queue/orders"))
        moves(lambda: setattr(acl, "defaults", DestinationAcl(None, {"*": {"produce"}})))
        moves(lambda: destinations.drop_queue("orders", ADMIN))
        client = FakeClient()
        client.temp_queue = lambda local, create=True: None          # type: ignore[method-assign]
        queue = None

        def make() -> None:
            nonlocal queue
            queue = destinations.create_temp_queue(client, "answers")
        moves(make)
        moves(lambda: destinations.orphan_temp_queues("c1-x", {"answers": queue}))
        moves(lambda: destinations.adopt_temp_queues("c1-x", client))
        moves(lambda: destinations.delete_temp_queue(queue))
        moves(lambda: destinations.reserve_dead_letter_name("orders", "Dead.orders", persist=False))
        moves(lambda: core.broker.subscriptions.creators.__setitem__("sub:bob:feed", "bob"))
    finally:
        core.close()


def test_a_long_destination_name_is_decided_each_time_not_kept(tmp_path):
    core = Core(tmp_path, memory_only=True)
    try:
        long_name = "q" * MAX_NAME
        core.queue(long_name)
        core.queue("short")                              # (made first: a SEND that makes one renews the routes)
        core.send(f"/queue/{long_name}", {})
        core.send("/queue/short", {})
        assert list(core.client.routes) == ["/queue/short"]
        assert core.broker.destinations.queues[long_name].depth == 1
    finally:
        core.close()


def test_a_connection_keeps_a_bounded_number_of_routes(tmp_path):
    core = Core(tmp_path, memory_only=True)
    try:
        for i in range(MAX_ROUTES + 10):
            core.queue(f"q{i}")                          # (made first: a SEND that makes one renews the routes)
        for i in range(MAX_ROUTES + 10):
            core.send(f"/queue/q{i}", {})
        assert 0 < len(core.client.routes) <= MAX_ROUTES
    finally:
        core.close()
