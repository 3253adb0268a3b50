"""RuleEvaluator and AdaptiveSelection: sorting only on change, run-time changes, strategies, fallbacks."""
from __future__ import annotations

import pytest

from pymq.errors import ConfigError, InvalidSelector, StorageError
from pymq.selector import rule_context
from pymq_server.storage.selection import (
    AdaptiveSelection, RuleBook, RuleEvaluator, SelectionConfig, SelectionRule, StaticHealth, StorageMonitor,
)
from tests.twins import twin_fixture

from .test_selection_monitor import FakeDevice
from .test_selection_rules import SEED_YAML

impl = twin_fixture("pymq.selector._evaluator_py", "pymq.selector._evaluator_c")

SEED_SCORES = {"HDD": -10, "MEMORY": 0, "DB1": -20, "DB2": 0, "GRID": -30}


def seed_evaluator(impl, **kwargs) -> RuleEvaluator:
    return RuleEvaluator(RuleBook.from_yaml(SEED_YAML), StaticHealth(SEED_SCORES), implementation=impl, **kwargs)


def small(kb: int = 10, **kw) -> dict:
    return rule_context(size_bytes=kb * 1024, body_type=kw.pop("body_type", "TEXT"),
                        destination=kw.pop("destination", "/queue/a"), **kw)


def test_sorted_once_for_many_messages(impl):
    ev = seed_evaluator(impl)
    assert ev.sorts == 0
    for kb in range(1, 200):
        ev.select(small(kb))
    assert ev.sorts == 1


def test_rule_change_resorts_and_applies_to_the_next_message(impl):
    ev = seed_evaluator(impl)
    assert ev.select(small(10)).device == "MEMORY"
    ev.rules.add(SelectionRule("W000", "DB1", 200, "SIZE < 50"))        # adjusted 180: now first
    decision = ev.select(small(10))
    assert (decision.device, decision.rule_id, decision.weight) == ("DB1", "W000", 180)
    assert ev.sorts == 2
    ev.rules.replace(SelectionRule("W000", "DB1", 200, "SIZE > 50"))
    assert ev.select(small(10)).rule_id == "W005"
    ev.rules.remove("W000")
    assert ev.select(small(10)).rule_id == "W005"
    assert ev.sorts == 4


def test_score_change_resorts_once(impl):
    health = StaticHealth(SEED_SCORES)
    ev = RuleEvaluator(RuleBook.from_yaml(SEED_YAML), health, implementation=impl)
    assert ev.select(small(15)).device == "MEMORY"
    health.set("MEMORY", -70)
    assert ev.select(small(15)).rule_id == "W001"
    ev.select(small(15))
    assert ev.sorts == 2


def test_programs_are_reused_across_sorts(impl):
    health = StaticHealth(SEED_SCORES)
    ev = RuleEvaluator(RuleBook.from_yaml(SEED_YAML), health, implementation=impl)
    before = {id(p) for p in ev.plan().programs}
    health.set("GRID", -5)
    assert {id(p) for p in ev.plan().programs} == before
    assert ev.sorts == 2


def test_monitor_refresh_without_change_does_not_resort(impl):
    devices = [FakeDevice(n, capacity=1000, bytes_used=0) for n in SEED_SCORES]
    mon = StorageMonitor(devices, period=0.01)
    ev = RuleEvaluator(RuleBook.from_yaml(SEED_YAML), mon, implementation=impl)
    mon.refresh(0.0)
    ev.select(small(10))
    for i in range(1, 50):
        mon.refresh(i * 0.01)
        ev.select(small(10))
    assert ev.sorts == 1
    devices[1].set(bytes_free=0)          # MEMORY full: its rules drop out at once
    mon.refresh(1.0)
    assert ev.select(small(10)).device != "MEMORY"
    assert ev.sorts == 2
    assert all(r.device != "MEMORY" for r in ev.ranking())


def test_unavailable_or_unknown_devices_are_never_selected(impl):
    book = RuleBook([SelectionRule("a", "SSD", 100, ""), SelectionRule("b", "HDD", 10, "")])
    ev = RuleEvaluator(book, StaticHealth({"HDD": 0}), implementation=impl)   # SSD unknown to the monitor
    assert ev.select(small()).device == "HDD"
    ev2 = RuleEvaluator(book, StaticHealth({"HDD": 0, "SSD": 0}, {"HDD": "full"}), default_device="HDD",
                        implementation=impl)
    assert ev2.select(small()).device == "SSD"
    book.remove("a")
    # the only rule's device and the default are unavailable; SSD is still healthy
    d = ev2.select(small())
    assert (d.device, d.fallback) == ("SSD", "best-available")


def test_nothing_available_is_a_storage_error(impl):
    ev = RuleEvaluator(RuleBook(), StaticHealth({"A": 0}, {"A": "offline"}), default_device="A",
                       implementation=impl)
    with pytest.raises(StorageError, match="no holding device is available .*A: offline"):
        ev.select(small())


def test_without_default_device_the_best_scored_wins(impl):
    ev = RuleEvaluator(RuleBook(), StaticHealth({"b": -5, "a": -5, "c": -1}), implementation=impl)
    assert ev.select(small()).device == "c"
    ev2 = RuleEvaluator(RuleBook(), StaticHealth({"b": -5, "a": -5}), implementation=impl)
    assert ev2.select(small()).device == "a"        # equal scores: by name


def test_ties_in_adjusted_weight_sort_by_rule_id(impl):
    book = RuleBook([SelectionRule("r2", "X", 50, ""), SelectionRule("r1", "Y", 40, ""),
                     SelectionRule("r3", "Y", 40, "")])
    ev = RuleEvaluator(book, StaticHealth({"X": -10, "Y": 0}), implementation=impl)
    assert [r.id for r in ev.ranking()] == ["r1", "r2", "r3"]
    assert ev.select(small()).rule_id == "r1"


def test_aggregation_tie_breaks(impl):
    book = RuleBook([SelectionRule("x1", "X", 60, ""), SelectionRule("y1", "Y", 70, ""),
                     SelectionRule("y2", "Y", 50, "")])
    ev = RuleEvaluator(book, StaticHealth({"X": 0, "Y": 0}), strategy="average", implementation=impl)
    d = ev.select(small())
    assert dict(d.aggregates) == {"X": 60, "Y": 60}
    assert (d.device, d.rule_id) == ("Y", "y1")     # equal averages: the device with more matching rules
    ev.match_bonus = -1                              # a negative bonus favours fewer rules
    assert ev.select(small()).device == "X"
    ev.strategy = "weighted-sum"
    ev.match_bonus = 0
    assert dict(ev.select(small()).aggregates) == {"X": 60, "Y": 120}


def test_strategy_validation(impl):
    with pytest.raises(ConfigError, match="first-match, average, weighted-sum"):
        seed_evaluator(impl, strategy="fuzzy")
    ev = seed_evaluator(impl)
    with pytest.raises(ConfigError):
        ev.strategy = "best"
    with pytest.raises(ConfigError):
        ev.match_bonus = "lots"
    with pytest.raises(ConfigError, match="no storage rule"):
        ev.aggregate(["W404"])


def test_decision_description(impl):
    ev = seed_evaluator(impl, default_device="DB2")
    assert ev.select(small(10)).describe() == "MEMORY: rule W005 (adjusted weight 80)"
    assert ev.select(small(5000, destination="/topic/t")).describe() == "DB2: no rule matched, default device"
    ev.strategy = "average"
    assert ev.aggregate(["W001", "W002", "W003", "W004", "W007"]).describe() == \
        "MEMORY: average 85 over W004, W003, W007, W002, W001 (MEMORY 85, DB2 60, HDD 35.5)"


SELECTION_YAML = """
strategy: average
default_device: memory
match_bonus: 5
monitor:
  period: 0.5
  periods: {grid: 10}
  scoring: {space_weight: 50, quantum: 0.5}
rules:
  - {id: big, device: grid, weight: 90, condition: SIZE > 10000}
  - {id: small, device: memory, weight: 80, condition: SIZE < 20}
  - {id: bytes, device: file, weight: 60, condition: "TYPE == BYTES"}
  - {id: bytes-large, device: file, weight: 40, condition: "TYPE == BYTES AND SIZE > 100"}
"""


def _devices():
    return [FakeDevice("memory", capacity=1000, bytes_used=0), FakeDevice("file", capacity=1000, bytes_used=500),
            FakeDevice("grid")]


def test_adaptive_selection_from_yaml():
    layer = AdaptiveSelection.from_yaml(SELECTION_YAML, _devices())
    assert layer.config.scoring.space_weight == 50 and layer.monitor.periods == {"grid": 10.0}
    layer.refresh(0.0)
    assert layer.health()["file"].score == -25.0
    assert layer.next_refresh() == pytest.approx(0.5)
    d = layer.select(rule_context(size_bytes=200 * 1024, body_type="BYTES"))
    # file: average(35, 15) + 5 bonus = 30
    assert (d.device, d.rule_id, d.weight, d.strategy) == ("file", "bytes", 30.0, "average")
    d = layer.select(rule_context(size_bytes=50 * 1024, body_type="TEXT"))
    assert (d.device, d.fallback) == ("memory", "default")


def test_adaptive_selection_admin_changes():
    layer = AdaptiveSelection.from_yaml(SELECTION_YAML, _devices())
    layer.add_rule({"id": "text", "device": "grid", "weight": 99, "condition": "TYPE == TEXT"})
    assert layer.select(rule_context(size_bytes=50 * 1024, body_type="TEXT")).device == "grid"
    layer.replace_rule({"id": "text", "device": "file", "weight": 99, "condition": "TYPE == TEXT"})
    assert layer.select(rule_context(size_bytes=50 * 1024, body_type="TEXT")).device == "file"
    assert layer.remove_rule("text").device == "file"
    with pytest.raises(ConfigError, match="unknown device 'tape'"):
        layer.add_rule({"id": "t", "device": "tape", "weight": 1, "condition": ""})
    with pytest.raises(InvalidSelector) as info:
        layer.add_rule({"id": "t", "device": "file", "weight": 1, "condition": "SIZE >"})
    assert info.value.position == 6
    view = layer.describe()
    assert view["strategy"] == "average" and [r["id"] for r in view["ranking"]][0] == "big"
    assert set(view["devices"]) == {"memory", "file", "grid"}


@pytest.mark.parametrize("text, match", [
    ("default_device: tape", "default_device 'tape'"),
    ("strategy: fuzzy", "strategy"),
    ("colour: red", "unknown storage-selection settings"),
    ("monitor: {period: 0.001}", "between 0.01 and 3600"),
    ("monitor: {periods: {tape: 1}}", "unknown devices"),
    ("monitor: {scoring: {speed: 1}}", "unknown scoring"),
    ("monitor: {interval: 1}", "unknown monitor settings"),
    ("- {id: a, device: memory, weight: 1, condition: ''}", "must be a mapping"),
    ("rules: [{id: a, device: tape, weight: 1, condition: ''}]", "unknown device"),
])
def test_adaptive_selection_config_errors(text, match):
    with pytest.raises(ConfigError, match=match):
        AdaptiveSelection.from_yaml(text, _devices())


def test_selection_config_defaults():
    cfg = SelectionConfig.from_document({})
    assert (cfg.strategy, cfg.default_device, cfg.match_bonus, cfg.period) == ("first-match", None, 0.0, 1.0)


# -- per message: durability, room, refusals (spec/storage_rules.md §6.4) ---------------------------

def _durability_evaluator(impl, *, downgrade: bool = False, **kwargs) -> RuleEvaluator:
    rules = RuleBook([SelectionRule("mem", "MEMORY", 90, "SIZE < 20", downgrade_durability=downgrade),
                      SelectionRule("hdd", "HDD", 50, "")])
    health = StaticHealth({"MEMORY": 0, "HDD": 0}, non_durable=["MEMORY"], **kwargs)
    return RuleEvaluator(rules, health, implementation=impl)


def test_a_persistent_message_skips_rules_of_devices_that_are_not_durable(impl):
    ev = _durability_evaluator(impl)
    assert ev.select(small(10, persistent=False)).device == "MEMORY"
    decision = ev.select(small(10, persistent=True))
    assert (decision.device, decision.rule_id) == ("HDD", "hdd")
    assert ev.sorts == 1, "the durable plan is derived from the sorted one, not sorted again"


def test_a_rule_may_downgrade_durability_explicitly(impl):
    ev = _durability_evaluator(impl, downgrade=True)
    assert ev.select(small(10, persistent=True)).device == "MEMORY"


def test_the_fallback_for_a_persistent_message_is_durable(impl):
    rules = RuleBook([SelectionRule("big", "HDD", 50, "SIZE > 1000")])
    health = StaticHealth({"MEMORY": 0, "HDD": -30}, non_durable=["MEMORY"])
    ev = RuleEvaluator(rules, health, default_device="MEMORY", implementation=impl)
    assert ev.select(small(10, persistent=False)).device == "MEMORY"
    decision = ev.select(small(10, persistent=True))
    assert (decision.device, decision.fallback) == ("HDD", "best-available")
    only_memory = RuleEvaluator(RuleBook(), StaticHealth({"MEMORY": 0}, non_durable=["MEMORY"]),
                                implementation=impl)
    with pytest.raises(StorageError, match="for a persistent message .*MEMORY: not durable"):
        only_memory.select(small(10, persistent=True))


def test_a_device_without_room_for_the_message_is_left_out_for_it_only(impl):
    rules = RuleBook([SelectionRule("hdd", "HDD", 90, ""), SelectionRule("db", "DB1", 50, "")])
    health = StaticHealth({"HDD": 0, "DB1": 0}, free={"HDD": 60_000})
    ev = RuleEvaluator(rules, health, implementation=impl)
    assert ev.select(small(10), size=10_000).device == "HDD"
    assert ev.select(small(100), size=100_000).device == "DB1"
    assert ev.select(small(1), size=1_000).device == "HDD"
    assert ev.sorts == 1


def test_excluded_devices_are_left_out_and_the_next_rule_decides(impl):
    ev = seed_evaluator(impl)
    first = ev.select(small(15))
    assert first.device == "MEMORY"
    again = ev.select(small(15), exclude=frozenset({"MEMORY"}))
    assert (again.device, again.rule_id) == ("HDD", "W001")
    with pytest.raises(StorageError):
        RuleEvaluator(RuleBook(), StaticHealth({"A": 0}), implementation=impl).select(
            small(), exclude=frozenset({"A"}))


def test_the_monitor_knows_room_and_lowers_it_between_checks():
    device = FakeDevice("d", bytes_free=100_000)
    monitor = StorageMonitor([device])
    monitor.refresh(0.0)
    assert monitor.lacking_room(50_000) == frozenset()
    monitor.consumed("d", 60_000)
    assert monitor.lacking_room(50_000) == {"d"}
    monitor.refresh(10.0)                    # measured again
    assert monitor.lacking_room(50_000) == frozenset()
    monitor.refused("d", 30_000)
    assert monitor.lacking_room(30_000) == {"d"} and monitor.lacking_room(1_000) == frozenset()
