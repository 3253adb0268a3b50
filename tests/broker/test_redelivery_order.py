"""Redelivered messages come first and in their original order (JMS), over raw STOMP.

A cumulative NACK in ``client`` mode, several NACKs read in one batch in ``client-individual`` mode,
and a consumer that leaves with messages outstanding all return several messages at once; the broker
must put every one back before it hands any out again, or newer messages slip in between
(``n0*, n2, n1*, ...``). The same holds inside a message group, whose messages only one consumer takes.
"""
from __future__ import annotations

import uuid

import pytest

from tests.conftest import RawStomp


def _send(producer: RawStomp, queue: str, n: int, group: str | None = None) -> None:
    for i in range(n):
        headers = {"destination": queue, "persistent": "false", "n": str(i)}
        if group is not None:
            headers["JMSXGroupID"] = group
        if i == n - 1:
            headers["receipt"] = "sent"
        producer.send("SEND", headers, f"n{i}".encode())
    assert producer.read().command == "RECEIPT"


def _read(consumer: RawStomp, count: int) -> list:
    frames = [consumer.read() for _ in range(count)]
    assert all(f.command == "MESSAGE" for f in frames), frames
    return frames


def _names(frames) -> list[str]:
    return [f.body.decode() + ("*" if f.headers.get("redelivered") == "true" else "") for f in frames]


@pytest.mark.parametrize("group", [None, "g1"])
def test_cumulative_nack_in_client_mode_redelivers_first_in_order(raw, group):
    queue = f"/queue/order-{uuid.uuid4().hex[:6]}"
    producer = raw()
    _send(producer, queue, 5, group)
    consumer = raw()
    consumer.send("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "client", "prefetch-count": "2"})
    first = _read(consumer, 2)
    assert _names(first) == ["n0", "n1"]
    consumer.send("NACK", {"id": first[1].headers["ack"]})          # cumulative: n0 and n1 come back
    again = _read(consumer, 2)
    assert _names(again) == ["n0*", "n1*"]
    consumer.send("ACK", {"id": again[1].headers["ack"]})
    assert _names(_read(consumer, 2)) == ["n2", "n3"]


@pytest.mark.parametrize("group", [None, "g1"])
def test_acks_and_nacks_read_in_one_batch_redeliver_first_in_order(raw, group):
    queue = f"/queue/order-{uuid.uuid4().hex[:6]}"
    producer = raw()
    _send(producer, queue, 8, group)
    consumer = raw()
    consumer.send("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "client-individual",
                                "prefetch-count": "4"})
    first = _read(consumer, 4)
    assert _names(first) == ["n0", "n1", "n2", "n3"]
    # what an SDK writes when the application acknowledged n3 and then recovers: one frame each, one write
    consumer.send_raw(consumer.encode("ACK", {"id": first[3].headers["ack"]})
                      + b"".join(consumer.encode("NACK", {"id": f.headers["ack"]}) for f in first[:3]))
    assert _names(_read(consumer, 4)) == ["n0*", "n1*", "n2*", "n4"]


def test_a_consumer_that_leaves_gives_its_group_back_first_in_order(raw):
    queue = f"/queue/order-{uuid.uuid4().hex[:6]}"
    producer = raw()
    _send(producer, queue, 6, group="g1")
    leaving = raw()
    leaving.send("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "client-individual",
                               "prefetch-count": "3"})
    assert _names(_read(leaving, 3)) == ["n0", "n1", "n2"]          # it owns the group now
    staying = raw()
    staying.send("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "client-individual",
                               "prefetch-count": "10", "receipt": "r"})
    assert staying.read().command == "RECEIPT"                      # n3..n5 wait for the group's owner
    leaving.send("DISCONNECT", {})
    leaving.close()
    assert _names(_read(staying, 6)) == ["n0*", "n1*", "n2*", "n3", "n4", "n5"]
