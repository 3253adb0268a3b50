"""The file device against a plain model, driven by hypothesis: random writes, removes, references,
catalog records, flushes, checkpoints, clean reopens and crashes (unflushed changes lost) in any order."""
from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice

PAGE = 4096
QUEUES = ["q1", "q2", "q3"]


class FileDeviceMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="pymq-model-")
        self.device = self._open()
        self.next_key = 1
        self.live: dict[int, tuple[StoredMessage, list[str]]] = {}     # everything held now
        self.catalog: dict[str, bytes] = {}
        self.flushed: tuple[dict, dict] = ({}, {})                     # persistent state the OS has

    index_hot = 65536

    def _open(self) -> FileDevice:
        device = FileDevice("file", self.dir, PAGE, fsync=False, checkpoint_bytes=6000, index_hot=self.index_hot)
        device.open()
        return device

    def _persistent_now(self):
        return ({k: (m, sorted(r)) for k, (m, r) in self.live.items() if m.persistent}, dict(self.catalog))

    def _after_reopen(self, expected):
        messages, catalog = expected
        got = {m.key: (m, sorted(r)) for m, r in self.device.recover()}
        assert got == messages
        assert dict(self.device.iter_meta()) == catalog
        self.live = {k: (m, list(r)) for k, (m, r) in messages.items()}
        self.catalog = dict(catalog)
        self.flushed = self._persistent_now()

    @rule(persistent=st.booleans(), size=st.sampled_from([0, 3, 100, 900, 2000, 9000]),
          refs=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3, unique=True), seq=st.integers(0, 9))
    def write(self, persistent, size, refs, seq):
        key = self.next_key
        self.next_key += 1
        message = StoredMessage(key, "/topic/t", seq, persistent, bytes([key % 256]) * size)
        self.device.write(message, refs)
        self.live[key] = (message, list(refs))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def remove(self, data):
        key = data.draw(st.sampled_from(sorted(self.live)))
        queue = data.draw(st.sampled_from(self.live[key][1]))
        self.device.remove(key, queue)
        self.live[key][1].remove(queue)
        if not self.live[key][1]:
            del self.live[key]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def add_reference(self, data):
        key = data.draw(st.sampled_from(sorted(self.live)))
        self.device.add_reference(key, "dlq")
        self.live[key][1].append("dlq")

    @rule(name=st.sampled_from(["a", "b", "c"]), value=st.one_of(st.none(), st.binary(max_size=20)))
    def put_meta(self, name, value):
        self.device.put_meta(name, value)
        if value is None:
            self.catalog.pop(name, None)
        else:
            self.catalog[name] = value

    @rule()
    def flush(self):
        self.device.flush()
        self.flushed = self._persistent_now()

    @rule()
    def sync(self):
        self.device.flush()
        self.device.sync()                    # may run a due checkpoint
        self.flushed = self._persistent_now()

    @rule()
    def checkpoint(self):
        self.device.checkpoint()
        self.flushed = self._persistent_now()

    @rule()
    def reopen(self):
        expected = self._persistent_now()
        self.device.close()
        self.device = self._open()
        self._after_reopen(expected)

    @rule()
    def crash(self):
        expected = self.flushed
        self.device._simulate_crash()
        self.device = self._open()
        self._after_reopen(expected)

    @invariant()
    def reads_match(self):
        for key, (message, refs) in self.live.items():
            assert self.device.read(key) == message
            assert sorted(self.device.references(key)) == sorted(refs)
        status = self.device.status()
        assert status.messages == len(self.live)
        assert status.bytes_used == sum(m.size for m, _ in self.live.values())
        self.device.store.pages.alloc.check()

    @invariant()
    def queues_iterate_in_time_sequence(self):
        for queue in QUEUES + ["dlq"]:
            expected = sorted((m.seq, k) for k, (m, r) in self.live.items() if queue in r)
            assert [(m.seq, m.key) for m in self.device.iterate(queue)] == expected

    def teardown(self):
        self.device._simulate_crash()
        shutil.rmtree(self.dir, ignore_errors=True)


TestFileDeviceModel = FileDeviceMachine.TestCase
TestFileDeviceModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


class ColdIndexMachine(FileDeviceMachine):
    """The same, with an index that keeps only the two newest messages as objects: every other message is
    in the cold arrays (index.py), so removals, references and reads go through folding and promotion."""

    index_hot = 2


TestFileDeviceColdIndex = ColdIndexMachine.TestCase
TestFileDeviceColdIndex.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
