"""Code blocks of the documentation, so tests run what the docs tell operators to run."""
from __future__ import annotations

import pathlib
import re

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


def marked_block(page: str, marker: str) -> str:
    """The fenced block between ``<!-- marker -->`` and ``<!-- /marker -->`` in docs/<page>."""
    text = (DOCS / page).read_text(encoding="utf-8")
    found = re.search(rf"<!-- {re.escape(marker)} -->\s*```\w*\n(.*?)```\s*<!-- /{re.escape(marker)} -->", text, re.S)
    assert found, f"docs/{page} has no block marked {marker}"
    return found.group(1)


def fenced_blocks(page: str, language: str) -> list[str]:
    text = (DOCS / page).read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)
