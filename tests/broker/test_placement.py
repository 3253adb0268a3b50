"""spec/placement.md against the code: the table of entry paths and rules is the one in placement.py, and
one message down every entry path, with every rule set up to bite, shows each rule applied exactly where
the table says ✓ and nowhere it says –.

The broker core runs in-process (a fake runtime, the real store with a file device, a fake cluster that
routes group "G" to node n9); each (path, rule) cell gets a broker of its own."""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import sqlalchemy as sa
from pymq_server.app import build_devices
from pymq_server.broker.apptx import PendingClaimer
from pymq_server.broker.auth import User
from pymq_server.broker.broker import Broker
from pymq_server.broker.membership import Standalone
from pymq_server.broker.message import BrokerMessage
from pymq_server.broker.placement import RULES, EntryPath, Rule
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.requests import BulkSendRequest, parse_send
from pymq_server.broker.routes import Routes
from pymq_server.broker.stored_form import STORED_CODEC
from pymq_server.config import BrokerConfig, QueueConfig
from pymq_server.storage.sql import send_in_transaction
from pymq_server.storage.store import HoldingStore

from pymq.errors import PymqError
from pymq.protocol.scanner import encode_frame

SPEC = os.path.join(os.path.dirname(__file__), "..", "..", "spec", "placement.md")
PATH_BY_ROW = {path.value: path for path in EntryPath}
RULE_BY_COLUMN = {rule.value: rule for rule in Rule}


def spec_table() -> dict[EntryPath, frozenset[Rule]]:
    """The 'Entry paths' table of spec/placement.md: path -> the rules marked ✓."""
    text = open(SPEC, encoding="utf-8").read()
    section = text.split("## Entry paths", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    table = {}
    for row in rows[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        path = PATH_BY_ROW[cells[0]]
        marks = dict(zip(header[2:], cells[2:]))
        assert set(marks.values()) <= {"✓", "–"}, row
        table[path] = frozenset(RULE_BY_COLUMN[column] for column, mark in marks.items() if mark == "✓")
    return table


def test_the_spec_table_is_the_code_table():
    assert spec_table() == dict(RULES)
    assert set(RULES) == set(EntryPath)


# -- an in-process broker ------------------------------------------------------------------------------

class FakeRuntime:
    time = staticmethod(time.monotonic)

    def call_later(self, delay: float, fn: Callable, *args: Any) -> None:
        pass                                   # nothing here waits for a timer

    def run_in_thread(self, work: Callable, done: Callable) -> None:
        done(work(), None)


class FakeClient:
    def __init__(self, cluster: bool = False) -> None:
        self.id = "c1"
        self.client_id = None
        self.user = User("tester", "", frozenset({"admin", "cluster"} if cluster else {"admin"}))
        self.closed = False
        self.paused: list[str] = []
        self.is_cluster = cluster
        self.routes = Routes()

    def temp_queue(self, local: str, create: bool = True) -> None:
        raise AssertionError("no temporary queues here")

    def pause_input(self, reason: str) -> None:
        self.paused.append(reason)

    def resume_input(self, reason: str) -> None:
        pass

    def deliver(self, consumer: Any, entry: Any) -> None:
        raise AssertionError("no consumers here")

    def forget_delivery(self, consumer: Any, entry: Any) -> None:
        pass


class FakeCluster(Standalone):
    """Routes messages of group "G" to node n9 while ``routing`` is on; outboxes get ``outbox_config``.
    Every other hook is the null cluster's (silent)."""

    active = True

    def __init__(self, broker: Broker, outbox_config: QueueConfig) -> None:
        self.broker = broker
        self.outbox_config = outbox_config
        self.routing = True

    def route_queue(self, queue: MessageQueue, headers: Any, message_id: str) -> str | None:
        return "n9" if self.routing and headers.get("JMSXGroupID") == "G" else None

    def topic_outboxes(self, topic: Any, message: BrokerMessage) -> list[MessageQueue]:
        return [self.outbox("n9")] if self.routing and message.group_id == "G" else []

    def outbox(self, peer: str) -> MessageQueue:
        return self.broker.internal_queue("$cluster.out." + peer, self.outbox_config)

    def status(self) -> dict:
        return {}


@dataclass
class Scenario:
    """What makes one rule bite at the target (queue settings, retention) and the message that tests it."""

    settings: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)
    prefill: bool = False
    twice: bool = False


SCENARIOS = {
    Rule.DEDUP: Scenario(headers={"pymq-dedup-id": "d1"}, twice=True),
    Rule.SCHEMA: Scenario(settings={"schema": {"must": {"type": "string", "required": True}}}),
    Rule.ROUTING: Scenario(headers={"JMSXGroupID": "G"}),
    Rule.DEPTH: Scenario(settings={"max_depth": 1, "overflow": "reject"}, prefill=True),
    Rule.DEFAULTS: Scenario(settings={"default_priority": 7}),
    Rule.RETAINED_LOG: Scenario(),
    Rule.STORE: Scenario(),
}

TARGET = {   # the queue whose settings the rules read, and where the message should arrive
    EntryPath.SEND: "t", EntryPath.CLUSTER_INBOUND: "t", EntryPath.APP_TRANSACTION: "t",
    EntryPath.REROUTE: "t", EntryPath.DEAD_LETTER: "DLQ.s", EntryPath.EXPIRY: "expired",
    EntryPath.PUBLISH: None, EntryPath.REDISTRIBUTION: None, EntryPath.HANDOVER: None,
    EntryPath.BULK_QUEUE: "t", EntryPath.BULK_TOPIC: None,
}
TOPIC_PATHS = (EntryPath.PUBLISH, EntryPath.BULK_TOPIC)


def bulk_body(headers: dict) -> bytes:
    """A bulk SEND's body (spec/spark.md §7) of one row carrying ``headers``' values in their columns."""
    import pyarrow as pa
    columns = {"body": pa.array([b"probe"]), "delivery_mode": pa.array([2], pa.int32()),
               "properties": pa.array([[("n", headers["n"])]], pa.map_(pa.string(), pa.string()))}
    if "pymq-dedup-id" in headers:
        columns["dedup_id"] = pa.array([headers["pymq-dedup-id"]])
    if "JMSXGroupID" in headers:
        columns["group"] = pa.array([headers["JMSXGroupID"]])
    batch = pa.RecordBatch.from_pydict(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


class Cell:
    """One broker for one (path, rule) cell."""

    def __init__(self, tmp_path, path: EntryPath, rule: Rule) -> None:
        self.path = path
        self.scenario = SCENARIOS[rule]
        settings = self.scenario.settings
        target = TARGET[path]
        storage: dict = {"devices": {"memory": {"kind": "memory"}, "file": {"kind": "file"}},
                         "persistent_device": "file"}
        if path is EntryPath.APP_TRANSACTION:
            self.db_url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
            storage["devices"]["db"] = {"kind": "sql", "url": self.db_url}
        retained = {"/topic/t": {}, "/queue/$cluster.out.n2": {}, f"/queue/{target}": {}} \
            if rule is Rule.RETAINED_LOG else {}
        config = BrokerConfig.from_dict(dict(
            host="127.0.0.1", port=0, data_dir=str(tmp_path / "data"), storage=storage, sync_policy="never",
            expiry_queue="expired", retention=retained,
            queues={target: settings} if target and settings else {},
            queue_defaults=settings if path in TOPIC_PATHS else {}))
        runtime = FakeRuntime()
        devices, persistent = build_devices(config)
        self.store = HoldingStore(devices, persistent_device=persistent, sync_policy="never",
                                  call_later=runtime.call_later, run_in_thread=runtime.run_in_thread,
                                  codec=STORED_CODEC)
        self.store.open()
        self.broker = Broker(config, self.store, runtime)
        self.broker.recover()
        outbox_config = QueueConfig(**{"max_deliveries": 0, "dead_letter": False, **settings}) \
            if path in (EntryPath.REDISTRIBUTION, EntryPath.HANDOVER) else QueueConfig(max_deliveries=0)
        self.cluster = FakeCluster(self.broker, outbox_config)
        self.broker.attach_cluster(self.cluster)
        self.client = FakeClient()
        if path in TOPIC_PATHS:
            topic = self.broker.destinations.topic("t")
            self.sub = self.broker.subscriptions.create_durable(topic, "sub:x:d", None, False, "x", False, "d")

    def close(self) -> None:
        self.store.close()

    # where the message should be
    def target(self) -> MessageQueue:
        if self.path in TOPIC_PATHS:
            return self.sub.queue
        if self.path in (EntryPath.REDISTRIBUTION, EntryPath.HANDOVER):
            return self.cluster.outbox("n2")
        return self.broker.destinations.queue(TARGET[self.path], create=True)

    def arrived(self) -> list:
        return [e for e in self.target().ready if e.message.body.startswith(b"probe")]

    def in_n9_outbox(self) -> int:
        return len([e for e in self.cluster.outbox("n9").ready if e.message.body.startswith(b"probe")])

    # the message's way in
    def send_headers(self, number: int) -> dict:
        return {**self.scenario.headers, "persistent": "true", "n": str(number)}

    def source_message(self, number: int, destination: str = "/queue/s") -> BrokerMessage:
        """A message this broker holds already, in queue s (or ``destination``), routing off."""
        headers = self.send_headers(number)
        dedup_id = headers.pop("pymq-dedup-id", None)    # the source queue must not drop the second one
        self.cluster.routing = False
        try:
            self.broker.send(self.client, parse_send({"destination": destination, **headers}, b"probe"))
        finally:
            self.cluster.routing = True
        _, name = self.broker.destinations.resolve(destination)
        queue = self.broker.destinations.queue(name)
        entry = [e for e in queue.ready if e.message.headers["n"] == str(number)][0]
        if dedup_id is not None:
            entry.message.headers["pymq-dedup-id"] = dedup_id
        return entry

    def enter(self, number: int) -> None:
        path = self.path
        broker = self.broker
        headers = self.send_headers(number)
        if path is EntryPath.SEND:
            broker.send(self.client, parse_send({"destination": "/queue/t", **headers}, b"probe"))
        elif path is EntryPath.PUBLISH:
            broker.send(self.client, parse_send({"destination": "/topic/t", **headers}, b"probe"))
        elif path in (EntryPath.BULK_QUEUE, EntryPath.BULK_TOPIC):
            destination = "/queue/t" if path is EntryPath.BULK_QUEUE else "/topic/t"
            broker.send_bulk(self.client, BulkSendRequest(destination, bulk_body(headers)))
        elif path is EntryPath.CLUSTER_INBOUND:
            forwarded = {"destination": "/queue/t", "pymq-forwarded": "n5", **headers}
            broker.send(FakeClient(cluster=True), parse_send(forwarded, b"probe"))
        elif path is EntryPath.APP_TRANSACTION:
            data = encode_frame("SEND", {"destination": "/queue/t", **headers}, b"probe", "1.2")
            with sa.create_engine(self.db_url).begin() as db:
                send_in_transaction(db, "/queue/t", data, persistent=True)
            claimer = PendingClaimer(broker.router, broker.seqs, self.store.devices["db"], None)
            claimer.claim_all()
            if claimer.discarded:
                raise PymqError("discarded by the claim")
        elif path is EntryPath.DEAD_LETTER:
            broker.router.dead_letter(self.source_message(number), "test")
        elif path is EntryPath.EXPIRY:
            broker.router.on_expired(self.source_message(number))
        elif path is EntryPath.REDISTRIBUTION:
            broker.redistribute(self.source_message(number).message, "n2")
        elif path is EntryPath.HANDOVER:
            broker.hand_over(self.source_message(number).message, "sub:x:d", "n2")
        elif path is EntryPath.REROUTE:
            # a message for queue t that sat in a dead peer's outbox
            message = self.source_message(number, "/queue/held").message
            message.destination = "/queue/t"
            broker.reroute(message, None)

    def run(self) -> Exception | None:
        if self.scenario.prefill:
            self.target().enqueue(BrokerMessage(10**9, "ID:prefill", self.target().destination, 10**9,
                                                {}, b"prefill", False, 4, 0, 0))
        try:
            for number in range(2 if self.scenario.twice else 1):
                self.enter(number)
        except PymqError as exc:
            return exc
        return None


def applied(cell: Cell, rule: Rule, error: Exception | None) -> bool:
    """Whether ``rule`` took effect for the message(s) ``cell`` sent down its path."""
    arrived = cell.arrived()
    if rule is Rule.DEDUP:
        return len(arrived) == 1
    if rule in (Rule.SCHEMA, Rule.DEPTH):
        return not arrived
    if rule is Rule.ROUTING:
        return cell.in_n9_outbox() > 0
    assert len(arrived) == 1, (error, arrived)
    entry = arrived[0]
    if rule is Rule.DEFAULTS:
        return entry.message.priority == 7
    if rule is Rule.RETAINED_LOG:
        log = cell.broker.logs.logs.get(cell.target().destination)
        return log is not None and any(m is entry.message for m in log.range(0, None))
    if rule is Rule.STORE:
        # on the device that keeps persistent messages (the file device; the SQL device for a claimed
        # application-transaction message, which that device wrote in the claim)
        device = entry.message.device
        return entry.stored and device is not None and device.kind != "memory"
    raise AssertionError(rule)


@pytest.mark.parametrize("rule", list(Rule), ids=lambda r: r.name.lower())
@pytest.mark.parametrize("path", list(EntryPath), ids=lambda p: p.name.lower())
def test_each_rule_applies_exactly_where_the_table_says(tmp_path, path, rule):
    expected = rule in spec_table()[path]
    cell = Cell(tmp_path, path, rule)
    try:
        error = cell.run()
        assert applied(cell, rule, error) is expected, (
            f"{path.value}: rule {rule.value} {'did not apply' if expected else 'applied'} (error: {error!r})")
    finally:
        cell.close()


def test_the_spec_lists_the_rules_in_the_order_placement_applies_them():
    text = open(SPEC, encoding="utf-8").read()
    order = re.findall(r"^\| \d \| ([a-z/ ()]+?) \|", text, flags=re.M)
    assert order == ["duplicates", "schema", "cluster routing", "depth / overflow", "queue defaults",
                     "duplicates (remember)", "retained log", "store"]
