"""The broker core's layers import one way (docs/architecture.md), and no module of it grows past ~400 lines.

Read from the source with ``ast`` (type-only imports included: a layer that names a higher layer's types
depends on it as much as one that calls it)."""
from __future__ import annotations

import ast
import os

import pytest

BROKER = os.path.join(os.path.dirname(__file__), "..", "..", "server", "broker")

#: bottom to top; a module may import its own layer and the layers below it, never above
LAYERS: list[tuple[str, set[str]]] = [
    ("building blocks", {"destination", "message", "states", "ready", "stats", "queue", "entry", "lastvalue", "groups", "idle",
                         "consumer", "topic",
                         "schema", "log", "acl", "auth", "requests", "clients", "membership", "sequences",
                         "dedup", "flow", "stored_form", "segments", "slices", "bulk_rows", "bulk_stream", "blocks", "quarantine",
                         "backlog", "upkeep"}),
    ("destinations", {"destinations", "temporary", "deadletters"}),
    ("subscriptions", {"subscriptions"}),
    ("router and range reader", {"placement", "placement_rules", "bulk_placement", "router", "ranges"}),
    ("recovery", {"recovery"}),
    ("facade", {"broker"}),
    ("connections", {"session", "intake", "outlet", "acks", "receipts", "transactions", "apptx"}),
]
LAYER_OF = {module: i for i, (_, modules) in enumerate(LAYERS) for module in modules}
#: what the connection side may use of the core: the facade and the building blocks, nothing in between
CORE_LAYERS = {"destinations", "subscriptions", "placement", "placement_rules", "router", "ranges", "recovery"}


def _modules() -> list[str]:
    return sorted(name[:-3] for name in os.listdir(BROKER) if name.endswith(".py") and name != "__init__.py")


def _imports(module: str) -> set[str]:
    tree = ast.parse(open(os.path.join(BROKER, module + ".py"), encoding="utf-8").read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("pymq_server.broker."):
                found.add(node.module.split(".")[2])
            elif node.module == "pymq_server.broker":
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pymq_server.broker."):
                    found.add(alias.name.split(".")[2])
    return found - {module}


def test_every_module_has_a_layer():
    assert set(_modules()) == set(LAYER_OF), "add new modules of server/broker/ to LAYERS (and the docs)"


@pytest.mark.parametrize("module", _modules())
def test_imports_point_down(module):
    upward = {other for other in _imports(module) if LAYER_OF[other] > LAYER_OF[module]}
    assert not upward, f"{module} ({LAYERS[LAYER_OF[module]][0]}) imports higher layers: {sorted(upward)}"


@pytest.mark.parametrize("module", sorted(LAYERS[-1][1]))
def test_the_connection_side_talks_to_the_facade_only(module):
    assert not _imports(module) & CORE_LAYERS, f"{module} reaches past the facade"


@pytest.mark.parametrize("module", _modules())
def test_no_module_is_over_about_400_lines(module):
    with open(os.path.join(BROKER, module + ".py"), encoding="utf-8") as fh:
        lines = sum(1 for _ in fh)
    assert lines <= 420, f"{module}.py has {lines} lines"


# -- the SDK and the broker ----------------------------------------------------------------------------------

SDK = os.path.join(os.path.dirname(__file__), "..", "..", "pymq")
_IMPORTERS = {"import_module", "__import__"}


def _broker_imports(path: str) -> list[str]:
    """Imports of the broker package in ``path``: any import statement (type-only ones too) and
    ``importlib.import_module``/``__import__`` of a literal name."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    names: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in _IMPORTERS and isinstance(node.args[0].value, str):
                names.append((node.lineno, node.args[0].value))
    return [f"{os.path.relpath(path, SDK)}:{line} {name}" for line, name in names
            if name.split(".")[0] in ("pymq_server", "server")]


def test_the_sdk_never_imports_the_broker():
    """pymq/ (what an application imports) reaches the broker only through the entry points the broker
    registers (pymq/client/vm.py): an SDK-only install works, and the dependency points one way."""
    found = [hit for folder, _, files in os.walk(SDK) for name in sorted(files) if name.endswith(".py")
             for hit in _broker_imports(os.path.join(folder, name))]
    assert not found, found


def test_the_sdk_import_check_can_fail(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import importlib\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from pymq_server.net.vm import VmLink\nimportlib.import_module('pymq_server.app')\n")
    assert len(_broker_imports(str(planted))) == 2
