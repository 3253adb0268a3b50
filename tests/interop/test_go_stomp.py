"""go-stomp (github.com/go-stomp/stomp/v3, driven by tests/interop/go/main.go) and the pymq SDK exchange
messages both ways: every scenario of tests/interop/foreign.py, over STOMP 1.1 and 1.2.

The driver comes from ``PYMQ_GO_STOMP`` (set by ``eval "$(.ci/interop-clients.sh)"``).
"""
from __future__ import annotations

import pytest

from tests.interop import foreign

VARIABLE = "PYMQ_GO_STOMP"


@pytest.fixture(scope="module")
def driver() -> list[str]:
    return foreign.driver_argv(VARIABLE, "go-stomp driver")


@pytest.fixture(params=["1.1", "1.2"])
def connect(request, driver, broker):      # driver first: no broker is started for a skip
    yield from foreign.connector(driver, "go-stomp", broker, request.param)


@pytest.mark.parametrize("scenario", foreign.SCENARIOS, ids=lambda f: f.__name__)
def test_go_stomp(scenario, connect, broker):
    scenario(broker, connect)
