"""Headers parsed once: the alias table read the same on every frame, every number through the one
bounded parser, and the RECEIPT's message id returned by the SEND that made it (server/broker/requests.py)."""
from __future__ import annotations

import uuid

import pytest
from pymq_server.broker.consumer import CLIENT
from pymq_server.broker.requests import (
    ALIASES,
    durable_name,
    parse_ack,
    parse_ack_upto,
    parse_send,
    parse_subscribe,
    parse_unsubscribe,
)

from pymq.errors import InvalidHeader

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


def test_send_maps_jms_fields_and_keeps_properties():
    request = parse_send({"destination": "/queue/q", "receipt": "r", "priority": "7", "expiration": "100",
                          "AMQ_SCHEDULED_DELAY": "50", "_AMQ_DUPL_ID": "d", "message-id": "forged",
                          "colour": "red", "persistent": "FALSE"}, b"x")
    assert (request.priority, request.ttl, request.delay, request.dedup_id, request.persistent) == \
        (7, 100, 50, "d", False)
    assert request.properties == {"AMQ_SCHEDULED_DELAY": "50", "_AMQ_DUPL_ID": "d", "colour": "red"}
    assert request.receipt == "r"


@pytest.mark.parametrize("name, value", [
    ("priority", "+5"), ("priority", "10"), ("priority", "\u0665"), ("expires", "-1"), ("expiration", "1_000"),
    ("timestamp", "1e3"), ("AMQ_SCHEDULED_DELAY", " 5"), ("AMQ_SCHEDULED_TIME", "9" * 20),
    ("persistent", "yes")])
def test_send_numbers_go_through_the_bounded_parser(name, value):
    with pytest.raises(InvalidHeader) as info:
        parse_send({"destination": "/queue/q", name: value}, b"")
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


# -- over the wire ---------------------------------------------------------------------------------------

def _durable(raw, topic: str, spelling: str, client_id: str):
    """A durable subscription made with ``spelling``, holding one message, its consumer gone."""
    sub = raw(**{"client-id": client_id})
    sub.send("SUBSCRIBE", {"destination": topic, "id": "d", spelling: "keep", "receipt": "r"})
    assert sub.read().command == "RECEIPT"
    sub.send("UNSUBSCRIBE", {"id": "d", "receipt": "r"})
    assert sub.read().command == "RECEIPT"
    sub.send("SEND", {"destination": topic, "receipt": "s"}, b"kept")
    assert sub.read().command == "RECEIPT"
    sub.send("DISCONNECT", {"receipt": "bye"})
    sub.read()
    sub.close()


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_browse_reads_the_durable_subscription_in_any_spelling(raw, spelling):
    topic = f"/topic/alias-{uuid.uuid4().hex[:6]}"
    client_id = f"c-{uuid.uuid4().hex[:6]}"
    _durable(raw, topic, "durable-subscription-name", client_id)
    reader = raw(**{"client-id": client_id})
    reader.send("SUBSCRIBE", {"destination": topic, "id": "b", "browser": "true", spelling: "keep",
                              "pymq-from-seq": "0"})
    frame = reader.read()
    assert frame.body == b"kept" and frame.headers["browser"] == "true"
    assert reader.read().headers["browser"] == "end"


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_unsubscribe_drops_the_durable_subscription_in_any_spelling(broker, raw, spelling):
    topic = f"/topic/alias-{uuid.uuid4().hex[:6]}"
    client_id = f"c-{uuid.uuid4().hex[:6]}"
    sub = raw(**{"client-id": client_id})
    sub.send("SUBSCRIBE", {"destination": topic, "id": "d", spelling: "gone"})
    sub.send("UNSUBSCRIBE", {"id": "d", spelling: "gone", "receipt": "r"})
    assert sub.read().command == "RECEIPT"
    name = topic[len("/topic/"):]
    assert broker.call(lambda: list(broker.broker.topics[name].subscriptions)) == []


def test_receipt_of_a_transacted_send_names_no_message(raw):
    queue = f"/queue/receipts-{uuid.uuid4().hex[:6]}"
    client = raw()
    client.send("SEND", {"destination": queue, "receipt": "plain"}, b"a")
    plain = client.read()
    assert plain.headers["receipt-id"] == "plain" and plain.headers["message-id"].startswith("ID:")
    client.send("BEGIN", {"transaction": "t"})
    client.send("SEND", {"destination": queue, "transaction": "t", "receipt": "in-tx"}, b"b")
    in_tx = client.read()
    # the message does not exist before COMMIT: no id yet (never the previous SEND's id)
    assert in_tx.headers["receipt-id"] == "in-tx" and "message-id" not in in_tx.headers
    client.send("SEND", {"destination": queue, "pymq-dedup-id": "x", "receipt": "first"}, b"c")
    first = client.read()
    client.send("SEND", {"destination": queue, "pymq-dedup-id": "x", "receipt": "dup"}, b"c")
    dup = client.read()
    assert "message-id" in first.headers and "message-id" not in dup.headers


def test_a_hostile_number_is_an_error_frame_and_the_broker_keeps_serving(raw):
    client = raw()
    client.send("SEND", {"destination": "/queue/q", "priority": "+5", "receipt": "r"}, b"")
    error = client.read()
    assert error.command == "ERROR" and error.headers["receipt-id"] == "r" and "priority" in error.headers["message"]
    assert raw().sock is not None
