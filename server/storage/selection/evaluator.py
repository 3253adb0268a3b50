"""The rule evaluator (seed 000): adjusted weights, strategies, and the decision for one message.

Each rule's weight is adjusted by its device's score (``adjusted = weight + score``, the score being 0
or negative).  Rules of unavailable devices (full, failing, offline, unknown to the health source) drop
out.  The remaining rules are sorted by adjusted weight, descending, ties by rule id; that *plan* is
rebuilt only when the rule book's version or the health's version changes, never per message
(``sorts`` counts the rebuilds).  Strategies:

* ``first-match``: the first rule of the plan whose condition holds picks its device;
* ``average`` / ``weighted-sum``: every matching rule counts; per device the mean (or the sum) of the
  matching rules' adjusted weights, plus ``match_bonus`` for each matching rule beyond the first; the
  highest aggregate wins (ties: more matching rules, then the higher single rule, then device name).

No match: the configured default device if it is available, otherwise the best-scored available device.
Every answer is a :class:`StorageDecision` that records the device and why, for the message's record.

Per message, on top of the plan (spec/storage_rules.md §6.4): a persistent message uses only rules of
durable devices, or rules that say ``downgrade_durability``; devices the health source says lack room
for the message's size, and devices the caller excludes (they refused this very message), drop out.
These filtered plans are derived from the sorted one and cached with it, so they never re-sort either.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from collections.abc import Callable, Iterable, Mapping

from pymq.errors import ConfigError, StorageError
from pymq.selector import _evaluator as _picker

from .monitor import DeviceHealth, HealthSource
from .rules import RuleBook, SelectionRule

STRATEGIES = ("first-match", "average", "weighted-sum")


@dataclass(frozen=True, slots=True)
class RankedRule:
    """A rule with its weight adjusted by its device's current score."""

    rule: SelectionRule
    adjusted: float

    @property
    def id(self) -> str:
        return self.rule.id

    @property
    def device(self) -> str:
        return self.rule.device


@dataclass(frozen=True, slots=True)
class StorageDecision:
    """Where one message goes, and why.

    ``rule_id`` is the rule that chose the device (first-match), or the strongest matching rule of the
    chosen device (aggregation); None when no rule applied.  ``weight`` is that rule's adjusted weight
    (first-match) or the device's aggregate.  ``matched`` lists the rules that counted.  ``fallback`` is
    None when a rule decided, ``"default"`` for the configured default device, ``"best-available"``
    when that was unavailable too.
    """

    device: str
    strategy: str
    rule_id: str | None = None
    weight: float | None = None
    matched: tuple[str, ...] = ()
    aggregates: Mapping[str, float] | None = None
    fallback: str | None = None

    def describe(self) -> str:
        if self.fallback == "default":
            return f"{self.device}: no rule matched, default device"
        if self.fallback == "best-available":
            return f"{self.device}: no rule matched and the default device is unavailable; best-scored device"
        if self.strategy == "first-match":
            return f"{self.device}: rule {self.rule_id} (adjusted weight {self.weight:g})"
        shown = ", ".join(f"{d} {w:g}" for d, w in (self.aggregates or {}).items())
        return f"{self.device}: {self.strategy} {self.weight:g} over {', '.join(self.matched)} ({shown})"


@dataclass(frozen=True, slots=True)
class _Plan:
    """The sorted usable rules, with parallel arrays so a message's hits are aggregated by index."""

    key: tuple[int, int]
    ranked: tuple[RankedRule, ...]
    programs: list
    index: Mapping[str, int]          # rule id -> position in ``ranked``
    ids: list[str]
    devices: list[str]
    adjusted: list[float]
    health: Mapping[str, DeviceHealth]
    derived: dict = field(default_factory=dict, compare=False)   # filtered plans, by filter


class RuleEvaluator:
    """Chooses a holding device for each message from a :class:`RuleBook` and a health source.

    ``implementation`` forces a selector evaluator module (``pymq.selector.IMPLEMENTATIONS["py"]``) for
    tests and benchmarks; by default the compiled one runs.
    """

    def __init__(self, rules: RuleBook, health: HealthSource, *, strategy: str = "first-match",
                 default_device: str | None = None, match_bonus: float = 0.0,
                 implementation: ModuleType | None = None) -> None:
        self.rules = rules
        self.health = health
        self.strategy = strategy
        self.default_device = default_device
        self.match_bonus = match_bonus
        self._impl = implementation or _picker.impl
        self._first_match = self._impl.first_match
        self._all_matches = self._impl.all_matches
        self._programs: dict[str, object] = {}     # condition text -> compiled program (kept across sorts)
        self._plan: _Plan | None = None
        #: how many times the rules were (re)sorted: only when rules or scores change
        self.sorts = 0

    # -- configuration (may change at run time) -----------------------------------------------------

    @property
    def strategy(self) -> str:
        return self._strategy

    @strategy.setter
    def strategy(self, value: str) -> None:
        if value not in STRATEGIES:
            raise ConfigError(f"storage selection strategy must be one of {', '.join(STRATEGIES)}, got {value!r}")
        self._strategy = value

    @property
    def match_bonus(self) -> float:
        return self._match_bonus

    @match_bonus.setter
    def match_bonus(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"match_bonus must be a number, got {value!r}")
        self._match_bonus = float(value)

    # -- the plan ----------------------------------------------------------------------------------

    def plan(self) -> _Plan:
        """The current sorted rules, rebuilt only if the rules or the device health changed."""
        rules_version, rules = self.rules.snapshot
        key = (rules_version, self.health.version)   # versions before contents: a race only re-plans
        plan = self._plan
        if plan is not None and plan.key == key:
            return plan
        health = self.health.health()
        ranked = []
        for rule in rules:
            h = health.get(rule.device)
            if h is None or not h.available:
                continue
            ranked.append(RankedRule(rule, rule.weight + h.score))
        ranked.sort(key=lambda r: (-r.adjusted, r.rule.id))
        programs = self._programs
        fresh = {}
        for r in ranked:
            text = r.rule.condition
            program = programs.get(text)
            if program is None:
                program = self._impl.build(r.rule.compiled.ir)
            fresh[text] = program
        self._programs = fresh
        plan = _Plan(key, tuple(ranked), [fresh[r.rule.condition] for r in ranked],
                     {r.id: i for i, r in enumerate(ranked)}, [r.rule.id for r in ranked],
                     [r.rule.device for r in ranked], [r.adjusted for r in ranked], health)
        self._plan = plan
        self.sorts += 1
        return plan

    def ranking(self) -> tuple[RankedRule, ...]:
        """The usable rules by adjusted weight, highest first (the seed's sorted list)."""
        return self.plan().ranked

    def _derive(self, plan: _Plan, key: object, keep: Callable[[RankedRule], bool]) -> _Plan:
        """``plan`` without the rules ``keep`` rejects (cached on ``plan``: built once per filter)."""
        sub = plan.derived.get(key)
        if sub is None:
            chosen = [i for i, r in enumerate(plan.ranked) if keep(r)]
            ranked = tuple(plan.ranked[i] for i in chosen)
            sub = _Plan(plan.key, ranked, [plan.programs[i] for i in chosen],
                        {r.id: j for j, r in enumerate(ranked)}, [r.rule.id for r in ranked],
                        [r.rule.device for r in ranked], [r.adjusted for r in ranked], plan.health)
            plan.derived[key] = sub
        return sub

    def plan_for(self, persistent: bool = False, skip: frozenset[str] = frozenset()) -> _Plan:
        """The plan a message sees: durable rules only for a persistent one, ``skip``ped devices out."""
        plan = self.plan()
        if persistent:
            health = plan.health
            plan = self._derive(plan, "durable", lambda r: health[r.device].durable
                                or r.rule.downgrade_durability)
        if skip:
            plan = self._derive(plan, skip, lambda r: r.rule.device not in skip)
        return plan

    # -- per message -------------------------------------------------------------------------------

    def select(self, ctx: Mapping[str, object], *, exclude: frozenset[str] = frozenset(),
               size: int | None = None) -> StorageDecision:
        """The device for a message with rule context ``ctx`` (see :func:`pymq.selector.rule_context`).

        ``size``: the message's bytes, checked against the room the health source knows of;
        ``exclude``: devices that must not be chosen (they refused this message)."""
        persistent = ctx.get("persistent") is True
        skip = exclude
        if size is not None:
            lacking = getattr(self.health, "lacking_room", None)
            if lacking is not None:
                short = lacking(size)
                if short:
                    skip = skip | short
        plan = self.plan_for(persistent, skip) if persistent or skip else self.plan()
        if self._strategy == "first-match":
            i = self._first_match(plan.programs, ctx)
            if i < 0:
                return self._fallback(plan, persistent, skip)
            r = plan.ranked[i]
            return StorageDecision(r.rule.device, "first-match", r.rule.id, r.adjusted, (r.rule.id,))
        hits = self._all_matches(plan.programs, ctx)
        if not hits:
            return self._fallback(plan, persistent, skip)
        return self._aggregate(plan, hits)

    def aggregate(self, matched: Iterable[str]) -> StorageDecision:
        """Aggregate the given matching rules (by id) with the current strategy's function.

        Rules of unavailable devices are ignored; an unknown id is an error.  With ``first-match`` as
        the strategy this aggregates by average.
        """
        plan = self.plan()
        hits = []
        for rule_id in matched:
            if rule_id not in self.rules:
                raise ConfigError(f"no storage rule with id {rule_id!r}")
            i = plan.index.get(rule_id)
            if i is not None:
                hits.append(i)
        if not hits:
            return self._fallback(plan)
        return self._aggregate(plan, sorted(set(hits)))

    def _aggregate(self, plan: _Plan, hits: list[int]) -> StorageDecision:
        """``hits``: ascending plan positions of the matching rules (so each device's first is its strongest)."""
        strategy = self._strategy if self._strategy != "first-match" else "average"
        devices, adjusted = plan.devices, plan.adjusted
        totals: dict[str, float] = {}
        counts: dict[str, int] = {}
        strongest: dict[str, int] = {}
        for i in hits:
            device = devices[i]
            if device in counts:
                totals[device] += adjusted[i]
                counts[device] += 1
            else:
                totals[device] = adjusted[i]
                counts[device] = 1
                strongest[device] = i
        bonus = self._match_bonus
        if strategy == "average":
            aggregates = {d: totals[d] / n + bonus * (n - 1) for d, n in counts.items()}
        else:
            aggregates = {d: totals[d] + bonus * (n - 1) for d, n in counts.items()}
        best = min(aggregates, key=lambda d: (-aggregates[d], -counts[d], -adjusted[strongest[d]], d))
        ids = plan.ids
        return StorageDecision(best, strategy, ids[strongest[best]], aggregates[best],
                               tuple([ids[i] for i in hits]), aggregates)

    def _fallback(self, plan: _Plan, persistent: bool = False,
                  skip: frozenset[str] = frozenset()) -> StorageDecision:
        """No rule matched: the default device, else the best-scored one; for a persistent message
        only a durable one (no rule allowed less), never one in ``skip``."""
        health = plan.health

        def usable(h: DeviceHealth) -> bool:
            return h.available and h.name not in skip and (h.durable or not persistent)

        default = self.default_device
        if default is not None:
            h = health.get(default)
            if h is not None and usable(h):
                return StorageDecision(default, self._strategy, fallback="default")
        candidates = [h for h in health.values() if usable(h)]
        if not candidates:
            reasons = []
            for h in health.values():
                if not h.available:
                    reasons.append(f"{h.name}: {h.reason}")
                elif h.name in skip:
                    reasons.append(f"{h.name}: no room for it or refused it")
                elif persistent and not h.durable:
                    reasons.append(f"{h.name}: not durable, and no rule allows a persistent message there")
            what = " for a persistent message" if persistent else ""
            raise StorageError(f"no holding device is available{what} ({'; '.join(reasons) or 'no devices'})")
        best = min(candidates, key=lambda h: (-h.score, h.name))
        return StorageDecision(best.name, self._strategy, fallback="best-available")
