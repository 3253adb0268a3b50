"""A bulk SEND's rows waiting in a queue as one unit: a *bulk block* (spec/spark.md §7.1).

The rows of one bulk SEND to a queue are stored as one record (the SEND's own body, as a retained log's
segment is: bulk_rows.segment_record) and wait in the queue's backlog as one run (backlog.py). A row
becomes a message object only when the queue takes it from the backlog for its ready index, so placing
a frame costs the broker a few operations whatever its row count, and a consumer that keeps up makes the
same objects a SEND-by-SEND producer would have, no more.

Rows are settled one by one (an ACK, an expiry, a dead-letter move, a purge): the block keeps which of
its rows are gone and, for a consumer that must acknowledge, each row's delivery count while it is out.
The stored record is released when its last row is gone. Until then, a block whose record a device keeps
has a catalog record ``rows:<record key>:<queue>`` (spec/storage.md §11) saying which rows are gone and
the counts, rewritten with the next barrier after a change (as a removal rides with the next flush), so
recovery brings back exactly the rows not settled, with their counts.

A row is known by its *offset*: its sequence number minus the block's first (the frame's rows have
consecutive numbers), which survives a restart whatever rows recovery leaves out.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pymq_server.broker import segments
from pymq_server.broker.quarantine import reason_of

if TYPE_CHECKING:
    from pymq_server.broker.message import BrokerMessage

log = logging.getLogger("pymq.broker")

#: the catalog record of a stored block's settled rows: ``rows:<record key>:<queue name>`` (store.py)
STATE_PREFIX = "rows:"
#: the header of a row's stand-in when the row could not be made into a message: why (backlog.py moves it
#: to the dead-letter queue with that reason; a browse shows it)
UNREADABLE = "pymq-unreadable-row"


def _offset(value: Any) -> int:
    """A row offset or count from the catalog record, within what Arrow's int64 arithmetic takes."""
    return max(0, min(int(value), 1 << 62))


class BulkBlock:
    """The rows of one bulk SEND in one queue (module docstring)."""

    __slots__ = ("rows", "holder", "queue", "destination", "first_seq", "first_key", "stored", "at",
                 "left", "done_below", "done_above", "counts", "recorded", "producer", "client_id", "user",
                 "_segment", "possibly_delivered")

    def __init__(self, rows: Any, holder: BrokerMessage, queue: str, first_key: int, stored: bool,
                 first_seq: int | None = None) -> None:
        self.rows = rows                   # the completed rows still to take (log schema, segments.py)
        self.holder = holder               # the message object standing for the stored record
        holder.refs += 1                   # one holder of it (with a log's segment, other queues' blocks)
        self.queue = queue                 # the queue's (storage) name
        self.destination = holder.destination
        self.first_seq = holder.seq if first_seq is None else first_seq
        self.first_key = first_key
        self.stored = stored               # a device keeps the record with a reference for ``queue``
        self.at = 0                        # rows[:at] are message objects already
        self.left = rows.num_rows          # rows not settled yet (taken or not)
        self.done_below = 0                # every offset below it is settled (or was never in the block)
        self.done_above: set[int] = set()  # settled offsets above done_below
        self.counts: dict[int, int] = {}   # offset -> delivery count, while out to a consumer that acks
        #: recovered after an unclean end (spec/ha.md §3.2): every row counts as delivered at least once
        self.possibly_delivered = False
        self.recorded = False              # a catalog record of its state exists (stored blocks)
        self._segment: segments.Segment | None = None     # the rows as a sealed segment (range reads)
        self.producer = ""                 # the producing connection (no-local), its client id and user
        self.client_id: str | None = None
        self.user: str | None = None

    # -- rows to message objects ------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        """Rows not taken yet (they count in the queue's backlog)."""
        return self.rows.num_rows - self.at

    def _made(self, start: int, stop: int) -> list[BrokerMessage]:
        from pymq_server.broker.message import BrokerMessage
        seqs = self.rows.column(0).slice(start, stop - start).to_pylist()
        key0 = self.first_key - self.first_seq
        return segments.materialize(self.rows, self.destination, [key0 + s for s in seqs], BrokerMessage,
                                    start, stop)

    def _made_safely(self, start: int, stop: int) -> list[BrokerMessage]:
        """:meth:`_made`, with a row that cannot become a message replaced by a stand-in saying why
        (:data:`UNREADABLE`), which the backlog dead-letters instead of delivering.  Defence in depth:
        every row passed bulk_rows.read_bulk's checks, at the SEND or at recovery, so this is for what
        those checks do not foresee — a consumer must never be closed with a generic error for a row."""
        try:
            return self._made(start, stop)
        except Exception as exc:  # noqa: BLE001 - whatever it is, one row must not poison the queue
            log.error("rows %d-%d of bulk record %s in %s could not be made into messages (%s): looking at "
                      "them one by one", start, stop - 1, self.holder.key, self.queue, reason_of(exc))
        out: list[BrokerMessage] = []
        for row in range(start, stop):
            try:
                out += self._made(row, row + 1)
            except Exception as exc:  # noqa: BLE001 - as above
                from pymq_server.broker.message import BrokerMessage
                seq = int(self.rows.column(0)[row].as_py())
                key = self.first_key - self.first_seq + seq
                out.append(BrokerMessage(key, f"ID:unreadable-{key}", self.destination, seq,
                                         {UNREADABLE: reason_of(exc)}, b"", True, 4, 0, 0))
        return out

    def take(self, n: int) -> list[tuple[BrokerMessage, int]]:
        """The next ``n`` rows (at most) as messages of this block, with their delivery counts."""
        start = self.at
        stop = min(start + n, self.rows.num_rows)
        self.at = stop
        made = self._made_safely(start, stop)
        counts = self.counts
        first_seq = self.first_seq
        floor = 1 if self.possibly_delivered else 0
        producer, client_id, user = self.producer, self.client_id, self.user
        out = []
        for message in made:
            message.bulk = self
            message.producer, message.client_id, message.user = producer, client_id, user
            out.append((message, max(floor, counts.get(message.seq - first_seq, 0)) if counts else floor))
        return out

    def waiting_rows(self, lo: int = 0, hi: int | None = None) -> tuple[segments.Segment, int, int]:
        """(the rows as a sealed segment, start, stop): the rows not taken yet with ``lo <= seq < hi``,
        found by bisection (rows are in sequence order) for range reads, which slice them in Arrow."""
        seg = self._segment
        if seg is None:
            seg = self._segment = segments.Segment(self.rows)
        start = max(self.at, seg.index(lo)) if lo else self.at
        stop = len(seg) if hi is None else seg.index(hi, start)
        return seg, start, max(start, stop)

    def peek(self, lo: int = 0, hi: int | None = None, step: int = 256) -> Iterator[BrokerMessage]:
        """The rows not taken yet with ``lo <= seq < hi``, as messages that are not the queue's (browsing,
        range reads per message), made a step at a time as the reader goes."""
        _, start, stop = self.waiting_rows(lo, hi)
        for at in range(start, stop, step):
            yield from self._made_safely(at, min(at + step, stop))

    # -- settling rows ----------------------------------------------------------------------------
    def settle(self, message: BrokerMessage) -> bool:
        """Row ``message`` is gone from the queue; True when it was the block's last."""
        offset = message.seq - self.first_seq
        if self.counts:
            self.counts.pop(offset, None)
        if offset == self.done_below:
            below = offset + 1
            above = self.done_above
            while below in above:
                above.discard(below)
                below += 1
            self.done_below = below
        else:
            self.done_above.add(offset)
        self.left -= 1
        return self.left == 0

    def delivered(self, message: BrokerMessage, count: int) -> None:
        self.counts[message.seq - self.first_seq] = count

    # -- the catalog record -----------------------------------------------------------------------
    def state(self) -> bytes:
        """The catalog record: ``{"below": n, "done": [[a, b], ...], "counts": [[offset, count], ...]}``,
        settled offsets as ``below`` and half-open ranges above it (spec/storage.md §11)."""
        ranges: list[list[int]] = []
        for offset in sorted(self.done_above):
            if ranges and ranges[-1][1] == offset:
                ranges[-1][1] = offset + 1
            else:
                ranges.append([offset, offset + 1])
        # (offset, count) pairs sorted as they are: JSON writes a tuple as an array, so no list per row
        return json.dumps({"below": self.done_below, "done": ranges, "counts": sorted(self.counts.items())},
                          separators=(",", ":")).encode()

    def restore(self, state: bytes | None) -> None:
        """Recovery: leave out the rows the record says are settled, and give the others their counts.
        Offsets the rows no longer have (non-persistent rows, gone at a restart) count as settled."""
        import pyarrow.compute as pc

        below, done, counts = 0, [], []
        if state is not None:
            self.recorded = True
            try:
                record = json.loads(state)
                below = _offset(record["below"])
                done = [(_offset(lo), _offset(hi)) for lo, hi in record["done"]]
                counts = [(_offset(k), _offset(v)) for k, v in record["counts"]]
            except (ValueError, TypeError, KeyError) as exc:
                # not what this broker writes: every row comes back (at least once), none is lost
                log.error("the settled rows of bulk record %s in %s are unreadable (%s): all its rows come "
                          "back", self.holder.key, self.queue, exc)
                below, done, counts = 0, [], []
        offsets = pc.subtract(self.rows.column(0), self.first_seq)
        keep = pc.greater_equal(offsets, below)
        for lo, hi in done:
            keep = pc.and_(keep, pc.invert(pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, hi))))
        self.rows = self.rows.filter(keep)
        self._segment = None
        self.left = self.rows.num_rows
        present = set(pc.subtract(self.rows.column(0), self.first_seq).to_pylist())
        self.done_below = min(present) if present else 0
        last = max(present) if present else -1
        self.done_above = set(range(self.done_below, last + 1)) - present
        self.counts = {k: v for k, v in counts if k in present}
