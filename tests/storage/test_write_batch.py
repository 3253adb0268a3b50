"""The write buffering under the SQL and grid devices, checked against a plain model.

A fake backend applies batches the way the SQL device does (inserts that skip existing rows, net
reference changes, deletion of freed messages).  Hypothesis drives writes, removals, added references,
catalog records and syncs that succeed, fail before reaching the server, or fail after it applied the
batch (a lost reply), with broker-thread operations landing while a commit is in progress.  After every
step what the device reports matches the model; after a final sync the backend holds exactly the model.
"""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pymq.errors import StorageError
from pymq_server.storage._buffered import ADD, DROP, BufferedDevice, WriteBatch
from pymq_server.storage.device import StoredMessage

QUEUES = ["q1", "q2", "q3"]


class ServerDown(Exception):
    pass


class FakeDevice(BufferedDevice):
    kind = "fake"
    _backend_errors = (ServerDown,)

    def __init__(self) -> None:
        super().__init__("fake")
        self.rows: dict[int, StoredMessage] = {}
        self.refs: set[tuple[int, str]] = set()
        self.catalog: dict[str, bytes] = {}
        self.outcome = "ok"                 # ok | fail-before | fail-after
        self.during_commit = None           # callable run while the commit is in progress
        self._opened = True
        self._online = True

    def _commit(self, batch: WriteBatch) -> None:
        if self.during_commit is not None:
            self.during_commit()
        if self.outcome == "fail-before":
            raise ServerDown("connection refused")
        for key, (message, queues) in batch.messages.items():
            self.rows.setdefault(key, message)
            self.refs |= {(key, q) for q in queues}
        for (key, queue), op in batch.ref_ops.items():
            if op == ADD:
                self.refs.add((key, queue))
            elif key not in batch.freed:
                self.refs.discard((key, queue))
        for key in batch.freed:
            self.rows.pop(key, None)
            self.refs = {(k, q) for k, q in self.refs if k != key}
        for name, value in batch.meta.items():
            if value is None:
                self.catalog.pop(name, None)
            else:
                self.catalog[name] = value
        if self.outcome == "fail-after":
            raise ServerDown("reply lost")

    def _read_stored(self, key: int) -> StoredMessage | None:
        return self.rows.get(key)

    def _stored_meta(self) -> dict[str, bytes]:
        return dict(self.catalog)

    def _status_extra(self) -> dict:
        with self._lock:
            self._online = True          # the fake server always answers a probe
        return {}

    def recover(self):
        return iter(())


class BufferedDeviceModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.device = FakeDevice()
        self.model: dict[int, tuple[StoredMessage, set[str]]] = {}
        self.meta: dict[str, bytes] = {}
        self.next_key = 1

    # -- operations of the broker thread, applied to device and model alike --------------------------
    def _write(self, queues: list[str], size: int) -> None:
        key = self.next_key
        self.next_key += 1
        message = StoredMessage(key, "/queue/a", key, True, bytes([key % 251]) * size)
        if not self.device._online:
            # after a failed commit, new messages are refused until a probe or a commit succeeds
            with pytest.raises(StorageError, match="refuses new messages"):
                self.device.write(message, queues)
            return
        self.device.write(message, queues)
        self.model[key] = (message, set(queues))

    def _remove(self, key: int, queue: str) -> None:
        self.device.remove(key, queue)
        self.model[key][1].discard(queue)
        if not self.model[key][1]:
            del self.model[key]

    def _add_reference(self, key: int, queue: str) -> None:
        self.device.add_reference(key, queue)
        self.model[key][1].add(queue)

    @rule(queues=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3, unique=True),
          size=st.integers(0, 20))
    def write(self, queues, size):
        self._write(queues, size)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data):
        key = data.draw(st.sampled_from(sorted(self.model)))
        self._remove(key, data.draw(st.sampled_from(sorted(self.model[key][1]))))

    @precondition(lambda self: self.model)
    @rule(data=st.data(), queue=st.sampled_from(QUEUES + ["dlq"]))
    def add_reference(self, data, queue):
        self._add_reference(data.draw(st.sampled_from(sorted(self.model))), queue)

    @rule(key=st.integers(0, 200), queue=st.sampled_from(QUEUES))
    def remove_unknown_reference(self, key, queue):
        if key in self.model and queue in self.model[key][1]:
            return
        with pytest.raises(KeyError):
            self.device.remove(key, queue)

    @rule()
    def repair(self):
        assert self.device.repair()
        assert self.device._online

    @rule(name=st.sampled_from(["a", "b", "c"]), value=st.none() | st.binary(max_size=4))
    def put_meta(self, name, value):
        self.device.put_meta(name, value)
        if value is None:
            self.meta.pop(name, None)
        else:
            self.meta[name] = value

    @rule(outcome=st.sampled_from(["ok", "fail-before", "fail-after"]), interleave=st.booleans(),
          data=st.data())
    def sync(self, outcome, interleave, data):
        def meanwhile():
            # broker-thread work that lands while the commit is in progress
            self._write(["q1"], 3)
            if self.model:
                key = data.draw(st.sampled_from(sorted(self.model)))
                self._remove(key, data.draw(st.sampled_from(sorted(self.model[key][1]))))

        self.device.outcome = outcome
        self.device.during_commit = meanwhile if interleave else None
        try:
            if outcome == "ok" or not self.device._pending:    # nothing to commit: nothing to fail
                self.device.sync()
            else:
                with pytest.raises(StorageError):
                    self.device.sync()
        finally:
            self.device.outcome = "ok"
            self.device.during_commit = None

    # -- what must hold after every step ---------------------------------------------------------------
    @invariant()
    def reads_and_figures_match_the_model(self):
        for key, (message, _) in self.model.items():
            assert self.device.read(key) == message
        status = self.device.status()
        assert status.messages == len(self.model)
        assert status.bytes_used == sum(m.size for m, _ in self.model.values())
        assert dict(self.device.iter_meta()) == self.meta

    def teardown(self):
        self.device.sync()
        assert self.device.rows == {key: message for key, (message, _) in self.model.items()}
        assert self.device.refs == {(key, q) for key, (_, queues) in self.model.items() for q in queues}
        assert self.device.catalog == self.meta


TestBufferedDevice = BufferedDeviceModel.TestCase
TestBufferedDevice.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)


def test_reference_changes_record_the_final_state():
    batch = WriteBatch()
    batch.add_reference(1, "q")
    batch.remove(1, "q", last=False)
    batch.remove(2, "q", last=False)
    batch.add_reference(2, "q")
    batch.remove(3, "q", last=True)
    assert batch.ref_ops == {(1, "q"): DROP, (2, "q"): ADD, (3, "q"): DROP}
    assert batch.freed == {3}


def test_message_written_and_freed_in_one_batch_leaves_nothing_to_commit():
    batch = WriteBatch()
    batch.write(StoredMessage(1, "/queue/a", 1, True, b"x"), ["q1", "q2"])
    batch.remove(1, "q1", last=False)
    batch.remove(1, "q2", last=True)
    assert not batch
