"""Headers read the same on every frame, over the wire (issue 9): the durable-name spellings SUBSCRIBE
accepts also name the subscription on a browse and on UNSUBSCRIBE, and a RECEIPT's message id is the id
the SEND that made it returned (on the landed main 792990a a browse and UNSUBSCRIBE knew two of the
spellings, and the receipt of a transacted SEND named the previous message: session.last_message_id).

Kept free of the broker's modules so the file runs unchanged against older code."""
from __future__ import annotations

import uuid

import pytest

#: ALIASES["durable-name"] in server/broker/requests.py (test_requests.py checks they agree)
DURABLE_SPELLINGS = ("durable-subscription-name", "durable-subscriber-name", "activemq.subscriptionName")

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


@pytest.mark.parametrize("spelling", DURABLE_SPELLINGS)
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


@pytest.mark.parametrize("spelling", DURABLE_SPELLINGS)
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
