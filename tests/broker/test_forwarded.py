"""A message crossing between cluster nodes is the same message on both (server/broker/forwarded.py,
spec/cluster.md §3): the sender's headers for it, and the receiving core placing them, in process.

The multi-node runs are tests/cluster/test_ids.py; these pin each rule of the wire form on its own."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq_server.broker.forwarded import CLUSTER_HEADERS, forward_headers
from pymq_server.broker.requests import SubscribeRequest, parse_send

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
        # (a link of its own: a connection is to one broker, and keeps that broker's routes)
        origin.broker.send(FakeClient(cluster=True), Core.request("/queue/q", forward_headers(there, "n1")))
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
    request = Core.request("/topic/t", headers)          # taken apart as it is parsed
    assert request.subscription == "sub:x:inbox" and request.forwarded == "n0"
    assert request.message_id == message.message_id
    assert request.dedup_id == f"fwd:n0-{message.key}"
    assert CLUSTER_HEADERS.isdisjoint(request.properties)
    assert request.properties["color"] == "red"


def test_a_forward_from_a_node_without_the_crossing_header_keeps_its_duplicate_id(core):
    request = Core.request("/queue/q", {"pymq-forwarded": "n0", "pymq-dedup-id": "fwd:ID:n0-5"})
    assert request.dedup_id == "fwd:ID:n0-5" and request.message_id is None
    assert "pymq-forwarded" not in request.properties


@pytest.mark.parametrize("header", ["pymq-message-id", "pymq-forward-id"])
@pytest.mark.parametrize("value", ["", "ID:n0 1", "ID:n0-1\nforged:yes", "x" * 513, "ID:n0-\u00e9", "\x00"])
@pytest.mark.parametrize("destination", ["/queue/q", "/topic/nobody"])
def test_an_id_a_peer_sends_that_no_frame_could_carry_is_refused_and_nothing_is_placed(core, header, value,
                                                                                       destination):
    """The same refusal whether the message would be placed or dropped as nobody's (a topic without a
    subscriber here: dropped before a message is built)."""
    headers = {"pymq-forwarded": "n0", "pymq-message-id": "ID:n0-1", "pymq-forward-id": "n0-1", header: value}
    with pytest.raises(InvalidHeader) as info:
        core.broker.send(FakeClient(cluster=True), Core.request(destination, headers))
    assert info.value.header == header
    assert _waiting(core, "q") == [] and core.broker.placement.dropped_no_subscriber == 0


def test_the_cluster_headers_are_taken_apart_as_the_send_is_parsed_and_the_request_placed_as_it_is(core,
                                                                                                    monkeypatch):
    """A forwarded SEND's id, crossing and node are the request's fields from the parse on (no second copy of
    its headers or of the request when it is placed); without ``pymq-forwarded`` the same names stay plain
    properties of a plain SEND (a client never picks its id)."""
    from pymq_server.broker.placement import Placement
    request = Core.request("/queue/q", _crossing(7, color="red", **{"pymq-dedup-id": "producer-1"}))
    assert (request.forwarded, request.message_id, request.dedup_id) == ("n0", "ID:n0-7", "fwd:n0-7")
    assert CLUSTER_HEADERS.isdisjoint(request.properties) and request.properties["color"] == "red"
    plain = Core.request("/queue/q", {"pymq-message-id": "ID:mine", "pymq-forward-id": "n0-1"})
    assert plain.message_id is None and plain.forwarded is None and plain.dedup_id is None
    assert plain.properties["pymq-message-id"] == "ID:mine"
    placed: list = []
    place = Placement.place

    def kept(self, path, target, source, client=None, admitted=False):
        placed.append(source)
        return place(self, path, target, source, client, admitted)

    monkeypatch.setattr(Placement, "place", kept)
    assert core.broker.send(FakeClient(cluster=True), request)[0] == "ID:n0-7"
    assert placed == [request] and placed[0] is request
    (message,) = _waiting(core, "q")
    assert message.message_id == "ID:n0-7" and "pymq-forwarded" not in message.headers


def test_a_database_transactions_send_cannot_pass_for_a_forwarded_one(core):
    """A pending SEND an application wrote (apptx.py) that names itself forwarded would, parsed as one,
    carry an id of the writer's choosing: refused (the claim discards it with the reason in the log)."""
    from pymq.protocol.scanner import encode_frame
    data = encode_frame("SEND", {"destination": "/queue/q", **_crossing(1)}, b"x", "1.2")
    with pytest.raises(PymqError, match="pymq-forwarded"):
        core.broker.router.plan_pending("/queue/q", data, set())
    plan = core.broker.router.plan_pending("/queue/q", encode_frame("SEND", {"destination": "/queue/q",
                                                                             "pymq-message-id": "ID:n0-1"},
                                                                    b"x", "1.2"), set())
    assert plan is not None and plan[0].message.message_id != "ID:n0-1"


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
        request = parse_send({**headers, "destination": "/queue/q", "pymq-forwarded": "n0"}, b"x")
    except PymqError:
        return
    assert CLUSTER_HEADERS.isdisjoint(request.properties)
    assert request.message_id is None or re.fullmatch(r"[!-~]{1,512}", request.message_id)
    crossing = headers.get("pymq-forward-id")
    assert request.dedup_id == ("fwd:" + crossing if crossing else
                                next((headers[n] for n in ("pymq-dedup-id", "_AMQ_DUPL_ID") if headers.get(n)), None))


# -- what a forwarded SEND costs: its link's kept routes, a discard decided before a message exists ----------
def _crossing(i: int, **headers: str) -> dict[str, str]:
    return {"pymq-forwarded": "n0", "pymq-message-id": f"ID:n0-{i}", "pymq-forward-id": f"n0-{i}", **headers}


class _Reader(FakeClient):
    """A subscriber's connection that keeps what it is given."""

    def __init__(self) -> None:
        super().__init__(name="reader")
        self.got: list[str] = []

    def deliver(self, consumer, entry) -> None:
        self.got.append(entry.message.message_id)


def test_a_peers_link_keeps_its_routes_apart_from_its_own_sends(core, monkeypatch):
    """The entry rules run once for a link's forwards to one destination (the route is kept like any
    connection's), and a non-forwarded SEND on the same connection never takes the forwarded route (nor the
    reverse): a client SEND there is decided by the rules and gets an id of this broker's."""
    from pymq_server.broker.router import Router
    entries: list[str] = []
    entry = Router._entry

    def counted(self, client, request, kind):
        entries.append(request.destination)
        return entry(self, client, request, kind)

    monkeypatch.setattr(Router, "_entry", counted)
    link = FakeClient(cluster=True)
    for i in range(3):
        assert core.broker.send(link, Core.request("/queue/q", _crossing(i)))[0] == f"ID:n0-{i}"
    assert len(entries) == 1
    own = core.broker.send(link, Core.request("/queue/q", {}))[0]
    assert own is not None and not own.startswith("ID:n0-") and len(entries) == 2
    core.broker.send(link, Core.request("/queue/q", _crossing(3)))
    core.broker.send(link, Core.request("/queue/q", {}))
    assert len(entries) == 2                        # each kind of SEND took its own kept route
    assert [m.message_id for m in _waiting(core, "q")] == ["ID:n0-0", "ID:n0-1", "ID:n0-2", own, "ID:n0-3",
                                                           _waiting(core, "q")[-1].message_id]
    assert all("pymq-forwarded" not in m.headers for m in _waiting(core, "q"))
    # a forward from a login that is not a node's is refused by the rules, whatever a link kept
    with pytest.raises(AccessDenied):
        core.broker.send(FakeClient(), Core.request("/queue/q", _crossing(4)))


def test_a_forward_nothing_here_holds_is_dropped_before_a_message_is_built(core, monkeypatch):
    """A forwarded topic message with no subscription here, of its topic or of a pattern matching it, is
    counted as the peer's false positive and dropped without building a message; one that a subscription's
    selector refuses needs the message, and commit's rule drops it the same way; a pattern's subscriber
    gets it."""
    from pymq_server.broker.membership import Standalone
    from pymq_server.broker.placement import Placement
    built: list[str] = []
    build = Placement._build

    def counted(self, request, destination, config, client):
        built.append(destination)
        return build(self, request, destination, config, client)

    discarded: list[int] = []
    monkeypatch.setattr(Placement, "_build", counted)
    monkeypatch.setattr(Standalone, "discarded_forwarded", lambda self: discarded.append(1))
    placement = core.broker.placement
    link = FakeClient(cluster=True)
    for i in range(3):
        assert core.broker.send(link, Core.request("/topic/nobody", _crossing(i))) == (f"ID:n0-{i}", False)
    assert built == [] and len(discarded) == 3 and placement.dropped_no_subscriber == 3
    assert core.broker.destinations.topics["nobody"].published == 3
    reader = _Reader()
    core.broker.subscribe(reader, SubscribeRequest("/topic/some", "s1", selector="n = 1"))
    core.broker.subscribe(reader, SubscribeRequest("/topic/p.*", "s2"))
    core.broker.send(link, Core.request("/topic/some", _crossing(10, n="2", **{"pymq-types": "n=i"})))
    assert built == ["/topic/some"] and len(discarded) == 4          # built, then dropped by commit's rule
    core.broker.send(link, Core.request("/topic/some", _crossing(11, n="1", **{"pymq-types": "n=i"})))
    core.broker.send(link, Core.request("/topic/p.x", _crossing(12)))
    topics = core.broker.destinations.topics
    held = [e.message.message_id for name in ("some", "p.*") for sub in topics[name].subscriptions.values()
            for e in sub.queue.ready]
    assert sorted(reader.got + held) == ["ID:n0-11", "ID:n0-12"] and len(discarded) == 4


def test_a_topic_message_asks_for_the_patterns_matching_its_topic_once(core, monkeypatch):
    """Plan's pattern clock and the subscriptions it is given to read the same matched pattern topics: asked
    of the topic once per message, a client's and a peer's alike."""
    from pymq_server.broker.topic import Topic
    asked: list[str] = []
    matched = Topic.matched
    monkeypatch.setattr(Topic, "matched", lambda self: asked.append(self.name) or matched(self))
    reader = _Reader()
    core.broker.subscribe(reader, SubscribeRequest("/topic/p.*", "s1"))
    core.broker.subscribe(reader, SubscribeRequest("/topic/p.x", "s2"))
    asked.clear()
    core.send("/topic/p.x", {})
    core.broker.send(FakeClient(cluster=True), Core.request("/topic/p.x", _crossing(1)))
    assert asked == ["p.x", "p.x"]
    topics = core.broker.destinations.topics
    held = [e.message for name in ("p.x", "p.*") for sub in topics[name].subscriptions.values()
            for e in sub.queue.ready]
    assert len(reader.got) + len(held) == 4
