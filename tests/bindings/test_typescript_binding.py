"""bindings/typescript runs its own suite (`npm test`: tsc, then node's test runner) against the shared
vectors and a real pymq-server.

npm comes from ``PYMQ_NPM`` (``eval "$(.ci/interop-clients.sh)"``, which also runs ``npm ci`` there);
without it the test skips, or fails when ``CI`` is set (the rule of tests/storage/services.py).  The tests
start the broker themselves from ``PYMQ_SERVER``, pointed at the interpreter running pytest; ``CI=1`` is
passed so none of them can skip.  The TAP summary must show tests passed, none failed, none skipped, and the
vector files loaded must be exactly those spec/vectors/bindings.json says TypeScript runs.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.bindings.vector_coverage import check_ran
from tests.interop.foreign import PROVIDER
from tests.storage.services import service_url

BINDING = pathlib.Path(__file__).parents[2] / "bindings" / "typescript"

#: suites that must appear in the run (the shared vectors and the client against a broker)
REQUIRED = ["frames.json parse vectors", "frames.json encode vectors", "murmur3.json", "group_routing.json",
            "messages.json: MESSAGE frames decode as in the Python SDK",
            "client against a real pymq-server",
            # hardening: broker restarts and cut connections, heart-beats, TLS, WebSocket in Node and Chromium
            "reconnection", "heart-beats", "TLS", "STOMP over WebSocket", "subscriptions as async iterators",
            "the broker's own TLS and WebSocket listeners",
            # failover (spec/ha.md section 4): the URL vectors; a takeover, re-sent SENDs, giving up
            "failover URLs (spec/vectors/failover_urls.json)", "failover against real brokers",
            # spec/ha.md section 4.7: a temporary queue's global name across a takeover, a forged token refused
            "temporary names across a takeover (spec/ha.md §4.7)",
            # spec/stomp.md section 1: the URL's path and the vhost option
            "virtual hosts"]


@pytest.mark.timeout(600)      # its own suite (a build and ~250 tests), bounded by the subprocess timeout below
def test_typescript_binding_suite(tmp_path):
    npm = service_url("PYMQ_NPM", "npm for bindings/typescript", PROVIDER)
    report = tmp_path / "vectors-ran.txt"
    env = dict(os.environ, CI="1", PYMQ_SERVER=f"{sys.executable} -m pymq_server", PYMQ_VECTORS_REPORT=str(report))
    env.pop("PYMQ_BROKER_ADDR", None)
    run = subprocess.run([npm, "test", "--silent"], cwd=BINDING, env=env, capture_output=True, text=True,
                         timeout=600)
    log = run.stdout[-12000:] + "\n" + run.stderr[-4000:]
    assert run.returncode == 0, f"npm test failed:\n{log}"
    summary = {k: int(v) for k, v in re.findall(r"^# (tests|pass|fail|skipped|cancelled|todo) (\d+)$",
                                                 run.stdout, re.M)}
    assert summary.get("tests", 0) > 0 and summary.get("pass") == summary["tests"], f"{summary}\n{log}"
    assert summary.get("fail") == 0 and summary.get("skipped") == 0, f"{summary}\n{log}"
    missing = [name for name in REQUIRED
               if not re.search(rf"^\s*ok \d+ - {re.escape(name)}$", run.stdout, re.M)]
    assert not missing, f"suites that did not run: {missing}\n{log}"
    check_ran("typescript", report)
