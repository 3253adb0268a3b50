"""The failover URL grammar of both SDKs (pymq/client/url.py ``parse_group``) against the shared vectors
spec/vectors/failover_urls.json, which the Java, Go and TypeScript bindings run too (spec/ha.md §4.1-4.2)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

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
