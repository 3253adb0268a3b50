"""Every row of the queue-entry state table (server/broker/states.py), driven through a real broker by what
a client does, and checked by what a client sees: which messages arrive, and the queue's metrics.

Issue 31 found four rows nothing noticed when removed — (ACQUIRED, EXPIRE), (SCHEDULED, EXPIRE),
(SCHEDULED, REPLACE), (SCHEDULED, PURGE) — because no test NACKed a delivery whose time ran out while it
was held, gave a delayed message a shorter time to live than its delay, replaced a scheduled message of a
last-value queue or purged a queue holding scheduled messages.  Each test here fails with its row gone
(an IllegalTransition where the broker meets it, and the message goes the wrong way or the figures are off).

Times: a message's ``expires`` is wall-clock ms, so a test waits on the clock passing it (``_wait_clock``),
never for a fixed while; housekeeping (which expires waiting messages) runs every second.
"""
from __future__ import annotations

import itertools
import time

import pytest

import pymq
from pymq_server.broker.states import (
    TRANSITIONS,
    EntryState,
    Event,
    IllegalTransition,
    transition,
)
from tests.conftest import RawStomp, wait_for

S, R, A = EntryState.SCHEDULED, EntryState.READY, EntryState.ACQUIRED
C, D, X = EntryState.COMPLETED, EntryState.DEAD, EntryState.EXPIRED

#: The lifecycle seed 001 and spec/admin.md describe, written out here on its own (not read from the code's
#: table), so that a row missing from, or added to, TRANSITIONS fails.
SPECIFIED = {
    (S, Event.DUE): R, (S, Event.EXPIRE): X, (S, Event.PURGE): C, (S, Event.REPLACE): C,
    (R, Event.ACQUIRE): A, (R, Event.EXPIRE): X, (R, Event.PURGE): C, (R, Event.DELAY): S,
    (R, Event.DEAD): D, (R, Event.REPLACE): C, (R, Event.PASS): C,
    (A, Event.ACK): C, (A, Event.RELEASE): R, (A, Event.DEAD): D, (A, Event.EXPIRE): X,
}


@pytest.mark.parametrize("state, event", list(itertools.product(EntryState, Event)))
def test_the_table_is_the_specified_lifecycle(state, event):
    if (state, event) in SPECIFIED:
        assert transition(state, event) is SPECIFIED[(state, event)]
    else:
        with pytest.raises(IllegalTransition):
            transition(state, event)
    assert len(TRANSITIONS) == len(SPECIFIED)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _wait_clock(past_ms: int) -> None:
    """Wait until the wall clock is past ``past_ms`` (a message's expiry or due time)."""
    assert wait_for(lambda: _now_ms() > past_ms, timeout=30, interval=0.02)


def _client(b, **subscribe) -> RawStomp:
    c = RawStomp(b.port)
    assert c.connect().command == "CONNECTED"
    if subscribe:
        c.send("SUBSCRIBE", {"id": "s", "ack": "client-individual", **subscribe})
    return c


def _send(c: RawStomp, destination: str, body: bytes, **headers) -> None:
    c.send("SEND", {"destination": destination, "receipt": "sent", **headers}, body)
    frame = c.read(10)
    assert frame.command == "RECEIPT", frame


def _metrics(b, name: str) -> dict:
    with pymq.connect(b.url) as conn:
        return conn.queue_manager().metrics(name)


def _figures(b, name: str, *keys: str) -> tuple:
    m = _metrics(b, name)
    return tuple(m[k] for k in keys)


def _nothing_arrives(c: RawStomp, timeout: float = 0.5) -> bool:
    try:
        frame = c.read(timeout)
    except TimeoutError:
        return True
    raise AssertionError(f"unexpected {frame}")


def _drain(b, queue: str) -> list[bytes]:
    """Every body waiting on ``queue``, read in order by a fresh consumer (acknowledged)."""
    with pymq.connect(b.url) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue(queue))
        out = []
        while (m := consumer.receive(1.0)) is not None:
            out.append(m.body if isinstance(m.body, bytes) else m.text.encode())
        return out


@pytest.mark.parametrize("how", ["nack", "consumer-gone"])
def test_a_delivery_whose_time_ran_out_while_held_expires_instead_of_coming_back(broker_factory, how):
    """(ACQUIRED, EXPIRE) and (ACQUIRED, RELEASE) side by side: the held copy that outlived its expiry goes
    to the expiry queue, counted expired; the fresh one held with it comes back."""
    b = broker_factory(expiry_queue="expired")
    expires = _now_ms() + 1500
    producer = _client(b)
    _send(producer, "/queue/held", b"short", expires=str(expires))
    _send(producer, "/queue/held", b"long")
    holder = _client(b, destination="/queue/held")
    got = [holder.read(10), holder.read(10)]
    assert [f.body for f in got] == [b"short", b"long"]
    _wait_clock(expires)
    if how == "nack":
        for frame in got:
            holder.send("NACK", {"id": frame.headers["ack"], "receipt": "n-" + frame.headers["ack"]})
        answers = [holder.read(10) for _ in range(3)]            # two receipts and 'long' again
        assert sorted(f.command for f in answers) == ["MESSAGE", "RECEIPT", "RECEIPT"], answers
        assert [f.body for f in answers if f.command == "MESSAGE"] == [b"long"]
        assert _nothing_arrives(holder)
    holder.close()
    assert wait_for(lambda: _figures(b, "held", "expired", "in_flight") == (1, 0), timeout=10)
    assert _drain(b, "held") == [b"long"]
    assert _drain(b, "expired") == [b"short"]
    # failures: each NACK, and each copy its leaving consumer held
    assert _figures(b, "held", "expired", "depth", "failed") == (1, 0, 3 if how == "nack" else 2)


def test_a_delayed_message_whose_time_to_live_is_shorter_than_its_delay_expires_unseen(broker_factory):
    """(SCHEDULED, EXPIRE): housekeeping expires it while it waits for its time; no consumer ever sees it."""
    b = broker_factory(expiry_queue="expired")
    watcher = _client(b, destination="/queue/later")
    producer = _client(b)
    _send(producer, "/queue/later", b"too-late", **{"AMQ_SCHEDULED_DELAY": "60000",
                                                    "expires": str(_now_ms() + 300)})
    assert _figures(b, "later", "scheduled", "depth")[0] in (0, 1)
    assert wait_for(lambda: _figures(b, "later", "expired", "scheduled", "depth") == (1, 0, 0), timeout=20)
    assert _nothing_arrives(watcher)
    assert _drain(b, "expired") == [b"too-late"]


def test_a_newer_message_of_its_key_replaces_a_scheduled_one_in_a_last_value_queue(broker_factory):
    """(SCHEDULED, REPLACE): the scheduled 'old' is replaced by 'new' at once, counted; only 'new' arrives,
    and 'old' does not turn up when its time comes."""
    b = broker_factory(queues={"prices": {"last_value_key": "sym"}})
    producer = _client(b)
    due = _now_ms() + 1500
    _send(producer, "/queue/prices", b"old", sym="X", AMQ_SCHEDULED_TIME=str(due))
    assert _figures(b, "prices", "scheduled", "depth") == (1, 1)
    _send(producer, "/queue/prices", b"new", sym="X")
    assert _figures(b, "prices", "replaced", "scheduled", "ready", "depth") == (1, 0, 1, 1)
    _wait_clock(due + 200)
    _send(producer, "/queue/prices", b"marker", sym="Y")      # after 'old' was due: sent behind it
    assert _drain(b, "prices") == [b"new", b"marker"]


def test_a_scheduled_message_of_a_last_value_queue_gives_way_to_a_newer_one_when_it_comes_due(broker_factory):
    """(SCHEDULED, REPLACE) the other way round: an older scheduled message cannot replace a newer one."""
    b = broker_factory(queues={"prices": {"last_value_key": "sym"}})
    producer = _client(b)
    _send(producer, "/queue/prices", b"later", sym="X", AMQ_SCHEDULED_DELAY="60000")
    _send(producer, "/queue/prices", b"now", sym="X")
    _send(producer, "/queue/prices", b"again", sym="X")
    assert _figures(b, "prices", "replaced", "scheduled", "depth") == (2, 0, 1)
    assert _drain(b, "prices") == [b"again"]


def test_purging_a_queue_removes_its_scheduled_messages_too(broker_factory):
    """(SCHEDULED, PURGE): a purge removes every waiting message, scheduled ones included: counted in the
    answer, gone from the figures, and never delivered when their time comes."""
    b = broker_factory()
    producer = _client(b)
    due = _now_ms() + 1500
    _send(producer, "/queue/purged", b"ready")
    _send(producer, "/queue/purged", b"scheduled", AMQ_SCHEDULED_TIME=str(due))
    _send(producer, "/queue/purged", b"redelivery", AMQ_SCHEDULED_DELAY="60000")
    assert _figures(b, "purged", "ready", "scheduled", "depth") == (1, 2, 3)
    with pymq.connect(b.url) as conn:
        assert conn.queue_manager().purge("purged") == 3
    assert _figures(b, "purged", "ready", "scheduled", "depth", "removed") == (0, 0, 0, 3)
    _wait_clock(due + 200)
    _send(producer, "/queue/purged", b"marker")
    assert _drain(b, "purged") == [b"marker"]


def test_the_other_rows_by_what_a_consumer_sees(broker_factory):
    """(SCHEDULED, DUE), (READY, ACQUIRE/EXPIRE/DELAY/REPLACE), (ACQUIRED, ACK/RELEASE/DEAD): a delayed
    message arrives after its time, an expired one never, a NACKed one again after its redelivery delay and
    to the dead-letter queue at the maximum; a newer message of a key replaces a ready one."""
    b = broker_factory(queues={"life": {"max_deliveries": 2, "redelivery_delay_ms": 300},
                               "lv": {"last_value_key": "k"}}, expiry_queue="expired")
    producer = _client(b)
    _send(producer, "/queue/life", b"gone", expires=str(_now_ms() - 1))              # (READY, EXPIRE)
    due = _now_ms() + 800
    _send(producer, "/queue/life", b"delayed", AMQ_SCHEDULED_TIME=str(due))          # (SCHEDULED, DUE)
    _send(producer, "/queue/life", b"nacked")
    c = _client(b, destination="/queue/life")
    first = c.read(10)
    assert first.body == b"nacked"                                                   # (READY, ACQUIRE)
    c.send("NACK", {"id": first.headers["ack"]})                     # (ACQUIRED, RELEASE) + (READY, DELAY)
    frames = [c.read(10), c.read(10)]
    assert _now_ms() >= due
    assert sorted(f.body for f in frames) == [b"delayed", b"nacked"]
    for f in frames:
        if f.body == b"nacked":
            c.send("NACK", {"id": f.headers["ack"]})                  # (ACQUIRED, DEAD): its second failure
        else:
            c.send("ACK", {"id": f.headers["ack"], "receipt": "acked"})             # (ACQUIRED, ACK)
    assert wait_for(lambda: _figures(b, "life", "depth", "acknowledged", "dead_lettered", "expired")
                    == (0, 1, 1, 1), timeout=10)
    assert _drain(b, "DLQ.life") == [b"nacked"]
    assert _drain(b, "expired") == [b"gone"]
    _send(producer, "/queue/lv", b"v1", k="a")
    _send(producer, "/queue/lv", b"v2", k="a")                                       # (READY, REPLACE)
    assert _drain(b, "lv") == [b"v2"]
