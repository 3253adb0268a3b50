"""The failover URL grammar of both SDKs (pymq/client/url.py ``parse_group``) against the shared vectors
spec/vectors/failover_urls.json, which the Java, Go and TypeScript bindings run too (spec/ha.md §4.1-4.2)."""
from __future__ import annotations

import json
import random
import socket
from pathlib import Path

import pymq
import pytest

from pymq.client._core import ConnectionCore, ConnectionSettings
from pymq.client.url import FAILOVER_OPTIONS, BrokerGroup, FailoverOptions, StompAddress, parse_group
from pymq.errors import ConnectFailed

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "spec" / "vectors" / "failover_urls.json").read_text())


def _options(group: BrokerGroup) -> dict[str, object]:
    return {key: getattr(group.options, name) for key, name in FAILOVER_OPTIONS.items()}


def test_the_defaults_are_the_specs():
    assert {key: getattr(FailoverOptions(), name) for key, name in FAILOVER_OPTIONS.items()} == VECTORS["defaults"]


@pytest.mark.parametrize("vector", VECTORS["parse"], ids=lambda v: v["name"])
def test_parse(vector):
    group = parse_group(vector["url"])
    assert group.failover is vector["failover"]
    brokers = []
    for address in group.brokers:
        assert isinstance(address, StompAddress)
        brokers.append({"host": address.host, "port": address.port, "tls": address.tls is not None,
                        "username": address.username, "password": address.password})
    assert brokers == vector["brokers"]
    assert _options(group) == vector["options"]


@pytest.mark.parametrize("vector", VECTORS["refuse"], ids=lambda v: v["name"])
def test_refuse(vector):
    with pytest.raises(ConnectFailed) as caught:
        parse_group(vector["url"])
    assert caught.value.reason == vector["error"], str(caught.value)


@pytest.mark.parametrize("vector", VECTORS["delays"], ids=lambda v: v["name"])
def test_delays(vector):
    options = parse_group(vector["url"]).options
    assert [options.delay_ms(attempt) for attempt in range(1, len(vector["delays_ms"]) + 1)] == vector["delays_ms"]
    rng = random.Random(7)
    for base in vector["delays_ms"]:
        waited = options.jittered(base, rng.random())
        assert base * (1 - options.jitter) <= waited <= min(base * (1 + options.jitter), options.max_reconnect_delay)


def test_a_password_never_reaches_an_error_message():
    for url in ("failover:(stomp://u:hunter2@a:1)?foo=1", "stomp://u:hunter2@a:1,stomp://v:hunter2@b:99999",
                "failover:(stomp://u:hunter2@a:1,vm://x)", "stomp://u:hunter2@a:99999"):
        with pytest.raises(ConnectFailed) as caught:
            parse_group(url)
        assert "hunter2" not in str(caught.value)


def test_many_attempts_do_not_overflow():
    options = FailoverOptions(backoff_multiplier=1000.0, max_reconnect_delay=2**31 - 1)
    assert options.delay_ms(10**6) == 2**31 - 1


def test_attempts_go_round_the_list_as_the_spec_says():
    """spec/ha.md §4.2: after a loss the attempts start with the broker after the lost one and wrap;
    maxReconnectAttempts counts attempts, not passes; at the first connect (1 + startupMaxReconnectAttempts)
    passes from the first broker; the waits are the vectors' delays (jitter 0 here); randomize shuffles each
    pass; an outage that goes on after a refused re-subscription (``made``) keeps its count and back-off."""
    from pymq.client._failover import Failover

    url = "failover:(stomp://a:1,stomp://b:2,stomp://c:3)?maxReconnectAttempts=5&startupMaxReconnectAttempts=1&jitter=0"
    group = parse_group(url)
    failover = Failover(group, random.Random(3))
    failover.current = 1                                           # b was lost
    after = list(failover.attempts(after_loss=True))
    assert [(n, a.host, w) for n, a, w in after] == [
        (1, "c", 0.0), (2, "a", 0.1), (3, "b", 0.2), (4, "c", 0.4), (5, "a", 0.8)]
    first = list(failover.attempts(after_loss=False))
    assert [a.host for _, a, _ in first] == ["a", "b", "c", "a", "b", "c"]
    assert [(n, w) for n, _, w in failover.attempts(after_loss=True, made=3)] == [(4, 0.4), (5, 0.8)]
    assert list(failover.attempts(after_loss=True, made=5)) == []  # every attempt of the outage was spent
    shuffled = Failover(parse_group(url.replace("maxReconnectAttempts=5", "maxReconnectAttempts=12")
                                    + "&randomize=true"), random.Random(5))
    hosts = [a.host for _, a, _ in shuffled.attempts(after_loss=True)]
    passes = [hosts[i:i + 3] for i in range(0, 12, 3)]
    assert all(sorted(p) == ["a", "b", "c"] for p in passes) and len({tuple(p) for p in passes}) > 1


@pytest.mark.parametrize("vector", VECTORS["vhosts"], ids=lambda v: v["name"])
def test_vhost_of_each_member(vector):
    """spec/stomp.md §1: a member's own path, else the connection's vhost setting, else none (host:/);
    the CONNECT of a link to each member carries it."""
    settings = ConnectionSettings(vector["url"], vhost=vector["vhost"])
    core = ConnectionCore(settings)
    members = []
    for address in settings.group.brokers:
        assert isinstance(address, StompAddress)
        vhost = settings._vhost_at(address)
        assert core._connect_headers(None, None, address)["host"] == "/" + (vhost or "")
        members.append({"host": address.host, "port": address.port, "vhost": vhost})
    assert members == vector["members"]


def test_a_link_to_the_second_member_enters_its_own_vhost(broker_factory):
    """The first member is down: the link goes to the second, which enters *its* path (books), not the
    first member's (shop) nor the setting; a member without a path enters the setting."""
    b = broker_factory(vhosts={"shop": ["*"], "books": ["*"]})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]          # closed below: nothing listens there
    group = f"failover:(stomp://127.0.0.1:{dead}/shop,stomp://127.0.0.1:{b.port}/books)?initialReconnectDelay=1"
    with pymq.connect(group, vhost="shop", timeout=5) as conn:
        conn.create_session().create_producer(pymq.Queue("orders")).send("via the group")
    group = f"failover:(stomp://127.0.0.1:{dead}/books,stomp://127.0.0.1:{b.port})?initialReconnectDelay=1"
    with pymq.connect(group, vhost="shop", timeout=5) as conn:
        conn.create_session().create_producer(pymq.Queue("orders")).send("to the setting")
    for vhost, want in (("books", "via the group"), ("shop", "to the setting")):
        with pymq.connect(f"{b.url}/{vhost}") as conn:
            conn.start()
            consumer = conn.create_session().create_consumer(pymq.Queue("orders"))
            got = consumer.receive(5)
            assert got is not None and got.body == want, (vhost, got)
            assert consumer.receive(0.2) is None
