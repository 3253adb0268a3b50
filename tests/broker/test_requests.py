"""Headers parsed once: the alias table read the same on every frame, every number through the one
bounded parser (server/broker/requests.py). The same rules over the wire: test_headers_on_the_wire.py."""
from __future__ import annotations

import pytest
from pymq_server.broker.consumer import CLIENT
from pymq_server.broker.requests import (
    ALIASES,
    durable_name,
    parse_ack,
    parse_ack_upto,
    parse_subscribe,
    parse_unsubscribe,
)

from pymq.errors import InvalidHeader
from tests.twins import twin_fixture

#: parse_send's twins (requests.py picks one): every SEND test here runs on both (ids c and py)
send = twin_fixture("pymq_server.broker._send_py", "pymq_server.broker._send_c")

SPELLINGS = ALIASES["durable-name"]


# -- the parsers ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_durable_spelling_names_the_subscription_on_every_frame(spelling):
    headers = {"destination": "/topic/t", "id": "s", spelling: "d1"}
    assert parse_subscribe(headers).durable_name == "d1"
    assert parse_subscribe(dict(headers, browser="true")).browse.durable_name == "d1"
    assert parse_unsubscribe(headers).drop_durable
    assert parse_ack_upto(dict(headers, **{"pymq-ack-upto": "5"})).durable_name == "d1"


def test_rabbitmq_queue_name_counts_only_with_durable_true():
    assert durable_name({"x-queue-name": "q"}) is None
    assert durable_name({"x-queue-name": "q", "durable": "true"}) == "q"
    assert durable_name({"x-queue-name": "q", "durable": "true", "durable-subscriber-name": "d"}) == "d"


def test_first_spelling_in_the_table_wins():
    headers = {spelling: spelling for spelling in reversed(SPELLINGS)}
    assert durable_name(headers) == SPELLINGS[0]
    prefetch = {spelling: str(i) for i, spelling in enumerate(ALIASES["prefetch"], 1)}
    assert parse_subscribe(dict(prefetch, destination="/queue/q")).prefetch == 1


def test_send_maps_jms_fields_and_keeps_properties(send):
    request = send.parse_send({"destination": "/queue/q", "receipt": "r", "priority": "7", "expiration": "100",
                          "AMQ_SCHEDULED_DELAY": "50", "_AMQ_DUPL_ID": "d", "message-id": "forged",
                          "colour": "red", "persistent": "FALSE"}, b"x")
    assert (request.priority, request.ttl, request.delay, request.dedup_id, request.persistent) == \
        (7, 100, 50, "d", False)
    # the scheduling headers are consumed here: the message does not carry them on (issue 15)
    assert request.properties == {"_AMQ_DUPL_ID": "d", "colour": "red"}
    assert request.receipt == "r"


def test_delay_spellings_first_wins_and_every_one_is_checked(send):
    both = send.parse_send({"destination": "/queue/q", "AMQ_SCHEDULED_DELAY": "5", "pymq-delay": "7"}, b"")
    assert both.delay == 5 and both.properties == {}
    assert send.parse_send({"destination": "/queue/q", "pymq-delay": "7"}, b"").delay == 7
    with pytest.raises(InvalidHeader):
        send.parse_send({"destination": "/queue/q", "AMQ_SCHEDULED_DELAY": "5", "pymq-delay": "soon"}, b"")


def test_exclusive_spellings():
    for spelling in ALIASES["exclusive"]:
        assert parse_subscribe({"destination": "/queue/q", spelling: "true"}).exclusive is True
    assert parse_subscribe({"destination": "/queue/q"}).exclusive is False


@pytest.mark.parametrize("name, value", [
    ("priority", "+5"), ("priority", "10"), ("priority", "\u0665"), ("expires", "-1"), ("expiration", "1_000"),
    ("timestamp", "1e3"), ("AMQ_SCHEDULED_DELAY", " 5"), ("AMQ_SCHEDULED_TIME", "9" * 20),
    ("persistent", "yes")])
def test_send_numbers_go_through_the_bounded_parser(send, name, value):
    with pytest.raises(InvalidHeader) as info:
        send.parse_send({"destination": "/queue/q", name: value}, b"")
    assert info.value.header == name


@pytest.mark.parametrize("headers", [
    {"prefetch-count": "-1"}, {"activemq.prefetchSize": str(1 << 31)}, {"pymq-prefetch": "0x10"},
    {"browser": "true", "pymq-from-seq": "+1"}, {"browser": "true", "pymq-max-messages": "1.5"},
    {"browser": "true", "pymq-source": "disk"}, {"ack": "sometimes"}])
def test_subscribe_numbers_and_choices_are_checked(headers):
    with pytest.raises(InvalidHeader):
        parse_subscribe(dict(headers, destination="/queue/q", id="s"))


def test_ack_requests():
    assert parse_ack({"id": "7", "transaction": "t"}, "1.2").token == "7"
    nack = parse_ack({"message-id": "m", "subscription": "s", "requeue": "False"}, "1.1", nack=True)
    assert (nack.token, nack.subscription, nack.nack, nack.requeue) == ("m", "s", True, False)
    with pytest.raises(InvalidHeader):
        parse_ack_upto({"destination": "/queue/q", "pymq-ack-upto": "-3"})
    assert parse_subscribe({"destination": "/queue/q", "ack": "client"}).ack is CLIENT


def test_the_wire_tests_cover_every_durable_spelling():
    from tests.broker.test_headers_on_the_wire import DURABLE_SPELLINGS
    assert DURABLE_SPELLINGS == SPELLINGS
