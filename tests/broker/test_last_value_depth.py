"""A full last-value queue takes a message that replaces a waiting one, on every entry path (spec/placement.md,
"Two queue settings act inside these rules"): the replacement does not make the queue deeper, so rule 4
(depth/overflow) has nothing to refuse.

Issue 25 found the paths disagreeing: a plain SEND to a full ``reject`` last-value queue replaced the waiting
message and was accepted, while the same SEND inside a transaction was refused with ``QueueFull`` at COMMIT
(the pre-check counted it as one more message), and a bulk SEND's rows were counted the same way. Each case
below runs the same rows down the three paths — one SEND at a time, one transaction, one bulk SEND — and
expects the same answer and the same queue afterwards."""
from __future__ import annotations

import pytest

from pymq.errors import QueueFull
from tests.broker.core_harness import Core

pytest.importorskip("pyarrow")

LV = {"last_value_key": "sym", "max_depth": 2}
PATHS = ("one by one", "transaction", "bulk")


def _enter(core: Core, path: str, rows: list[dict[str, str]]) -> None:
    if path == "one by one":
        for row in rows:
            core.send("/queue/lv", row)
    elif path == "transaction":
        core.commit([("/queue/lv", row) for row in rows])
    else:
        core.bulk("/queue/lv", rows)


def _core(tmp_path, overflow: str, waiting: list[str]) -> Core:
    core = Core(tmp_path, queues={"lv": {**LV, "overflow": overflow}})
    for sym in waiting:
        core.send("/queue/lv", {"sym": sym, "v": "old"})
    return core


@pytest.mark.parametrize("path", PATHS)
def test_a_replacing_message_enters_a_full_reject_queue(tmp_path, path):
    core = _core(tmp_path, "reject", ["A", "B"])
    try:
        _enter(core, path, [{"sym": "A", "v": "new"}])
        queue = core.queue("lv")
        assert queue.depth == 2
        assert sorted((e.message.headers["sym"], e.message.headers["v"]) for e in queue.ready) == \
            [("A", "new"), ("B", "old")]
        assert queue.stats.replaced == 1
    finally:
        core.close()


@pytest.mark.parametrize("path", PATHS)
def test_a_new_key_is_still_refused_and_nothing_of_it_enters(tmp_path, path):
    core = _core(tmp_path, "reject", ["A", "B"])
    try:
        with pytest.raises(QueueFull):
            # the replacing row first: on the one-by-one path it is placed before the new key is refused
            _enter(core, path, [{"sym": "C", "v": "new"}])
        assert sorted(core.waiting("lv", "sym")) == ["A", "B"] and core.queue("lv").depth == 2
    finally:
        core.close()


@pytest.mark.parametrize("path", PATHS)
def test_rows_that_replace_each_other_count_once(tmp_path, path):
    """One place left: two rows of a new key C take it (the second replaces the first), a row of A replaces
    the waiting A; a third key would not fit."""
    core = _core(tmp_path, "reject", ["A"])
    try:
        _enter(core, path, [{"sym": "C", "v": "1"}, {"sym": "C", "v": "2"}, {"sym": "A", "v": "3"}])
        queue = core.queue("lv")
        assert queue.depth == 2
        assert sorted((e.message.headers["sym"], e.message.headers["v"]) for e in queue.ready) == \
            [("A", "3"), ("C", "2")]
    finally:
        core.close()


@pytest.mark.parametrize("path", ("transaction", "bulk"))
def test_two_new_keys_for_one_place_are_refused_as_a_unit(tmp_path, path):
    core = _core(tmp_path, "reject", ["A"])
    try:
        with pytest.raises(QueueFull):
            _enter(core, path, [{"sym": "C", "v": "1"}, {"sym": "D", "v": "2"}])
        assert core.waiting("lv", "sym") == ["A"]
    finally:
        core.close()


@pytest.mark.parametrize("path", PATHS)
def test_drop_oldest_makes_no_room_for_a_replacing_message(tmp_path, path):
    core = _core(tmp_path, "drop-oldest", ["A", "B"])
    try:
        _enter(core, path, [{"sym": "B", "v": "new"}])
        queue = core.queue("lv")
        assert sorted((e.message.headers["sym"], e.message.headers["v"]) for e in queue.ready) == \
            [("A", "old"), ("B", "new")]
        assert queue.stats.dropped == 0
    finally:
        core.close()


def test_over_the_wire_the_transaction_commits_what_a_plain_send_would(broker_factory):
    """The issue's sequence through a real broker: a SEND to a full reject last-value queue that replaces
    a waiting message, plain and inside a transaction; both are accepted."""
    from tests.conftest import RawStomp

    running = broker_factory(queues={"lv": {**LV, "overflow": "reject"}})
    c = RawStomp(running.port)
    try:
        assert c.connect().command == "CONNECTED"
        for sym in ("A", "B"):
            c.send("SEND", {"destination": "/queue/lv", "sym": sym, "receipt": f"r-{sym}"}, b"old")
            assert c.read().command == "RECEIPT"
        c.send("SEND", {"destination": "/queue/lv", "sym": "A", "receipt": "plain"}, b"plain")
        assert c.read().command == "RECEIPT"
        c.send("BEGIN", {"transaction": "t"})
        c.send("SEND", {"destination": "/queue/lv", "sym": "B", "transaction": "t"}, b"in-tx")
        c.send("COMMIT", {"transaction": "t", "receipt": "commit"})
        frame = c.read()
        assert frame.command == "RECEIPT", frame
        bodies = running.call(lambda: sorted(e.message.body for e in running.broker.queues["lv"].ready))
        assert bodies == [b"in-tx", b"plain"]
    finally:
        c.close()
