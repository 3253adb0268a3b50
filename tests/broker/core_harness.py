"""The broker core in-process, for tests that drive its entry paths directly: the real layers, the real
holding store (memory and a file device), a fake runtime whose timers never fire, and a fake client.

``Core(tmp_path, queues={...})`` builds one; ``send``, ``commit`` (a STOMP transaction's COMMIT: every
SEND admitted, then applied, as session.py does) and ``bulk`` enter messages the three ways a client can."""
from __future__ import annotations

import time
from typing import Any
from collections.abc import Callable

from pymq_server.app import build_devices
from pymq_server.broker.auth import User
from pymq_server.broker.broker import Broker
from pymq_server.broker.bulk_rows import BulkResult
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.requests import BulkSendRequest, SendRequest, parse_send
from pymq_server.broker.routes import Routes
from pymq_server.broker.stored_form import STORED_CODEC
from pymq_server.broker.transactions import Transactions
from pymq_server.config import BrokerConfig
from pymq_server.storage.store import HoldingStore


class FakeRuntime:
    time = staticmethod(time.monotonic)

    def call_later(self, delay: float, fn: Callable, *args: Any) -> None:
        pass                                   # nothing here waits for a timer

    def run_in_thread(self, work: Callable, done: Callable) -> None:
        done(work(), None)


class FakeClient:
    def __init__(self, cluster: bool = False, name: str = "tester") -> None:
        self.id = "c1"
        self.client_id = None
        self.user = User(name, "", frozenset({"admin", "cluster"} if cluster else {"admin"}))
        self.closed = False
        self.paused: list[str] = []
        self.is_cluster = cluster
        self.routes = Routes()

    def temp_queue(self, local: str, create: bool = True) -> None:
        raise AssertionError("no temporary queues here")

    def temp_topic(self, local: str, create: bool = True) -> None:
        raise AssertionError("no temporary topics here")

    def pause_input(self, reason: str) -> None:
        self.paused.append(reason)

    def resume_input(self, reason: str) -> None:
        pass

    def deliver(self, consumer: Any, entry: Any) -> None:
        raise AssertionError("no consumers here")

    def forget_delivery(self, consumer: Any, entry: Any) -> None:
        pass


def bulk_body(rows: list[dict[str, str]]) -> bytes:
    """A bulk SEND's body (spec/spark.md §7): one row per mapping, its items as the row's properties
    (``pymq-dedup-id`` goes to the dedup column), body ``probe``."""
    import pyarrow as pa
    properties = [[(k, v) for k, v in row.items() if k != "pymq-dedup-id"] for row in rows]
    columns = {"body": pa.array([b"probe"] * len(rows)), "delivery_mode": pa.array([2] * len(rows), pa.int32()),
               "properties": pa.array(properties, pa.map_(pa.string(), pa.string()))}
    if any("pymq-dedup-id" in row for row in rows):
        columns["dedup_id"] = pa.array([row.get("pymq-dedup-id") for row in rows], pa.string())
    batch = pa.RecordBatch.from_pydict(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


class Core:
    def __init__(self, tmp_path: Any, memory_only: bool = False, **settings: Any) -> None:
        storage: dict = {"devices": {"memory": {"kind": "memory"}, "file": {"kind": "file"}},
                         "persistent_device": "file"}
        if memory_only:
            storage = {"devices": {"memory": {"kind": "memory"}}, "persistent_device": "memory"}
        config = BrokerConfig.from_dict(dict(host="127.0.0.1", port=0, data_dir=str(tmp_path / "data"),
                                             storage=storage, sync_policy="never", **settings))
        runtime = FakeRuntime()
        devices, persistent = build_devices(config)
        self.store = HoldingStore(devices, persistent_device=persistent, sync_policy="never",
                                  call_later=runtime.call_later, run_in_thread=runtime.run_in_thread,
                                  codec=STORED_CODEC)
        self.store.open()
        self.broker = Broker(config, self.store, runtime)
        self.broker.recover()
        self.client = FakeClient()

    def close(self) -> None:
        self.store.close()

    def queue(self, name: str) -> MessageQueue:
        return self.broker.destinations.queue(name, create=True)

    @staticmethod
    def request(destination: str, headers: dict[str, str], body: bytes = b"probe", **frame: str) -> SendRequest:
        return parse_send({"destination": destination, **frame, **headers}, body)

    def send(self, destination: str, headers: dict[str, str]) -> str | None:
        return self.broker.send(self.client, self.request(destination, headers))[0]

    def commit(self, sends: list[tuple[str, dict[str, str]]]) -> None:
        """BEGIN, the SENDs, COMMIT, as a session does: every SEND admitted before the first is applied."""
        budget = self.broker.budgets.connection("harness", "c0")       # what a session's transactions charge
        transactions = Transactions(10, 1000, 1 << 40, lambda: budget)
        transactions.begin("tx")
        for destination, headers in sends:
            transactions.add("tx", self.request(destination, headers, transaction="tx"))
        for op in transactions.commit("tx", lambda request, unit: self.broker.admit(self.client, request, unit)):
            assert isinstance(op, SendRequest)
            self.broker.send(self.client, op, admitted=True)

    def bulk(self, destination: str, rows: list[dict[str, str]]) -> BulkResult:
        return self.broker.send_bulk(self.client, BulkSendRequest(destination, bulk_body(rows)))

    def waiting(self, name: str, key: str) -> list[str]:
        """The values of property ``key`` of the messages waiting in queue ``name``, in delivery order."""
        return [entry.message.headers.get(key, "") for entry in self.queue(name).ready]
