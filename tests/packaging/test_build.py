"""What a stranger installs: ``python -m build`` makes an sdist with the Cython sources and, from that
sdist, a wheel with the compiled core; the wheel installs into a fresh virtual environment and runs a
broker there; without a compiler the build says so loudly, and fails under PYMQ_REQUIRE_EXTENSIONS=1.

Slow (two builds, each in pip's isolated build environment, compiling the Cython modules): a couple of
minutes.  Builds need the ``build`` package and, for the isolated environment, the package index (or
pip's cache) — as ``pip install -e .`` does.
"""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _extensions() -> list[tuple[str, str]]:
    """(module, .pyx) pairs from setup.py's EXTENSIONS table (read, not imported: it calls setup())."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "EXTENSIONS":
            return [tuple(item) for item in ast.literal_eval(node.value)]
    raise AssertionError("setup.py has no EXTENSIONS table")


def _build(args: list[str], out: Path, **env: str) -> subprocess.CompletedProcess:
    pytest.importorskip("build", reason="pip install build (in the test extra)")
    # the build is what is tested: PYMQ_NO_EXTENSIONS picks the twins this suite imports (a pure run of the
    # suite sets it), it must not quietly turn the builds under test into pure ones
    inherited = {k: v for k, v in os.environ.items() if k != "PYMQ_NO_EXTENSIONS"}
    run = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), *args],
                         capture_output=True, text=True, timeout=900, cwd=ROOT, env={**inherited, **env})
    return run


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # the sdist first, then the wheel from the unpacked sdist: what `python -m build` does by default
    run = _build([str(ROOT)], out, PYMQ_REQUIRE_EXTENSIONS="1")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    sdists, wheels = list(out.glob("*.tar.gz")), list(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in out.iterdir())
    return sdists[0], wheels[0], out


def test_sdist_carries_the_cython_sources_and_the_licence(built):
    sdist, _, _ = built
    assert sdist.name.startswith("pymq_broker-")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        pkg_info = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("/PKG-INFO"))).read().decode()
    for _, pyx in _extensions():
        assert pyx in names, pyx
    for path in ("LICENSE", "README.md", "setup.py", "pyproject.toml", "docs/configuration.md",
                 "server/admin/console/index.html", "pymq/py.typed"):
        assert path in names, path
    assert not [n for n in names if n.endswith((".c", ".so", ".pyc"))]      # generated at build time
    assert not [n for n in names if n.startswith(("tests/", "bindings/", "bench/")) or "node_modules" in n]
    assert "Name: pymq-broker" in pkg_info and "License-Expression: Apache-2.0" in pkg_info


def test_wheel_carries_the_compiled_core(built):
    _, wheel, _ = built
    # a platform wheel (cp3XX-cp3XX-<platform>), never py3-none-any
    assert re.match(r"pymq_broker-[\d.]+-cp3\d+-cp3\d+-\w+\.whl$", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(info).decode()
        entry_points = zf.read(info.replace("METADATA", "entry_points.txt")).decode()
    for module, _ in _extensions():
        path = module.replace("pymq_server.", "pymq_server/").replace(".", "/")
        assert [n for n in names if n.startswith(path + ".") and n.endswith((".so", ".pyd"))], module
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert {"pymq_server/admin/console/index.html", "pymq/py.typed", "pymq_server/config.py"} <= names
    assert not [n for n in names if n.endswith((".pyx", ".c")) or n.startswith("tests/")]
    assert "Name: pymq-broker" in metadata and "License-Expression: Apache-2.0" in metadata
    assert "Project-URL: Documentation" in metadata and "Classifier: Programming Language :: Cython" in metadata
    assert "pymq-server = pymq_server.cli:main" in entry_points and "pymq-admin" in entry_points


def test_the_wheel_installs_and_runs_a_broker_in_a_fresh_environment(built, tmp_path):
    _, wheel, _ = built
    venv = tmp_path / "venv"
    # system site-packages provide the dependencies (no index needed); the wheel itself goes in the venv
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
                   check=True, timeout=300, capture_output=True)
    script = """
import pymq, pymq_server, sys
from pymq.protocol import scanner
assert pymq.__file__.startswith(sys.prefix), pymq.__file__       # the installed copy, not the checkout
assert scanner.COMPILED, "the compiled scanner is not installed"
with pymq.connect("vm://wheel-check") as conn:
    s = conn.create_session()
    s.create_producer(pymq.Queue("q")).send("from the wheel")
    assert s.create_consumer(pymq.Queue("q")).receive(5).text == "from the wheel"
print("ok", pymq.__version__)
"""
    run = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYMQ_NO_EXTENSIONS"})
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stderr[-3000:]
    check = subprocess.run([str(venv / "bin" / "pymq-server"), "--check-config"], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
    assert check.returncode == 0 and "is valid" in check.stderr


def test_without_a_compiler_the_build_is_loud_and_fails_when_extensions_are_required(built, tmp_path):
    sdist, _, _ = built
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no compiler to take away")
    # CC=false: the C compiler "fails" for every module, as on a machine without one
    loud = _build(["--wheel", str(sdist)], tmp_path / "loud", CC="false", PYMQ_REQUIRE_EXTENSIONS="0")
    output = loud.stdout + loud.stderr
    assert loud.returncode == 0, output[-3000:]
    assert "pymq: WARNING: not building pymq.protocol._scanner_c" in output
    assert "runs the pure-Python twin instead" in output
    required = _build(["--wheel", str(sdist)], tmp_path / "strict", CC="false", PYMQ_REQUIRE_EXTENSIONS="1")
    output = required.stdout + required.stderr
    assert required.returncode != 0
    assert "pymq: cannot build pymq.protocol._scanner_c" in output
    assert "PYMQ_REQUIRE_EXTENSIONS=1 makes this an error" in output
    assert not list((tmp_path / "strict").glob("*.whl")) if (tmp_path / "strict").exists() else True
