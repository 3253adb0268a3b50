"""The Python distributions as a stranger installs them (issue 28.1), each into a clean virtual environment
(no system site packages, the package index off: only the built files and a wheelhouse are offered).

* ``pip install pymq-broker`` by name gives the SDK alone: no third-party distribution comes with it, the
  broker's package says what to install instead of failing deep inside, and the README's snippet runs
  from that install against
* a broker installed from the **manylinux** wheel with ``pip install "pymq-broker[server]"`` and started as
  its ``pymq-server`` command.

The builds (sdist, the wheel built offline from it, auditwheel's repair) are made once per session by
conftest.py.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.packaging.conftest import ROOT, PythonDists, run
from tests.storage.disks import BrokerProcess

# the session's one build (conftest.py) is paid by the first test: minutes on a loaded machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def clean_venv(path: Path) -> Path:
    """A virtual environment with nothing from this machine's site packages: its python."""
    run([sys.executable, "-m", "venv", str(path)], timeout=300)
    python = path / "bin" / "python"
    probe = run([str(python), "-c", "import sys; print(sys.flags.no_site, sys.prefix != sys.base_prefix)"])
    assert probe.stdout.split() == ["0", "True"]
    return python


def installed(python: Path) -> set[str]:
    listing = run([str(python), "-m", "pip", "list", "--format", "json"]).stdout
    return {d["name"].lower() for d in json.loads(listing)} - {"pip", "setuptools"}   # what venv itself brings


def readme_snippet() -> str:
    """The README's first Python example (the one after 'Set up and run the broker')."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"```python\n(.*?)```", text, re.S)
    assert found and "pymq.connect(" in found.group(1)
    return found.group(1)


@pytest.fixture(scope="module")
def server_venv(python_dists: PythonDists, tmp_path_factory) -> Path:
    python = clean_venv(tmp_path_factory.mktemp("server") / "venv")
    run([str(python), "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(python_dists.wheelhouse),
         "--find-links", str(python_dists.manylinux.parent), "pymq-broker[server]"], timeout=600)
    return python


def test_the_manylinux_wheel_is_tagged_with_what_auditwheel_proves(python_dists: PythonDists):
    assert re.fullmatch(r"manylinux_2_\d+_x86_64", python_dists.tag), python_dists.tag
    assert python_dists.tag in python_dists.manylinux.name, python_dists.manylinux.name
    assert "linux_x86_64" in python_dists.wheel.name and "manylinux" not in python_dists.wheel.name
    # the tag docs/releasing.md names is the one this build proves
    assert python_dists.tag in (ROOT / "docs" / "releasing.md").read_text()
    with zipfile.ZipFile(python_dists.manylinux) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    compiled = re.findall(r'\("([\w.]+_c)", "_ext/', (ROOT / "setup.py").read_text())
    assert len([n for n in names if n.endswith(".so")]) == len(compiled) >= 6, names
    # no library had to be grafted in: the modules use libc and libpython only
    assert not [n for n in names if ".libs/" in n], names
    # real project URLs or none: no placeholder domain is published
    assert ".example" not in meta and "Project-URL" not in meta
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert requires and all("extra ==" in line for line in requires), requires   # the SDK needs nothing


def test_pip_install_by_name_gives_the_sdk_alone(python_dists: PythonDists, server_venv: Path, tmp_path):
    client = clean_venv(tmp_path / "client")
    # by name, from the manylinux wheel, with nothing else on offer: it resolves only because it needs nothing
    run([str(client), "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
         str(python_dists.manylinux.parent), "pymq-broker"], timeout=300)
    assert installed(client) == {"pymq-broker"}
    # run away from the checkout: `python -c` puts the working directory first on sys.path
    probe = run([str(client), "-c", """
import sys, pymq
from pymq.protocol import scanner
assert pymq.__file__.startswith(sys.prefix), pymq.__file__
assert scanner.COMPILED, "the compiled scanner is not in the manylinux wheel"
try:
    import pymq_server
except ImportError as exc:
    print("server:", exc)
try:
    pymq.connect("vm://alone")
except pymq.errors.ConnectFailed as exc:
    print("vm:", exc)
"""], cwd=tmp_path)
    assert 'server: the pymq broker needs PyYAML, pydantic, aiohttp' in probe.stdout, probe.stdout
    assert 'pip install "pymq-broker[server]"' in probe.stdout
    assert re.search(r'vm: vm://alone needs the broker \(`pip install "pymq-broker\[server\]"`\)', probe.stdout)

    # the broker: the [server] extra of the same wheel, its pymq-server command in its own clean venv
    assert {"pymq-broker", "pydantic", "aiohttp", "pyyaml"} <= installed(server_venv)
    broker = BrokerProcess(tmp_path / "data", command=(str(server_venv.parent / "pymq-server"),), cwd=tmp_path)
    try:
        snippet = readme_snippet().replace("stomp://127.0.0.1:61613", broker.url)
        assert broker.url in snippet
        done = subprocess.run([str(client), "-c", snippet], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path)
        assert done.returncode == 0 and done.stdout == "hello\n", done.stdout + done.stderr
    finally:
        assert broker.terminate() == 0, broker.log
    assert "pure-Python" not in broker.log, broker.log     # the manylinux wheel's broker runs compiled


def test_the_server_extra_installs_the_broker_from_the_manylinux_wheel(server_venv: Path, tmp_path):
    check = subprocess.run([str(server_venv.parent / "pymq-server"), "--check-config"], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    assert check.returncode == 0 and "is valid" in check.stderr, check.stderr
    probe = run([str(server_venv), "-c", """
import sys, pymq, pymq_server
from pymq.protocol import scanner
assert pymq_server.__file__.startswith(sys.prefix) and pymq.__file__.startswith(sys.prefix), pymq.__file__
assert scanner.COMPILED
with pymq.connect("vm://server-extra") as conn:
    s = conn.create_session()
    s.create_producer(pymq.Queue("q")).send("in process")
    print(s.create_consumer(pymq.Queue("q")).receive(5).text)
"""], cwd=tmp_path)
    assert probe.stdout == "in process\n"
