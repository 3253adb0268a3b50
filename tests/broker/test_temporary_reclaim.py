"""A reconnecting client takes its temporary destinations' global names back (spec/ha.md §4.7).

CONNECTED gives each connection a token (``pymq-reclaim-token``); a later CONNECT of the same user offering it
(``pymq-reclaim``) gets the same global names, so a reply a responder addressed to the old name reaches the
new connection. Refused, and nothing made under the old names: another user's CONNECT with the token, a
forged token, a token offered past ``temporary_reclaim_ms``, names another worker holds. The rules are
tested on :class:`TemporaryNames` with a clock of the test's own, and end to end on a real broker: a link
lost without DISCONNECT, a half-open link the broker still holds, a restart on the same store (the key that
signs the tokens is in its catalog).
"""
from __future__ import annotations

import pytest

from pymq_server.broker.auth import save_user
from pymq_server.broker import temporary
from pymq_server.broker.temporary import TemporaryNames
from tests.conftest import RawStomp


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def holders() -> tuple[TemporaryNames, Clock]:
    clock = Clock()
    names = TemporaryNames(30_000, clock)
    names.start(None)
    return names, clock


# -- the rules, on the registry ------------------------------------------------------------------------------

def test_a_lost_link_s_names_come_back_to_the_same_user_within_the_window(holders):
    names, clock = holders
    first = names.issue("c1", "/", "alice")
    assert first.names.startswith("c1-") and first.token
    names.released(first.names, "c1", lost=True)
    clock.now += 29.9
    again = names.reclaim(first.token, "c2", "/", "alice")
    assert (again.names, again.refused, again.holder) == (first.names, "", "")
    assert names.held[first.names] == "c2"
    names.released(again.names, "c2", lost=True)
    clock.now += 30.1                                       # the window counts from the last loss
    late = names.reclaim(first.token, "c3", "/", "alice")
    assert late.refused.startswith("the names were not re-claimed within") and late.names != first.names


def test_another_user_s_or_a_forged_token_re_claims_nothing(holders):
    names, clock = holders
    first = names.issue("c1", "/", "alice")
    names.released(first.names, "c1", lost=True)
    for user, vhost, token in [("bob", "/", first.token), ("alice", "other", first.token),
                               ("alice", "/", first.token[:-2] + ("AA" if not first.token.endswith("AA") else "BB")),
                               ("alice", "/", "c1." + first.names.split("-")[1] + ".x"),
                               ("alice", "/", "x" * 10_000), ("alice", "/", "c1.zz.zz"), ("alice", "/", "")]:
        answer = names.reclaim(token, "c9", vhost, user)
        assert answer.refused and answer.names != first.names, (user, vhost, token[:40])
    assert first.names not in names.held                     # nothing given, and still alice's to take
    assert names.reclaim(first.token, "c10", "/", "alice").names == first.names


def test_names_held_by_an_open_connection_name_their_holder(holders):
    names, _ = holders
    first = names.issue("c1", "/", "alice")
    answer = names.reclaim(first.token, "c2", "/", "alice")
    assert answer.holder == "c1" and names.held[first.names] == "c1"    # the facade closes c1, then asks again


def test_names_of_another_process_only_within_the_window_after_it_starts_serving(holders):
    names, clock = holders
    token = names.issue("c7", "/", "alice").token
    other = TemporaryNames(30_000, clock)                     # a restart or a backup taking over: the same key
    other.start(names.key)
    clock.now += 29.0
    assert other.reclaim(token, "c1", "/", "alice").refused == ""
    third = TemporaryNames(30_000, clock)
    third.start(names.key)
    clock.now += 30.5
    assert third.reclaim(token, "c1", "/", "alice").refused.startswith("the names were not re-claimed within")
    fresh = TemporaryNames(30_000, clock)
    fresh.start(None)                                        # a store without the key: nothing verifies
    assert fresh.reclaim(token, "c1", "/", "alice").refused == "the token does not verify for this user"


def test_names_of_another_worker_and_a_window_of_zero_are_refused(holders):
    names, _ = holders
    token = names.issue("w1c4", "/", "alice").token
    assert "another worker" in names.reclaim(token, "w0c9", "/", "alice").refused
    off = TemporaryNames(0, Clock())
    off.start(None)
    assert off.issue("c1", "/", "alice").token == ""          # no token at all: nothing to offer


def test_what_is_kept_for_a_re_claim_is_bounded_by_the_window_and_a_count(holders, monkeypatch):
    names, clock = holders
    for k in range(1000):
        names.released(names.issue(f"c{k}", "/", "alice").names, f"c{k}", lost=True)
    clock.now += 31
    last = names.issue("c5000", "/", "alice")
    names.released(last.names, "c5000", lost=True)
    assert list(names.lost) == [last.names]
    assert not names.held
    clock.now += 1
    monkeypatch.setattr(temporary, "MAX_KEPT", 10)
    for k in range(25):
        names.released(names.issue(f"c{6000 + k}", "/", "alice").names, f"c{6000 + k}", lost=True)
    assert len(names.lost) == 10 and last.names not in names.lost          # the oldest forgotten first
    disconnected = names.issue("c5001", "/", "alice")
    names.released(disconnected.names, "c5001", lost=False)   # DISCONNECT: nothing kept for it
    assert disconnected.names not in names.lost
    assert names.reclaim(disconnected.token, "c5002", "/", "alice").refused


def test_names_ended_by_disconnect_are_not_re_claimed_even_in_the_first_window(holders):
    names, clock = holders
    first = names.issue("c1", "/", "alice")
    names.released(first.names, "c1", lost=False)
    clock.now += 1
    assert names.reclaim(first.token, "c2", "/", "alice").refused == \
        "the connection that held the names ended them with DISCONNECT"


# -- end to end ----------------------------------------------------------------------------------------------

def _connect(port: int, user: str = "guest", token: str | None = None, host: str = "/") -> tuple[RawStomp, dict]:
    client = RawStomp(port)
    headers = {"pymq-reclaim": token} if token is not None else {}
    headers["host"] = host
    frame = client.connect(login=user, passcode=user + "pw" if user != "guest" else "guest", **headers)
    assert frame.command == "CONNECTED", frame
    return client, frame.headers


def _reply_to(client: RawStomp, local: str = "reply") -> str:
    """``client`` subscribes to its temporary queue ``local``; the global name a ``reply-to`` gets for it."""
    client.send("SUBSCRIBE", {"destination": f"/temp-queue/{local}", "id": local})
    client.send("SEND", {"destination": f"/temp-queue/{local}", "reply-to": f"/temp-queue/{local}", "receipt": "r"},
                b"ask")
    got = {}
    while len(got) < 2:
        frame = client.read(10)
        got[frame.command] = frame
    return got["MESSAGE"].headers["reply-to"]


def _reply(port: int, destination: str, host: str = "/") -> object:
    responder, _ = _connect(port, host=host)
    responder.send("SEND", {"destination": destination, "receipt": "answer"}, b"the reply")
    frame = responder.read(10)
    responder.close()
    return frame


def test_a_reply_to_the_old_name_reaches_the_connection_that_re_claimed_it(broker):
    first, connected = _connect(broker.port)
    token = connected["pymq-reclaim-token"]
    old = _reply_to(first)
    first.close()                                            # lost without DISCONNECT
    second, connected = _connect(broker.port, token=token)
    assert connected["pymq-reclaimed"] == "true" and connected["pymq-reclaim-token"] == token
    second.send("SUBSCRIBE", {"destination": "/temp-queue/reply", "id": "again", "receipt": "sub"})
    assert second.read(10).command == "RECEIPT"
    assert _reply(broker.port, old).command == "RECEIPT"
    frame = second.read(10)
    assert frame.command == "MESSAGE" and frame.body == b"the reply" and frame.headers["subscription"] == "again"
    second.close()


def test_a_half_open_link_of_the_same_client_is_closed_and_its_client_id_freed(broker):
    first = RawStomp(broker.port)
    connected = first.connect(**{"client-id": "app-1"}).headers
    old = _reply_to(first)
    # the broker still holds the first link (nothing was closed): the same client comes back on a new one
    second = RawStomp(broker.port)
    frame = second.connect(**{"client-id": "app-1", "pymq-reclaim": connected["pymq-reclaim-token"]})
    assert frame.command == "CONNECTED" and frame.headers["pymq-reclaimed"] == "true", frame
    assert first.is_closed(5)
    assert _reply_to(second) == old
    second.close()


@pytest.fixture
def users_broker(broker_factory, tmp_path):
    users = str(tmp_path / "users.yaml")
    save_user(users, "alice", "alicepw", [])
    save_user(users, "bob", "bobpw", [])
    save_user(users, "guest", "guest", [])
    data = str(tmp_path / "kept")
    return lambda: broker_factory(users_file=users, data_dir=data)


def test_after_a_restart_the_owner_re_claims_and_another_user_with_the_token_is_refused(users_broker):
    first_process = users_broker()
    alice, connected = _connect(first_process.port, "alice")
    token = connected["pymq-reclaim-token"]
    old = _reply_to(alice)
    alice.close()
    first_process.stop()
    broker = users_broker()                                  # the same store: the key that signs tokens is there
    bob, connected = _connect(broker.port, "bob", token=token)
    assert connected["pymq-reclaimed"] == "false" and connected["pymq-reclaim-refused"] == \
        "the token does not verify for this user"
    assert connected["pymq-reclaim-token"] != token
    assert _reply_to(bob) != old                             # bob's 'reply' has a name of its own
    frame = _reply(broker.port, old)
    assert frame.command == "ERROR" and frame.headers["pymq-code"] == "unknown-destination", frame
    with pytest.raises(TimeoutError):
        bob.read(0.5)
    holders = broker.broker.destinations.name_holders
    old_names = old[len("/temp-queue/tmp."):].rpartition(".")[0]
    assert broker.call(lambda: (old_names in holders.held, old_names in holders.lost,
                                [n for n in broker.broker.destinations.temp_queues if old_names in n])) == \
        (False, False, [])                                   # nothing made or kept under alice's names
    alice, connected = _connect(broker.port, "alice", token=token)
    assert connected["pymq-reclaimed"] == "true"
    assert _reply_to(alice) == old
    bob.close()
    alice.close()


def test_without_re_claiming_no_token_is_given(broker_factory):
    broker = broker_factory(temporary_reclaim_ms=0)
    client, connected = _connect(broker.port)
    assert "pymq-reclaim-token" not in connected
    client.close()
    client, connected = _connect(broker.port, token="c1.0123456789abcdef.AAAA")
    assert connected["pymq-reclaimed"] == "false" and "temporary_reclaim_ms: 0" in connected["pymq-reclaim-refused"]
    client.close()


# -- what a lost link's temporary queues hold meanwhile ------------------------------------------------------

def _until(fn, timeout: float = 10.0) -> bool:
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return True
        time.sleep(0.01)
    return fn()


def _kept(broker, reply_to: str) -> bool:
    names = reply_to[len("/temp-queue/tmp."):].rpartition(".")[0]
    return broker.call(lambda: names in broker.broker.destinations.orphaned)


def test_a_lost_link_s_queue_keeps_its_messages_and_takes_replies_until_the_re_claim(broker):
    first, connected = _connect(broker.port)
    old = _reply_to(first, "kept")            # its own 'ask' was delivered and never acknowledged (auto: acked)
    first.send("SUBSCRIBE", {"destination": "/temp-queue/unacked", "id": "u", "ack": "client-individual"})
    first.send("SEND", {"destination": "/temp-queue/unacked", "receipt": "u1"}, b"delivered, not acknowledged")
    got = {first.read(10).command, first.read(10).command}
    assert got == {"RECEIPT", "MESSAGE"}
    first.close()                                            # lost without DISCONNECT
    assert _until(lambda: _kept(broker, old))
    assert _reply(broker.port, old).command == "RECEIPT"     # taken while nobody holds the name
    second, connected = _connect(broker.port, token=connected["pymq-reclaim-token"])
    assert connected["pymq-reclaimed"] == "true" and not _kept(broker, old)
    second.send("SUBSCRIBE", {"destination": "/temp-queue/kept", "id": "k"})
    frame = second.read(10)
    assert frame.command == "MESSAGE" and frame.body == b"the reply", frame
    second.send("SUBSCRIBE", {"destination": "/temp-queue/unacked", "id": "u"})
    frame = second.read(10)
    assert frame.body == b"delivered, not acknowledged" and frame.headers.get("redelivered") == "true", frame
    second.close()


@pytest.mark.parametrize("vhost, other", [("/", "shop"), ("shop", "/")])
def test_a_kept_queue_takes_replies_from_its_own_vhost_only(broker_factory, vhost, other):
    """Kept for a re-claim, a lost link's queue is owned by nobody but stays in the link's vhost: a reply to
    its global name reaches it from that vhost as while the link lived, and another vhost's client hears
    `unknown-destination` as for a name that does not exist there. Before, an orphan had no vhost: replies
    from 'shop' were refused meanwhile, and a client of '/' reached 'shop''s kept queues."""
    broker = broker_factory(vhosts={"shop": ["*"]})
    first, connected = _connect(broker.port, host=vhost)
    old = _reply_to(first)
    first.close()                                            # lost without DISCONNECT
    assert _until(lambda: _kept(broker, old))
    frame = _reply(broker.port, old, host=other)
    assert frame.command == "ERROR" and frame.headers["pymq-code"] == "unknown-destination", frame
    assert _reply(broker.port, old, host=vhost).command == "RECEIPT"
    second, connected = _connect(broker.port, token=connected["pymq-reclaim-token"], host=vhost)
    assert connected["pymq-reclaimed"] == "true"
    second.send("SUBSCRIBE", {"destination": "/temp-queue/reply", "id": "k"})
    frame = second.read(10)
    assert frame.command == "MESSAGE" and frame.body == b"the reply", frame
    with pytest.raises(TimeoutError):                        # the other vhost's reply went nowhere
        second.read(0.3)
    second.close()


def test_kept_queues_go_with_their_messages_when_the_window_passes(broker_factory):
    broker = broker_factory(temporary_reclaim_ms=300)
    first, connected = _connect(broker.port)
    old = _reply_to(first)
    first.close()
    assert _until(lambda: _kept(broker, old))
    assert _until(lambda: not _kept(broker, old))           # the window's end dropped it
    frame = _reply(broker.port, old)
    assert frame.command == "ERROR" and frame.headers["pymq-code"] == "unknown-destination", frame
    assert broker.call(lambda: [n for n in broker.broker.destinations.temp_queues if n in old]) == []


def test_disconnect_keeps_nothing_and_past_the_cap_a_lost_link_keeps_nothing(broker, monkeypatch):
    first, connected = _connect(broker.port)
    old = _reply_to(first)
    first.send("DISCONNECT", {"receipt": "bye"})
    assert first.read(10).command == "RECEIPT"
    assert _until(lambda: _reply(broker.port, old).command == "ERROR")
    assert not _kept(broker, old)
    from pymq_server.broker import temporary
    monkeypatch.setattr(temporary, "MAX_ORPHANED", 0)
    second, _ = _connect(broker.port)
    old = _reply_to(second)
    second.close()
    assert _until(lambda: _reply(broker.port, old).command == "ERROR")
    assert not _kept(broker, old)


def test_a_handed_over_connection_s_first_token_re_claims_the_names_it_got_where_it_went(holders):
    """spec/cores.md §2.4: the client knows only the token of the worker that sent CONNECTED; the worker the
    connection moved to registers it for the names it gave, for the same user and vhost only."""
    names, clock = holders
    first_worker = TemporaryNames(30_000, clock)
    first_worker.start(None)                                 # another worker: another key
    first = first_worker.issue("w0c1", "/", "alice")
    here = names.issue("w1c5", "/", "alice")
    names.alias(first.token, here.names, "/", "alice")
    names.released(here.names, "w1c5", lost=True)
    for user, vhost in (("bob", "/"), ("alice", "other")):
        refused = names.reclaim(first.token, "w1c6", vhost, user)
        assert refused.refused and refused.names != here.names, (user, vhost)
    back = names.reclaim(first.token, "w1c7", "/", "alice")
    assert (back.names, back.refused) == (here.names, "") and back.token == names.token_of(here.names, "/", "alice")
    assert names.held[here.names] == "w1c7"
    names.released(back.names, "w1c7", lost=True)
    clock.now += 30.1
    assert names.reclaim(first.token, "w1c8", "/", "alice").refused      # the window holds as for any token
