"""Retained logs: destinations kept in sequence order for replay (spec/stomp.md §9, spec/spark.md §8).

A :class:`RetainedLog` holds every message its destination receives, in sequence order, until retention
drops it (age, count or expiry, applied by housekeeping from the head).  Readers take ranges by sequence
number without removing anything; consumers of the destination are unaffected.

The rows live in two forms, one after the other in sequence order:

* sealed :class:`~pymq_server.broker.segments.Segment` s, Arrow batches built once: a bulk SEND's rows
  are one segment as they arrive; messages sent one by one are sealed ``SEGMENT_ROWS`` at a time (the
  segment keeps the message objects too, which hold their storage references);
* the open tail: the newest messages sent one by one, not sealed yet.

A per-message read (:meth:`range`) yields message objects, made from a bulk segment's rows on demand and
not kept; an Arrow read (:meth:`read_arrow`) slices segments (and builds the tail's rows for that read).
Persistent messages keep a storage reference named ``log:<destination>``; a bulk segment is one stored
record, released when its last row leaves the log.  Without pyarrow nothing is sealed: the log is its tail.

A log may hold more than memory: once message memory is short (``MemoryFlow.short``, the point where
queues page out), the oldest bulk segments whose stored record has every row and nothing but the log
holds them leave memory (``Segment.page_out``), keeping only sequence numbers, timestamps and expiry.
A read takes such a segment's rows back from its record, the way recovery rebuilds them
(``bulk_rows.restored_segment``), for that read only.  Without this a log kept for longer than memory
lasts paused every producer until retention trimmed it.
"""
from __future__ import annotations

import bisect
import fnmatch
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pymq.errors import StorageError
from pymq_server.broker import bulk_rows, segments, slices
from pymq_server.broker.message import BrokerMessage
from pymq_server.broker.segments import SEGMENT_ROWS, Segment
from pymq_server.broker.stored_form import decode_stored

if TYPE_CHECKING:
    from pymq_server.broker.queue import QueueHost

#: rows made into message objects at a time when a per-message read walks a bulk segment
_MATERIALIZE_CHUNK = 256


class RetainedLog:
    def __init__(self, host: QueueHost, destination: str, retention_ms: int = 0, retention_messages: int = 0) -> None:
        self.host = host
        self.destination = destination
        self.name = "log:" + destination
        self.retention_ms = retention_ms
        self.retention_messages = retention_messages
        self._segments: list[Segment] = []     # sealed, from index _first on
        self._firsts: list[int] = []           # each segment's first sequence number (for bisect)
        self._first = 0
        self._row = 0                          # first live row of the head segment
        self._tail: list = []                  # unsealed messages, from index _tail_head on
        self._tail_head = 0
        self._rows = 0
        self._stored: dict[int, bool] = {}     # message key -> holds a storage reference
        self._restoring: list | None = None    # recovery: rows handed over in any order
        self._unpaged = 0                      # segments below this index are paged out or not pageable
        self._loaded: tuple[Segment, Segment] | None = None    # the paged segment read last, and its rows
        self.trimmed = 0

    def __len__(self) -> int:
        return self._rows

    # -- appending --------------------------------------------------------------------------------------
    def append(self, message, stored: bool) -> None:
        """One message sent on its own (normally numbered above every row)."""
        if self._restoring is not None:
            self._restoring.append((message.seq, message, stored))
            return
        message.refs += 1
        if stored:
            self._stored[message.key] = True
        tail = self._tail
        if len(tail) > self._tail_head and tail[-1].seq > message.seq:
            # a device opened late hands its messages over while the log runs: keep the tail in order
            # (rows below a sealed segment's would need the segment rebuilt: they stay in the tail)
            bisect.insort(tail, message, lo=self._tail_head, key=_seq)
            self._rows += 1
            return
        self._tail.append(message)
        self._rows += 1
        if len(self._tail) - self._tail_head >= SEGMENT_ROWS and segments.available():
            self._seal()

    def append_segment(self, batch: Any, first_key: int, holder=None) -> None:
        """A bulk SEND's rows, as one sealed segment; ``holder`` is the message object of its stored record
        (None when it is not stored: non-persistent rows, a memory store)."""
        if self._restoring is not None:
            self._restoring.append((batch.column(0)[0].as_py(), (batch, first_key, holder), None))
            return
        self._seal()
        if holder is not None:
            holder.refs += 1
        self._push(Segment(batch, None, holder, first_key))
        self._rows += batch.num_rows
        pager = getattr(self.host, "pager", None)
        if pager is not None and pager.flow.short():
            self._page_out(pager)

    # -- paging (see the module's docstring) ----------------------------------------------------------
    def _page_out(self, pager: Any) -> None:
        """Page the oldest pageable segments out while memory is short (the newest stays: it was just
        appended and is the likeliest to be read)."""
        flow, store = pager.flow, pager.store
        k = settled = max(self._unpaged, self._first)    # below ``settled``: paged, or never pageable
        last = len(self._segments) - 1
        while k < last and flow.short():
            seg = self._segments[k]
            k += 1
            pageable = _pageable(seg)
            if pageable is None:
                continue          # queues' bulk blocks share its rows: pageable once they are done, not now
            if pageable:
                holder = seg.stored
                if store.waiting(holder):
                    store.write_waiting()      # written behind not yet: written now, read back later
                if holder.device.kind != "memory":     # (a write refused just now left it in the heap)
                    seg.page_out()
                    holder.body = b""          # its record has it; the rows were a view of it or built from it
                    flow.paged_out(holder)
            if settled == k - 1:
                settled = k
        self._unpaged = settled

    def _resident(self, seg: Segment) -> Segment:
        """``seg`` with its rows in memory: itself, or (paged out) its rows read back from its stored
        record, kept until another paged segment is read."""
        if not seg.paged:
            return seg
        loaded = self._loaded
        if loaded is not None and loaded[0] is seg:
            return loaded[1]
        holder = seg.stored
        restored = bulk_rows.restored_segment(decode_stored(holder.device.read(holder.key)), self.host.max_decoded)
        if restored is None or restored[0].num_rows != len(seg) or restored[1] != seg.first_key:
            raise StorageError(f"{self.destination}: the stored record {holder.key} of a paged-out segment "
                               f"does not hold its {len(seg)} rows")
        resident = Segment(restored[0], None, holder, seg.first_key)
        self._loaded = (seg, resident)
        return resident

    def _push(self, segment: Segment) -> None:
        self._segments.append(segment)
        self._firsts.append(segment.first)

    def _seal(self) -> None:
        """The open tail becomes a sealed segment (its message objects stay with it)."""
        live = self._tail[self._tail_head:]
        if not live or not segments.available():
            return
        self._push(Segment(segments.from_messages(live), live))
        self._tail, self._tail_head = [], 0

    # -- recovery -----------------------------------------------------------------------------------------
    def begin_restore(self) -> None:
        """Recovery hands rows over in storage order: collect them, sort once at the end."""
        if self._restoring is None:
            self._restoring = []

    def end_restore(self) -> None:
        items, self._restoring = self._restoring or [], None
        items.sort(key=lambda item: item[0])
        for _, item, stored in items:
            if stored is None:
                batch, first_key, holder = item
                self.append_segment(batch, first_key, holder)
            else:
                self.append(item, stored)

    # -- reading ------------------------------------------------------------------------------------------
    @property
    def earliest(self) -> int | None:
        """The first sequence number still held (None when the log is empty)."""
        if self._first < len(self._segments):
            return self._segments[self._first].seq(self._row)
        if self._tail_head < len(self._tail):
            return self._tail[self._tail_head].seq
        return None

    def _start(self, from_seq: int) -> tuple[int, int]:
        """(segment index, row) of the first live row with seq >= from_seq (segment index past the sealed
        ones means the tail)."""
        k = max(self._first, bisect.bisect_right(self._firsts, from_seq, self._first) - 1)
        while k < len(self._segments):
            seg = self._segments[k]
            row = seg.index(from_seq, self._row if k == self._first else 0)
            if row < len(seg):
                return k, row
            k += 1
        return k, 0

    def range(self, from_seq: int, to_seq: int | None) -> Iterator:
        """Message objects with from_seq <= seq < to_seq, in order, lazily (a reader that stops after a few
        costs a binary search); a bulk segment's rows are made into messages a chunk at a time and not
        kept.  The caller finishes with it before the broker's loop runs anything else (browses do)."""
        k, row = self._start(from_seq)
        while k < len(self._segments):
            seg = self._segments[k]
            stop = len(seg) if to_seq is None else seg.index(to_seq, row)
            if seg.messages is not None:
                for i in range(row, stop):
                    yield seg.messages[i]
            else:
                for lo in range(row, stop, _MATERIALIZE_CHUNK):
                    hi = min(stop, lo + _MATERIALIZE_CHUNK)
                    yield from self.materialize(seg, lo, hi)
            if stop < len(seg):
                return
            k, row = k + 1, 0
        tail = self._tail
        i = bisect.bisect_left(tail, from_seq, lo=self._tail_head, key=_seq)
        while i < len(tail):
            message = tail[i]
            if to_seq is not None and message.seq >= to_seq:
                return
            yield message
            i += 1

    def materialize(self, seg: Segment, lo: int, hi: int) -> list:
        """Message objects for rows ``lo:hi`` of a bulk segment (made for a reader, not kept)."""
        first = seg.first_key
        if first is None:
            raise ValueError("only a bulk append's segment is kept without message objects")
        seg = self._resident(seg)
        return segments.materialize(seg.batch, self.destination, range(first + lo, first + hi),
                                    BrokerMessage, lo, hi)

    def read_arrow(self, from_seq: int, to_seq: int | None, max_messages: int | None, max_bytes: int | None,
                   from_ts: int | None, now: int) -> tuple[list, int, int | None, bool]:
        """An Arrow range read (spec/spark.md §6): (batches, count, last examined seq, stopped by a limit).
        Sealed rows are sliced, not copied, unless expiry or ``from_ts`` removes rows inside a slice."""
        out: list = []
        count = sent = 0
        last = None
        k, row = self._start(from_seq)
        parts: list[tuple[Segment, int]] = [(self._segments[i], row if i == k else 0)
                                            for i in range(k, len(self._segments))]
        tail_from = bisect.bisect_left(self._tail, from_seq, lo=self._tail_head, key=_seq)
        if tail_from < len(self._tail):
            stop = len(self._tail) if to_seq is None else \
                bisect.bisect_left(self._tail, to_seq, lo=tail_from, key=_seq)
            if stop > tail_from:
                # the open tail's rows are built for this read only (they are sealed once, later)
                parts.append((Segment(segments.from_messages(self._tail[tail_from:stop])), 0))
        for seg, start in parts:
            stop = len(seg) if to_seq is None else seg.index(to_seq, start)
            if stop <= start:
                break
            want = None if max_messages is None else max_messages - count
            budget = None if max_bytes is None else max_bytes - sent
            piece, kept, size, examined, full = slices.select(self._resident(seg), start, stop, want, budget,
                                                                from_ts, now, first=count == 0)
            if piece is not None:
                out.append(piece)
            count += kept
            sent += size
            if examined is not None:
                last = examined
            if not full:
                return out, count, last, True
            if to_seq is not None and stop < len(seg):
                break
        return out, count, last, False

    # -- retention ----------------------------------------------------------------------------------------
    def trim(self, now_ms: int) -> int:
        """Drop rows from the head while retention says so (count, age, expiry); the number dropped."""
        dropped = 0
        while self._rows:
            if self._first < len(self._segments):
                seg = self._segments[self._first]
                seq_row = self._row
                stamp, expires = seg.timestamp(seq_row), seg.expires(seq_row)
            else:
                head = self._tail[self._tail_head]
                seg, stamp, expires = None, head.timestamp, head.expires
            too_many = self.retention_messages and self._rows > self.retention_messages
            too_old = self.retention_ms and stamp + self.retention_ms <= now_ms
            expired = expires and expires <= now_ms
            if not (too_many or too_old or expired):
                break
            self._drop_head(seg)
            dropped += 1
        self._compact()
        self.trimmed += dropped
        return dropped

    def _drop_head(self, seg: Segment | None) -> None:
        self._rows -= 1
        if seg is None:
            message = self._tail[self._tail_head]
            self._tail[self._tail_head] = None
            self._tail_head += 1
            self._drop(message)
            return
        if seg.messages is not None:
            self._drop(seg.messages[self._row])
        self._row += 1
        if self._row == len(seg):
            self._segments[self._first] = None      # type: ignore[call-overload]
            self._first += 1
            self._row = 0
            if self._loaded is not None and self._loaded[0] is seg:
                self._loaded = None
            if seg.paged:
                pager = self.host.pager
                assert pager is not None                  # only a log with a pager pages segments out
                pager.flow.paged_in(seg.stored)           # counted again as it goes (message_gone uncounts it)
            if seg.stored is not None:
                # a bulk segment's stored record goes with its last row
                self.host.release_reference(seg.stored, self.name)
                self._release(seg.stored)

    def _drop(self, message) -> None:
        if self._stored.pop(message.key, False):
            self.host.release_reference(message, self.name)
        self._release(message)

    def _release(self, message) -> None:
        message.refs -= 1
        if not message.refs:
            self.host.message_gone(message)

    def _compact(self) -> None:
        if self._first > 64 and self._first * 2 > len(self._segments):
            del self._segments[:self._first]
            del self._firsts[:self._first]
            self._unpaged = max(0, self._unpaged - self._first)
            self._first = 0
        if self._tail_head > 1024 and self._tail_head * 2 > len(self._tail):
            del self._tail[:self._tail_head]
            self._tail_head = 0

    def clear(self) -> int:
        n = self._rows
        while self._rows:
            self._drop_head(self._segments[self._first] if self._first < len(self._segments) else None)
        self._segments, self._firsts, self._first, self._row = [], [], 0, 0
        self._tail, self._tail_head = [], 0
        self._unpaged, self._loaded = 0, None
        return n


def _seq(message) -> int:
    return message.seq


def _pageable(seg: Segment) -> bool | None:
    """Whether ``seg`` can leave memory: True now; None not yet (queues' bulk blocks still share its
    record); False never (paged already, messages sent one by one, a record only memory holds, or rows a
    restart would drop: non-persistent ones are not in the record's rebuilt rows)."""
    holder = seg.stored
    if seg.paged or holder is None or seg.messages is not None or holder.device is None \
            or holder.device.kind == "memory":
        return False
    if holder.refs != 1:
        return None
    return segments.all_persistent(seg.batch)


class RetainedLogs:
    """Which destinations keep a log (the broker's ``retention`` setting: names or glob patterns, the first
    match wins), and their logs. A destination is matched once; the answer is remembered."""

    def __init__(self, retention: dict, host: QueueHost) -> None:
        self.retention = retention
        self.host = host
        self.logs: dict[str, RetainedLog] = {}
        self._checked: dict[str, RetainedLog | None] = {}

    def get(self, destination: str) -> RetainedLog | None:
        """The log ``destination`` keeps, or None (created on first use when retention names it)."""
        try:
            return self._checked[destination]
        except KeyError:
            pass
        found = None
        for pattern, settings in self.retention.items():
            if pattern == destination or fnmatch.fnmatchcase(destination, pattern):
                settings = settings or {}
                found = RetainedLog(self.host, destination, int(settings.get("ms", 0) or 0),
                                    int(settings.get("messages", 0) or 0))
                self.logs[destination] = found
                break
        self._checked[destination] = found
        return found

    def keeps(self, destination: str) -> bool:
        """``destination`` has a log now (an idle topic with a log is not deleted)."""
        return destination in self.logs

    def restore(self, destination: str) -> RetainedLog:
        """The log a recovered reference ``log:<destination>`` names, even if retention no longer does
        (what was kept stays readable until trimmed)."""
        found = self.get(destination)
        if found is None:
            found = self.logs[destination] = self._checked[destination] = RetainedLog(self.host, destination)
        found.begin_restore()        # recovery hands rows over in storage order: sorted once, at the end
        return found

    def end_restore(self) -> None:
        """Recovery has handed every stored row over: each log puts its rows in sequence order."""
        for retained in self.logs.values():
            retained.end_restore()

    def trim(self, now_ms: int) -> None:
        for retained in list(self.logs.values()):
            retained.trim(now_ms)

    def __iter__(self) -> Iterator[str]:
        """The destinations that keep a log."""
        return iter(self.logs)

    def __len__(self) -> int:
        return len(self.logs)
