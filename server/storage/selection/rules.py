"""Storage selection rules and the rule book that holds them (seed 000).

A :class:`SelectionRule` says "prefer ``device`` with ``weight`` for messages whose ``condition`` holds";
the condition is compiled once, when the rule is made, by :func:`pymq.selector.compile_rule`.  Rules
need not exclude each other.  The :class:`RuleBook` is the live set: loaded from YAML, changed at run
time by the admin interface (the seed's BPM extension) with :meth:`RuleBook.add`, :meth:`replace` and
:meth:`remove`.

Invariants: ``snapshot`` is one immutable ``(version, rules)`` pair replaced in a single assignment, so
the broker thread always reads a consistent set, and every change (however small) increments the
version, which is what tells the evaluator to sort again; the change applies to the next message.
Mutations are serialised by a lock, so an admin thread and the broker thread can both call them.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterable, Mapping

import yaml

from pymq.errors import ConfigError, InvalidSelector
from pymq.selector import Selector, compile_rule

_RULE_KEYS = {"id", "device", "weight", "condition"}
#: keys a rule may have besides the required ones
_OPTIONAL_KEYS = {"downgrade_durability"}


@dataclass(frozen=True)
class SelectionRule:
    """One storage selection rule; the condition is compiled (and checked) on construction."""

    id: str
    device: str
    weight: float
    condition: str
    #: persistent messages this rule matches may be held on a device that does not survive a crash
    #: (spec/storage_rules.md §6.4); without it such a rule only takes non-persistent messages
    downgrade_durability: bool = False
    compiled: Selector = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id.strip():
            raise ConfigError(f"a storage rule needs a non-empty string id, got {self.id!r}")
        if not isinstance(self.device, str) or not self.device.strip():
            raise ConfigError(f"rule {self.id}: device must be a non-empty string, got {self.device!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) \
                or not math.isfinite(self.weight):
            raise ConfigError(f"rule {self.id}: weight must be a finite number, got {self.weight!r}")
        if not isinstance(self.condition, str):
            raise ConfigError(f"rule {self.id}: condition must be a string, got {type(self.condition).__name__}")
        if not isinstance(self.downgrade_durability, bool):
            raise ConfigError(f"rule {self.id}: downgrade_durability must be true or false, "
                              f"got {self.downgrade_durability!r}")
        try:
            compiled = compile_rule(self.condition)
        except InvalidSelector as err:
            # keep position/expected for the admin API, name the rule for the operator
            raise InvalidSelector(f"rule {self.id}: {err.message}", position=getattr(err, "position", -1),
                                  expected=getattr(err, "expected", "")) from None
        object.__setattr__(self, "compiled", compiled)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SelectionRule:
        """Build a rule from ``{id, device, weight, condition}`` (YAML / JSON / admin request body)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"a storage rule must be a mapping with {sorted(_RULE_KEYS)}, got {data!r}")
        unknown = set(data) - _RULE_KEYS - _OPTIONAL_KEYS
        missing = _RULE_KEYS - set(data)
        where = f"rule {data.get('id', '?')}"
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)} (expected {sorted(_RULE_KEYS)}, "
                              f"optionally {sorted(_OPTIONAL_KEYS)})")
        if missing:
            raise ConfigError(f"{where}: missing keys {sorted(missing)}")
        condition = data["condition"]
        return cls(id=data["id"], device=data["device"], weight=data["weight"],
                   condition="" if condition is None else condition,
                   downgrade_durability=data.get("downgrade_durability", False))

    def to_mapping(self) -> dict[str, Any]:
        mapping = {"id": self.id, "device": self.device, "weight": self.weight, "condition": self.condition}
        if self.downgrade_durability:
            mapping["downgrade_durability"] = True
        return mapping


class RuleBook:
    """The live set of storage selection rules, safe to change while messages are being placed.

    ``known_devices``, when given, makes :meth:`add`/:meth:`replace` refuse rules for devices the broker
    does not have (a typo in an admin request fails loudly instead of never matching).
    """

    def __init__(self, rules: Iterable[SelectionRule] = (), *, known_devices: Iterable[str] | None = None) -> None:
        self._lock = threading.Lock()
        self.known_devices = frozenset(known_devices) if known_devices is not None else None
        by_id: dict[str, SelectionRule] = {}
        for rule in rules:
            self._check(rule)
            if rule.id in by_id:
                raise ConfigError(f"two storage rules have the id {rule.id!r}")
            by_id[rule.id] = rule
        self._by_id = by_id
        #: (version, rules in insertion order): read it in one go
        self.snapshot: tuple[int, tuple[SelectionRule, ...]] = (0, tuple(by_id.values()))

    # -- reading -----------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self.snapshot[0]

    @property
    def rules(self) -> tuple[SelectionRule, ...]:
        return self.snapshot[1]

    def __len__(self) -> int:
        return len(self.snapshot[1])

    def __iter__(self):
        return iter(self.snapshot[1])

    def __contains__(self, rule_id: object) -> bool:
        return rule_id in self._by_id

    def get(self, rule_id: str) -> SelectionRule:
        try:
            return self._by_id[rule_id]
        except KeyError:
            raise ConfigError(f"no storage rule with id {rule_id!r}") from None

    # -- changing (admin interface) ----------------------------------------------------------------

    def add(self, rule: SelectionRule) -> None:
        """Add a new rule; an existing id is an error (use :meth:`replace`)."""
        self._check(rule)
        with self._lock:
            if rule.id in self._by_id:
                raise ConfigError(f"a storage rule with id {rule.id!r} already exists")
            by_id = dict(self._by_id)
            by_id[rule.id] = rule
            self._publish(by_id)

    def replace(self, rule: SelectionRule) -> SelectionRule:
        """Replace the rule with the same id (keeping its place); returns the old rule."""
        self._check(rule)
        with self._lock:
            old = self._by_id.get(rule.id)
            if old is None:
                raise ConfigError(f"no storage rule with id {rule.id!r} to replace")
            by_id = dict(self._by_id)
            by_id[rule.id] = rule
            self._publish(by_id)
            return old

    def remove(self, rule_id: str) -> SelectionRule:
        """Remove a rule; returns it."""
        with self._lock:
            old = self._by_id.get(rule_id)
            if old is None:
                raise ConfigError(f"no storage rule with id {rule_id!r} to remove")
            by_id = dict(self._by_id)
            del by_id[rule_id]
            self._publish(by_id)
            return old

    def load(self, rules: Iterable[SelectionRule]) -> None:
        """Replace every rule at once (a reloaded rule file): all or nothing."""
        fresh = RuleBook(rules, known_devices=self.known_devices)
        with self._lock:
            self._publish(dict(fresh._by_id))

    def _check(self, rule: SelectionRule) -> None:
        if not isinstance(rule, SelectionRule):
            raise ConfigError(f"expected a SelectionRule, got {type(rule).__name__}")
        if self.known_devices is not None and rule.device not in self.known_devices:
            raise ConfigError(f"rule {rule.id}: unknown device {rule.device!r} "
                              f"(devices: {', '.join(sorted(self.known_devices))})")

    def _publish(self, by_id: dict[str, SelectionRule]) -> None:
        self._by_id = by_id
        self.snapshot = (self.snapshot[0] + 1, tuple(by_id.values()))

    # -- YAML --------------------------------------------------------------------------------------

    @classmethod
    def from_yaml(cls, text: str, *, known_devices: Iterable[str] | None = None) -> RuleBook:
        """Rules from YAML: a document with a ``rules:`` list (other keys ignored here) or a bare list."""
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"storage rules are not valid YAML: {exc}") from None
        return cls(rules_from_document(doc), known_devices=known_devices)

    def to_yaml(self) -> str:
        return yaml.safe_dump({"rules": [r.to_mapping() for r in self.rules]}, sort_keys=False,
                              allow_unicode=True, width=120)


def rules_from_document(doc: Any) -> list[SelectionRule]:
    """The rules of a parsed YAML/JSON document (``{"rules": [...]}``, a bare list, or nothing)."""
    if doc is None:
        return []
    if isinstance(doc, Mapping):
        doc = doc.get("rules") or []
    if not isinstance(doc, list):
        raise ConfigError("storage rules must be a list of {id, device, weight, condition}")
    return [SelectionRule.from_mapping(item) for item in doc]
