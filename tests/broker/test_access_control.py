"""Users, roles, per-queue produce/consume/browse permissions, owners granting and revoking (seed 001)."""
from __future__ import annotations

import pytest

import pymq
from pymq.errors import AccessDenied
from pymq_server.broker.auth import save_user
from tests.conftest import RawStomp


@pytest.fixture
def secured(broker_factory, tmp_path):
    users = str(tmp_path / "users.yaml")
    save_user(users, "root", "rootpw", ["admin"])
    save_user(users, "alice", "alicepw", ["apps"])
    save_user(users, "bob", "bobpw", [])
    save_user(users, "carol", "carolpw", ["auditors"])
    # alice's role may declare queues (seed 001's "create" permission); nobody else may
    return broker_factory(users_file=users, default_permissions={"role:admin": ["produce", "consume", "browse"],
                                                                 "role:apps": ["create"]})


def _conn(broker, user):
    return pymq.connect(broker.url, username=user, password=f"{user}pw")


def test_users_file_holds_no_plain_passwords(secured, tmp_path):
    text = (tmp_path / "users.yaml").read_text()
    assert "alicepw" not in text and "scrypt$" in text


def test_owner_grants_and_revokes(secured):
    with _conn(secured, "alice") as alice:
        alice.queue_manager().create("ledger", max_deliveries=3)
        alice.create_session().create_producer(pymq.Queue("ledger")).send("entry")     # owner may
    with _conn(secured, "bob") as bob:
        with pytest.raises(AccessDenied) as info:
            bob.create_session().create_producer(pymq.Queue("ledger")).send("x")
        msg = str(info.value)
        assert "user 'bob'" in msg and "/queue/ledger" in msg and "'produce'" in msg
    with _conn(secured, "bob") as bob:
        with pytest.raises(AccessDenied, match="only its owner 'alice', a holder of 'manage' or an administrator"):
            bob.queue_manager().grant("ledger", "user:bob", "produce")
    with _conn(secured, "alice") as alice:
        alice.queue_manager().grant("ledger", "user:bob", "produce")
        alice.queue_manager().grant("ledger", "role:auditors", "browse")
    with _conn(secured, "bob") as bob:
        bob.create_session().create_producer(pymq.Queue("ledger")).send("from bob")
        with pytest.raises(AccessDenied, match="'consume'"):
            bob.create_session().create_consumer(pymq.Queue("ledger"))
    with _conn(secured, "carol") as carol:
        texts = [m.text for m in carol.create_session().create_browser(pymq.Queue("ledger"))]
        assert texts == ["entry", "from bob"]                # browse does not remove
        with pytest.raises(AccessDenied, match="'produce'"):
            carol.create_session().create_producer(pymq.Queue("ledger")).send("x")
    with _conn(secured, "alice") as alice:
        alice.queue_manager().revoke("ledger", "user:bob", "produce")
        c = alice.create_session().create_consumer(pymq.Queue("ledger"))
        assert [c.receive(5).text, c.receive(5).text] == ["entry", "from bob"]
    with _conn(secured, "bob") as bob:
        with pytest.raises(AccessDenied):
            bob.create_session().create_producer(pymq.Queue("ledger")).send("x")


def test_administrator_may_do_anything_and_drop(secured):
    with _conn(secured, "alice") as alice:
        alice.queue_manager().create("private")
    with _conn(secured, "bob") as bob:
        with pytest.raises(AccessDenied, match="only its owner"):
            bob.queue_manager().drop("private")
    with _conn(secured, "root") as root:
        root.create_session().create_producer(pymq.Queue("private")).send("admin was here")
        assert root.queue_manager().drop("private") == 1


def test_default_permissions_for_auto_created(secured):
    # default_permissions grants only admins: a plain user cannot use a destination nobody owns
    with _conn(secured, "bob") as bob:
        with pytest.raises(AccessDenied, match="user 'bob' may not produce on /queue/anything"):
            bob.create_session().create_producer(pymq.Queue("anything")).send("x")


def test_denied_over_raw_stomp_is_an_error_frame(secured):
    with _conn(secured, "alice") as alice:
        alice.queue_manager().create("owned")
    c = RawStomp(secured.port)
    assert c.connect("bob", "bobpw").command == "CONNECTED"
    c.send("SUBSCRIBE", {"destination": "/queue/owned", "id": "1"})
    err = c.read_until_closed()[-1]
    assert err.command == "ERROR" and err.headers["pymq-code"] == "access-denied"
    assert err.headers["pymq-field-user"] == "bob" and err.headers["pymq-field-permission"] == "consume"


def test_acl_survives_restart(broker_factory, tmp_path):
    users = str(tmp_path / "users.yaml")
    save_user(users, "alice", "alicepw")
    save_user(users, "bob", "bobpw")
    data = str(tmp_path / "d")
    b1 = broker_factory(users_file=users, data_dir=data)
    with _conn(b1, "alice") as alice:
        alice.queue_manager().create("kept")
        alice.queue_manager().grant("kept", "user:bob", "consume")
    b1.stop()
    b2 = broker_factory(users_file=users, data_dir=data)
    with _conn(b2, "bob") as bob:
        bob.create_session().create_consumer(pymq.Queue("kept")).close()          # still granted
        with pytest.raises(AccessDenied):
            bob.create_session().create_producer(pymq.Queue("kept")).send("x")  # never granted
