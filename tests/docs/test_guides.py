"""The guides' examples are valid as written: configuration blocks pass the schema, the users file
passes its schema, and every relative link points at a file that exists."""
from __future__ import annotations

import re

import pytest
import yaml

from pymq_server.config import BrokerConfig, UsersFile
from tests.docs._blocks import DOCS, fenced_blocks, marked_block

PAGES = sorted(p.name for p in DOCS.glob("*.md"))


@pytest.mark.parametrize("page", PAGES + ["../README.md", "../examples/README.md"])
def test_relative_links_resolve(page):
    path = (DOCS / page).resolve()
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (path.parent / target).exists(), f"{page}: link to {target} does not resolve"


def test_getting_started_configurations_are_valid():
    first, tls = [yaml.safe_load(b) for b in fenced_blocks("getting-started.md", "yaml")]
    BrokerConfig.from_dict(first)
    BrokerConfig.from_dict({**first, **tls})          # section 6 adds to the file of section 4


def test_users_guide_file_is_valid():
    text = marked_block("users.md", "users-file").replace("<salt>$<hash>", "c2FsdA==$aGFzaA==")
    document = UsersFile.model_validate(yaml.safe_load(text))
    assert document.users["billing-service"].certificate_subject == "CN=billing-service,O=Example"
    assert document.users["ops-laptop"].loopback_only


def _known_settings() -> set[str]:
    from pydantic import BaseModel
    from pymq_server import config as c
    names: set[str] = set()
    for model in (c.BrokerConfig, c.QueueConfig, c.StorageConfig, c.TlsConfig, c.WebSocketConfig, c.ClusterConfig,
                  c.MemoryDeviceConfig, c.FileDeviceConfig, c.SqlDeviceConfig, c.GridDeviceConfig, c.HaConfig):
        names |= set(model.model_fields)
    for section in ("storage", "tls", "websocket", "cluster", "ha"):
        field = c.BrokerConfig.model_fields[section]
        model = next(a for a in getattr(field.annotation, "__args__", (field.annotation,))
                     if isinstance(a, type) and issubclass(a, BaseModel))
        names |= {f"{section}.{name}" for name in model.model_fields}
    return names


@pytest.mark.parametrize("page", ["operations.md", "getting-started.md", "tls.md", "users.md", "upgrades.md"])
def test_guides_name_real_settings(page):
    """A backquoted setting-like name (snake_case, or section.key) in a guide is a real setting."""
    known = _known_settings()
    text = (DOCS / page).read_text(encoding="utf-8")
    allowed = {"pymq_server", "pyspark_pymq", "pymq_build_info", "certificate_subject", "loopback_only", "log_format", "user_name"}
    for name in re.findall(r"`([a-z]+(?:_[a-z]+)+(?:\.[a-z_]+)?|[a-z]+\.[a-z_]+)`", text):
        if name in allowed or name.endswith((".md", ".py", ".yaml")) or name.startswith("pymq."):
            continue
        if name.startswith("pymq_"):            # a metric: its family is named in the broker's source
            family = name.removesuffix("_total")
            assert any(f'"{family}"' in source.read_text(encoding="utf-8")
                       for source in (DOCS.parent / "server").rglob("*.py")), f"docs/{page}: no metric {name!r}"
            continue
        assert name in known, f"docs/{page} mentions {name!r}, which is not a setting"
