"""Every vector file in spec/vectors/ is either run by each client binding or declared not applicable to it
(spec/vectors/bindings.json, with the reason).  Adding a vector file fails this test until every binding
runs it or says why not; the binding wrappers check that their suites load exactly what the manifest says.
"""
from __future__ import annotations

from tests.bindings import vector_coverage


def test_every_vector_file_is_run_or_declared_not_applicable_by_every_binding():
    gaps = vector_coverage.declared_gaps()
    assert not gaps, (f"vector files neither run nor declared not applicable: {gaps}; add each to 'runs' (and "
                      f"run it in the binding) or to 'not_applicable' with the reason in spec/vectors/bindings.json")


def test_the_manifest_names_only_existing_files_and_says_why():
    files = vector_coverage.vector_files()
    for binding, entry in vector_coverage.manifest().items():
        runs, na = set(entry["runs"]), entry["not_applicable"]
        assert runs <= files, f"{binding} runs files that do not exist: {sorted(runs - files)}"
        assert set(na) <= files, f"{binding} declares files that do not exist: {sorted(set(na) - files)}"
        assert not runs & set(na), f"{binding} both runs and excludes {sorted(runs & set(na))}"
        assert all(isinstance(why, str) and len(why) > 20 for why in na.values()), f"{binding}: say why"
    assert {"java", "go", "typescript"} <= set(vector_coverage.manifest())


def test_a_new_vector_file_is_caught(tmp_path, monkeypatch):
    """The check can fail: a vector file nobody declared shows up as a gap for every binding."""
    for p in vector_coverage.VECTORS.glob("*.json"):
        (tmp_path / p.name).write_text(p.read_text())
    (tmp_path / "brand_new.json").write_text("{}")
    monkeypatch.setattr(vector_coverage, "VECTORS", tmp_path)
    monkeypatch.setattr(vector_coverage, "MANIFEST", tmp_path / "bindings.json")
    gaps = vector_coverage.declared_gaps()
    assert gaps == {"java": ["brand_new.json"], "go": ["brand_new.json"], "typescript": ["brand_new.json"]}
