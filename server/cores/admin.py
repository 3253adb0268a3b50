"""Admin and metrics over all workers (spec/cores.md §3.7)."""
from __future__ import annotations

from typing import Any


def install(server: Any, mesh: Any) -> None:
    return None
