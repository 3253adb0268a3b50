"""Virtual hosts (spec/stomp.md §1): CONNECT's host header selects one; each has its own queues, topics,
grants and durable subscriptions, kept apart in storage and across restarts; an unknown vhost and a user
who is not one of a vhost's principals are refused at CONNECT, and a refusal creates nothing."""
from __future__ import annotations

import pymq
import pytest
import stomp
from pymq.errors import AccessDenied
from pymq.protocol.frame import Frame
from pymq_server.broker.auth import save_user

from tests.conftest import RawStomp
from tests.stomp_py_client import Collector

VHOSTS = {"shop": ["*"], "books": ["*"]}


def _raw(b, vhost: str | None, login: str = "guest", passcode: str = "guest") -> tuple[RawStomp, object]:
    c = RawStomp(b.port)
    headers = {} if vhost is None else {"host": vhost}
    return c, c.connect(login, passcode, **headers)


def _send(c: RawStomp, destination: str, body: str, **headers) -> None:
    c.send("SEND", {"destination": destination, "receipt": "r-" + body, **headers}, body.encode())
    frame = c.read()
    assert frame.command == "RECEIPT", frame


def _receive(c: RawStomp, destination: str, count: int) -> list:
    c.send("SUBSCRIBE", {"destination": destination, "id": "1"})
    return [c.read() for _ in range(count)]


def _names(b) -> tuple[list[str], list[str]]:
    return b.call(lambda: (sorted(b.broker.queues), sorted(b.broker.topics)))


def test_the_same_queue_name_in_two_vhosts_is_two_queues(broker_factory):
    b = broker_factory(vhosts=VHOSTS)
    shop, books, default = _raw(b, "/shop")[0], _raw(b, "books")[0], _raw(b, None)[0]
    _send(shop, "/queue/orders", "shop-1")
    _send(books, "/queue/orders", "books-1")
    _send(shop, "/queue/orders", "shop-2")
    _send(default, "/queue/orders", "default-1")
    got = _receive(shop, "/queue/orders", 2)
    assert [f.body for f in got] == [b"shop-1", b"shop-2"]
    assert {f.headers["destination"] for f in got} == {"/queue/orders"}     # as its clients name it
    assert [f.body for f in _receive(books, "/queue/orders", 1)] == [b"books-1"]
    assert [f.body for f in _receive(default, "/queue/orders", 1)] == [b"default-1"]
    queues, _ = _names(b)
    assert {"orders", "$vh.shop.orders", "$vh.books.orders"} <= set(queues)
    depths = b.call(lambda: {n: q.depth for n, q in b.broker.queues.items()})
    assert depths["orders"] == depths["$vh.shop.orders"] == depths["$vh.books.orders"] == 0


def test_topics_and_patterns_stay_in_their_vhost(broker_factory):
    b = broker_factory(vhosts=VHOSTS)
    shop_sub, default_sub, shop_pub, books_pub = (_raw(b, v)[0] for v in ("/shop", None, "/shop", "/books"))
    for c in (shop_sub, default_sub):
        c.send("SUBSCRIBE", {"destination": "/topic/#", "id": "all", "receipt": "s"})
        assert c.read().command == "RECEIPT"
    _send(books_pub, "/topic/news.x", "books")
    _send(shop_pub, "/topic/news.x", "shop")
    frame = shop_sub.read()
    assert (frame.body, frame.headers["destination"]) == (b"shop", "/topic/news.x")
    _send(_raw(b, None)[0], "/topic/news.x", "default")
    frame = default_sub.read()       # the default vhost's '#' never saw the two vhosts' messages
    assert frame.body == b"default"


def test_durable_subscriptions_with_one_client_id_in_two_vhosts_are_two(broker_factory):
    b = broker_factory(vhosts=VHOSTS)
    for vhost in ("/shop", "/books"):
        c, connected = _raw(b, vhost, **{})
        c.close()
    subs = []
    for vhost in ("/shop", "/books"):
        c = RawStomp(b.port)
        assert c.connect(host=vhost, **{"client-id": "app"}).command == "CONNECTED"
        c.send("SUBSCRIBE", {"destination": "/topic/t", "id": "d", "durable-subscription-name": "feed",
                             "receipt": "s"})
        assert c.read().command == "RECEIPT"
        c.send("DISCONNECT", {"receipt": "bye"})
        assert c.read().command == "RECEIPT"
        subs.append(c)
    assert b.call(lambda: sorted(b.broker.subscriptions.durable)) == ["sub:books/app:feed", "sub:shop/app:feed"]


def test_unknown_vhost_is_refused_at_connect_and_host_names_mean_the_default(broker_factory):
    b = broker_factory(vhosts=VHOSTS)
    for host in ("/nope", "/shop/x", "/SHOP"):
        c, frame = _raw(b, host)
        assert frame.command == "ERROR" and frame.headers["pymq-code"] == "access-denied", (host, frame)
        assert "unknown virtual host" in frame.headers["message"]
    for host in ("localhost", "127.0.0.1", "/", "broker.example.com"):
        c, frame = _raw(b, host)
        assert frame.command == "CONNECTED", (host, frame)
        _send(c, "/queue/hosted", host)
    assert b.call(lambda: b.broker.queues["hosted"].depth) == 4
    # a broker without vhosts refuses an unknown one too, and serves the default as before
    plain = broker_factory()
    assert _raw(plain, "/shop")[1].command == "ERROR"
    assert _raw(plain, "localhost")[1].command == "CONNECTED"


def test_a_client_cannot_name_another_vhosts_destinations(broker_factory):
    b = broker_factory(vhosts=VHOSTS)
    _send(_raw(b, "/shop")[0], "/queue/orders", "shop-only")
    for vhost, destination in ((None, "/queue/$vh.shop.orders"), ("/books", "/queue/$vh.shop.orders"),
                               (None, "/topic/$vh.shop.#")):
        c = _raw(b, vhost)[0]
        c.send("SUBSCRIBE", {"destination": destination, "id": "1", "receipt": "s"})
        frame = c.read()
        assert frame.command == "ERROR" and frame.headers["pymq-code"] == "invalid-destination", frame
    assert b.call(lambda: b.broker.queues["$vh.shop.orders"].depth) == 1
    assert not any(n.startswith("$vh.books") for n in _names(b)[0])


@pytest.fixture
def secured(broker_factory, tmp_path):
    users = str(tmp_path / "users.yaml")
    save_user(users, "root", "rootpw", ["admin"])
    save_user(users, "alice", "alicepw", ["apps"])
    save_user(users, "bob", "bobpw", [])
    return broker_factory(users_file=users, vhosts={"a": ["role:apps", "user:bob"], "b": ["user:bob"]},
                          default_permissions={"role:admin": ["produce", "consume", "browse"]},
                          data_dir=str(tmp_path / "data"))


def test_a_user_of_vhost_a_is_refused_in_b_and_nothing_is_created(secured):
    b = secured
    before = _names(b)
    sessions = b.call(lambda: len(b.broker.sessions))
    c, frame = _raw(b, "/b", "alice", "alicepw")
    assert frame.command == "ERROR" and frame.headers["pymq-code"] == "access-denied"
    assert "virtual host '/b'" in frame.headers["message"]
    assert c.is_closed()
    assert _names(b) == before
    assert b.call(lambda: len(b.broker.sessions)) == sessions
    with pytest.raises(AccessDenied, match="virtual host"):
        pymq.connect(b.url + "/b", username="alice", password="alicepw")
    # a grant on vhost a's queue (administrators name it broker-wide: /queue/$vh.a.q) is not one in b
    with pymq.connect(b.url, username="root", password="rootpw") as root:
        root.queue_manager().grant("/queue/$vh.a.q", "user:bob", "consume", "produce")
    with pymq.connect(b.url, username="bob", password="bobpw", vhost="a") as bob:
        bob.create_session().create_producer(pymq.Queue("q")).send("in a")
        assert bob.create_session().create_consumer(pymq.Queue("q")).receive(5).text == "in a"
    with pymq.connect(b.url + "/b", username="bob", password="bobpw") as bob:
        with pytest.raises(AccessDenied, match="/queue/q"):
            bob.create_session().create_consumer(pymq.Queue("q"))
    queues, topics = _names(b)
    assert not any(n.startswith("$vh.b.") for n in queues + topics)
    # and a non-administrator's admin operations stay in the default vhost
    with pymq.connect(b.url + "/a", username="alice", password="alicepw") as alice:
        with pytest.raises(AccessDenied, match="admin operations"):
            alice.queue_manager().create("mine")


def test_vhosts_stay_apart_across_restart(broker_factory, tmp_path):
    settings = dict(vhosts=VHOSTS, data_dir=str(tmp_path / "d"))
    b = broker_factory(**settings)
    for vhost in ("shop", "books"):
        with pymq.connect(b.url, vhost=vhost) as conn:
            p = conn.create_session().create_producer(pymq.Queue("orders"))
            for i in range(3):
                p.send(f"{vhost}-{i}")
    b.stop()
    b2 = broker_factory(**settings)
    for vhost in ("books", "shop"):
        with pymq.connect(f"{b2.url}/{vhost}") as conn:
            consumer = conn.create_session().create_consumer(pymq.Queue("orders"))
            got = [consumer.receive(5) for _ in range(3)]
            assert [m.text for m in got] == [f"{vhost}-{i}" for i in range(3)]
            assert {m.destination.name for m in got} == {"orders"}
            assert consumer.receive(0.2) is None
    with pymq.connect(b2.url) as conn:
        assert conn.create_session().create_consumer(pymq.Queue("orders")).receive(0.2) is None


def test_stomp_py_selects_a_vhost_with_its_vhost_argument(broker_factory):
    b = broker_factory(vhosts=VHOSTS)
    c = stomp.Connection12([("127.0.0.1", b.port)], heartbeats=(0, 0), vhost="/shop")
    listener = Collector()
    c.set_listener("collector", listener)
    c.connect("guest", "guest", wait=True)
    c.subscribe("/queue/orders", id="1", headers={"receipt": "s"})
    assert listener.receipts.get(timeout=5) == "s"
    with pymq.connect(b.url, vhost="books") as conn:
        conn.create_session().create_producer(pymq.Queue("orders")).send("to books")
    with pymq.connect(b.url + "/shop") as conn:
        conn.create_session().create_producer(pymq.Queue("orders")).send("to shop")
    frame = listener.next()
    assert (frame.body, frame.headers["destination"]) == ("to shop", "/queue/orders")
    assert listener.none(0.3)
    c.disconnect()
    refused = stomp.Connection12([("127.0.0.1", b.port)], heartbeats=(0, 0), vhost="/unknown")
    listener = Collector()
    refused.set_listener("collector", listener)
    with pytest.raises(stomp.exception.ConnectFailedException):
        refused.connect("guest", "guest", wait=True)


def test_a_connections_kept_core_names_are_forgotten_when_it_enters_another_vhost(broker_factory):
    """A session keeps what each destination is called in its vhost (the name step, decided once per connection
    and name, session._core_name); entering a vhost forgets it, so the next SEND and SUBSCRIBE are mapped into
    the new one (without the forgetting they would still reach the first vhost's queue)."""
    b = broker_factory(vhosts=VHOSTS)
    c, _ = _raw(b, "/shop")
    _send(c, "/queue/orders", "kept")               # /queue/orders -> /queue/$vh.shop.orders, kept

    def enter_books() -> str:
        (session,) = b.broker.sessions.values()
        session.enter_vhost("books", None)
        return session._named(Frame("SUBSCRIBE", {"destination": "/queue/orders", "id": "1"}, b"")).headers[
            "destination"]
    assert b.call(enter_books) == "/queue/$vh.books.orders"
    _send(c, "/queue/orders", "moved")
    assert b.call(lambda: (b.broker.queues["$vh.shop.orders"].depth, b.broker.queues["$vh.books.orders"].depth)) \
        == (1, 1)


def test_a_vhosts_core_name_sent_literally_is_refused_after_a_send_was_routed_under_it(broker_factory):
    """A SEND in the default vhost skips the name step for a name its connection was routed by (the route is
    kept under the name as sent); in a vhost routes are kept under the core's name, which a client may not
    send: it is refused even once a route holds it."""
    b = broker_factory(vhosts=VHOSTS)
    c, _ = _raw(b, "/shop")
    _send(c, "/queue/orders", "routed")             # a route under /queue/$vh.shop.orders
    c.send("SEND", {"destination": "/queue/$vh.shop.orders", "receipt": "r"}, b"literal")
    frame = c.read()
    assert frame.command == "ERROR" and frame.headers["pymq-code"] == "invalid-destination", frame
    assert b.call(lambda: b.broker.queues["$vh.shop.orders"].depth) == 1
