"""The sans-IO parts of the multi-worker broker: the channel envelope and the ownership rules
(spec/cores.md §2.1, §2.2), including hostile input."""
from __future__ import annotations

import json
import pathlib
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
def test_the_owner_of_a_name_without_a_number_is_the_routing_modules_rendezvous_over_worker_ids(workers):
    router = GroupRouter([f"w{k}" for k in range(workers)])
    views = [Ownership(k, workers, "pymq") for k in range(workers)]
    counts = [0] * workers
    for i in range(2000):
        name = f"/queue/orders-{i}" if i % 2 else f"/topic/prices.eu{i}"
        owners = {v.owner(name) for v in views}
        assert owners == {int(router.route(name)[1:])}        # every worker agrees, as the hash says
        counts[owners.pop()] += 1
    assert all(c > 2000 / workers / 2 for c in counts)         # spread, not all in one


@pytest.mark.parametrize("workers", [2, 3, 5, 16])
def test_a_numbered_family_is_spread_evenly_from_its_stems_winner(workers):
    """spec/cores.md §2: `<stem>.<n>` goes to (rendezvous(stem) + n) mod W, so any W consecutive members are
    on W different workers and no worker holds more than ceil(D/W) of D members (the hash alone put bench
    row m's 4 queues on 2 workers 3:1 or 4:0 five times in eight)."""
    router = GroupRouter([f"w{k}" for k in range(workers)])
    views = [Ownership(k, workers, "pymq") for k in range(workers)]
    for family in range(50):
        stem = f"/queue/bench.{1764356400 + family}.m"
        first = int(router.route(stem)[1:])
        owners = []
        for n in range(3 * workers + 1):
            agreed = {v.owner(f"{stem}.{n}") for v in views}
            assert agreed == {(first + n) % workers}
            owners.append(agreed.pop())
        for start in range(len(owners) - workers + 1):
            assert sorted(owners[start:start + workers]) == list(range(workers))
        for d in range(1, len(owners) + 1):
            assert max(owners[:d].count(k) for k in range(workers)) == -(-d // workers)


def test_the_owner_table_of_four_queues_over_two_workers_is_two_and_two():
    o = Ownership(0, 2, "pymq")
    for run in range(200):
        table = [o.owner(f"/queue/bench.{run}.md.{i}") for i in range(4)]
        assert sorted(table) == [0, 0, 1, 1], (run, table)
    # a data directory written before the rule (cores.json without `placement`): the hash alone, as then
    old = Ownership(0, 2, "pymq", numbered=False)
    router = GroupRouter(["w0", "w1"])
    tables = [[old.owner(f"/queue/bench.{run}.md.{i}") for i in range(4)] for run in range(200)]
    assert tables == [[int(router.route(f"/queue/bench.{run}.md.{i}")[1:]) for i in range(4)] for run in range(200)]
    assert any(sorted(t) != [0, 0, 1, 1] for t in tables)      # what the rule is for


def test_owners_match_the_spec_vectors_in_every_worker():
    cases = json.loads((pathlib.Path(__file__).resolve().parents[2] / "spec" / "vectors"
                        / "worker_owners.json").read_text(encoding="utf-8"))["cases"]
    assert len(cases) > 200
    assert {case["placement"] for case in cases} == {"numbered", "hash"}
    for case in cases:
        numbered = case["placement"] == "numbered"
        for me in range(case["workers"]):
            got = Ownership(me, case["workers"], "pymq", numbered=numbered).owner(case["destination"])
            assert got == case["owner"], case


def test_the_placement_is_decided_once_with_the_data_directory(tmp_path):
    """A new data directory records the numbered placement; one written before it (cores.json without
    `placement`) keeps the hash alone, so its messages stay with the owners they were written at."""
    from pymq.errors import ConfigError
    from pymq_server.config import BrokerConfig
    from pymq_server.cores.supervisor import prepare_data_dir

    def config(d):  # type: ignore[no-untyped-def]
        return BrokerConfig.from_dict({"data_dir": str(d), "workers": 2})

    assert prepare_data_dir(config(tmp_path / "new")) is True
    assert json.loads((tmp_path / "new" / "cores.json").read_text()) == {"workers": 2, "placement": "numbered"}
    assert prepare_data_dir(config(tmp_path / "new")) is True           # the same after a restart
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "cores.json").write_text(json.dumps({"workers": 2}))
    assert prepare_data_dir(config(tmp_path / "old")) is False
    assert json.loads((tmp_path / "old" / "cores.json").read_text()) == {"workers": 2}   # not rewritten
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "cores.json").write_text(json.dumps({"workers": 2, "placement": "random"}))
    with pytest.raises(ConfigError, match="placement 'random'"):
        prepare_data_dir(config(tmp_path / "odd"))


def test_a_numbered_name_keeps_bounded_hostile_numbers_hashed():
    o = Ownership(0, 3, "pymq")
    router = GroupRouter(["w0", "w1", "w2"])
    for name in ("/queue/x." + "9" * 5000, "/queue/x.1e5", "/queue/x.\u0663", "/queue/x.", "/queue/x.+1"):
        assert o.owner(name) == int(router.route(name)[1:])    # hashed whole, no giant int, no Unicode digit


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
