"""A cluster node with backups (spec/ha.md §5), on the cluster's sans-IO state with a fake clock: the highest
HA epoch a node id has shown (its record, a link's CONNECT) wins; a lower one's links, forwards and control
frames are refused; a higher one replaces the former process (its link closes, its filter and consumers are
forgotten, a link to the record's new address follows); a lower record racing its fence is read as the last
record of the higher epoch; this process, finding its own record at a higher epoch, is fenced."""
from __future__ import annotations

import pytest

from pymq_server.cluster.actions import Connect, Fenced, PeerDead, Replaced
from pymq.errors import PymqError
from pymq_server.cluster.records import Member
from pymq_server.cluster.registry import record_epoch
from tests.cluster.test_state import FakeClock, _state
from tests.storage.services import postgres_url, redis_url  # noqa: F401 - fixtures


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _read(state, *members: Member) -> list:
    return state.read(list(members), {}, {})


def _member(clock: FakeClock, node: str, port: int, epoch: int = 0, beat_ago: int = 0) -> Member:
    return Member(node, f"127.0.0.1:{port}", 0, clock.wall - beat_ago, epoch)


def test_rule_5_1_and_5_2_a_record_at_a_higher_epoch_replaces_the_former_process_and_connects_to_the_new_address(clock):
    n0 = _state("n0", clock)
    actions = _read(n0, _member(clock, "n0", 6000), _member(clock, "n1", 6001, epoch=1))
    assert Connect("n1", "127.0.0.1:6001") in actions
    n0.link_up("n1")
    n0.routes.consumers_of("n1", {"/queue/q": 2})
    n0.topics.announced("n1", {}, n0.topics.announcement()[1])     # n1 announced an empty filter
    assert n0.topics.peers.targets("t") == []
    assert n0.admits("n1", 1)
    clock.advance(100)                                              # n1's backup took over at epoch 2
    actions = _read(n0, _member(clock, "n0", 6000), _member(clock, "n1", 7001, epoch=2))
    assert actions[0] == Replaced("n1", 2)
    assert Connect("n1", "127.0.0.1:7001") in actions              # the record's new address
    assert not any(isinstance(a, PeerDead) for a in actions)       # taken over within dead_after_ms: alive
    assert "n1" not in n0.ready
    assert n0.topics.peers.targets("t") == ["n1"]                  # match-all until the new process announces
    assert n0.routes.remote_consumers.get("/queue/q", {}).get("n1", 0) == 0
    # the former process's frames are refused from now on, the new one's admitted
    assert not n0.admits("n1", 1) and n0.admits("n1", 2)
    assert n0.figures.refused_stale_epoch == 1
    assert n0.link_opened("n1", 1) == (False, [])
    assert n0.link_opened("n1", 2) == (True, [])
    assert n0.figures.refused_stale_epoch == 2


def test_rule_5_2_a_link_at_a_higher_epoch_replaces_before_the_record_says_so(clock):
    n0 = _state("n0", clock)
    _read(n0, _member(clock, "n0", 6000), _member(clock, "n1", 6001, epoch=1))
    n0.link_up("n1")
    admitted, actions = n0.link_opened("n1", 2)                     # the new live's CONNECT came first
    assert admitted and actions == [Replaced("n1", 2)] and "n1" not in n0.ready
    assert not n0.admits("n1", 1)
    # the record still at epoch 1 (the new live's first beat not read yet): the known epoch stays 2, so the
    # next record of epoch 2 is not a second replacement
    _read(n0, _member(clock, "n0", 6000), _member(clock, "n1", 6001, epoch=1))
    assert not n0.admits("n1", 1)
    clock.advance(100)
    actions = _read(n0, _member(clock, "n0", 6000), _member(clock, "n1", 7001, epoch=2))
    assert not any(isinstance(a, Replaced) for a in actions) and Connect("n1", "127.0.0.1:7001") in actions


def test_rule_5_2_a_lower_epochs_record_is_read_as_the_last_record_of_the_higher_one(clock):
    """A former live's beat that raced its fence puts its old address back for a moment: peers keep the
    address of the epoch they know, and the node does not die or flap for it."""
    n0 = _state("n0", clock)
    _read(n0, _member(clock, "n0", 6000), _member(clock, "n1", 7001, epoch=2))
    n0.link_up("n1")
    clock.advance(100)
    actions = _read(n0, _member(clock, "n0", 6000), _member(clock, "n1", 6001, epoch=1))
    assert actions == [] and n0.membership.members["n1"].address == "127.0.0.1:7001"
    assert n0.membership.alive("n1")
    # and once that last record of epoch 2 ages past dead_after_ms (300 ms) with nothing newer, n1 is dead
    clock.advance(300)
    actions = _read(n0, _member(clock, "n0", 6000), _member(clock, "n1", 6001, epoch=1))
    assert PeerDead("n1") in actions


def test_rule_5_2_nodes_without_backups_are_epoch_0_and_a_restart_is_no_replacement(clock):
    n0 = _state("n0", clock)
    _read(n0, _member(clock, "n0", 6000), _member(clock, "n1", 6001))
    n0.link_up("n1")
    assert n0.link_opened("n1", 0) == (True, [])
    clock.advance(100)
    actions = _read(n0, _member(clock, "n0", 6000), _member(clock, "n1", 6002))   # restarted elsewhere
    assert not any(isinstance(a, Replaced) for a in actions) and n0.admits("n1", 0)
    assert n0.figures.refused_stale_epoch == 0


def test_rule_5_2_a_node_started_again_without_ha_is_the_node_again(clock):
    """An operator drops ``ha:`` from a node that had it: its new process writes no epoch. A record of
    epoch 0 that started after the node's last record with an epoch is the node (a former live always has
    an epoch and started earlier), so peers do not lock it out; a record of a lower epoch that started
    earlier is still a former live's."""
    n0 = _state("n0", clock)
    _read(n0, _member(clock, "n0", 6000), Member("n1", "127.0.0.1:7001", 100, clock.wall, 2))
    n0.link_up("n1")
    clock.advance(100)
    actions = _read(n0, _member(clock, "n0", 6000), Member("n1", "127.0.0.1:6001", 50, clock.wall, 1))
    assert actions == [] and not n0.admits("n1", 1)                           # a former live: refused
    actions = _read(n0, _member(clock, "n0", 6000), Member("n1", "127.0.0.1:6001", 50, clock.wall, 0))
    assert actions == [] and not n0.admits("n1", 0)                           # started before: refused too
    clock.advance(100)
    actions = _read(n0, _member(clock, "n0", 6000), Member("n1", "127.0.0.1:8001", 300, clock.wall, 0))
    assert actions[0] == Replaced("n1", 0) and Connect("n1", "127.0.0.1:8001") in actions
    assert n0.admits("n1", 0) and n0.link_opened("n1", 0) == (True, [])


def test_rule_5_4_this_process_is_fenced_when_its_own_record_is_at_a_higher_epoch(clock):
    n1 = _state("n1", clock)
    n1.epoch = 1
    _read(n1, _member(clock, "n0", 6000), _member(clock, "n1", 6001, epoch=1))
    n1.link_up("n0")
    clock.advance(100)
    actions = _read(n1, _member(clock, "n0", 6000), _member(clock, "n1", 7001, epoch=2))
    assert actions == [Fenced(2)] and n1.fenced
    assert _read(n1, _member(clock, "n0", 6000), _member(clock, "n1", 7001, epoch=2)) == []   # once, and nothing


def test_rule_5_1_records_carry_the_epoch_only_when_there_is_one_and_read_unknown_fields(clock):
    plain = Member("n0", "h:1", 5, 6)
    assert "epoch" not in plain.encode() and Member.decode(plain.encode()) == plain
    held = Member("n0", "h:1", 5, 6, 3)
    assert Member.decode(held.encode()) == held and record_epoch(held.encode()) == 3
    assert Member.decode('{"node": "n0", "address": "h:1", "started": 5, "beat": 6, "later": true}') == plain
    assert record_epoch(None) == 0 and record_epoch(b"not json") == 0


@pytest.mark.parametrize("kind", ["redis", "postgresql"])
def test_rule_5_3_a_former_processs_store_writes_are_refused_and_change_nothing(request, kind):
    """The membership store is not fenced by the HA lease: its writes check the epoch themselves."""
    import uuid

    from pymq.errors import ClusterError
    from pymq_server.cluster.registry import open_registry
    url = request.getfixturevalue("redis_url" if kind == "redis" else "postgres_url")
    name = "e" + uuid.uuid4().hex[:8]
    former, new, plain = (open_registry(url, name, "n1", 1), open_registry(url, name, "n1", 2),
                          open_registry(url, name))
    try:
        former.beat(Member("n1", "127.0.0.1:6001", 1, 10, 1))
        former.assign("sub-a", "n1", {"topic": "t"})
        new.beat(Member("n1", "127.0.0.1:7001", 2, 20, 2))               # the backup took over
        new.set_routing_key("q", "correlation-id")
        before = (plain.members(), plain.subscriptions(), plain.routing_keys())
        writes = [lambda: former.beat(Member("n1", "127.0.0.1:6001", 1, 30, 1)),
                  lambda: former.leave("n1"), lambda: former.assign("sub-a", None),
                  lambda: former.assign("sub-b", "n1", {"topic": "t"}), lambda: former.claim("sub-a", "n1"),
                  lambda: former.set_routing_key("q", "message-id")]
        for write in writes:
            with pytest.raises(ClusterError) as refused:
                write()
            assert refused.value.reason == "stale-epoch"
        assert (plain.members(), plain.subscriptions(), plain.routing_keys()) == before
        assert [m.address for m in plain.members()] == ["127.0.0.1:7001"]
        new.assign("sub-b", "n1", {"topic": "t"})                          # the holder writes as ever
        new.beat(Member("n1", "127.0.0.1:7001", 2, 40, 2))
        assert set(plain.subscriptions()) == {"sub-a", "sub-b"} and plain.members()[0].beat == 40
    finally:
        new.leave("n1")
        for key in ("sub-a", "sub-b"):
            new.assign(key, None)
        for registry in (former, new, plain):
            registry.close()


def test_rule_5_2_a_links_frames_are_looked_up_only_once_some_node_has_shown_an_epoch(clock):
    """Without backups anywhere (every epoch 0) no link can be below its node's highest: a forward is not
    looked up. Once a node id shows an epoch, its former process's links are refused frame by frame."""
    from pymq_server.cluster.epochs import LinkEpochs

    class Session:
        def __init__(self, name: str) -> None:
            self.user = type("User", (), {"name": "cluster:" + name})()
            self.link = self
            self.aborted = False

        def abort(self) -> None:
            self.aborted = True

        close = abort

    class Unread(dict):
        def get(self, key, default=None):
            raise AssertionError("looked up")

    n0 = _state("n0", clock)
    epochs = LinkEpochs(n0)
    old, other = Session("n1"), Session("n2")
    epochs.admitted(old, {})                                      # n1's link at epoch 0
    epochs.admitted(other, {})
    kept, epochs.inbound = epochs.inbound, Unread()
    epochs.check(old)                                             # no epoch anywhere: nothing looked up
    epochs.inbound = kept
    _read(n0, _member(clock, "n0", 6000), _member(clock, "n1", 6001, epoch=2), _member(clock, "n2", 6002))
    assert n0.epochs_shown
    with pytest.raises(PymqError):
        epochs.check(old)                                         # n1's former process: refused
    assert old.aborted
    epochs.check(other)                                           # n2 is at its highest (0): admitted
    assert not other.aborted
