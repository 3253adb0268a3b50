"""Write buffering shared by the devices that live behind a server (SQL database, Redis grid).

The device keeps, in memory, which messages it holds with their size and references (``_held``:
about 150 bytes a message), so ``remove``/``read`` of something it does not hold raise ``KeyError``
at once and the status figures are exact without asking the server.  The contents live on the server.

The broker thread calls ``write``/``remove``/``add_reference``/``put_meta``; besides ``_held`` they
only touch an in-memory :class:`WriteBatch`.  ``sync`` (possibly in a worker thread, concurrently with
more writes) swaps the batch for an empty one under ``_lock`` and hands the swapped batch to the
backend as one transaction (:meth:`BufferedDevice._commit`).  Invariants:

* A message written and fully consumed inside one batch never reaches the backend: the batch drops it.
  This is what makes group commit pay off for queues whose consumers keep up.
* A reference change to a message an earlier batch wrote records the reference's final state
  (ADD: present, DROP: absent), which backends apply idempotently (insert if missing, delete if
  there).  So the last change wins, and replaying a batch that may already have been applied is safe.
* While a batch is being committed it stays visible to ``read`` (as ``_inflight``), so a message is
  readable at every instant between ``write`` and the removal of its last reference.
* Commits are serialised (``_sync_lock``): batch N is committed before batch N+1 starts.  A failed
  commit puts its batch back in front of the writes made meanwhile, so the next ``sync`` retries it.
* While the server is unreachable (a failed commit or probe, until one succeeds) new messages are
  refused (a refusal the store can fall over from), and :meth:`repair` — which the store calls with a
  back-off — probes the server and commits what waits; removals keep being buffered meanwhile.
  A commit whose reply was lost may have happened all the same, so backends apply batches
  idempotently, and the messages of a failed batch become *uncertain*: they may exist on the server,
  so changes to them are recorded as reference operations too, and freeing one deletes it there.
"""
from __future__ import annotations

import abc
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

from pymq.errors import StorageError

from .device import Allocation, DeviceStatus, HoldingDevice, StoredMessage

#: reference change recorded in a batch for a message an earlier batch wrote
ADD = 1
DROP = -1


class WriteBatch:
    """Net changes since the last swap."""

    __slots__ = ("messages", "ref_ops", "freed", "meta", "uncertain")

    def __init__(self) -> None:
        #: key -> (message, queues still referencing it), for messages this batch writes
        self.messages: dict[int, tuple[StoredMessage, set[str]]] = {}
        #: (key, queue) -> ADD | DROP (present | absent at the end), for messages an earlier batch wrote
        self.ref_ops: dict[tuple[int, str], int] = {}
        #: earlier messages whose last reference this batch drops: delete them
        self.freed: set[int] = set()
        #: catalog name -> value, None meaning delete
        self.meta: dict[str, bytes | None] = {}
        #: keys of ``messages`` that a failed commit may have written all the same
        self.uncertain: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self.messages or self.ref_ops or self.freed or self.meta)

    def write(self, message: StoredMessage, queues: Iterable[str]) -> None:
        self.messages[message.key] = (message, set(queues))

    def add_reference(self, key: int, queue: str) -> None:
        entry = self.messages.get(key)
        if entry is not None:
            entry[1].add(queue)
            if key not in self.uncertain:
                return
        self._ref_op(key, queue, ADD)

    def remove(self, key: int, queue: str, last: bool) -> None:
        """Record a removal; ``last`` says the device holds no other reference to ``key``."""
        entry = self.messages.get(key)
        if entry is not None:
            entry[1].discard(queue)
            if last:
                del self.messages[key]
            if key not in self.uncertain:
                return
            if last:
                self.uncertain.discard(key)
        self._ref_op(key, queue, DROP)
        if last:
            self.freed.add(key)

    def _ref_op(self, key: int, queue: str, op: int) -> None:
        # Never cancel an ADD against a DROP: after a failed commit either may already be applied.
        self.ref_ops[(key, queue)] = op

    def put_meta(self, name: str, value: bytes | None) -> None:
        self.meta[name] = value

    def absorb(self, later: WriteBatch) -> None:
        """Replay ``later`` on top of this batch, which failed to commit (``later`` came meanwhile)."""
        self.uncertain |= set(self.messages)
        for (key, queue), op in later.ref_ops.items():
            entry = self.messages.get(key)
            if entry is not None:
                if op == ADD:
                    entry[1].add(queue)
                else:
                    entry[1].discard(queue)
                    if not entry[1]:
                        del self.messages[key]
                        self.uncertain.discard(key)
            self._ref_op(key, queue, op)
        self.freed |= later.freed
        self.messages.update(later.messages)
        self.uncertain |= later.uncertain
        self.meta.update(later.meta)


class BufferedDevice(HoldingDevice):
    """A device whose writes are buffered in memory and committed to a server by ``sync``."""

    #: exceptions of the backend client that mean "the server failed us" (become StorageError)
    _backend_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()          # guards everything below that both threads touch
        self._sync_lock = threading.Lock()     # one commit at a time, in batch order
        self._pending = WriteBatch()
        self._inflight: WriteBatch | None = None
        #: key -> (size, queues): every message this device holds, committed or not
        self._held: dict[int, tuple[int, tuple[str, ...]]] = {}
        self._bytes = 0
        self._errors = 0
        self._last_error = ""
        self._online = False
        self._latency = 0.0                    # moving average of commit time, seconds
        self._opened = False
        # an open unit (spec/ha.md §3.4): ``sync`` does not swap the batch until it ends, so its changes are
        # committed in one transaction (the broker thread opens and closes it in synchronous code)
        self._unit_depth = 0
        self._unit_owner = 0
        self._unit_closed = threading.Condition(self._lock)

    # -- subclass hooks -------------------------------------------------------------------------
    @abc.abstractmethod
    def _commit(self, batch: WriteBatch) -> None:
        """Apply ``batch`` atomically and idempotently."""

    @abc.abstractmethod
    def _read_stored(self, key: int) -> StoredMessage | None:
        """Read a committed message (None if absent)."""

    @abc.abstractmethod
    def _stored_meta(self) -> dict[str, bytes]:
        """Every committed catalog record."""

    def _status_extra(self) -> dict:
        return {}

    def _describe(self) -> str:
        return f"{self.kind} device {self.name!r}"

    # -- helpers --------------------------------------------------------------------------------
    def _failure(self, action: str, exc: BaseException) -> StorageError:
        error = StorageError(f"{self._describe()}: {action} failed: {exc}", device=self.name)
        with self._lock:
            self._errors += 1
            self._online = False
            self._last_error = error.message
        return error

    def _check_open(self) -> None:
        if not self._opened:
            raise StorageError(f"{self._describe()} is not open", device=self.name)

    @property
    def needs_repair(self) -> bool:
        return self._opened and not self._online

    def repair(self) -> bool:
        """Probe the server and commit what waits; True when it answers again."""
        if not self._opened:
            return False
        self._status_extra()            # the probe flips _online either way
        if not self._online:
            return False
        try:
            self.sync()
        except StorageError:
            return False
        return self._online

    def holds(self, key: int) -> bool:
        with self._lock:
            return key in self._held

    def _hold(self, items: Iterable[tuple[int, int, Sequence[str]]]) -> None:
        """Record committed messages (loaded at open, claimed, taken over): (key, size, queues)."""
        with self._lock:
            for key, size, queues in items:
                old = self._held.get(key)
                if old is not None:
                    self._bytes -= old[0]
                self._held[key] = (size, tuple(sorted(set(queues))))
                self._bytes += size

    def _reset_held(self) -> None:
        with self._lock:
            self._held.clear()
            self._bytes = 0

    # -- HoldingDevice --------------------------------------------------------------------------
    def write(self, message: StoredMessage, queues: Sequence[str],
              allocation: Allocation | None = None) -> None:
        self._check_open()
        refs = tuple(sorted(set(queues)))
        if not refs:
            return      # nobody owes it to anyone: nothing to hold
        if not self._online:
            with self._lock:
                self._errors += 1
            raise StorageError(f"{self._describe()} refuses new messages while its server does not answer "
                               f"({self._last_error or 'offline'}); it is retried", device=self.name)
        with self._lock:
            if message.key in self._held:
                raise StorageError(f"{self._describe()}: key {message.key} is already held "
                                   f"(keys are never reused)", device=self.name, key=message.key)
            self._held[message.key] = (message.size, refs)
            self._bytes += message.size
            self._pending.write(message, refs)

    def remove(self, key: int, queue: str) -> None:
        self._check_open()
        with self._lock:
            held = self._held.get(key)
            if held is None or queue not in held[1]:
                raise KeyError((key, queue))
            rest = tuple(q for q in held[1] if q != queue)
            if rest:
                self._held[key] = (held[0], rest)
            else:
                del self._held[key]
                self._bytes -= held[0]
            self._pending.remove(key, queue, last=not rest)

    def add_reference(self, key: int, queue: str) -> None:
        self._check_open()
        with self._lock:
            held = self._held.get(key)
            if held is None:
                raise KeyError(key)
            if queue in held[1]:
                return
            self._held[key] = (held[0], tuple(sorted((*held[1], queue))))
            self._pending.add_reference(key, queue)

    def put_meta(self, key: str, value: bytes | None) -> None:
        self._check_open()
        with self._lock:
            self._pending.put_meta(key, value)

    def iter_meta(self) -> Iterator[tuple[str, bytes]]:
        self._check_open()
        # Buffers first, store second: a batch committed in between is then in both, which is
        # harmless, whereas the other order could miss it in both.
        with self._lock:
            overlays = [dict(self._inflight.meta)] if self._inflight is not None else []
            overlays.append(dict(self._pending.meta))
        try:
            records = self._stored_meta()
        except self._backend_errors as exc:
            raise self._failure("reading the catalog", exc) from exc
        for overlay in overlays:
            for name, value in overlay.items():
                if value is None:
                    records.pop(name, None)
                else:
                    records[name] = value
        return iter(sorted(records.items()))

    def read(self, key: int) -> StoredMessage:
        self._check_open()
        with self._lock:
            if key not in self._held:
                raise KeyError(key)
            for batch in (self._pending, self._inflight):
                if batch is not None and key in batch.messages:
                    return batch.messages[key][0]
        # Held and not buffered, so committed: a batch leaves _inflight only after its commit, and
        # only the broker thread (ours) can free it meanwhile.
        try:
            message = self._read_stored(key)
        except self._backend_errors as exc:
            raise self._failure(f"reading message {key}", exc) from exc
        if message is None:
            raise StorageError(f"{self._describe()}: message {key} is held but missing from the store "
                               f"(was it changed behind the broker's back?)", device=self.name, key=key)
        return message

    def flush(self) -> None:
        """Nothing to do: the batch is handed to the server in one transaction by :meth:`sync`."""

    def begin_unit(self) -> None:
        with self._lock:
            self._unit_depth += 1
            self._unit_owner = threading.get_ident()

    def end_unit(self) -> None:
        with self._lock:
            self._unit_depth -= 1
            if self._unit_depth == 0:
                self._unit_closed.notify_all()

    def sync(self) -> None:
        self._check_open()
        with self._sync_lock:
            with self._lock:
                if self._unit_depth and self._unit_owner != threading.get_ident():
                    # another thread is inside a unit: commit it whole, after its end
                    self._unit_closed.wait_for(lambda: self._unit_depth == 0, timeout=30.0)
                batch = self._pending
                if not batch:
                    return
                self._pending = WriteBatch()
                self._inflight = batch
            started = time.perf_counter()
            try:
                self._commit(batch)
            except BaseException as exc:
                with self._lock:
                    batch.absorb(self._pending)
                    self._pending = batch
                    self._inflight = None
                if isinstance(exc, self._backend_errors):
                    raise self._failure("commit", exc) from exc
                raise
            elapsed = time.perf_counter() - started
            with self._lock:
                self._inflight = None
                self._online = True
                self._latency = elapsed if self._latency == 0.0 else 0.8 * self._latency + 0.2 * elapsed

    def status(self) -> DeviceStatus:
        extra = self._status_extra()     # may probe the server and flip _online
        with self._lock:
            if not self._online and self._last_error:
                extra["last_error"] = self._last_error
            return DeviceStatus(
                name=self.name, kind=self.kind, messages=len(self._held), bytes_used=self._bytes,
                errors=self._errors, write_latency_s=self._latency,
                online=self._online and self._opened, extra=extra,
            )
