"""Imports point one way (docs/architecture.md, "Layers"): between the packages of ``server/``, and between the
layers of the broker core; and every module says what it owns.

Read from the source with ``ast``. Every form of import counts: absolute and relative (``from ..device
import``), ``import a.b``, type-only imports (a layer that names a higher layer's types depends on it as
much as one that calls it) and ``importlib.import_module`` / ``__import__`` with a literal name; a dynamic
import whose name is not a literal cannot be checked and is refused. Size is not a rule: a class over about
400 lines is reported as a hint (a warning), what decides where code goes is what each module owns."""
from __future__ import annotations

import ast
import os
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "server"
BROKER = SERVER / "broker"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

#: the packages (and top modules) of server/, bottom to top; each may import its own package and those of
#: lower levels, never a higher level nor another package of its own level (the top modules of one level
#: are one unit: config.py and its reference, cli.py and __main__.py)
PACKAGE_LEVELS: list[tuple[str, set[str]]] = [
    ("storage", {"storage"}),
    ("configuration", {"__init__", "config", "_config_reference", "logs", "schema"}),
    ("the broker core", {"broker"}),
    ("around the core", {"cluster", "admin", "net", "ha_role"}),
    ("one server", {"app", "listeners", "chores", "reloading"}),
    ("servers run for others", {"embedded", "cores"}),
    ("the command line", {"cli", "__main__"}),
]
PACKAGE_LEVEL = {name: i for i, (_, names) in enumerate(PACKAGE_LEVELS) for name in names}

#: the broker core's layers, bottom to top; a module may import its own layer and the layers below it
LAYERS: list[tuple[str, set[str]]] = [
    ("building blocks", {"destination", "routes", "message", "states", "ready", "stats", "queue", "entry", "lastvalue",
                         "groups", "idle", "consumer", "topic", "log", "acl", "auth", "requests", "_send_py", "_message_py", "clients",
                         "membership", "forwarded", "sequences", "dedup", "flow", "budgets", "stored_form",
                         "segments", "slices", "bulk_rows",
                         "bulk_stream", "blocks", "quarantine", "vhosts", "queue_logs", "backlog", "upkeep", "dispatch"}),
    ("destinations", {"destinations", "temporary", "deadletters"}),
    ("subscriptions", {"subscriptions"}),
    ("router and range reader", {"placement", "placement_rules", "bulk_placement", "router", "ranges"}),
    ("recovery", {"recovery"}),
    ("facade", {"broker"}),
    ("connections", {"session", "handshake", "intake", "outlet", "acks", "receipts", "refusals", "transactions", "apptx"}),
]
LAYER_OF = {module: i for i, (_, modules) in enumerate(LAYERS) for module in modules}
#: what the connection side may use of the core: the facade and the building blocks, nothing in between
CORE_LAYERS = {"destinations", "subscriptions", "placement", "placement_rules", "bulk_placement", "router", "ranges",
               "recovery"}


def _dotted(path: Path) -> str:
    """``server/broker/queue.py`` -> ``pymq_server.broker.queue`` (the installed name of server/)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts[0] = "pymq_server" if parts[0] == "server" else parts[0]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> tuple[set[str], list[str]]:
    """The absolute names ``path`` imports, and the dynamic imports whose names are not literals."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module = _dotted(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    unchecked: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                prefix = ".".join(base)
                where = f"{prefix}.{node.module}" if node.module else prefix
            else:
                where = node.module or ""
            found.add(where)
            found.update(f"{where}.{alias.name}" for alias in node.names)   # ``from pkg import module``
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("import_module", "__import__"):
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add(arg.value)
                else:
                    unchecked.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found, unchecked


def _server_files() -> list[Path]:
    return sorted(p for p in SERVER.rglob("*.py") if "console" not in p.parts)


def _package_of(dotted: str) -> str | None:
    """The unit of server/ a ``pymq_server`` name belongs to: its package, or for a top module its level."""
    parts = dotted.split(".")
    if parts[0] != "pymq_server":
        return None
    name = parts[1] if len(parts) > 1 else "__init__"
    if name in PACKAGE_LEVEL and not (SERVER / name).is_dir():
        return PACKAGE_LEVELS[PACKAGE_LEVEL[name]][0]
    return name


def _level(unit: str) -> int:
    return next(i for i, (level, names) in enumerate(PACKAGE_LEVELS) if unit == level or unit in names)


def test_every_server_package_has_a_level():
    names = {p.stem if p.parent == SERVER else p.relative_to(SERVER).parts[0] for p in _server_files()}
    names = {n for n in names if not n.startswith("_ext")}
    missing = names - set(PACKAGE_LEVEL)
    assert not missing, f"give these a level in PACKAGE_LEVELS (and the docs): {missing}"


@pytest.mark.parametrize("path", _server_files(), ids=lambda p: str(p.relative_to(SERVER)))
def test_server_packages_import_downward(path):
    mine = _package_of(_dotted(path))
    found, unchecked = imports(path)
    assert not unchecked, f"a dynamic import whose name is not a literal cannot be checked: {unchecked}"
    assert mine is not None
    wrong = sorted(name for name in found
                   if (other := _package_of(name)) is not None and other != mine and _level(other) >= _level(mine))
    assert not wrong, f"{mine} ({PACKAGE_LEVELS[_level(mine)][0]}) imports its level or above: {wrong}"


def _broker_modules() -> list[str]:
    return sorted(p.stem for p in BROKER.glob("*.py") if p.name != "__init__.py")


def _broker_imports(module: str) -> set[str]:
    found, _ = imports(BROKER / f"{module}.py")
    return {name.split(".")[2] for name in found
            if name.startswith("pymq_server.broker.") and name.split(".")[2] in LAYER_OF} - {module}


def test_every_module_has_a_layer():
    assert set(_broker_modules()) == set(LAYER_OF), "add new modules of server/broker/ to LAYERS (and the docs)"


@pytest.mark.parametrize("module", _broker_modules())
def test_imports_point_down(module):
    upward = {other for other in _broker_imports(module) if LAYER_OF[other] > LAYER_OF[module]}
    assert not upward, f"{module} ({LAYERS[LAYER_OF[module]][0]}) imports higher layers: {sorted(upward)}"


@pytest.mark.parametrize("module", sorted(LAYERS[-1][1]))
def test_the_connection_side_talks_to_the_facade_only(module):
    assert not _broker_imports(module) & CORE_LAYERS, f"{module} reaches past the facade"


@pytest.mark.parametrize("module", _broker_modules())
def test_every_module_says_what_it_owns(module):
    """The responsibility rule: a module opens with what it owns, and docs/architecture.md names it."""
    tree = ast.parse((BROKER / f"{module}.py").read_text(encoding="utf-8"))
    assert ast.get_docstring(tree), f"{module}.py does not say what it owns (a docstring first)"
    assert f"`{module}`" in ARCHITECTURE.read_text(encoding="utf-8") or \
        f"`{module}.py`" in ARCHITECTURE.read_text(encoding="utf-8"), f"docs/architecture.md does not name {module}"


def test_the_checker_sees_every_form_of_import(tmp_path, monkeypatch):
    """The reader itself: relative, importlib, __import__ and type-only imports are all seen (the old
    test saw only absolute ones)."""
    package = ROOT / "server" / "broker"
    probe = package / "_probe_layers.py"
    probe.write_text("from __future__ import annotations\nimport importlib\nfrom typing import TYPE_CHECKING\n"
                     "from . import router\nfrom ..admin import ops\n"
                     "importlib.import_module('pymq_server.cluster.node')\n__import__('pymq_server.app')\n"
                     "name = 'x'\nimportlib.import_module(name)\n"
                     "if TYPE_CHECKING:\n    from pymq_server.cores.mesh import Mesh\n")
    try:
        found, unchecked = imports(probe)
    finally:
        probe.unlink()
    assert {"pymq_server.broker.router", "pymq_server.admin.ops", "pymq_server.cluster.node", "pymq_server.app",
            "pymq_server.cores.mesh"} <= found
    assert len(unchecked) == 1


def test_classes_over_about_400_lines_are_a_hint():
    """Not a rule (what a module owns is): the classes of server/ and pymq/ over 400 lines, as a warning."""
    big = []
    for path in sorted([*SERVER.rglob("*.py"), *(ROOT / "pymq").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno and node.end_lineno - node.lineno + 1 > 400:
                big.append(f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    if big:
        warnings.warn("classes over about 400 lines (issue 25's bar; a hint, not a rule): " + ", ".join(big),
                      stacklevel=1)
    assert all(os.sep not in b.split(":")[1] for b in big)       # the listing itself is well formed


# -- the SDK and the broker ----------------------------------------------------------------------------------

SDK = ROOT / "pymq"


def _sdk_broker_imports(path: Path) -> list[str]:
    """Imports of the broker package in ``path`` (every form :func:`imports` reads)."""
    found, _ = imports(path)
    return [f"{path}: {name}" for name in sorted(found) if name.split(".")[0] in ("pymq_server", "server")]


def test_the_sdk_never_imports_the_broker():
    """pymq/ (what an application imports) reaches the broker only through the entry points the broker
    registers (pymq/client/vm.py): an SDK-only install works, and the dependency points one way."""
    found = [hit for path in sorted(SDK.rglob("*.py")) for hit in _sdk_broker_imports(path)]
    assert not found, found


def test_the_sdk_import_check_can_fail():
    planted = SDK / "_planted_import.py"
    planted.write_text("import importlib\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from pymq_server.net.vm import VmLink\nimportlib.import_module('pymq_server.app')\n")
    try:
        found = _sdk_broker_imports(planted)
        assert any(hit.endswith(" pymq_server.app") for hit in found)              # importlib
        assert any(hit.endswith(" pymq_server.net.vm") for hit in found)           # type-only
    finally:
        planted.unlink()
