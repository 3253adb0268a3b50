"""What a stranger installs: an sdist with the Cython sources and, from that sdist, a wheel with the
compiled core (built once per session by conftest.py, offline); the wheel installs into a fresh virtual
environment and runs a broker there; without a compiler the build says so loudly, and fails under
PYMQ_REQUIRE_EXTENSIONS=1.  test_python_packages.py installs the same builds into clean environments.
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
# the session's one build (conftest.py) is paid by the first test: minutes on a loaded machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


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
def built(python_dists):
    # the session's one build: the sdist, and the wheel built offline from it (conftest.py)
    return python_dists.sdist, python_dists.wheel, python_dists.wheelhouse


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
    assert "Classifier: Programming Language :: Cython" in metadata
    assert ".example" not in metadata, "no placeholder addresses in the published metadata"
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


def test_without_a_compiler_and_with_the_fallback_asked_for_the_build_is_loud(built, tmp_path):
    sdist, _, wheelhouse = built
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no compiler to take away")
    # CC=false: the C compiler "fails" for every module, as on a machine without one
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse)}    # the build requirements, offline
    loud = _build(["--wheel", str(sdist)], tmp_path / "loud", CC="false", PYMQ_REQUIRE_EXTENSIONS="0", **offline)
    output = loud.stdout + loud.stderr
    assert loud.returncode == 0, output[-3000:]
    assert "pymq: WARNING: not building pymq.protocol._scanner_c" in output
    assert "runs the pure-Python twin instead" in output
    # PYMQ_REQUIRE_EXTENSIONS=1 (the default) fails: test_pip_install_without_a_compiler... below


def test_pip_install_without_a_compiler_fails_loudly_unless_the_twins_are_chosen(built, tmp_path):
    """pip shows a build's output only when it fails (or with -v): a build that cannot compile fails by
    default, with the banner naming the module and the ways on; PYMQ_NO_EXTENSIONS=1 installs the twins."""
    sdist, _, wheelhouse = built
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no compiler to take away")
    env = {k: v for k, v in os.environ.items() if k not in ("PYMQ_NO_EXTENSIONS", "PYMQ_REQUIRE_EXTENSIONS")}
    env.update(CC="false", PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse))
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir"]
    failed = subprocess.run([*pip, "--target", str(tmp_path / "default"), str(sdist)], capture_output=True,
                            text=True, timeout=900, env=env)
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0, output[-3000:]
    assert "pymq: cannot build pymq.protocol._scanner_c" in output, output[-3000:]      # without -v
    assert "PYMQ_NO_EXTENSIONS=1" in output and "apt-get install gcc python3-dev" in output
    chosen = subprocess.run([*pip, "--target", str(tmp_path / "twins"), str(sdist)], capture_output=True,
                            text=True, timeout=900, env={**env, "PYMQ_NO_EXTENSIONS": "1"})
    assert chosen.returncode == 0, (chosen.stdout + chosen.stderr)[-3000:]
    assert (tmp_path / "twins" / "pymq" / "protocol" / "_scanner_py.py").exists()
    assert not list((tmp_path / "twins").rglob("*.so"))
