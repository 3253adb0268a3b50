"""A message crossing between cluster nodes is the same message on both (server/broker/forwarded.py,
spec/cluster.md §3): the sender's headers for it, and the receiving core placing them, in process.

The multi-node runs are tests/cluster/test_ids.py; these pin each rule of the wire form on its own."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq_server.broker.forwarded import CLUSTER_HEADERS, arrived, forward_headers
from pymq_server.broker.requests import parse_send

from pymq.errors import AccessDenied, InvalidHeader, PymqError
from tests.broker.core_harness import Core, FakeClient


@pytest.fixture
def core(tmp_path):
    c = Core(tmp_path)
    yield c
    c.close()


def _waiting(core: Core, name: str) -> list:
    return [entry.message for entry in core.queue(name).ready]


def test_a_forwarded_message_keeps_its_id_timestamp_and_headers(tmp_path):
    origin, peer = Core(tmp_path / "a"), Core(tmp_path / "b")
    try:
        mid = origin.send("/queue/q", {"correlation-id": "c-1", "type": "Quote", "reply-to": "/queue/r",
                                       "priority": "7", "expires": "4102444800000", "n": "5",
                                       "pymq-types": "n=i", "pymq-dedup-id": "producer-1",
                                       "timestamp": "1700000000000"})
        (sent,) = _waiting(origin, "q")
        peer.broker.send(FakeClient(cluster=True), Core.request("/queue/q", forward_headers(sent, "n0")))
        (got,) = _waiting(peer, "q")
        assert got.message_id == sent.message_id == mid
        assert got.timestamp == sent.timestamp == 1700000000000
        assert (got.priority, got.expires, got.persistent) == (sent.priority, sent.expires, sent.persistent)
        assert got.headers == sent.headers                   # the cluster's own headers taken out again
        assert got.selector_values()["JMSMessageID"] == mid
    finally:
        origin.close()
        peer.close()


def test_a_resend_of_one_crossing_is_dropped_and_a_later_crossing_is_not(tmp_path):
    origin, peer = Core(tmp_path / "a"), Core(tmp_path / "b")
    try:
        origin.send("/queue/q", {})
        (message,) = _waiting(origin, "q")
        crossing = forward_headers(message, "n0")
        cluster = FakeClient(cluster=True)
        assert peer.broker.send(cluster, Core.request("/queue/q", crossing))[0] == message.message_id
        assert peer.broker.send(cluster, Core.request("/queue/q", crossing))[0] is None     # a resend: dropped
        assert len(_waiting(peer, "q")) == 1
        # the same message back on the origin (redistributed) and forwarded again: a new crossing
        (there,) = _waiting(peer, "q")
        origin.broker.send(cluster, Core.request("/queue/q", forward_headers(there, "n1")))
        back = _waiting(origin, "q")[-1]                     # beside the original, under a key of its own
        assert back.message_id == message.message_id and back.key != message.key
        again = forward_headers(back, "n0")
        assert again["pymq-message-id"] == crossing["pymq-message-id"]
        assert again["pymq-forward-id"] != crossing["pymq-forward-id"]
        assert peer.broker.send(cluster, Core.request("/queue/q", again))[0] == message.message_id
        assert len(_waiting(peer, "q")) == 2
    finally:
        origin.close()
        peer.close()


def test_only_a_cluster_login_gives_a_message_its_id(core):
    with pytest.raises(AccessDenied):
        core.broker.send(FakeClient(), Core.request("/queue/q", {"pymq-forwarded": "n0",
                                                                  "pymq-message-id": "ID:forged-1"}))
    assert _waiting(core, "q") == []
    mid = core.send("/queue/q", {"pymq-message-id": "ID:forged-2"})      # a plain property of a plain SEND
    (message,) = _waiting(core, "q")
    assert message.message_id == mid != "ID:forged-2"


def test_a_hand_over_copy_is_the_same_message_addressed_to_its_subscription(core):
    core.send("/queue/q", {"color": "red"})
    (message,) = _waiting(core, "q")
    headers = forward_headers(message, "n0", {"pymq-subscription": "sub:x:inbox"})
    request = arrived(Core.request("/topic/t", headers))
    assert request.subscription == "sub:x:inbox" and request.forwarded == "n0"
    assert request.message_id == message.message_id
    assert request.dedup_id == f"fwd:n0-{message.key}"
    assert CLUSTER_HEADERS.isdisjoint(request.properties)
    assert request.properties["color"] == "red"


def test_a_forward_from_a_node_without_the_crossing_header_keeps_its_duplicate_id(core):
    request = arrived(Core.request("/queue/q", {"pymq-forwarded": "n0", "pymq-dedup-id": "fwd:ID:n0-5"}))
    assert request.dedup_id == "fwd:ID:n0-5" and request.message_id is None
    assert "pymq-forwarded" not in request.properties


@pytest.mark.parametrize("header", ["pymq-message-id", "pymq-forward-id"])
@pytest.mark.parametrize("value", ["", "ID:n0 1", "ID:n0-1\nforged:yes", "x" * 513, "ID:n0-\u00e9", "\x00"])
def test_an_id_a_peer_sends_that_no_frame_could_carry_is_refused_and_nothing_is_placed(core, header, value):
    headers = {"pymq-forwarded": "n0", "pymq-message-id": "ID:n0-1", "pymq-forward-id": "n0-1", header: value}
    with pytest.raises(InvalidHeader) as info:
        core.broker.send(FakeClient(cluster=True), Core.request("/queue/q", headers))
    assert info.value.header == header
    assert _waiting(core, "q") == []


_NAMES = st.sampled_from(sorted(CLUSTER_HEADERS) + ["pymq-dedup-id", "_AMQ_DUPL_ID", "color", "timestamp",
                                                     "priority", "persistent", "AMQ_SCHEDULED_DELAY"]) | \
    st.text(min_size=1, max_size=8)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_NAMES, st.text(max_size=600) | st.sampled_from(["ID:n0-1", "n0-9"]), max_size=8))
def test_any_headers_a_peer_forwards_give_a_clean_request_or_a_precise_refusal(headers):
    """Hostile input from the cluster side of the wire: whatever a peer's forwarded SEND carries, the
    receiver ends with a request free of the cluster's headers whose id a frame can carry, or refuses it
    with an error of the tree (never another exception)."""
    try:
        request = arrived(parse_send({**headers, "destination": "/queue/q", "pymq-forwarded": "n0"}, b"x"))
    except PymqError:
        return
    assert CLUSTER_HEADERS.isdisjoint(request.properties)
    assert request.message_id is None or re.fullmatch(r"[!-~]{1,512}", request.message_id)
    crossing = headers.get("pymq-forward-id")
    assert request.dedup_id == ("fwd:" + crossing if crossing else
                                next((headers[n] for n in ("pymq-dedup-id", "_AMQ_DUPL_ID") if headers.get(n)), None))
