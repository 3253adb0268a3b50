"""Operator traps of issue 28.3, each as an operator meets it, with the real commands as processes:

* ``pymq-server --check-config`` opens every TLS file the configuration names and matches the key to the
  certificate (it said "valid" for a missing certificate and for a key of another certificate, and the
  start then failed);
* ``pymq-admin``'s global options anywhere on the line (``--json`` worked only before the command);
* ``pymq-admin ... | head``: quiet when the reader goes away (a BrokenPipeError traceback);
* ``--version`` on both commands;
* the start-up warning of an installation without its compiled modules names every one of them (it named
  the two that happened to be imported first).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import pymq
from tests.admin.conftest import ADMIN, ADMIN_PW, run_cli
from tests.client.tls import Authority
from tests.storage.disks import BrokerProcess as PlainBroker

COMPILED = ("pymq.protocol._scanner_c", "pymq.selector._evaluator_c", "pymq.routing._bloom_c",
            "pymq.routing._topics_c", "pymq_server.storage._page_alloc_c", "pymq_server.broker._send_c",
            "pymq_server.broker._message_c",
            "pyspark_pymq._decode_c")


def check_config(tmp_path: Path, config: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "broker.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([sys.executable, "-m", "pymq_server.cli", "--config", str(path), "--check-config"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)


# -- --check-config and TLS files ----------------------------------------------------------------------
@pytest.fixture
def pki(tmp_path):
    ca = Authority(tmp_path)
    return ca, ca.issue("broker", dns=("localhost",), ips=("127.0.0.1",)), ca.issue("other", ips=("127.0.0.1",))


def test_check_config_accepts_a_certificate_and_its_key(tmp_path, pki):
    ca, broker, _ = pki
    done = check_config(tmp_path, {"tls_port": 0, "tls": {"cert_file": str(broker.cert), "key_file": str(broker.key),
                                                          "ca_file": str(ca.ca_file)}})
    assert done.returncode == 0 and "is valid" in done.stderr, done.stderr


@pytest.mark.parametrize("trap", ["missing certificate", "missing key", "key of another certificate",
                                  "certificate file holds no certificate", "missing CA file"])
def test_check_config_opens_and_matches_every_tls_file(tmp_path, pki, trap):
    ca, broker, other = pki
    tls = {"cert_file": str(broker.cert), "key_file": str(broker.key), "ca_file": str(ca.ca_file)}
    key, expected = {
        "missing certificate": ("cert_file", "cannot read it"),
        "missing key": ("key_file", "cannot read it"),
        "key of another certificate": ("key_file", "matching private key"),
        "certificate file holds no certificate": ("cert_file", "matching private key"),
        "missing CA file": ("ca_file", "cannot read it"),
    }[trap]
    tls[key] = {"missing certificate": str(tmp_path / "absent.crt"), "missing key": str(tmp_path / "absent.key"),
                "key of another certificate": str(other.key), "certificate file holds no certificate": str(other.key),
                "missing CA file": str(tmp_path / "absent-ca.crt")}[trap]
    done = check_config(tmp_path, {"tls_port": 0, "tls": tls})
    assert done.returncode == 2, (trap, done.stderr)
    assert "is valid" not in done.stderr
    assert f"tls.{key} = " in done.stderr or "tls.cert_file = " in done.stderr, done.stderr
    assert expected in done.stderr, done.stderr
    # and it is what the start would have said: the same file named, the same status, nothing listens
    start = subprocess.run([sys.executable, "-m", "pymq_server.cli", "--config", str(tmp_path / "broker.yaml"),
                            "--port", "0", "--data-dir", str(tmp_path / "data")],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert start.returncode == 2 and expected in start.stderr and "listening" not in start.stderr


# -- --version ---------------------------------------------------------------------------------------------
def test_both_commands_print_their_version():
    for module, name in (("pymq_server.cli", "pymq-server"), ("pymq_server.admin.cli", "pymq-admin")):
        done = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{name} {pymq.__version__}", done.stdout


# -- pymq-admin's global options anywhere, and a closed pipe ---------------------------------------------------
def test_global_options_go_anywhere_on_the_line(broker_process):
    url = broker_process.admin_url
    before = run_cli(None, "--json", "--url", url, "--user", ADMIN, "--password", ADMIN_PW, "queues", "list",
                     user=None, password=None)
    assert before.returncode == 0, before.stderr
    layouts = [
        ("queues", "list", "--json", "--url", url, "--user", ADMIN, "--password", ADMIN_PW),
        ("queues", "--json", "list", "--url", url, "-u", ADMIN, "-p", ADMIN_PW),
        ("--url", url, "status", "--json", "--user", ADMIN, "--password", ADMIN_PW),
    ]
    for argv in layouts:
        done = run_cli(None, *argv, user=None, password=None)
        assert done.returncode == 0, (argv, done.stderr)
        json.loads(done.stdout)     # --json took effect wherever it stood
    assert json.loads(run_cli(None, *layouts[0], user=None, password=None).stdout) == json.loads(before.stdout)
    # a credential after the command is the one used: a wrong password there is refused (exit 4)
    wrong = run_cli(None, "queues", "list", "--url", url, "--user", ADMIN, "--password", "not-it",
                    user=None, password=None)
    assert wrong.returncode == 4, wrong.stderr
    # given twice, the later one wins, as with any option
    twice = run_cli(None, "--password", "not-it", "queues", "list", "--url", url, "--user", ADMIN,
                    "--password", ADMIN_PW, user=None, password=None)
    assert twice.returncode == 0, twice.stderr


def test_a_closed_pipe_is_quiet(broker_process):
    queue = "pipe-" + re.sub(r"\W", "", str(id(broker_process)))
    with pymq.connect(broker_process.url, username=ADMIN, password=ADMIN_PW) as conn:
        producer = conn.create_session().create_producer(pymq.Queue(queue))
        for i in range(40):
            producer.send(f"{i:04d}" + "x" * 8000)      # ~320 KiB of output: more than a pipe holds
    try:
        cmd = [sys.executable, "-m", "pymq_server.admin.cli", "--url", broker_process.admin_url, "messages",
               "browse", queue, "--limit", "40", "--body-limit", "8192", "--user", ADMIN, "--password", ADMIN_PW]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()       # what `| head -1` reads, then it goes away
        proc.stdout.close()
        err = proc.stderr.read().decode()
        status = proc.wait(60)
        assert first, err
        assert "Traceback" not in err and "BrokenPipeError" not in err, err
        assert status == 141, (status, err)
    finally:
        broker_process.op("drop-queue", name=queue, force=True)


# -- the pure-Python warning names every missing compiled module --------------------------------------------
BLOCKER = '''
import importlib.abc, sys
BLOCKED = {blocked!r}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
        return None
sys.meta_path.insert(0, Blocker())
'''


def test_the_start_up_warning_names_every_missing_compiled_module(tmp_path, monkeypatch):
    # an installation without its compiled modules, as a build without a compiler leaves it: a
    # sitecustomize makes each one unimportable in the broker's process
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=set(COMPILED)))
    monkeypatch.setenv("PYTHONPATH", f"{site}")
    monkeypatch.delenv("PYMQ_NO_EXTENSIONS", raising=False)
    broker = PlainBroker(tmp_path / "data")
    try:
        found = broker.wait_log(r"the compiled core is not installed \(([^)]*)\)")
        assert found, broker.log
        assert sorted(found.group(1).split(", ")) == sorted(COMPILED), found.group(0)
    finally:
        assert broker.terminate() == 0


def test_every_compiled_module_of_the_build_is_known_to_the_warning():
    # setup.py's table and the start-up check name the same modules
    setup = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert sorted(re.findall(r'\("([\w.]+_c)", "_ext/', setup)) == sorted(COMPILED)


def test_the_start_up_check_of_compiled_modules_imports_no_spark():
    # the check looks for the Spark connector's decoder without importing its package (which imports pyspark:
    # about 10 MiB of a broker's memory and 120 modules, taken right after the listeners opened), and still
    # finds it where it is installed
    code = ("import sys; from pymq_server.cli import compiled_missing; missing = compiled_missing(); "
            "print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('pyspark', 'pyspark_pymq', "
            "'py4j'))); print(missing)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYMQ_NO_EXTENSIONS": ""})
    assert done.returncode == 0, done.stderr
    imported, missing = done.stdout.splitlines()
    assert imported == "[]", imported
    assert "pyspark_pymq._decode_c" not in missing, missing
