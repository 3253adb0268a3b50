"""The storage-rule dialect (seed 000): the JMS selector grammar with the keywords of storage rules.

A storage rule's condition reads the *rule context* of one message, a mapping built once per message
(see :func:`rule_context` and spec/storage_rules.md) instead of message properties:

=====================  ======================  ==========================================================
keyword                context key             value
=====================  ======================  ==========================================================
``SIZE``               ``size_bytes``          size in kilobytes, ``size_bytes / 1024`` (a real number)
``TYPE``               ``body_type``           ``'TEXT'``, ``'BYTES'``, ``'MAP'`` (also OBJECT, STREAM)
``DESTINATION``        ``destination_type``    ``'QUEUE'`` or ``'TOPIC'``
``DESTINATION_NAME``   ``destination``         the destination, e.g. ``'/queue/orders'``
``CLIENT_ID``          ``client_id``           the producing connection's client id
``PRIORITY``           ``priority``            JMS priority 0-9
``PERSISTENT``         ``persistent``          boolean
``PRODUCER``           ``producer``            the producing principal (login)
``HEADER('n')``        ``headers``             the header ``n`` (a string) or NULL when absent
=====================  ======================  ==========================================================

Bare constants ``TEXT BYTES BYTE MAP OBJECT STREAM QUEUE TOPIC`` are the strings of those names
(``BYTE`` is the seed's spelling of ``'BYTES'``).  Any value keyword takes the methods
``.contains('text')`` and ``.isPresent()``, both two-valued (an absent header contains nothing).  Rules
also accept ``==``, ``!=``, ``&&``, ``||``, ``!`` and double-quoted strings, the spellings the seed's
figure uses; a bare word that is not a keyword is an error, so a misspelt keyword cannot silently read
NULL.  Keywords and constants are case-insensitive like JMS reserved words.
"""
from __future__ import annotations

from collections.abc import Mapping

from ._lexer import Token
from ._parser import ANY, BOOL, NUM, STR, Dialect, Node, Parser

#: keyword -> (context key, static kind)
VALUE_KEYWORDS: dict[str, tuple[str, str]] = {
    "TYPE": ("body_type", STR),
    "DESTINATION": ("destination_type", STR),
    "DESTINATION_NAME": ("destination", STR),
    "CLIENT_ID": ("client_id", STR),
    "PRIORITY": ("priority", NUM),
    "PERSISTENT": ("persistent", BOOL),
    "PRODUCER": ("producer", STR),
}

#: bare constants -> the string they stand for
CONSTANTS: dict[str, str] = {
    "TEXT": "TEXT", "BYTES": "BYTES", "BYTE": "BYTES", "MAP": "MAP", "OBJECT": "OBJECT",
    "STREAM": "STREAM", "QUEUE": "QUEUE", "TOPIC": "TOPIC",
}

BODY_TYPES = ("TEXT", "BYTES", "MAP", "OBJECT", "STREAM")
DESTINATION_TYPES = ("QUEUE", "TOPIC")

_METHODS = {"contains": "contains", "ispresent": "isPresent"}


def _value_keyword(parser: Parser, tok: Token) -> Node:
    key, kind = VALUE_KEYWORDS[tok.value.upper()]
    parser.reads.add(key)
    return Node(("prop", key), kind, tok.pos, ref=True)


def _size(parser: Parser, tok: Token) -> Node:
    parser.reads.add("size_bytes")
    return Node(("arith", "/", ("prop", "size_bytes"), ("lit", 1024)), NUM, tok.pos, ref=True, height=2)


def _header(parser: Parser, tok: Token) -> Node:
    parser.expect_op("(")
    name = parser.expect_string("a header name in quotes")
    parser.expect_op(")")
    parser.reads.add("headers")
    return Node(("field", "headers", name.value), STR, tok.pos, ref=True)


def _constant(parser: Parser, tok: Token) -> Node:
    return Node(("lit", CONSTANTS[tok.value.upper()]), STR, tok.pos)


class StorageRuleDialect(Dialect):
    label = "storage rule"
    double_quotes = True
    aliases = {
        "==": ("op", "="), "!=": ("op", "<>"),
        "&&": ("keyword", "AND"), "||": ("keyword", "OR"), "!": ("keyword", "NOT"),
        ".": ("op", "."),
    }
    keywords = {
        **{word: _value_keyword for word in VALUE_KEYWORDS},
        "SIZE": _size,
        "HEADER": _header,
        **{word: _constant for word in CONSTANTS},
    }

    def identifier(self, parser: Parser, token: Token) -> Node:
        raise parser.error(token.pos, "a storage-rule keyword (SIZE, TYPE, HEADER, DESTINATION, "
                                      "DESTINATION_NAME, CLIENT_ID, PRIORITY, PERSISTENT, PRODUCER)",
                           token.describe())

    def postfix(self, parser: Parser, node: Node) -> Node:
        if not parser.at_op("."):
            return node
        dot = parser.advance()
        if not node.ref:
            raise parser.error(dot.pos, "an operator (methods apply to keywords such as HEADER('name'))", "'.'")
        tok = parser.peek
        method = _METHODS.get(tok.value.lower()) if tok.kind == "ident" else None
        if method is None:
            raise parser.error(tok.pos, "contains or isPresent", tok.describe())
        parser.advance()
        parser.expect_op("(")
        if method == "contains":
            if node.kind not in (STR, ANY):
                raise parser.error(tok.pos, "isPresent (contains applies to string values)", tok.describe())
            needle = parser.expect_string("the text to look for in quotes")
            parser.expect_op(")")
            return parser.node(("contains", node.ir, needle.value), BOOL, node.pos, node, cond=True)
        parser.expect_op(")")
        present = parser.node(("isnull", node.ir), BOOL, node.pos, node, cond=True)
        return parser.node(("not", present.ir), BOOL, node.pos, present, cond=True)


STORAGE_RULES = StorageRuleDialect()


def rule_context(*, size_bytes: int, body_type: str = "BYTES", headers: Mapping[str, str] | None = None,
                 destination: str | None = None, destination_type: str | None = None,
                 client_id: str | None = None, priority: int | None = None, persistent: bool | None = None,
                 producer: str | None = None) -> dict[str, object]:
    """The mapping a storage rule reads, for one message (build it once, evaluate every rule on it).

    ``destination_type`` defaults from the destination's prefix (``/topic/`` -> TOPIC, else QUEUE).
    """
    if destination_type is None and destination is not None:
        destination_type = "TOPIC" if destination.startswith("/topic/") else "QUEUE"
    return {
        "size_bytes": size_bytes,
        "body_type": body_type,
        "headers": headers if headers is not None else {},
        "destination": destination,
        "destination_type": destination_type,
        "client_id": client_id,
        "priority": priority,
        "persistent": persistent,
        "producer": producer,
    }
