"""The adaptive storage layer's decision half, configured from one YAML document.

:class:`AdaptiveSelection` owns the three parts of seed 000 that are not device code: the
:class:`RuleBook`, the :class:`StorageMonitor` and the :class:`RuleEvaluator`.  The broker builds it
once with its devices, calls :meth:`refresh` from its event loop at :meth:`next_refresh`, calls
:meth:`select` for each message it must hold, and lets the admin interface call :meth:`add_rule`,
:meth:`replace_rule`, :meth:`remove_rule` (the change applies to the next message).  Sans-IO: no
event loop, no socket; the caller supplies the clock.

The YAML format is specified in spec/storage_rules.md §5.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterable, Mapping

import yaml

from pymq.errors import ConfigError
from pymq_server.storage.device import HoldingDevice

from .evaluator import STRATEGIES, RuleEvaluator, StorageDecision
from .monitor import DeviceHealth, ScoringPolicy, StorageMonitor
from .rules import RuleBook, SelectionRule, rules_from_document

_TOP_KEYS = {"strategy", "default_device", "match_bonus", "monitor", "rules"}
_MONITOR_KEYS = {"period", "periods", "scoring"}


@dataclass(frozen=True)
class SelectionConfig:
    """Everything in the storage-selection document except the rules."""

    strategy: str = "first-match"
    default_device: str | None = None
    match_bonus: float = 0.0
    period: float = 1.0
    periods: Mapping[str, float] = field(default_factory=dict)
    scoring: ScoringPolicy = field(default_factory=ScoringPolicy)

    @classmethod
    def from_document(cls, doc: Mapping[str, Any] | None) -> SelectionConfig:
        doc = dict(doc or {})
        unknown = set(doc) - _TOP_KEYS
        if unknown:
            raise ConfigError(f"unknown storage-selection settings {sorted(unknown)} (known: {sorted(_TOP_KEYS)})")
        monitor = doc.get("monitor") or {}
        if not isinstance(monitor, Mapping):
            raise ConfigError("storage-selection 'monitor' must be a mapping")
        unknown = set(monitor) - _MONITOR_KEYS
        if unknown:
            raise ConfigError(f"unknown monitor settings {sorted(unknown)} (known: {sorted(_MONITOR_KEYS)})")
        strategy = doc.get("strategy", "first-match")
        if strategy not in STRATEGIES:
            raise ConfigError(f"storage selection strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        return cls(strategy=strategy, default_device=doc.get("default_device"),
                   match_bonus=doc.get("match_bonus", 0.0) or 0.0, period=monitor.get("period", 1.0),
                   periods=dict(monitor.get("periods") or {}),
                   scoring=ScoringPolicy.from_mapping(monitor.get("scoring")))


class AdaptiveSelection:
    """Rule book + storage monitor + rule evaluator for a set of holding devices."""

    def __init__(self, devices: Iterable[HoldingDevice], rules: RuleBook | Iterable[SelectionRule] = (),
                 config: SelectionConfig | None = None) -> None:
        config = config or SelectionConfig()
        devices = list(devices)
        names = [d.name for d in devices]
        if config.default_device is not None and config.default_device not in names:
            raise ConfigError(f"default_device {config.default_device!r} is not one of the devices {names}")
        unknown_periods = set(config.periods) - set(names)
        if unknown_periods:
            raise ConfigError(f"monitor periods name unknown devices {sorted(unknown_periods)}")
        if not isinstance(rules, RuleBook):
            rules = RuleBook(rules, known_devices=names)
        elif rules.known_devices is None:
            rules.known_devices = frozenset(names)
            for rule in rules:
                rules._check(rule)
        self.config = config
        self.rules = rules
        self.monitor = StorageMonitor(devices, period=config.period, periods=config.periods,
                                      policy=config.scoring)
        self.evaluator = RuleEvaluator(rules, self.monitor, strategy=config.strategy,
                                       default_device=config.default_device, match_bonus=config.match_bonus)

    @classmethod
    def from_yaml(cls, text: str, devices: Iterable[HoldingDevice]) -> AdaptiveSelection:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"storage selection is not valid YAML: {exc}") from None
        if doc is not None and not isinstance(doc, Mapping):
            raise ConfigError("the storage-selection document must be a mapping with a 'rules' list")
        return cls(devices, rules_from_document(doc), SelectionConfig.from_document(doc))

    # -- the event loop's timer ---------------------------------------------------------------------

    def refresh(self, now: float) -> bool:
        """Refresh the devices that are due at monotonic time ``now``; True if a score changed."""
        return self.monitor.refresh(now)

    def next_refresh(self) -> float:
        return self.monitor.next_refresh()

    # -- per message -------------------------------------------------------------------------------

    def select(self, ctx: Mapping[str, object], *, exclude: frozenset[str] = frozenset(),
               size: int | None = None) -> StorageDecision:
        return self.evaluator.select(ctx, exclude=exclude, size=size)

    def consumed(self, device: str, size: int) -> None:
        """A message of ``size`` bytes went to ``device`` (its room shrinks until the next check)."""
        self.monitor.consumed(device, size)

    def refused(self, device: str, size: int) -> None:
        """``device`` refused a message of ``size`` bytes (see :meth:`StorageMonitor.refused`)."""
        self.monitor.refused(device, size)

    def health(self) -> Mapping[str, DeviceHealth]:
        return self.monitor.health()

    # -- admin interface -----------------------------------------------------------------------------

    def add_rule(self, data: Mapping[str, Any]) -> SelectionRule:
        rule = SelectionRule.from_mapping(data)
        self.rules.add(rule)
        return rule

    def replace_rule(self, data: Mapping[str, Any]) -> SelectionRule:
        rule = SelectionRule.from_mapping(data)
        self.rules.replace(rule)
        return rule

    def remove_rule(self, rule_id: str) -> SelectionRule:
        return self.rules.remove(rule_id)

    def describe(self) -> dict[str, Any]:
        """A JSON-able view for the admin interface: settings, health, and the current sorted rules."""
        ev = self.evaluator
        return {
            "strategy": ev.strategy, "default_device": ev.default_device, "match_bonus": ev.match_bonus,
            "rules_version": self.rules.version, "health_version": self.monitor.version, "sorts": ev.sorts,
            "devices": {name: {"score": h.score, "available": h.available, "reason": h.reason,
                               "pinned": h.pinned, "checked_at": h.checked_at, "durable": h.durable,
                               "bytes_free": self.monitor.free(name)}
                        for name, h in self.monitor.health().items()},
            "ranking": [{"id": r.id, "device": r.device, "weight": r.rule.weight, "adjusted": r.adjusted,
                         "condition": r.rule.condition,
                         "downgrade_durability": r.rule.downgrade_durability} for r in ev.ranking()],
        }
