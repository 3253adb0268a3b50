"""The three ways rows enter a queue share their rules (placement_rules.py), and these properties hold them
to it: whatever the queue's settings (depth limit and overflow, a last-value key, a schema) and whatever
rows arrive (keys, dedup ids, a property the schema wants or not),

* **admit agrees with place**: before each SEND, a COMMIT's dry run (``Broker.admit``) says what the SEND
  then does — refused with the same error, dropped as a duplicate, or taken;
* **a transaction agrees with the rows sent one by one**: its COMMIT is refused exactly when one of them
  would be, and otherwise leaves the queue as they do;
* **a bulk SEND agrees with the rows sent one by one**: the same refusal, the same rows dropped as
  duplicates, the same queue afterwards.

Nothing consumes meanwhile (a consumer taking a row between two others is where the paths may differ by
design: spec/placement.md). The last tests plant a drift — a mutated copy of one rule in one path, as the
copies issue 25 removed had drifted — and check that the properties catch it."""
from __future__ import annotations

import itertools
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.errors import PymqError, QueueFull, SchemaViolation
from pymq_server.broker import bulk_placement, placement_rules
from pymq_server.broker.placement import Placement
from tests.broker.core_harness import Core

pytest.importorskip("pyarrow")

_dirs = itertools.count()

queue_settings = st.builds(
    lambda depth, overflow, last_value, schema: {"max_depth": depth, "overflow": overflow,
                                                 **({"last_value_key": "sym"} if last_value else {}),
                                                 **({"schema": {"n": {"type": "int", "required": True}}}
                                                    if schema else {})},
    st.sampled_from([1, 2, 3, 0]), st.sampled_from(["reject", "drop-oldest", "block"]),
    st.booleans(), st.sampled_from([False, False, False, True]))

row = st.builds(
    lambda sym, dedup, n: {**({"sym": sym} if sym else {}), **({"pymq-dedup-id": dedup} if dedup else {}),
                           **({"n": n} if n else {})},
    st.sampled_from(["A", "B", "A", "C", None]), st.sampled_from([None, None, None, "d1", "d2"]),
    st.sampled_from(["1", "1", "1", "x", None]))
case = st.tuples(queue_settings, st.lists(row, max_size=4), st.lists(row, min_size=1, max_size=5))


def _numbered(rows: list[dict[str, str]], start: int) -> list[dict[str, str]]:
    """The rows with a ``seq`` property saying which they are (so a queue's contents can be compared)."""
    return [{**r, "seq": str(start + i)} for i, r in enumerate(rows)]


def _core(tmp_path, settings_: dict, prefill: list[dict[str, str]]) -> Core:
    core = Core(tmp_path / f"c{next(_dirs)}", memory_only=True, queues={"q": settings_}, dedup_window_ms=60_000)
    for r in prefill:
        try:
            core.send("/queue/q", r)
        except PymqError:
            pass
    return core


def _state(core: Core) -> tuple:
    """What waits (ready, and a bulk block's rows in the backlog) by the rows' own numbers, and the figures."""
    queue = core.queue("q")
    waiting = [e.message for e in queue.ready] + list(queue.backlog.messages())
    return (sorted((m.headers.get("seq", ""), m.headers.get("sym")) for m in waiting),
            queue.depth, queue.stats.dropped, queue.stats.replaced)


def _one_by_one(core: Core, rows: list[dict[str, str]]) -> tuple[list, type | None]:
    """Each row's fate (None: a duplicate, "taken", or the error's class) until the first refusal."""
    fates: list = []
    for r in rows:
        try:
            fates.append("taken" if core.send("/queue/q", r) is not None else None)
        except PymqError as exc:
            return fates, type(exc)
    return fates, None


def _property(check, examples: int = 300):
    """``check`` as a hypothesis test over :data:`case` (the planted drifts run it with more examples)."""
    @settings(max_examples=examples, deadline=None, database=None if examples > 300 else settings().database,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(case=case)
    def run(tmp_path, case):
        check(tmp_path, case)
    return run


def _admit_agrees(tmp_path, case):
    settings, prefill, rows = case
    core = _core(tmp_path, settings, _numbered(prefill, 100))
    try:
        for r in _numbered(rows, 0):
            request = core.request("/queue/q", r)
            try:
                core.broker.admit(core.client, request, {})
                predicted: object = "taken"
            except PymqError as exc:
                predicted = type(exc)
            try:
                done: object = "taken" if core.broker.send(core.client, request)[0] is not None else "duplicate"
            except PymqError as exc:
                done = type(exc)
            assert predicted == done or (predicted == "taken" and done == "duplicate"), (r, predicted, done)
            if done == "duplicate":
                # the dry run says a duplicate adds nothing (it returns quietly): the window knows it too
                assert core.broker.dedup.seen("/queue/q", r["pymq-dedup-id"])
    finally:
        core.close()


def _transaction_agrees(tmp_path, case):
    settings, prefill, rows = case
    rows = _numbered(rows, 0)
    single = _core(tmp_path, settings, _numbered(prefill, 100))
    unit = _core(tmp_path, settings, _numbered(prefill, 100))
    try:
        before = _state(unit)
        _, refused = _one_by_one(single, rows)
        try:
            unit.commit([("/queue/q", r) for r in rows])
            committed: type | None = None
        except PymqError as exc:
            committed = type(exc)
        assert committed is refused, (rows, committed, refused)
        assert _state(unit) == (before if refused else _state(single))
    finally:
        single.close()
        unit.close()


def _bulk_agrees(tmp_path, case):
    settings, prefill, rows = case
    rows = _numbered(rows, 0)
    single = _core(tmp_path, settings, _numbered(prefill, 100))
    bulk = _core(tmp_path, settings, _numbered(prefill, 100))
    try:
        before = _state(bulk)
        fates, refused = _one_by_one(single, rows)
        try:
            result = bulk.bulk("/queue/q", rows)
            sent: type | None = None
        except PymqError as exc:
            sent = type(exc)
        # the same refusal; a frame's rows all meet rule 2 before rule 4 counts them (spec/placement.md), so
        # where one by one a row fills the queue before a later one breaks the schema, the frame names the schema
        assert sent is refused or (sent is SchemaViolation and refused is QueueFull), (rows, sent, refused)
        if refused:
            assert _state(bulk) == before
        else:
            assert result.duplicates == fates.count(None) and result.count == fates.count("taken")
            assert _state(bulk) == _state(single)
    finally:
        single.close()
        bulk.close()


test_admit_agrees_with_place = _property(_admit_agrees)
test_a_transaction_agrees_with_its_sends_one_by_one = _property(_transaction_agrees)
test_a_bulk_send_agrees_with_its_rows_one_by_one = _property(_bulk_agrees)


# -- planted drifts: a mutated copy of one rule in one path must fail the properties -------------------------

def _old_growing(target, rows, ahead):
    """Rule 4's measure as the copies had it before issue 25: every row makes the queue deeper."""
    return [True] * len(rows)


def test_a_drift_planted_in_the_bulk_path_is_caught(monkeypatch, tmp_path):
    monkeypatch.setattr(bulk_placement, "rules", types.SimpleNamespace(**{**vars(placement_rules),
                                                                           "growing": _old_growing}))
    with pytest.raises(AssertionError):
        _property(_bulk_agrees, 3000)(tmp_path)


def test_a_drift_planted_in_the_commit_check_is_caught(monkeypatch, tmp_path):
    """A copy of Placement.admit that forgets the dedup ids of earlier SENDs of the transaction."""
    original = Placement.admit

    def drifted(self, path, target, request, ahead):
        ahead.ids.clear()
        return original(self, path, target, request, ahead)

    monkeypatch.setattr(Placement, "admit", drifted)
    with pytest.raises(AssertionError):
        _property(_transaction_agrees, 3000)(tmp_path)


def test_a_drift_planted_in_the_depth_check_of_admit_is_caught(monkeypatch, tmp_path):
    """A copy of Placement.admit whose depth rule counts every SEND (the drift issue 25 found)."""
    import pymq_server.broker.placement as placement_module
    monkeypatch.setattr(placement_module, "rules", types.SimpleNamespace(**{**vars(placement_rules),
                                                                             "growing": _old_growing}))
    # plan reads the same module: keep the real rule there, so only admit's copy drifts
    original_plan = Placement.plan

    def plan(self, *args, **kwargs):
        monkeypatch.setattr(placement_module, "rules", placement_rules)
        try:
            return original_plan(self, *args, **kwargs)
        finally:
            monkeypatch.setattr(placement_module, "rules", types.SimpleNamespace(
                **{**vars(placement_rules), "growing": _old_growing}))

    monkeypatch.setattr(Placement, "plan", plan)
    with pytest.raises(AssertionError):
        _property(_admit_agrees, 3000)(tmp_path)
