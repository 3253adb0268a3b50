"""Argument and permission checks shared by every admin operation (spec/admin.md).

Admin arguments arrive as JSON (an HTTP body, a STOMP admin message) or as text (an HTTP query
string), so each reader accepts both spellings and bounds what it accepts: a page size, an id list or
a name that is too large is an error naming the argument, never a broker that does a million times the
work.  Permission refusals are raised before an operation changes anything.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

from pymq.errors import AccessDenied, ConfigError, InvalidHeader
from pymq.protocol.numbers import parse_wire_int
from pymq_server.broker.acl import is_admin

#: the most message ids one move/retry/drop request may name
MAX_IDS = 10_000
#: the longest name or id an admin argument may carry
MAX_TEXT = 1024


def text_arg(args: dict, key: str, *, required: bool = True, default: str | None = None) -> str | None:
    value = args.get(key)
    if value is None or value == "":
        if required:
            raise ConfigError(f"admin operation needs a non-empty string '{key}'")
        return default
    if not isinstance(value, str):
        raise ConfigError(f"argument '{key}' must be a string, got {type(value).__name__}")
    if len(value) > MAX_TEXT:
        raise ConfigError(f"argument '{key}' is {len(value)} characters long; at most {MAX_TEXT} are allowed")
    return value


def queue_name(args: dict, key: str = "name") -> str:
    """A queue's name from ``name`` or ``/queue/name``."""
    value = text_arg(args, key)
    assert value is not None
    if value.startswith("/queue/"):
        value = value[len("/queue/"):]
    return value


def int_arg(args: dict, key: str, default: int, *, minimum: int = 0, maximum: int) -> int:
    """An integer from JSON (a number) or a query string (digits only, through the wire parser)."""
    value = args.get(key)
    if value is None or value == "":
        return default
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"argument '{key}' must be an integer, got {type(value).__name__}")
    if isinstance(value, str):
        try:
            value = parse_wire_int(key, value, minimum=minimum, maximum=maximum)
        except InvalidHeader as exc:
            raise ConfigError(exc.message.replace("header", "argument", 1)) from None
    if not minimum <= value <= maximum:
        raise ConfigError(f"argument '{key}' must be between {minimum} and {maximum}, got {value}")
    return value


def bool_arg(args: dict, key: str, default: bool = False) -> bool:
    value = args.get(key)
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise ConfigError(f"argument '{key}' must be true or false, got {value!r}")


def ids_arg(args: dict, key: str = "message_ids") -> list[str] | None:
    """A list of message ids (or one comma-separated string from a query), or None when absent."""
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        value = [v for v in value.split(",") if v]
    if not isinstance(value, list) or not all(isinstance(v, str) and 0 < len(v) <= MAX_TEXT for v in value):
        raise ConfigError(f"argument '{key}' must be a list of message id strings")
    if len(value) > MAX_IDS:
        raise ConfigError(f"argument '{key}' names {len(value)} messages; at most {MAX_IDS} per request")
    return value


def user_name(user) -> str:
    return getattr(user, "name", None) or "anonymous"


def require_admin(user, what: str) -> None:
    if not is_admin(user):
        name = user_name(user)
        raise AccessDenied(f"user '{name}' may not {what}: administrators only", user=name,
                           destination="*", permission="admin")


@dataclass(frozen=True)
class Offload:
    """An operation whose slow part (password hashing, file writes) runs in a worker thread.

    ``work()`` runs off the event loop and touches no broker state; ``finish(result)`` then runs on the
    loop and returns the operation's answer.  Both admin adapters (HTTP and STOMP) run it the same way
    through :meth:`pymq_server.admin.ops.Admin.submit`.
    """

    work: Callable[[], Any]
    finish: Callable[[Any], Any]
