"""bindings/java (the Jakarta Messaging provider) runs its own suite (``mvn test``: JUnit 5) against the shared
vectors, a real pymq-server, the Python SDK (interoperability) and Spring JMS.

Maven comes from ``PYMQ_MVN`` (``eval "$(.ci/interop-clients.sh)"``, which also fills the local Maven
repository once); without it the test skips, or fails when ``CI`` is set (the rule of
tests/storage/services.py).  The JUnit tests start the broker themselves from ``PYMQ_SERVER`` and run the
Python peer (tests/bindings/python_peer.py) with ``PYMQ_PYTHON``, both pointed at the interpreter running
pytest; ``CI=1`` is passed so none of them can skip.  The surefire reports must show every test passed,
none skipped, the required classes present, and the vector files loaded must be exactly those
spec/vectors/bindings.json says Java runs.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.bindings.vector_coverage import check_ran
from tests.interop.foreign import PROVIDER
from tests.storage.services import service_url

BINDING = pathlib.Path(__file__).parents[2] / "bindings" / "java"

#: test classes that must have run (vectors, the provider live, interoperability with Python, Spring JMS)
REQUIRED = {
    "io.pymq.stomp.FrameVectorsTest", "io.pymq.routing.RoutingVectorsTest", "io.pymq.jms.MessageVectorsTest",
    "io.pymq.jms.SelectorVectorsTest", "io.pymq.jms.ProviderTest", "io.pymq.jms.InteropTest",
    "io.pymq.jms.HeartBeatTest", "io.pymq.jms.TlsTest", "io.pymq.jms.examples.SpringJmsExampleTest",
    # issue 28.5's race forced, failover (spec/ha.md section 4) against real brokers and its URL vectors
    "io.pymq.jms.ClientIdSwapTest", "io.pymq.jms.FailoverTest", "io.pymq.jms.FailoverUrlVectorsTest",
    "io.pymq.jms.TemporaryDeleteTest", "io.pymq.jms.VhostTest", "io.pymq.jms.TemporaryReclaimTest",
}


@pytest.mark.timeout(900)      # its own suite, bounded by the subprocess timeout below
def test_java_binding_suite(tmp_path):
    mvn = service_url("PYMQ_MVN", "Maven for bindings/java", PROVIDER)
    report = tmp_path / "vectors-ran.txt"
    reports = BINDING / "target" / "surefire-reports"
    shutil.rmtree(reports, ignore_errors=True)
    env = dict(os.environ, CI="1", PYMQ_SERVER=f"{sys.executable} -m pymq_server", PYMQ_PYTHON=sys.executable,
               PYMQ_VECTORS_REPORT=str(report))
    env.pop("PYMQ_BROKER_ADDR", None)
    run = subprocess.run([mvn, "-B", "-q", "test"], cwd=BINDING, env=env, capture_output=True, text=True,
                         timeout=900)
    log = run.stdout[-12000:] + "\n" + run.stderr[-4000:]
    assert run.returncode == 0, f"mvn test failed:\n{log}"
    results: dict[str, dict[str, int]] = {}
    for xml in reports.glob("TEST-*.xml"):
        suite = ET.parse(xml).getroot()
        results[suite.get("name", "")] = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors",
                                                                               "skipped")}
    missing = REQUIRED - results.keys()
    assert not missing, f"JUnit classes that did not run: {sorted(missing)}\n{log}"
    bad = {name: r for name, r in results.items() if r["tests"] == 0 or r["failures"] or r["errors"] or r["skipped"]}
    assert not bad, f"JUnit classes not fully passed: {bad}\n{log}"
    check_ran("java", report)
