"""The one parser for every integer read from the wire (spec/stomp.md §"Numbers").

Every number a peer sends — content-length, heart-beat intervals, prefetch, priority, delays, TTLs,
sequence numbers, credits, byte and message limits — goes through :func:`parse_wire_int`, so that no
call site can forget a bound: digits only (ASCII ``0-9``, an optional leading ``-`` only where the
caller allows negatives), at most ``MAX_DIGITS`` characters, and a maximum value.  Python's ``int()``
accepts ``"+5"``, ``" 5"``, ``"5_000"``, Unicode digits and 4,300-digit numbers; none of those is a
STOMP number, and a huge one is how a compiled consumer of the value overflows.  The error names the
header, the value (shortened) and what was expected, and is an :class:`~pymq.errors.InvalidHeader`, so
the broker answers it with an ERROR frame and the SDK raises the same class.

The compiled scanner (``_ext/scanner.pyx``) applies the same rule to ``content-length`` in C; the twin
tests feed both the same hostile values.
"""
from __future__ import annotations

from typing import Final, overload
from collections.abc import Mapping

from pymq.errors import InvalidHeader

#: the most characters a wire integer may have: 19 digits holds every int64, and more is never needed.
MAX_DIGITS: Final = 19
#: the largest value anything on the wire may carry unless the caller sets a smaller bound (int64 max).
INT64_MAX: Final = (1 << 63) - 1
#: a bound for 32-bit quantities (heart-beat milliseconds, prefetch, credits).
INT32_MAX: Final = (1 << 31) - 1


def _shown(value: str) -> str:
    return repr(value if len(value) <= 32 else value[:29] + "...")


def parse_wire_int(name: str, value: str, *, minimum: int = 0, maximum: int = INT64_MAX) -> int:
    """``value`` (the text of header ``name``) as an int in ``[minimum, maximum]``, or InvalidHeader.

    Only ``[-]?[0-9]{1,19}`` is accepted; a leading ``-`` only when ``minimum`` is negative.
    """
    text = value
    negative = text[:1] == "-"
    digits = text[1:] if negative else text
    if not digits or not digits.isascii() or not digits.isdigit() or (negative and minimum >= 0):
        want = "an integer" if minimum < 0 else "a non-negative integer"
        raise InvalidHeader(f"header {name!r} must be {want} (digits only), got {_shown(value)}",
                            header=name)
    if len(digits) > MAX_DIGITS:
        raise InvalidHeader(f"header {name!r} has {len(digits)} digits; at most {MAX_DIGITS} are allowed",
                            header=name)
    n = int(text)
    if n < minimum or n > maximum:
        raise InvalidHeader(f"header {name!r} must be between {minimum} and {maximum}, got {n}",
                            header=name)
    return n


@overload
def header_int(headers: Mapping[str, str], name: str, default: int, *,
               minimum: int = ..., maximum: int = ...) -> int: ...
@overload
def header_int(headers: Mapping[str, str], name: str, default: None = None, *,
               minimum: int = ..., maximum: int = ...) -> int | None: ...


def header_int(headers: Mapping[str, str], name: str, default: int | None = None, *,
               minimum: int = 0, maximum: int = INT64_MAX) -> int | None:
    """Header ``name`` parsed by :func:`parse_wire_int`, or ``default`` when absent or empty."""
    value = headers.get(name)
    if value is None or value == "":
        return default
    return parse_wire_int(name, value, minimum=minimum, maximum=maximum)
