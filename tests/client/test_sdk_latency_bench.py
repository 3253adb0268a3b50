"""bench/sdk_latency.py (bench_brokers' es/esp/ea/eap rows, issue 30 item 4) counts right: every message sent
through the SDK is received once, its latency taken from the send time in its body (no timing is asserted)."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import sdk_latency  # noqa: E402


@pytest.mark.parametrize("api", ["blocking", "aio"])
@pytest.mark.parametrize("persistent", [False, True])
def test_every_message_is_received_once_and_timed(broker, api, persistent):
    queue = f"latency.{api}.{persistent}"
    if api == "aio":
        r = asyncio.run(sdk_latency._run_aio(broker.url, queue, 400.0, 0.25, persistent))
    else:
        r = sdk_latency.run_blocking(broker.url, queue, 400.0, 0.25, persistent)
    assert (r["sent"], r["received"], r["lost"], r["duplicated"]) == (100, 100, 0, 0), r
    assert 0 < r["lat_p50_us"] <= r["lat_p99_us"] <= r["lat_p999_us"] <= r["lat_max_us"], r


def test_a_duplicate_and_a_loss_are_counted():
    stamps = [(0, 10), (1, 20), (1, 30)]          # seq 1 twice, seq 2 never
    r = sdk_latency._summary(3, stamps, 1.0, 3.0, "blocking", False)
    assert (r["lost"], r["duplicated"], r["received"]) == (1, 1, 3) and r["lat_max_us"] == 20
