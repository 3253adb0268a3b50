"""Issue 11's attacks, tried as the other users would: each one worked on the landed main (792990a).

Queue takeover through create-queue, dead letters read through a pre-declared ``DLQ.<queue>``, a durable
subscription drained through another user's client id (also after a restart), one deleted by a user who
does not own it, a refused browse or ack-up-to that still created the durable subscription it named,
purge with consume alone, and lists and metrics that showed every queue to everyone.
"""
from __future__ import annotations

import uuid

import pytest
import yaml

import pymq
from pymq.errors import AccessDenied
from pymq_server.broker.auth import hash_password
from tests.conftest import RawStomp


def _users(tmp_path) -> str:
    path = tmp_path / "users.yaml"
    path.write_text(yaml.safe_dump({"users": {
        name: {"password": hash_password(f"{name}pw", n=2), "roles": roles}
        for name, roles in (("root", ["admin"]), ("alice", ["app"]), ("bob", ["app"]), ("mallory", []))}}))
    return str(path)


@pytest.fixture
def make_secured(broker_factory, tmp_path):
    users = _users(tmp_path)

    def make(**overrides):
        settings = dict(users_file=users, data_dir=str(tmp_path / "data"),
                        default_permissions={"*": ["produce"], "role:app": ["consume", "browse", "create"]})
        settings.update(overrides)
        return broker_factory(**settings)
    return make


@pytest.fixture
def secured(make_secured):
    return make_secured()


def _conn(b, user, **kw):
    return pymq.connect(b.url, username=user, password=f"{user}pw", **kw)


def _raw(b, user, **headers) -> RawStomp:
    c = RawStomp(b.port)
    frame = c.connect(user, f"{user}pw", **headers)
    c.first = frame
    return c


def _state(b):
    """What an attack must not change (read through the broker's facade only)."""
    def read():
        br = b.broker
        return {"acls": {d: a.to_dict() for d, a in br.acl.acls.items()},
                "declared": dict(br.declared),
                "configs": {n: q.config.to_dict() for n, q in br.queues.items()},
                "durable": sorted(k for t in br.topics.values() for k, s in t.subscriptions.items() if s.durable),
                "topics": sorted(br.topics)}
    return b.call(read)


# -- queue takeover ---------------------------------------------------------------------------------------

def test_create_queue_cannot_take_over_an_auto_created_queue(secured):
    with _conn(secured, "alice") as alice:
        alice.create_session().create_producer(pymq.Queue("orders")).send("order 1")   # auto-created by use
    before = _state(secured)
    with _conn(secured, "mallory") as mallory:
        with pytest.raises(AccessDenied, match="belongs to no user"):
            mallory.queue_manager().create("orders", max_deliveries=1)
    assert _state(secured) == before
    assert secured.call(lambda: secured.broker.queues["orders"].depth) == 1


def test_create_queue_cannot_take_over_a_configured_queue_with_grants(make_secured):
    b = make_secured(queues={"payroll": {"max_deliveries": 5}})
    with _conn(b, "root") as root:
        root.create_session().create_producer(pymq.Queue("payroll")).send("salary")
        root.queue_manager().grant("payroll", "user:alice", "consume")
    before = _state(b)
    with _conn(b, "mallory") as mallory:
        with pytest.raises(AccessDenied):
            mallory.queue_manager().create("payroll", max_deliveries=1)
        with pytest.raises(AccessDenied):
            mallory.queue_manager().drop("payroll")
    with _conn(b, "bob") as bob:                 # create in default_permissions makes new queues, claims none
        with pytest.raises(AccessDenied):
            bob.queue_manager().create("payroll")
    assert _state(b) == before
    # a claim the administrator allowed keeps the grants and the configured settings
    with _conn(b, "root") as root:
        root.queue_manager().grant("payroll", "user:bob", "create")
    with _conn(b, "bob") as bob:
        bob.queue_manager().create("payroll")
    acl = b.call(lambda: b.broker.acl.acls["/queue/payroll"].to_dict())
    assert acl["owner"] == "bob" and "consume" in acl["grants"]["user:alice"]
    assert b.call(lambda: b.broker.queues["payroll"].config.max_deliveries) == 5


def test_a_refused_declaration_creates_nothing(secured):
    before = _state(secured)
    with _conn(secured, "alice") as alice:
        qm = alice.queue_manager()
        with pytest.raises(pymq.errors.ConfigError, match="principal 'everyone'"):
            qm.create("half-made", grants={"everyone": ["consume"]})
        with pytest.raises(pymq.errors.ConfigError, match="unknown permission"):
            qm.create("half-made", grants={"user:bob": ["own"]})
    assert _state(secured) == before


# -- dead letters ------------------------------------------------------------------------------------------

def test_nobody_declares_dlq_of_another_users_queue_and_dead_letters_reach_only_the_owner(secured):
    with _conn(secured, "alice") as alice:
        alice.queue_manager().create("jobs", max_deliveries=1)
    before = _state(secured)
    with _conn(secured, "mallory") as mallory:
        with pytest.raises(AccessDenied, match="system-owned"):
            mallory.queue_manager().create("DLQ.jobs")
    with _conn(secured, "bob") as bob:                   # even with 'create' in the defaults
        with pytest.raises(AccessDenied, match="system-owned"):
            bob.queue_manager().create("DLQ.jobs")
    assert _state(secured) == before
    # subscribing before any dead letter exists is refused too (bob's role may consume by default)
    c = _raw(secured, "bob")
    c.send("SUBSCRIBE", {"destination": "/queue/DLQ.jobs", "id": "1"})
    assert c.read_until_closed()[-1].headers["pymq-code"] == "access-denied"
    # a message dies; its owner reads it from the dead-letter queue, others cannot
    with _conn(secured, "alice") as alice:
        alice.create_session().create_producer(pymq.Queue("jobs")).send("poison")
        session = alice.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(pymq.Queue("jobs"))
        assert consumer.receive(5).text == "poison"
        session.recover()                                # delivery 1 of 1: dead
        dead = alice.create_session().create_consumer(pymq.Queue("DLQ.jobs")).receive(5)
        assert dead is not None and dead.text == "poison"
    with _conn(secured, "mallory") as mallory:
        with pytest.raises(AccessDenied):
            mallory.create_session().create_consumer(pymq.Queue("DLQ.jobs"))
    with _conn(secured, "alice") as alice:               # granting on the source opens its dead letters
        alice.queue_manager().grant("jobs", "user:mallory", "browse")
    with _conn(secured, "mallory") as mallory:
        assert list(mallory.create_session().create_browser(pymq.Queue("DLQ.jobs"))) == []


def test_a_durable_subscriptions_dead_letters_are_its_creators(make_secured):
    b = make_secured(queue_defaults={"max_deliveries": 1})
    with _conn(b, "root") as root:
        root.queue_manager().grant("/topic/feed", "role:app", "consume")
    with _conn(b, "alice") as alice:
        session = alice.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        reader = session.create_durable_consumer(pymq.Topic("feed"), "mine")
        with _conn(b, "root") as root:
            root.create_session().create_producer(pymq.Topic("feed")).send("poison")
        assert reader.receive(5).text == "poison"
        session.recover()                                   # its one delivery: dead
    dlq = "DLQ.sub.alice.mine"
    assert b.call(lambda: b.broker.queues[dlq].depth) == 1
    with _conn(b, "bob") as bob:                            # bob may consume the topic, not alice's letters
        with pytest.raises(AccessDenied):
            bob.create_session().create_consumer(pymq.Queue(dlq))
    with _conn(b, "alice") as alice:
        assert alice.create_session().create_consumer(pymq.Queue(dlq)).receive(5).text == "poison"


# -- durable subscriptions ---------------------------------------------------------------------------------

def test_client_id_is_bound_to_its_first_user_and_survives_restart(make_secured, tmp_path):
    b = make_secured()
    with _conn(b, "root") as root:
        root.queue_manager().grant("/topic/news", "role:app", "consume")
    alice = _raw(b, "alice", **{"client-id": "alice-app"})
    assert alice.first.command == "CONNECTED"
    alice.send("SUBSCRIBE", {"destination": "/topic/news", "id": "1", "durable-subscription-name": "feed",
                             "receipt": "s"})
    assert alice.read().command == "RECEIPT"
    alice.close()
    with _conn(b, "root") as root:
        root.create_session().create_producer(pymq.Topic("news")).send("for alice")
    before = _state(b)
    for thief in ("bob", "mallory"):                    # bob may consume the topic; not alice's client id
        c = _raw(b, thief, **{"client-id": "alice-app"})
        assert c.first.command == "ERROR" and c.first.headers["pymq-code"] == "access-denied"
        assert "belongs to user 'alice'" in c.first.headers["message"]
    assert _state(b) == before
    b.stop()
    b2 = make_secured()
    c = _raw(b2, "mallory", **{"client-id": "alice-app"})
    assert c.first.command == "ERROR" and c.first.headers["pymq-code"] == "access-denied"
    alice = _raw(b2, "alice", **{"client-id": "alice-app"})
    alice.send("SUBSCRIBE", {"destination": "/topic/news", "id": "1", "durable-subscription-name": "feed"})
    assert alice.read().body == b"for alice"
    alice.close()


def test_unsubscribe_of_another_users_durable_subscription_is_refused(secured):
    with _conn(secured, "root") as root:
        root.queue_manager().grant("/topic/alerts", "*", "consume")
    alice = _raw(secured, "alice")
    alice.send("SUBSCRIBE", {"destination": "/topic/alerts", "id": "1", "durable-subscription-name": "ops",
                             "shared": "true", "receipt": "s"})
    assert alice.read().command == "RECEIPT"
    alice.send("UNSUBSCRIBE", {"id": "1", "receipt": "u"})      # detach; the subscription stays
    assert alice.read().command == "RECEIPT"
    alice.close()
    before = _state(secured)
    assert "sub:shared:ops" in before["durable"]
    c = _raw(secured, "mallory")
    c.send("UNSUBSCRIBE", {"id": "x", "pymq-durable-name": "ops", "shared": "true"})
    err = c.read_until_closed()[-1]
    assert err.command == "ERROR" and err.headers["pymq-code"] == "access-denied"
    c = _raw(secured, "mallory")                               # nor attach to it
    c.send("SUBSCRIBE", {"destination": "/topic/alerts", "id": "1", "durable-subscription-name": "ops",
                         "shared": "true"})
    assert c.read_until_closed()[-1].headers["pymq-code"] == "access-denied"
    assert _state(secured) == before


@pytest.mark.parametrize("how", ["browse", "ack-up-to"])
def test_a_refused_range_read_creates_no_durable_subscription(secured, how):
    topic = f"secret-{uuid.uuid4().hex[:6]}"
    before = _state(secured)
    c = _raw(secured, "mallory")
    if how == "browse":
        c.send("SUBSCRIBE", {"destination": f"/topic/{topic}", "id": "1", "browser": "true",
                             "durable-subscription-name": "collect"})
    else:
        c.send("ACK", {"id": "1", "destination": f"/topic/{topic}", "pymq-ack-upto": "5",
                       "durable-subscription-name": "collect"})
    err = c.read_until_closed()[-1]
    assert err.command == "ERROR" and err.headers["pymq-code"] == "access-denied"
    assert _state(secured) == before                          # no subscription, not even the topic
    with _conn(secured, "root") as root:
        root.create_session().create_producer(pymq.Topic(topic)).send("nobody collects this")
    assert _state(secured)["durable"] == before["durable"]


# -- purge, metrics and lists -----------------------------------------------------------------------------

def test_consume_alone_does_not_purge(secured):
    with _conn(secured, "alice") as alice:
        alice.queue_manager().create("ledger")
        alice.create_session().create_producer(pymq.Queue("ledger")).send("entry")
        alice.queue_manager().grant("ledger", "user:bob", "consume")
    with _conn(secured, "bob") as bob:
        with pytest.raises(AccessDenied, match="'purge'"):
            bob.queue_manager().purge("ledger")
    assert secured.call(lambda: secured.broker.queues["ledger"].depth) == 1
    with _conn(secured, "alice") as alice:
        alice.queue_manager().grant("ledger", "user:bob", "purge")
    with _conn(secured, "bob") as bob:
        assert bob.queue_manager().purge("ledger") == 1


def test_lists_and_metrics_show_only_what_the_user_may_see(secured):
    with _conn(secured, "alice") as alice:
        alice.queue_manager().create("private-books")
    with _conn(secured, "mallory") as mallory:
        qm = mallory.queue_manager()
        assert "private-books" not in [q["name"] for q in qm.list()]
        with pytest.raises(AccessDenied):
            qm.info("private-books")
    with _conn(secured, "alice") as alice:
        assert "private-books" in [q["name"] for q in alice.queue_manager().list()]
