"""The JMS message selector language and its storage-rule dialect (seed 000).

    >>> from pymq.selector import compile_selector
    >>> s = compile_selector("JMSType = 'car' AND color = 'blue' AND weight > 2500")
    >>> s.matches({"JMSType": "car", "color": "blue", "weight": 3000})
    True
    >>> sorted(s.identifiers)
    ['JMSType', 'color', 'weight']

Grammar, type rules and error format: spec/selector.md and spec/storage_rules.md.  Sans-IO: nothing
here touches a socket or an event loop.
"""
from __future__ import annotations

from pymq.errors import InvalidSelector

from ._compiler import Selector, compile_rule, compile_selector
from ._evaluator import IMPLEMENTATION, IMPLEMENTATIONS
from ._ir import UntypedNumber, read_number, untyped
from ._parser import DEFAULT_LIMITS, SelectorLimits
from ._rules import BODY_TYPES, DESTINATION_TYPES, rule_context

__all__ = [
    "Selector", "compile_selector", "compile_rule", "rule_context", "InvalidSelector",
    "SelectorLimits", "DEFAULT_LIMITS",
    "IMPLEMENTATIONS", "IMPLEMENTATION", "BODY_TYPES", "DESTINATION_TYPES",
    "UntypedNumber", "untyped", "read_number",
]
