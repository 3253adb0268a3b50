"""Rule 6's references, written once (placement_rules.stored_references): a message placed by a SEND and one
an application wrote in its database transaction (router.pending_write, the claim's write) are stored under
the same names in the same order — each durable queue, the retained log, each peer's outbox."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pymq_server.broker.message import BrokerMessage
from pymq_server.broker.placement_rules import EntryPath, new_plan
from pymq_server.broker.router import Router

from tests.broker.core_harness import Core


@pytest.fixture
def core(tmp_path):
    c = Core(tmp_path)
    yield c
    c.close()


def _holder(name: str, durable: bool = True) -> SimpleNamespace:
    got: list = []
    return SimpleNamespace(name=name, durable=durable, got=got, host=SimpleNamespace(clock=lambda: 0.0),
                           enqueue=lambda message, stored=False, now=None, sole=False: got.append(message),
                           append=lambda message, stored: got.append(message))


def test_a_pending_messages_write_names_what_commit_would_in_the_same_order(core, monkeypatch):
    message = BrokerMessage(1, "ID:x-1", "/topic/t", 1, {}, b"x", True, 4, 0, 0)
    queues = [_holder("sub-a"), _holder("sub-b", durable=False), _holder("sub-c")]
    log, outboxes = _holder("$log.t"), [_holder("$outbox.n1"), _holder("$outbox.n2")]
    plan = new_plan((EntryPath.PUBLISH, message, queues, outboxes, log, None, None, None, "/topic/t"))
    written = Router.pending_write(plan)
    assert written is not None
    held: list[list[str]] = []
    monkeypatch.setattr(core.broker.placement.store, "hold", lambda m, refs: held.append(list(refs)) or False)
    core.broker.placement.commit(plan, None)
    assert held == [written[1]] == [["sub-a", "sub-c", "$log.t", "$outbox.n1", "$outbox.n2"]]
    assert all(h.got == [message] for h in (*queues, log, *outboxes))
