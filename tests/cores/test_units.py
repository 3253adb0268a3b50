"""The sans-IO parts of the multi-worker broker: the channel envelope and the ownership rules
(spec/cores.md §2.1, §2.2), including hostile input."""
from __future__ import annotations

import struct

import pytest

from pymq.errors import ClusterError
from pymq.routing import GroupRouter
from pymq_server.cores.envelope import HEAD_SIZE, EnvelopeReader, Kind, encode
from pymq_server.cores.ownership import Ownership


def test_envelopes_round_trip_whole_and_byte_by_byte():
    items = [(Kind.HELLO, 3, "", b"3"), (Kind.FRAME, 1, "w1c17", b"SEND\ndestination:/queue/a\n\n\0"),
             (Kind.CLOSE, 0, "w0c2", b""), (Kind.FRAME, 65535, "é" * 10, b"\0" * 1000)]
    wire = b"".join(encode(*item) for item in items)
    assert len(encode(Kind.CLOSE, 0, "", b"")) == HEAD_SIZE == 9
    whole = EnvelopeReader(1 << 20).feed(wire)
    assert [tuple(e) for e in whole] == items
    reader = EnvelopeReader(1 << 20)
    got = []
    for i in range(len(wire)):
        got.extend(reader.feed(wire[i:i + 1]))
    assert [tuple(e) for e in got] == items and reader.buffered == 0
    reader = EnvelopeReader(1 << 20)
    assert reader.feed(wire + wire[:5]) and reader.buffered == 5       # a trailing partial head waits


def test_hostile_envelopes_are_refused_before_anything_is_held():
    with pytest.raises(ClusterError, match="over the limit"):
        EnvelopeReader(1024).feed(struct.pack(">BHHI", Kind.FRAME, 0, 0, 0xFFFFFFFF))   # 4 GiB announced
    with pytest.raises(ClusterError, match="unknown kind"):
        EnvelopeReader(1024).feed(struct.pack(">BHHI", 200, 0, 0, 0))
    with pytest.raises(ClusterError, match="not UTF-8"):
        EnvelopeReader(1024).feed(struct.pack(">BHHI", Kind.CLOSE, 0, 2, 0) + b"\xff\xfe")


@pytest.mark.parametrize("workers", [2, 3, 5])
def test_the_owner_is_the_routing_modules_rendezvous_over_worker_ids(workers):
    router = GroupRouter([f"w{k}" for k in range(workers)])
    views = [Ownership(k, workers, "pymq") for k in range(workers)]
    counts = [0] * workers
    for i in range(2000):
        name = f"/queue/orders.{i}" if i % 2 else f"/topic/prices.{i}"
        owners = {v.owner(name) for v in views}
        assert owners == {int(router.route(name)[1:])}        # every worker agrees, as the hash says
        counts[owners.pop()] += 1
    assert all(c > 2000 / workers / 2 for c in counts)         # spread, not all in one


def test_names_the_home_keeps_and_names_that_follow_another():
    o = Ownership(1, 3, "pymq")
    assert o.owner("/pymq/admin") == 1
    assert o.owner("/temp-queue/replies") == 1                  # one's own, by local name
    assert o.owner("/temp-queue/tmp.w2c17.replies") == 2        # the global name names its home
    assert o.owner("/temp-topic/tmp.w0c1.x") == 0
    assert o.owner("/temp-queue/tmp.w9c1.x") == 1               # no such worker: the home's (then refused there)
    assert o.owner("/temp-queue/tmp.w" + "9" * 5000) == 1       # hostile: bounded, no giant int
    for i in range(50):
        assert o.owner(f"/queue/DLQ.jobs.{i}") == o.owner(f"/queue/jobs.{i}")


@pytest.mark.parametrize("token,owner", [
    ("w1.5", 1), ("w2.123", 2), ("5", None), ("w3.1", None), ("w.1", None), ("wx.1", None), ("w1", None),
    ("w" + "9" * 4000 + ".1", None), ("ID:pymq.w2-17", 2), ("ID:pymq.w1x-2", None), ("ID:pymq.w-2", None),
    ("ID:other.w1-2", None), ("ID:pymq.w" + "1" * 4000 + "-2", None), ("", None),
])
def test_ack_tokens_name_their_owner_or_none(token, owner):
    assert Ownership(0, 3, "pymq").ack_owner(token) == owner


def test_hand_over_state_round_trips_and_hostile_state_is_a_value_error():
    from pymq_server.cores.handover import pack_state, unpack_state
    doc = {"user": "guest", "roles": ["a"], "version": "1.2", "to_client": 250, "to_server": 0}
    unread = b"SEND\ndestination:/queue/a\n\nx\0SEN"
    assert unpack_state(pack_state(doc, unread)) == (doc, unread)
    assert unpack_state(pack_state(doc, b"")) == (doc, b"")
    wire = pack_state(doc, unread)
    for bad in (b"", b"\0\0", struct.pack(">I", 0xFFFFFFFF) + b"{}", struct.pack(">I", 2) + b"[]",
                struct.pack(">I", 3) + b"{x}", wire[:10]):
        with pytest.raises(ValueError):
            unpack_state(bad)


def test_hand_over_tokens_of_a_restarted_worker_never_join_its_dead_predecessors():
    """A descriptor whose envelope never left (its worker died between the two) waits at the owner for 30 s;
    the restarted worker's first hand-over must not be joined with it (the old client's socket adopted with
    the new connection's principal)."""
    import asyncio

    from pymq_server.cores.mesh import Mesh
    loop = asyncio.new_event_loop()
    try:
        before, after = (Mesh(0, 2, "/nonexistent", "pymq", loop, 1 << 20).handover for _ in range(2))
        assert before is not None and after is not None
        first = [before.next_token() for _ in range(3)]
        assert len(set(first)) == 3
        assert not set(first) & {after.next_token() for _ in range(3)}
        assert all(len(t.encode()) < 64 for t in first)      # the datagram the owner reads is at most 64 bytes
    finally:
        loop.close()
