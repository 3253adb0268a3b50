"""The failover harness (bench/bench_failover.py, issue 26 item 3) in short: one round of each fault (kill -9
of the live, SIGSTOP of the live resumed after the takeover, kill -9 of the backup in the middle of its
recovery) per store kind, under producers with receipts and transactions through the Python SDK's failover,
stomp.py as an outside producer and an SDK consumer with client acknowledgement.  Nothing acknowledged may
be lost, no duplicate may come unflagged, no transaction may be seen in part, and the zombie must find itself
fenced.  Takeover times are printed, never asserted (bench/README.md has the 20-round figures)."""
from __future__ import annotations

import pytest

from bench.bench_failover import FAULTS, report, run_store


@pytest.mark.parametrize("store", ["file", "postgresql"])
def test_failover_rounds_lose_nothing_acknowledged(store, request):
    url = request.getfixturevalue("postgres_url") if store == "postgresql" else None
    result = run_store(store, len(FAULTS), 1000, url, log=print)
    print(report(result))
    assert result.acknowledged > 0 and len(result.rounds) == len(FAULTS)
    assert result.errors == []
    assert result.lost == 0, result.lost_sample
    assert result.duplicates_unflagged == 0, result.unflagged_sample
    assert result.transactions_partial == 0
    assert result.transactions_committed > 0
    assert result.zombies_not_fenced == 0
    assert all(r.takeover_s is not None for r in result.rounds)     # every takeover served the consumer again
