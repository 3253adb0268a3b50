"""docs/failover.md (the Python SDK user's guide to failover) lists exactly the options the URL parser
knows, with the defaults the spec's vectors give, and the README's SDK section names every one too."""
from __future__ import annotations

import json
import re
from pathlib import Path

from pymq.client.url import FAILOVER_OPTIONS

ROOT = Path(__file__).resolve().parents[2]


def test_the_guide_lists_every_option_with_its_default():
    text = (ROOT / "docs" / "failover.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", text, re.MULTILINE))
    defaults = json.loads((ROOT / "spec" / "vectors" / "failover_urls.json").read_text())["defaults"]
    assert set(rows) == set(FAILOVER_OPTIONS) == set(defaults)
    for name, written in rows.items():
        assert json.loads(written) == defaults[name], name


def test_the_readme_names_every_option():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("* **Failover**"):text.index("* **URLs**")]
    assert all(f"`{name}`" in section for name in FAILOVER_OPTIONS)
