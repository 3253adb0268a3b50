"""A SEND's message, built and numbered (bench/README, the 1→1 queue row: the build is most of the SEND side).

* The message is built by one call (message.py's ``message_from_request``: the compiled twin, or
  _message_py.py's), the producing connection's fields set as it is constructed (not set to None and again
  after); both twins (tests/broker/test_message_twins.py's ``message_twin``).
* A message's id is ``Placement.id_prefix`` and its key wherever a new message is named: a SEND's, a dead
  letter's copy, the id a cluster routes a queue message by (one prefix, formatted once)."""
from __future__ import annotations

import os
import sys
from typing import Any


from pymq_server.app import build_devices
from pymq_server.broker.broker import Broker
from pymq_server.broker.membership import Standalone
from pymq_server.broker.message import BrokerMessage
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.requests import parse_send
from pymq_server.broker.stored_form import STORED_CODEC
from pymq_server.config import BrokerConfig
from pymq_server.storage.store import HoldingStore
from tests.broker.test_message_twins import message_twin  # noqa: F401  (the fixture)
from tests.broker.test_placement import FakeClient, FakeRuntime


# -- the build of a SEND's message ----------------------------------------------------------------------

def _broker(tmp_path) -> tuple[Broker, HoldingStore]:
    config = BrokerConfig.from_dict(dict(host="127.0.0.1", port=0, data_dir=str(tmp_path / "data"),
                                         sync_policy="never", queues={"a": {"max_deliveries": 1}}))
    runtime = FakeRuntime()
    devices, persistent = build_devices(config)
    store = HoldingStore(devices, persistent_device=persistent, sync_policy="never", call_later=runtime.call_later,
                         run_in_thread=runtime.run_in_thread, codec=STORED_CODEC)
    store.open()
    broker = Broker(config, store, runtime)
    broker.recover()
    return broker, store


def test_a_sends_message_is_built_by_one_call_with_its_producer(tmp_path, message_twin):
    broker, store = _broker(tmp_path)
    try:
        client = FakeClient()
        client.client_id = "app-1"
        broker.send(client, parse_send({"destination": "/queue/a", "persistent": "false"}, b"first"))
        calls: list[str] = []
        constructed: dict = {}

        def profile(frame, event, arg):  # type: ignore[no-untyped-def]
            code = frame.f_code
            if event == "call":
                calls.append(f"{os.path.basename(code.co_filename)}:{code.co_name}")
            elif event == "return" and code is getattr(BrokerMessage.__init__, "__code__", None):
                made = frame.f_locals["self"]
                constructed.update(producer=made.producer, client_id=made.client_id, user=made.user)

        sys.setprofile(profile)
        try:
            broker.send(client, parse_send({"destination": "/queue/a", "persistent": "false"}, b"second"))
        finally:
            sys.setprofile(None)
        build = [c for c in calls if c.split(":")[0] in ("sequences.py", "message.py", "_message_py.py")]
        if message_twin.__name__.endswith("_py"):
            assert build == ["sequences.py:next", "sequences.py:next", "_message_py.py:message_from_request",
                             "_message_py.py:now_ms", "_message_py.py:init_message"], calls
            # the producer's fields are the message's as it is constructed, not set afterwards
            assert constructed == {"producer": "c1", "client_id": "app-1", "user": "tester"}
        else:
            # compiled: no Python step between the two numbers and the message (and no __init__ frame)
            assert build == ["sequences.py:next", "sequences.py:next"], calls
        first, second = [e.message for e in broker.destinations.queue("a").ready]
        assert (second.producer, second.client_id, second.user) == ("c1", "app-1", "tester")
        assert (second.key, second.seq) == (first.key + 1, first.seq + 1)
        assert second.message_id == f"ID:{broker.config.node_id}-{second.key}"
    finally:
        store.close()


class RecordingCluster(Standalone):
    """Routes nothing away; writes down the id each queue message is routed by."""

    active = True

    def __init__(self) -> None:
        self.routed_by: list[str] = []

    def route_queue(self, queue: MessageQueue, headers: Any, message_id: str) -> str | None:
        self.routed_by.append(message_id)
        return None

    def status(self) -> dict:
        return {}


def test_every_new_message_is_named_by_the_placements_one_prefix(tmp_path):
    """The prefix is read where each new message is named: changing it (as nothing but this test does)
    changes a SEND's id, the id a cluster routes it by, and a dead letter's copy's id alike."""
    broker, store = _broker(tmp_path)
    try:
        cluster = RecordingCluster()
        broker.attach_cluster(cluster)
        broker.placement.id_prefix = "ID:renamed-"
        broker.send(FakeClient(), parse_send({"destination": "/queue/a", "persistent": "false"}, b"x"))
        [entry] = broker.destinations.queue("a").ready
        message = entry.message
        assert message.message_id == f"ID:renamed-{message.key}"
        assert cluster.routed_by == [message.message_id]
        broker.router.dead_letter(entry, "test")
        [dead] = [e.message for e in broker.destinations.queue("DLQ.a").ready]
        assert dead.key != message.key and dead.message_id == f"ID:renamed-{dead.key}"
        assert dead.headers["pymq-original-message-id"] == message.message_id
    finally:
        store.close()
