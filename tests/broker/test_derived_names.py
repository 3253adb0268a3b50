"""Names one client derives from another's: dead-letter names made by a custom ``dead_letter_prefix``, and
temporary destinations (issue 24 item 5; spec/admin.md "Dead-letter names").

On landed main, bob, holding only ``create``, declared ``ders`` with ``dead_letter_prefix: or``: the
name ``orders``, which nobody used yet, became his dead-letter queue; an administrator who later declared
``orders`` for carol made a queue bob could read.  A prefix reaching into the default dead-letter
prefix's names (``DLQ.or`` + ``ders``) took over another queue's dead letters the same way, and a browse
of another connection's temporary topic answered with its message count.
"""
from __future__ import annotations

import json
import uuid

import pytest
import yaml

from pymq_server.broker.auth import hash_password
from tests.conftest import RawStomp

USERS = ("root", "bob", "carol", "dave")
DEFAULTS = {"user:bob": ["create"], "user:carol": ["create", "produce", "consume", "browse"]}


def _users(tmp_path) -> str:
    path = tmp_path / "users.yaml"
    path.write_text(yaml.safe_dump({"users": {u: {"password": hash_password(u + "pw", n=2),
                                                  "roles": ["admin"] if u == "root" else []} for u in USERS}}))
    return str(path)


@pytest.fixture
def start(broker_factory, tmp_path):
    users = _users(tmp_path)
    data = str(tmp_path / "derived")

    def make(**extra):
        return broker_factory(users_file=users, default_permissions=DEFAULTS, data_dir=data, **extra)
    return make


class Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


def _connect(rb, user: str) -> RawStomp:
    c = RawStomp(rb.port)
    assert c.connect(user, user + "pw").command == "CONNECTED"
    return c


def admin(rb, user: str, op: str, **args):
    c = _connect(rb, user)
    try:
        c.send("SUBSCRIBE", {"destination": "/temp-queue/a", "id": "a"})
        c.send("SEND", {"destination": "/pymq/admin", "pymq-admin-op": op, "reply-to": "/temp-queue/a"},
               json.dumps(args).encode())
        frame = c.read()
        while frame.command != "MESSAGE":
            frame = c.read()
        answer = json.loads(frame.body)
    finally:
        c.close()
    if not answer["ok"]:
        raise Refused(answer["error"]["code"], answer["error"]["message"])
    return answer["result"]


def frame_as(rb, user: str, command: str, headers: dict, c: RawStomp | None = None):
    """Send a frame with a receipt; the answers up to the RECEIPT, or Refused at an ERROR."""
    own = c is None
    c = c or _connect(rb, user)
    receipt = uuid.uuid4().hex[:8]
    try:
        c.send(command, {**headers, "receipt": receipt})
        out = []
        while True:
            frame = c.read()
            if frame.command == "ERROR":
                raise Refused(frame.headers.get("pymq-code", ""), frame.headers.get("message", ""))
            if frame.command == "RECEIPT" and frame.headers.get("receipt-id") == receipt:
                return out
            out.append(frame)
    finally:
        if own:
            c.close()


def state(rb) -> dict:
    def read():
        b = rb.broker
        return {"queues": sorted(b.queues), "declared": json.dumps(b.declared, sort_keys=True),
                "acls": {d: a.to_dict() for d, a in b.acl.acls.items()},
                "catalog": sorted((k, bytes(v)) for k, v in b.store.iter_meta() if not k.startswith("seq:"))}
    return rb.call(read)


def test_a_custom_prefix_cannot_claim_a_name_someone_declares_later(start):
    """The issue's case: bob's dead-letter queue ``orders`` is made, visible and system-owned when bob
    declares ``ders``; the administrator's later declaration of ``orders`` for carol is refused instead of
    handing carol a queue bob reads, and carol cannot put messages into bob's dead-letter queue."""
    rb = start()
    result = admin(rb, "bob", "create-queue", name="ders", config={"dead_letter_prefix": "or"})
    assert result["created"] is True
    assert "orders" in [q["name"] for q in admin(rb, "root", "list-queues")]
    dlqs = {q["name"]: q for q in admin(rb, "root", "list-dead-letter-queues")}
    assert "orders" in dlqs
    before = state(rb)
    with pytest.raises(Refused) as refused:
        admin(rb, "root", "create-queue", name="orders", grants={"user:carol": ["produce", "consume"]})
    assert refused.value.code == "destination-exists" and "/queue/ders" in refused.value.message
    with pytest.raises(Refused) as refused:
        admin(rb, "carol", "create-queue", name="orders")
    assert refused.value.code == "access-denied"          # she may not see bob's dead-letter queue
    with pytest.raises(Refused) as refused:
        frame_as(rb, "carol", "SEND", {"destination": "/queue/orders"})
    assert refused.value.code == "access-denied"
    assert state(rb) == before
    # bob reads his own dead letters, and nobody else's: the queue serves ders only
    frame_as(rb, "bob", "SUBSCRIBE", {"destination": "/queue/orders", "id": "s"})


def test_the_reservation_survives_a_restart(start):
    rb = start()
    admin(rb, "bob", "create-queue", name="ders", config={"dead_letter_prefix": "or"})
    rb.stop()
    rb = start()
    with pytest.raises(Refused) as refused:
        admin(rb, "root", "create-queue", name="orders")
    assert refused.value.code == "destination-exists"
    frame_as(rb, "bob", "SUBSCRIBE", {"destination": "/queue/orders", "id": "s"})
    with pytest.raises(Refused):
        frame_as(rb, "carol", "SUBSCRIBE", {"destination": "/queue/orders", "id": "s"})


@pytest.mark.parametrize("prefix, why", [
    ("DLQ.or", "system-owned"),        # DLQ.orders: the default dead-letter queue of a queue `orders`
    ("ex", "system-owned"),            # `expired`: the expiry queue
    ("or", "a queue of that name"),    # `orders`, which carol made by use
])
def test_a_prefix_may_not_make_a_taken_or_system_name(start, prefix, why):
    rb = start(expiry_queue="expired")
    frame_as(rb, "carol", "SEND", {"destination": "/queue/orders"})
    before = state(rb)
    for user in ("bob", "root"):
        with pytest.raises(Refused) as refused:
            admin(rb, user, "create-queue", name="ders" if prefix != "ex" else "pired",
                  config={"dead_letter_prefix": prefix})
        assert refused.value.code == "destination-exists" and why in refused.value.message, refused.value
    assert state(rb) == before


def test_the_declarer_must_be_allowed_to_create_the_dead_letter_name(start):
    """dave may create ``src`` (granted on that name) but no other name: its dead-letter queue under his
    prefix would be a name he could not declare himself."""
    rb = start()
    admin(rb, "root", "grant", destination="/queue/src", principal="user:dave", permissions=["create"])
    before = state(rb)
    with pytest.raises(Refused) as refused:
        admin(rb, "dave", "create-queue", name="src", config={"dead_letter_prefix": "dead."})
    assert refused.value.code == "access-denied" and "/queue/dead.src" in refused.value.message
    assert state(rb) == before
    assert admin(rb, "dave", "create-queue", name="src")["created"] is True       # default prefix: fine
    before = state(rb)
    with pytest.raises(Refused):
        admin(rb, "dave", "alter-queue", name="src", config={"dead_letter_prefix": "dead."})
    assert state(rb) == before


def test_dropping_the_source_leaves_its_dead_letter_queue_to_administrators(start):
    rb = start()
    admin(rb, "bob", "create-queue", name="ders", config={"dead_letter_prefix": "or"})
    frame_as(rb, "root", "SEND", {"destination": "/queue/orders"})
    admin(rb, "bob", "drop-queue", name="ders")
    for user in ("bob", "carol"):
        with pytest.raises(Refused):
            frame_as(rb, user, "SUBSCRIBE", {"destination": "/queue/orders", "id": "s"})
    with pytest.raises(Refused):        # still bob's dead letters: nobody declares the name over them
        admin(rb, "root", "create-queue", name="orders")
    assert admin(rb, "root", "drop-queue", name="orders")["dropped_messages"] == 1
    assert admin(rb, "root", "create-queue", name="orders")["created"] is True     # free again


def test_dropping_a_reserved_dead_letter_queue_empties_it_and_keeps_the_name(start):
    rb = start()
    admin(rb, "bob", "create-queue", name="ders", config={"dead_letter_prefix": "or"})
    frame_as(rb, "root", "SEND", {"destination": "/queue/orders"})
    assert admin(rb, "root", "drop-queue", name="orders")["dropped_messages"] == 1
    assert "orders" in [q["name"] for q in admin(rb, "root", "list-queues")]
    with pytest.raises(Refused):
        admin(rb, "root", "create-queue", name="orders")


def test_a_configured_queue_reserves_its_dead_letter_name_from_the_start(start):
    rb = start(queues={"ders": {"dead_letter_prefix": "or"}})
    with pytest.raises(Refused) as refused:
        admin(rb, "carol", "create-queue", name="orders")
    assert refused.value.code == "access-denied"
    with pytest.raises(Refused) as refused:
        admin(rb, "root", "create-queue", name="orders")
    assert refused.value.code == "destination-exists"


def test_another_connections_temporary_topic_tells_a_browser_nothing(start):
    """Landed main answered carol's browse of bob's temporary topic with its bounds: the count of what
    was published there.  Only the connection that made it may browse it now."""
    rb = start()
    owner = _connect(rb, "bob")
    frame_as(rb, "bob", "SUBSCRIBE", {"destination": "/temp-topic/mine", "id": "t"}, c=owner)
    name = rb.call(lambda: next(iter(rb.broker.destinations.temp_topics)))
    for _ in range(3):
        frame_as(rb, "carol", "SEND", {"destination": "/temp-topic/" + name})
    before = state(rb)
    for user in ("carol", "root"):              # temporaries are private even to an administrator
        with pytest.raises(Refused) as refused:
            frame_as(rb, user, "SUBSCRIBE", {"destination": "/temp-topic/" + name, "id": "b", "browser": "true"})
        assert refused.value.code == "access-denied"
        with pytest.raises(Refused) as refused:
            frame_as(rb, user, "ACK", {"destination": "/temp-topic/" + name, "id": "u", "pymq-ack-upto": "5"})
        assert refused.value.code == "access-denied"
    with pytest.raises(Refused) as refused:             # a name that does not exist answers the same
        frame_as(rb, "carol", "SUBSCRIBE", {"destination": "/temp-topic/tmp.c999.x", "id": "b", "browser": "true"})
    assert refused.value.code == "access-denied"
    for user in ("bob", "root"):
        with pytest.raises(Refused) as refused:
            admin(rb, user, "acl", destination="/temp-topic/" + name)
        assert refused.value.code == "invalid-destination"
        with pytest.raises(Refused):
            admin(rb, user, "grant", destination="/temp-topic/" + name, principal="user:carol",
                  permissions=["consume"])
    assert state(rb) == before
    answers = frame_as(rb, "bob", "SUBSCRIBE", {"destination": "/temp-topic/mine", "id": "b", "browser": "true"},
                       c=owner)
    assert answers[-1].headers["browser"] == "end"
    owner.close()
