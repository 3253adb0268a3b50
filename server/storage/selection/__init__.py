"""Adaptive holding-storage selection (seed 000): rules, storage monitor, rule evaluator.

    from pymq_server.storage.selection import AdaptiveSelection
    layer = AdaptiveSelection.from_yaml(open("storage.yaml").read(), devices)
    layer.refresh(time.monotonic())                  # on the event loop's timer, at layer.next_refresh()
    decision = layer.select(rule_context(size_bytes=..., body_type="TEXT", ...))
    decision.device, decision.rule_id                # where it goes, which rule chose it

Device code is elsewhere (server/storage/*); this package only reads ``HoldingDevice.status()``.
"""
from .evaluator import STRATEGIES, RankedRule, RuleEvaluator, StorageDecision
from .layer import AdaptiveSelection, SelectionConfig
from .monitor import DeviceHealth, HealthSource, ScoringPolicy, StaticHealth, StorageMonitor, used_fraction
from .rules import RuleBook, SelectionRule, rules_from_document

__all__ = [
    "AdaptiveSelection", "SelectionConfig", "RuleBook", "SelectionRule", "rules_from_document",
    "StorageMonitor", "ScoringPolicy", "StaticHealth", "DeviceHealth", "HealthSource", "used_fraction",
    "RuleEvaluator", "StorageDecision", "RankedRule", "STRATEGIES",
]
