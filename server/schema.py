"""Optional message schemas per queue (seed 001): declared properties, their types, required flags.

A queue with a schema refuses a message whose properties do not fit, with an error naming the
property; a queue without one takes anything.  STOMP carries every property as a string, so a value
fits a declared type when it has that type (``pymq-types``, spec/stomp.md §7) *or* its text parses as
one — a foreign client sending ``amount:12.5`` satisfies ``amount: float``.

A schema is declared in the configuration (config.py checks the declaration parses) or by the admin, and
checked by the broker core; so it sits beside config.py, below both, rather than in the broker package.
"""
from __future__ import annotations

from dataclasses import dataclass

from pymq.errors import ConfigError, SchemaViolation

TYPES = ("string", "int", "float", "bool")
_CODES = {"i": "int", "f": "float", "b": "bool"}


@dataclass(frozen=True)
class PropertyRule:
    name: str
    type: str = "string"
    required: bool = False


class MessageSchema:
    def __init__(self, rules: list[PropertyRule]) -> None:
        self.rules = rules

    @classmethod
    def from_dict(cls, data: dict, where: str = "queue") -> MessageSchema:
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: schema must be a mapping of property name to its declaration")
        props = data.get("properties", data)
        rules = []
        for name, decl in props.items():
            if isinstance(decl, str):
                decl = {"type": decl}
            if not isinstance(decl, dict):
                raise ConfigError(f"{where}: schema property {name!r} must be a type name or a mapping")
            unknown = set(decl) - {"type", "required"}
            if unknown:
                raise ConfigError(f"{where}: schema property {name!r} has unknown keys {sorted(unknown)}")
            kind = decl.get("type", "string")
            if kind not in TYPES:
                raise ConfigError(f"{where}: schema property {name!r} has type {kind!r}; "
                                  f"use one of {', '.join(TYPES)}")
            rules.append(PropertyRule(str(name), kind, bool(decl.get("required", False))))
        return cls(rules)

    def check(self, headers: dict, destination: str) -> None:
        """Raise SchemaViolation naming the first property that does not fit."""
        declared = {}
        spec = headers.get("pymq-types")
        if spec:
            for item in spec.split(","):
                name, _, code = item.rpartition("=")
                declared[name] = _CODES.get(code, "string")
        for rule in self.rules:
            value = headers.get(rule.name)
            if value is None:
                if rule.required:
                    raise SchemaViolation(f"message for {destination} is missing required property "
                                          f"{rule.name!r} ({rule.type})", property=rule.name,
                                          destination=destination)
                continue
            if not _fits(value, rule.type, declared.get(rule.name)):
                raise SchemaViolation(f"message for {destination}: property {rule.name!r} must be "
                                      f"{rule.type}, got {value!r}", property=rule.name,
                                      destination=destination)


def _fits(value: str, kind: str, sent_as: str | None) -> bool:
    if kind == "string":
        return sent_as in (None, "string")
    if sent_as is not None and sent_as != "string":
        return sent_as == kind or (kind == "float" and sent_as == "int")
    try:
        if kind == "int":
            int(value)
        elif kind == "float":
            float(value)
        else:
            return value.lower() in ("true", "false")
    except ValueError:
        return False
    return True
