"""Enum bases whose members hash in C.

``enum.Enum`` (CPython 3.11) hashes a member with a Python-level ``__hash__`` (``hash(self._name_)``),
about 80 ns a call. Protocol states, queue-entry states and placement paths are dict keys on the
per-frame and per-message paths, several times per message, so the project's enums use these bases.
"""
from __future__ import annotations

import enum


class Enum(enum.Enum):
    """Members compare by identity (as ``enum.Enum``'s do), so the identity hash agrees with equality."""

    __hash__ = object.__hash__


class StrEnum(str, enum.Enum):
    """Members equal their string values, so they hash as those strings do (a plain string key finds them)."""

    __hash__ = str.__hash__
