"""A queue's backlog: messages waiting behind its ready index, most of them on disk (paging).

When memory is short (flow.py: the resident estimate above ``PAGE_OUT_AT`` of ``max_memory``), a new
message that only this queue holds does not wait in memory: it joins the backlog, and its bytes go to
disk. The queue takes messages back from the backlog's head when its ready index runs low and memory has
room (always at least one run when its consumers have nothing to take, so a drain never stalls).

A bulk SEND's rows join the backlog as one run too (a *block*, blocks.py), whatever the memory.

Order: the backlog is FIFO and lies behind every ready entry; once a queue has a backlog every new
message joins it, even when memory is no longer short, until it is empty — so messages come back in the
order they came (one that joins while memory has room waits in memory). Priorities order the ready index
only: a message of higher priority that arrives behind a backlog waits its turn there (as ActiveMQ's
store cursors do). Likewise a consumer's selector (or a message group another consumer owns) is matched
against what is in memory; when nothing there suits a consumer the queue reads further while memory has
room (upkeep.py ``_page_more``), but while memory is short, a queue whose in-memory window holds only
messages nobody may take reads no further (memory has room again once those are consumed or expire; a
known limit, spec/stomp.md §8).

Runs, oldest first:

* **held** — entries kept in memory: a message other queues share (paging it out would not free it), or
  a delayed one — and the newest heap-held messages while they collect into a batch;
* **batch** — heap-held messages (non-persistent, or on a queue that keeps no storage references)
  written as *one* non-persistent record of the paged store (seed 002: non-persistent pages are never
  logged and are freed unread at a restart, when such messages are gone anyway): one device index entry
  per batch, not per message. Record: per message ``key u64, seq u64, persistent u8, destination length
  u16, chosen length u16, rule length u16, frame length u32``, those strings (UTF-8), the stored frame;
* **stored** — messages a device already holds with a reference for this queue (persistent ones): only
  their keys stay in memory (8 bytes each); the bytes are read back from the device;
* **block** — the rows of a bulk SEND (blocks.py), in memory as the frame's Arrow batch, made into
  messages a step at a time as the queue takes them.

Refused writes (a full disk) keep the batch in memory: the memory limit then pauses producers as
before paging existed. Nothing here is durable state: after a restart recovery rebuilds queues from the
devices (and pages again if memory is short).
"""
from __future__ import annotations

import struct
from array import array
from collections import deque
from typing import TYPE_CHECKING, Any, cast
from collections.abc import Iterator

from pymq_server.broker.blocks import UNREADABLE
from pymq_server.broker.states import Event, transition
from pymq_server.broker.stored_form import decode_stored, encode_stored
from pymq_server.storage.device import StoredMessage

from pymq.errors import StorageError

if TYPE_CHECKING:
    from pymq_server.broker.flow import MemoryFlow
    from pymq_server.broker.message import BrokerMessage
    from pymq_server.broker.entry import Entry
    from pymq_server.storage.store import HoldingStore

#: a batch is written once its messages hold this many bytes (with their headers a record stays under the
#: quarter page a 64 KiB page holds inline: four records a page, no continuation pages)
BATCH_BYTES = 12 * 1024
BATCH_MESSAGES = 256
#: stored messages read back per step
STORED_STEP = 256
_HEAD = struct.Struct("<QQBHHHI")


class Pager:
    """What backlogs share: the memory budget (flow) and the store, whose paged file device (if any)
    takes batches."""

    def __init__(self, store: HoldingStore, flow: MemoryFlow) -> None:
        self.store = store
        self.flow = flow
        self.paged = 0                       # messages on disk in backlogs now (admin, tests)

    @property
    def batch_device(self) -> Any:
        return self.store.paging_device()

    def write_batch(self, entries: list[Entry], queue: str) -> tuple[Any, int] | None:
        """Write heap-held messages as one non-persistent record; (device, key), or None when refused."""
        device = self.batch_device
        if device is None:
            return None
        parts = []
        for entry in entries:
            m = entry.message
            frame = encode_stored(m)
            strings = [m.destination.encode(), (m.chosen or "").encode(), (m.rule or "").encode()]
            parts.append(_HEAD.pack(m.key, m.seq, m.persistent, *map(len, strings), len(frame)))
            parts.extend(strings)
            parts.append(frame)
        first = entries[0].message
        try:
            device.write(StoredMessage(first.key, first.destination, first.seq, False, b"".join(parts)), [queue])
        except StorageError:
            return None
        self.store.mark_dirty(device)
        memory = self.store.memory
        for entry in entries:
            memory.account(entry.message.size, -1)
            self.flow.paged_out(entry.message)
        self.flow.entries -= len(entries)        # the entries go; the batch record is their place now
        self.paged += len(entries)
        return device, first.key

    def read_batch(self, device: Any, key: int, queue: str | None) -> list[BrokerMessage]:
        """The messages of a batch; ``queue`` given: they are in memory again and the record goes."""
        data = device.read(key).data
        messages = []
        at = 0
        while at < len(data):
            mkey, seq, persistent, dlen, clen, rlen, flen = _HEAD.unpack_from(data, at)
            at += _HEAD.size
            destination = data[at:at + dlen].decode()
            chosen = data[at + dlen:at + dlen + clen].decode() or None
            rule = data[at + dlen + clen:at + dlen + clen + rlen].decode() or None
            at += dlen + clen + rlen
            message = decode_stored(StoredMessage(mkey, destination, seq, bool(persistent), data[at:at + flen]))
            at += flen
            message.chosen, message.rule = chosen, rule
            messages.append(message)
        if queue is not None:
            device.remove(key, queue)
            self.store.mark_dirty(device)
            memory = self.store.memory
            for message in messages:
                message.device = memory
                memory.account(message.size, 1)
                self.flow.paged_in(message)
            self.paged -= len(messages)
        return messages

    def drop_stored(self, message: BrokerMessage) -> None:
        """A stored message leaves memory; the device keeps it (and its reference for the queue). One
        still waiting to be written behind (spec/storage.md §9) is written now: it is read back later."""
        if self.store.waiting(message):
            self.store.write_waiting()
        self.flow.paged_out(message)
        self.flow.entries -= 1                   # its entry goes; the key in the run is its place now
        self.paged += 1

    def read_stored(self, device: Any, key: int, chosen: str | None, rule: str | None,
                    admit: bool) -> BrokerMessage:
        message = decode_stored(device.read(key))
        message.device, message.chosen, message.rule = device, chosen, rule
        if admit:
            self.flow.paged_in(message)
            self.paged -= 1
        return message


#: the runs of every empty backlog, never added to (Backlog._append gives a backlog its own deque: a deque
#: allocates its first 64-slot block when made, 760 bytes a queue that never pages)
NO_RUNS: deque[list] = cast("deque[list]", ())


class Backlog:
    """One queue's backlog (see the module's docstring)."""

    __slots__ = ("pager", "runs", "count")

    def __init__(self, pager: Pager | None) -> None:
        self.pager = pager
        # ["held", entries, bytes] | ["batch", device, key, n] | ["stored", ...] | ["block", BulkBlock]; an
        # empty backlog (most queues, most of the time) shares NO_RUNS: a deque is 760 bytes from birth
        self.runs: deque[list] = NO_RUNS
        self.count = 0

    def _append(self, run: list) -> None:
        runs = self.runs
        if runs is NO_RUNS:
            runs = self.runs = deque()
        runs.append(run)

    def _popleft(self) -> None:
        runs = self.runs
        runs.popleft()
        if not runs:
            self.runs = NO_RUNS       # drained: its deque goes

    def takes(self, entry: Entry, sole: bool) -> bool:
        """Whether a new ready entry joins the backlog (paged out or kept behind it) instead of the ready
        index: when the backlog is not empty (order), or memory is short and paging frees something — unless
        the queue has consumers and nothing ready, where the entry goes out at once (the backlog is read
        back when dispatch runs low, and nothing would run dispatch for a new message that waits there).

        Paging frees something only for a ``sole`` message, so an empty backlog never takes a shared one: the
        queue asks only when ``self.count or sole`` (MessageQueue.enqueue: a topic message's fan-out to
        subscriptions with nothing waiting does not call this once per subscription)."""
        pager = self.pager
        # (waiting consumers asked before memory: a queue being read asks flow.short() not at all; an empty
        # backlog is asked about a sole message only, see above)
        if pager is None or (not self.count and ((entry.queue.consumers and not entry.queue.ready.count)
                                                 or not pager.flow.short())):
            return False
        self.count += 1
        runs = self.runs
        last = runs[-1] if runs else None
        message = entry.message
        if not sole or not pager.flow.short():
            # shared (paging it out frees nothing), or memory has room: it waits in memory, behind the rest
            self._held(entry, last, False)
        elif entry.stored:
            device, chosen, rule = message.device, message.chosen, message.rule
            if last is None or last[0] != "stored" or last[1] is not device or last[2] != chosen or last[3] != rule:
                last = ["stored", device, chosen, rule, array("Q"), 0]
                self._append(last)
            last[4].append(message.key)
            message.refs -= 1
            pager.drop_stored(message)
        else:
            self._held(entry, last, True)
        return True

    def take_block(self, block: Any) -> int:
        """A bulk block joins the backlog's tail (blocks.py); how many rows it adds."""
        n = block.waiting
        if n:
            self._append(["block", block])
            self.count += n
        return n

    def _held(self, entry: Entry, last: list | None, pageable: bool) -> None:
        if last is None or last[0] != "held" or last[3] != pageable:
            last = ["held", [], 0, pageable]
            self._append(last)
        last[1].append(entry)
        last[2] += entry.message.size
        if pageable and (last[2] >= BATCH_BYTES or len(last[1]) >= BATCH_MESSAGES):
            queue = entry.queue.name
            assert self.pager is not None
            written = self.pager.write_batch(last[1], queue)
            if written is not None:
                for held in last[1]:
                    held.message.refs -= 1
                last[:] = ["batch", written[0], written[1], len(last[1])]
            else:
                last[3] = False           # refused: it stays in memory (the memory limit pauses producers)

    def take(self, queue: Any) -> list[Entry]:
        """Entries of the head run (or part of it), in memory again; the queue makes them ready."""
        from pymq_server.broker.entry import Entry   # (entry.py names Pager for type checking only)
        run = self.runs[0]
        kind = run[0]
        pager = self.pager
        assert pager is not None
        now = queue.host.clock()
        if kind == "held":
            self._popleft()
            entries = run[1]
        elif kind == "block":
            block = run[1]
            entries = []
            for message, deliveries in block.take(STORED_STEP):
                entry = Entry(message, queue, now, deliveries=deliveries)
                message.refs += 1
                if UNREADABLE in message.headers:
                    self._unreadable(queue, entry)
                    continue
                entries.append(entry)
            if not block.waiting:
                self._popleft()
        elif kind == "batch":
            self._popleft()
            entries = []
            for message in pager.read_batch(run[1], run[2], queue.name):
                entry = Entry(message, queue, now)
                message.refs += 1
                entries.append(entry)
        else:
            _, device, chosen, rule, keys, at = run
            step = keys[at:at + STORED_STEP]
            run[5] = at + len(step)
            if run[5] >= len(keys):
                self._popleft()
            entries = []
            for key in step:
                message = pager.read_stored(device, key, chosen, rule, True)
                entry = Entry(message, queue, now, True, device.deliveries(key).get(queue.name, 0))  # recovered
                message.refs += 1
                entries.append(entry)
        self.count -= len(entries)
        return entries

    def _unreadable(self, queue: Any, entry: Entry) -> None:
        """A block's row that could not be made into a message (blocks.py ``_made_safely``): dead-lettered
        with the reason, settled in its block, never delivered (a consumer closed with a generic error for
        it, and every one after it, was a poisoned queue: issue 24)."""
        self.count -= 1
        entry.state = transition(entry.state, Event.DEAD)
        queue.stats.dead_lettered += 1
        queue.host.dead_letter(entry, "the bulk row could not be made into a message: "
                               + entry.message.headers[UNREADABLE])
        queue._drop(entry)
        queue._depth_delta(-1)

    def messages(self, lo: int = 0, hi: int | None = None) -> Iterator[BrokerMessage]:
        """Every message of the backlog in order, read without taking them (browsing); a bulk block's
        rows only from sequence number ``lo`` (and below ``hi``), others whatever their number."""
        yield from self.pieces(lo, hi, blocks_as_rows=False)

    def pieces(self, lo: int = 0, hi: int | None = None, blocks_as_rows: bool = True) -> Iterator[Any]:
        """:meth:`messages`, with a bulk block's waiting rows as one (segment, start, stop) each (an Arrow
        range read slices them: no message made)."""
        pager = self.pager
        for run in list(self.runs):
            kind = run[0]
            if kind == "held":
                yield from (entry.message for entry in list(run[1]))
            elif kind == "block":
                if blocks_as_rows:
                    yield run[1].waiting_rows(lo, hi)
                else:
                    yield from run[1].peek(lo, hi)
            elif kind == "batch":
                yield from pager.read_batch(run[1], run[2], None)   # type: ignore[union-attr]
            else:
                _, device, chosen, rule, keys, at = run
                for key in keys[at:]:
                    if device.holds(key):
                        yield pager.read_stored(device, key, chosen, rule, False)  # type: ignore[union-attr]
