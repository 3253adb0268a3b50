"""bindings/go runs its own suite (`go test ./...`) against the shared vectors and a real pymq-server.

The Go toolchain comes from ``PYMQ_GO`` (``eval "$(.ci/interop-clients.sh)"``); without it the test skips,
or fails when ``CI`` is set (the rule of tests/storage/services.py).  The Go tests start the broker
themselves from ``PYMQ_SERVER``, which this wrapper points at the interpreter running pytest; ``CI=1`` is
passed so that none of them can skip.  The run is read as ``go test -json`` events: the test fails on any
failed or skipped Go test, and checks that the vector suites ran at all
and loaded exactly the vector files spec/vectors/bindings.json says Go runs.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.bindings.vector_coverage import check_ran
from tests.interop.foreign import PROVIDER
from tests.storage.services import service_url

BINDING = pathlib.Path(__file__).parents[2] / "bindings" / "go"

#: top-level Go tests that must have run and passed (the shared vectors and the client against a broker)
REQUIRED = {
    "TestParseVectors", "TestEncodeVectors", "TestMurmur3Vectors", "TestSMHasherVerification",
    "TestGroupRoutingVectors", "TestRoutingKeyVectors", "TestMessageVectors",
    "TestJMSHeadersAndTypedPropertiesCrossTheBroker", "TestClientIndividualAckNackAndRedelivery", "TestTransactions",
    "TestServerErrorsAreTypedAndEndTheConnection",
    # hardening: broker restart and cut connections, heart-beats both ways, contexts, net.Conn, channels, TLS
    "TestReconnectAfterBrokerRestart", "TestReconnectAfterTheConnectionIsCut", "TestTransactionsDoNotSurviveAReconnect",
    "TestWithoutReconnectALostBrokerIsFinal", "TestHeartBeatsBothWaysWithTheBroker", "TestASilentBrokerIsDeclaredDead",
    "TestContextCancelsAHandshakeWithASilentServer", "TestConnectOverYourOwnConn", "TestChannelAPI",
    "TestTLSThroughATerminatingProxy", "TestTheModulePathResolves", "TestAContextCancelledAfterConnectDoesNotCutTheConnection",
    "TestTLSToTheBrokersOwnPort",
    # failover (spec/ha.md section 4): the URL vectors, a takeover on the same store, re-sent SENDs, giving up
    "TestFailoverURLVectors", "TestFailoverFollowsATakeover", "TestUnreceiptedSendsGoAgainOnce",
    "TestFailoverGivesUpAfterItsAttempts", "TestAClientIDTheBrokerStillHoldsIsWaitedFor",
    "TestTemporaryNamesSurviveATakeover", "TestAReclaimEndsAHalfOpenLinkAtOnce",
    "TestASilentBrokerIsPassedOverWithinConnectionTimeout",
    # virtual hosts (spec/stomp.md section 1): the URL's path and Options.VHost
    "TestVirtualHostsKeepTheirQueuesApart",
}


@pytest.mark.timeout(600)      # its own suite, bounded by the subprocess timeout below
def test_go_binding_suite(tmp_path):
    go = service_url("PYMQ_GO", "Go toolchain for bindings/go", PROVIDER)
    report = tmp_path / "vectors-ran.txt"
    env = dict(os.environ, CI="1", PYMQ_SERVER=f"{sys.executable} -m pymq_server", PYMQ_VECTORS_REPORT=str(report))
    env.pop("PYMQ_BROKER_ADDR", None)
    run = subprocess.run([go, "test", "-count=1", "-json", "./..."], cwd=BINDING, env=env,
                         capture_output=True, text=True, timeout=600)
    results: dict[str, str] = {}
    output: list[str] = []
    for line in run.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            output.append(line)
            continue
        if event.get("Action") == "output":
            output.append(event.get("Output", "").rstrip("\n"))
        elif event.get("Test") and event.get("Action") in ("pass", "fail", "skip"):
            results[event["Test"]] = event["Action"]
    log = "\n".join(output[-200:]) + "\n" + run.stderr[-4000:]
    assert run.returncode == 0, f"go test failed:\n{log}"
    bad = {name: action for name, action in results.items() if action != "pass"}
    assert not bad, f"Go tests not passed: {bad}\n{log}"
    missing = REQUIRED - results.keys()
    assert not missing, f"Go tests that did not run: {sorted(missing)}\n{log}"
    check_ran("go", report)
