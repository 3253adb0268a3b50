"""Tokens of the selector language and of its dialects.

The lexer is shared by every dialect; a dialect only switches on double-quoted strings and adds
operator spellings (``==``, ``&&``, ...) that map onto the JMS ones, so the parser never sees them.
Reserved words (``AND``, ``NULL``, ...) come out as ``keyword`` tokens whatever their case; every other
word is an ``ident`` token and keeps its case (identifiers are case-sensitive).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping

from pymq.errors import InvalidSelector

#: JMS 2.0 §3.8.1.1: these words can never be identifiers.
RESERVED = frozenset({"NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "NULL", "TRUE", "FALSE", "ESCAPE"})

#: the most digits an exact numeric can have (a long), and what the error says when it has more
LONG_DIGITS = 19
LONG_RANGE = "an integer between -9223372036854775808 and 9223372036854775807"

_JMS_OPERATORS = ("<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "(", ")", ",")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str        # "keyword" | "ident" | "string" | "int" | "float" | "op" | "eof"
    value: Any       # keyword: upper-case word; string: decoded text; int/float: the number; op: symbol
    pos: int         # 0-based offset of the first character
    text: str        # the source text, for error messages

    def describe(self) -> str:
        if self.kind == "eof":
            return "end of input"
        # an error message never echoes a 30,000-character literal back whole
        return f"'{self.text}'" if len(self.text) <= 40 else f"'{self.text[:37]}...'"


def _is_ident_start(c: str) -> bool:
    # Java's isJavaIdentifierStart, to the precision that matters: letters (any script), '_' and '$'.
    return c.isalpha() or c == "_" or c == "$"


def _is_ident_part(c: str) -> bool:
    return c.isalnum() or c == "_" or c == "$"


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"     # str.isdigit() would accept other scripts' digits


def _fail(label: str, pos: int, expected: str, found: str) -> InvalidSelector:
    return InvalidSelector(f"{label} error at position {pos}: expected {expected} but found {found}",
                           position=pos, expected=expected)


def tokenize(text: str, *, label: str = "selector", double_quotes: bool = False,
             aliases: Mapping[str, tuple[str, str]] | None = None) -> list[Token]:
    """Split ``text`` into tokens, ending with one ``eof`` token; raise InvalidSelector on bad input.

    ``aliases`` maps extra operator spellings to (kind, value), e.g. ``{"&&": ("keyword", "AND")}``.
    """
    aliases = aliases or {}
    # longest spelling first, so '<>' wins over '<' and '!=' over '!'
    operators = sorted([*_JMS_OPERATORS, *aliases], key=len, reverse=True)
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        start = i
        if c == "'" or (c == '"' and double_quotes):
            value, i = _string(text, i, label)
            tokens.append(Token("string", value, start, text[start:i]))
            continue
        if _is_digit(c) or (c == "." and i + 1 < n and _is_digit(text[i + 1])):
            tokens.append(_number(text, i, label))
            i = start + len(tokens[-1].text)
            continue
        if _is_ident_start(c):
            while i < n and _is_ident_part(text[i]):
                i += 1
            word = text[start:i]
            upper = word.upper()
            if upper in RESERVED:
                tokens.append(Token("keyword", upper, start, word))
            else:
                tokens.append(Token("ident", word, start, word))
            continue
        for op in operators:
            if text.startswith(op, i):
                kind, value = aliases.get(op, ("op", op))
                tokens.append(Token(kind, value, start, op))
                i += len(op)
                break
        else:
            raise _fail(label, i, "an expression or operator", f"'{c}'")
    tokens.append(Token("eof", None, n, ""))
    return tokens


def _string(text: str, i: int, label: str) -> tuple[str, int]:
    quote = text[i]
    start = i
    i += 1
    parts = []
    n = len(text)
    while True:
        j = text.find(quote, i)
        if j < 0:
            raise _fail(label, n, f"{quote} to close the string opened at position {start}", "end of input")
        parts.append(text[i:j])
        if j + 1 < n and text[j + 1] == quote:     # a doubled quote is one quote character
            parts.append(quote)
            i = j + 2
            continue
        return "".join(parts), j + 1


def _number(text: str, i: int, label: str) -> Token:
    """Exact numerics are decimal integers (optional L suffix); approximate ones have '.' or an exponent."""
    start = i
    n = len(text)
    while i < n and _is_digit(text[i]):
        i += 1
    is_float = False
    if i < n and text[i] == ".":
        is_float = True
        i += 1
        while i < n and _is_digit(text[i]):
            i += 1
    if i < n and text[i] in "eE":
        j = i + 1
        if j < n and text[j] in "+-":
            j += 1
        if j < n and _is_digit(text[j]):
            is_float = True
            i = j
            while i < n and _is_digit(text[i]):
                i += 1
        else:
            raise _fail(label, j, "the digits of an exponent", _found_at(text, j))
    digits = text[start:i]
    if not is_float and i < n and text[i] in "lL":
        i += 1
    if i < n and _is_ident_part(text[i]):
        what = "hexadecimal" if digits == "0" and text[i] in "xX" else None
        expected = "a decimal number (hexadecimal is not supported)" if what else "an operator after a number"
        raise _fail(label, i, expected, f"'{text[i]}'")
    if is_float:
        return Token("float", float(digits), start, text[start:i])
    if len(digits) > 1 and digits[0] == "0":
        raise _fail(label, start, "a decimal integer without leading zeros (octal is not supported)",
                    f"'{text[start:i]}'")
    if len(digits) > LONG_DIGITS:
        # int() of a 5,000-digit literal would raise ValueError (or be slow); no long has 20 digits
        found = Token("int", 0, start, text[start:i]).describe()
        raise _fail(label, start, LONG_RANGE, found)
    return Token("int", int(digits), start, text[start:i])


def _found_at(text: str, i: int) -> str:
    return "end of input" if i >= len(text) else f"'{text[i]}'"
