"""spec/stomp.md §6 lists every error code the broker sends (issue 27 item 8).

The codes a broker can send are those of the error classes its code raises or builds: every call of a class
of the one error tree (``pymq.errors``) in the broker's package and in the SDK modules it runs (the codec, the
selector compiler, the routing primitives), found by reading their source, plus codes written as literals
in admin answers and the codes of error classes the broker defines itself (``code = "..."``). Each must be a
row of the table in §6, so a new error cannot reach the wire undocumented.
"""
from __future__ import annotations

import ast
import inspect
import pathlib
import re

from pymq import errors

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: what the broker runs: its own package and the SDK modules it imports to serve connections
BROKER_SOURCES = ("server", "pymq/protocol", "pymq/selector", "pymq/routing")
#: codes raised by the broker's code that never reach a client, and why
NEVER_SENT = {
    "listen": "a listener that cannot bind stops pymq-server at start-up, before any client connects",
}


def _classes() -> dict[str, type[errors.PymqError]]:
    return {name: cls for name, cls in vars(errors).items()
            if inspect.isclass(cls) and issubclass(cls, errors.PymqError)}


def _error_names(tree: ast.Module, classes: dict[str, type[errors.PymqError]]) -> tuple[dict[str, str], set[str]]:
    """Names a module binds to classes of the error tree (``from pymq.errors import X as Y``), and the names
    it binds to the module itself (``from pymq import errors``): another library's ``TimeoutError`` is not ours."""
    direct: dict[str, str] = {}
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "pymq.errors":
            for alias in node.names:
                if alias.name in classes:
                    direct[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module == "pymq":
            modules.update(alias.asname or alias.name for alias in node.names if alias.name == "errors")
        elif isinstance(node, ast.Import):
            modules.update(alias.asname for alias in node.names if alias.name == "pymq.errors" and alias.asname)
    return direct, modules


def raised_codes() -> dict[str, set[str]]:
    """code -> the files that make an error of it."""
    classes = _classes()
    found: dict[str, set[str]] = {}
    for root in BROKER_SOURCES:
        for path in (ROOT / root).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            where = str(path.relative_to(ROOT))
            direct, modules = _error_names(tree, classes)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    func = node.func
                    name = None
                    if isinstance(func, ast.Name):
                        name = direct.get(func.id)
                    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                            func.value.id in modules:
                        name = func.attr
                    if name in classes:
                        found.setdefault(classes[name].code, set()).add(where)
                # an error class of the broker's own with its code (class TooLarge(PymqError): code = "...")
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "code"
                                                                for t in item.targets) and \
                                isinstance(item.value, ast.Constant) and isinstance(item.value.value, str):
                            found.setdefault(item.value.value, set()).add(where)
                # a code written out in an answer: {"code": "config", ...}
                if isinstance(node, ast.Dict):
                    for key, value in zip(node.keys, node.values):
                        if isinstance(key, ast.Constant) and key.value == "code" and \
                                isinstance(value, ast.Constant) and isinstance(value.value, str):
                            found.setdefault(value.value, set()).add(where)
    return found


def table_codes() -> set[str]:
    text = (ROOT / "spec" / "stomp.md").read_text(encoding="utf-8")
    section = text.split("## 6.", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([a-z-]+)` \|", section, re.MULTILINE)}


def test_every_code_the_broker_sends_is_in_the_table():
    documented = table_codes()
    missing = {code: sorted(where) for code, where in raised_codes().items()
               if code not in documented and code not in NEVER_SENT}
    assert not missing, f"codes the broker sends that spec/stomp.md §6 does not list: {missing}"


def test_the_table_names_real_codes_and_their_classes():
    """Each row's code is one of the error tree's, and the row names that code's class."""
    text = (ROOT / "spec" / "stomp.md").read_text(encoding="utf-8")
    section = text.split("## 6.", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z-]+)` \| ([A-Za-z]+) \|", section, re.MULTILINE)
    assert rows
    for code, cls in rows:
        assert code in errors.ERROR_CODES, f"§6 lists {code!r}, which is no code of pymq.errors"
        assert errors.ERROR_CODES[code].__name__ == cls, f"§6 names {cls} for {code!r}"


def test_the_scan_sees_what_it_must():
    """The scan is not blind: codes known to be sent are found where they are made."""
    found = raised_codes()
    assert "server/broker/placement_rules.py" in found["queue-full"]
    assert "server/schema.py" in found["schema-violation"]
    assert "server/broker/destinations.py" in found["destination-exists"]
    assert "storage" in found and "listen" in found
    assert "server/admin/http.py" in found["resource-limit"]         # its own class TooLarge's code
