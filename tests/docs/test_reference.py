"""docs/configuration.md is generated from the configuration schema; the committed file must match."""
from __future__ import annotations

import pathlib

from pymq_server.config import BrokerConfig, reference

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_committed_reference_matches_the_schema():
    assert DOC.read_text(encoding="utf-8") == reference(), (
        "docs/configuration.md is stale: run `python -m pymq_server.config --reference > docs/configuration.md`")


def test_every_top_level_setting_is_documented():
    text = DOC.read_text(encoding="utf-8")
    for name in BrokerConfig.model_fields:
        assert f"| `{name}` |" in text, name
