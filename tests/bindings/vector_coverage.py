"""The contract between spec/vectors/ and the client bindings: spec/vectors/bindings.json says which vector
files each binding runs and why the others do not apply to it.

``declared_gaps()`` lists vector files a binding neither runs nor declares not applicable (a new vector file
makes this non-empty until every binding says what it does with it); ``check_ran(binding, report)`` compares
what a binding's suite actually loaded (the ``PYMQ_VECTORS_REPORT`` file its vector loader appends to) with
what the manifest says it runs.  The binding wrappers (test_go_binding.py, test_typescript_binding.py,
test_java_binding.py) call ``check_ran`` after their suite passed.
"""
from __future__ import annotations

import json
import pathlib

VECTORS = pathlib.Path(__file__).parents[2] / "spec" / "vectors"
MANIFEST = VECTORS / "bindings.json"


def manifest() -> dict:
    return json.loads(MANIFEST.read_text())["bindings"]


def vector_files() -> set[str]:
    return {p.name for p in VECTORS.glob("*.json") if p != MANIFEST}


def declared_gaps() -> dict[str, list[str]]:
    """binding -> vector files it neither runs nor declares not applicable (empty when all is said)."""
    gaps = {}
    for binding, entry in manifest().items():
        said = set(entry["runs"]) | set(entry["not_applicable"])
        missing = sorted(vector_files() - said)
        if missing:
            gaps[binding] = missing
    return gaps


def check_ran(binding: str, report: pathlib.Path) -> None:
    """Fail unless the binding's suite loaded exactly the vector files the manifest says it runs."""
    ran = set(report.read_text().split()) if report.exists() else set()
    want = set(manifest()[binding]["runs"])
    assert ran == want, (f"{binding} ran vector files {sorted(ran)}, spec/vectors/bindings.json says it runs "
                         f"{sorted(want)}: missing {sorted(want - ran)}, undeclared {sorted(ran - want)}")
