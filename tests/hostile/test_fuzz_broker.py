"""The fuzzing suite that stays: generated traffic against a real broker, compiled and pure twins.

A short run on every test run (the long one is ``python -m bench.fuzz --minutes N``).  The broker runs
as a ``pymq-server`` child process, once with the compiled core and once with ``PYMQ_NO_EXTENSIONS=1``,
so a crash in either fails the test instead of killing pytest.  The rules it checks are in
tests/hostile/fuzzing.py.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from pymq._accel import NO_EXTENSIONS
from tests.hostile.conftest import start_broker
from tests.hostile.fuzzing import BrokerFuzz


@pytest.fixture(params=["c", "py"], scope="module")
def fuzzed_broker(request, tmp_path_factory):
    if request.param == "c" and NO_EXTENSIONS:
        pytest.skip("PYMQ_NO_EXTENSIONS=1: the compiled twin is disabled on purpose")
    env = {"PYMQ_NO_EXTENSIONS": "1" if request.param == "py" else "0"}
    bp = start_broker(tmp_path_factory.mktemp(f"fuzz-{request.param}"), env=env, websocket=True)
    yield bp
    bp.stop()


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_broker_under_generated_traffic(fuzzed_broker, transport):
    """``ws``: the same traffic over the WebSocket listener, in fragments (issue 24 item 7)."""
    BrokerFuzz.broker = fuzzed_broker
    BrokerFuzz.transport = transport
    try:
        run_state_machine_as_test(BrokerFuzz, settings=settings(
            max_examples=int(os.environ.get("PYMQ_FUZZ_EXAMPLES", "12")), stateful_step_count=25,
            deadline=None, suppress_health_check=list(HealthCheck)))
    finally:
        BrokerFuzz.transport = "tcp"
    assert fuzzed_broker.alive(), fuzzed_broker.describe()
