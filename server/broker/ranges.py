"""Layer 3, the range reader: sequence-number ranges of a destination, read without removing anything.

What a browse (SUBSCRIBE ``browser:true``, spec/stomp.md §9) reads: a destination's retained log when it
has one, else the live queue — a queue, a temporary queue, or a topic's durable subscription (which a
reader that owns it may create by reading it first). The reader hands back a :class:`Browse`; the
session writes its messages and then the ``browser:end`` marker with the bounds. A range asked in Arrow
(``pymq-format: arrow``, spec/spark.md §6) is an :class:`ArrowBrowse`: no message frames, one end marker
whose body is an Arrow IPC stream — slices of the log's sealed segments (and of a queue's bulk blocks),
or (a queue's messages, a selector) the messages chosen by the same rules one by one. Ranges of a queue
follow sequence numbers through the ready index (``ReadyIndex.by_seq``: a merge of sorted runs, no sort of
the queue per read).
``ack_upto`` completes the ready messages below a sequence number (a range reader that consumes,
spec/stomp.md §9).

Depends on: destinations (layer 1), subscriptions (layer 2), the retained logs and the sequence book.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator

from pymq_server.broker import segments, slices
from pymq_server.broker.clients import Client
from pymq_server.broker.destinations import Destinations, Kind
from pymq_server.broker.log import RetainedLog, RetainedLogs
from pymq_server.broker.message import BrokerMessage
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.requests import AckUptoRequest, RangeRequest
from pymq_server.broker.sequences import SequenceBook
from pymq_server.broker.subscriptions import Subscriptions

from pymq.errors import UnknownDestination

#: the most body bytes one Arrow range answer carries (spec/spark.md §6): a bound on the frame a browse holds
ARROW_MAX_BYTES = 16 * 1024 * 1024


class Browse:
    """One browse as a cursor: :meth:`next` gives the messages in order, then None; :meth:`end_marker`
    the closing frame's headers. The session writes while its connection's outgoing buffer has room and
    calls :meth:`resume` after a pause (a browse of a whole queue never holds more than
    ``write_buffer_high`` in the broker). ``source`` says what the range is read from (``log``, ``queue``,
    or ``none``: a topic with neither a log nor a subscription, where a reader can never read anything)."""

    #: the end marker's body (an Arrow answer carries its rows there, as views of the segments)
    end_body: bytes | segments.IpcPieces = b""

    def __init__(self, request: RangeRequest, candidates: Iterable[BrokerMessage], retained: RetainedLog | None,
                 selector: object, earliest: int, latest: int, now_ms: Callable[[], int],
                 queue: MessageQueue | None = None, source: str = "log") -> None:
        self.request = request
        self._candidates = iter(candidates)
        self._retained = retained
        self._queue = queue
        self.source = source
        self.max_bytes = request.max_bytes
        self._selector = selector
        self.earliest = earliest
        self.latest = latest
        self._now_ms = now_ms
        self.count = 0
        self._sent_bytes = 0
        self._next_seq: int | None = None
        self._exhausted = True

    def resume(self) -> None:
        """After a pause: a log is read again from the next sequence number (it may have been trimmed
        meanwhile, and a range of it is only valid until the loop runs something else); so is a range of a
        queue's ready index (entries may have been taken or added)."""
        request = self.request
        if self._retained is not None and self._next_seq is not None:
            self._candidates = self._retained.range(self._next_seq, request.to_seq)
        elif self._queue is not None and request.ranged:
            start = self._next_seq if self._next_seq is not None else request.from_seq or 0
            self._candidates = _queue_range(self._queue, start, request.to_seq)

    def next(self) -> BrokerMessage | None:
        """The next message to send, or None when the browse is complete."""
        for message in self._candidates:
            verdict = self._consider(message)
            if verdict:
                return message
            if verdict is None:
                return None
        return None

    def _consider(self, message: BrokerMessage) -> bool | None:
        """The range rules for the next candidate: True to send it, False to skip it (expired, stamped
        before ``pymq-from-timestamp``, refused by the selector), None when a limit ends the read before it."""
        request = self.request
        max_messages, max_bytes = request.max_messages, self.max_bytes
        if (max_messages is not None and self.count >= max_messages) or \
                (max_bytes is not None and self.count and self._sent_bytes >= max_bytes):
            self._exhausted = False
            return None
        self._next_seq = message.seq + 1
        from_ts = request.from_timestamp
        if message.expired(self._now_ms()) or (from_ts is not None and message.timestamp < from_ts):
            return False
        selector = self._selector
        if selector is not None and not selector.matches(message.selector_values()):  # type: ignore[attr-defined]
            return False
        self.count += 1
        self._sent_bytes += message.size
        return True

    @property
    def stopped(self) -> bool:
        """A limit (messages, bytes) ended the read before the range did."""
        return not self._exhausted

    @property
    def next_seq(self) -> int | None:
        """One past the last sequence number examined (None before any)."""
        return self._next_seq

    def end_marker(self) -> dict[str, str]:
        """The headers of the closing ``browser:end`` MESSAGE (after the messages were read)."""
        request = self.request
        next_seq = self._next_seq
        if self._exhausted:
            # the whole range was read: continue after it, but never past what exists yet
            end = self.latest + 1 if request.to_seq is None else min(request.to_seq, self.latest + 1)
            next_seq = max(next_seq or 0, end, request.from_seq or 0)
        elif next_seq is None:
            next_seq = request.from_seq if request.from_seq is not None else self.earliest
        return {"subscription": request.id, "destination": request.destination, "message-id": "browser-end",
                "browser": "end", "pymq-earliest-seq": str(self.earliest), "pymq-latest-seq": str(self.latest),
                "pymq-next-seq": str(next_seq), "pymq-count": str(self.count), "pymq-source": self.source}


class ArrowBrowse(Browse):
    """A range read answered in one frame (spec/spark.md §6): the end marker carries the rows as an Arrow
    IPC stream. A log without a selector is answered by slicing its sealed segments (no row touched);
    otherwise the messages are chosen one by one by :meth:`Browse.next`'s rules and built into one batch.
    The rows' bodies are capped at :data:`ARROW_MAX_BYTES` (the reader continues from ``pymq-next-seq``),
    so one answer never holds more than that in the broker. Built at once: nothing to pause or resume."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        request = self.request
        self.max_bytes = ARROW_MAX_BYTES if request.max_bytes is None else min(request.max_bytes, ARROW_MAX_BYTES)
        retained = self._retained
        if retained is not None and self._selector is None:
            batches, self.count, last, stopped = retained.read_arrow(
                request.from_seq or 0, request.to_seq, request.max_messages, self.max_bytes,
                request.from_timestamp, self._now_ms())
            self._next_seq = None if last is None else last + 1
            self._exhausted = not stopped
            self._sent_bytes = sum(_body_bytes(batch) for batch in batches)
        elif self._queue is not None and self._selector is None and request.ranged:
            batches = self._queue_rows()
        else:
            chosen = []
            message = Browse.next(self)
            while message is not None:
                chosen.append(message)
                message = Browse.next(self)
            batches = [segments.from_messages(chosen)] if chosen else []
        # the reader's columns only (pymq-columns): a projection of the same buffers, nothing copied
        schema, positions = segments.projected(request.columns)
        if positions is not None:
            batches = [batch.select(positions) for batch in batches]
        self.end_body = segments.ipc_pieces(schema, batches)

    def _queue_rows(self) -> list:
        """A queue's range in Arrow: its messages by the per-message rules, a bulk block's waiting rows
        sliced as a log's segment is (slices.select: the same rules, column-wise), in sequence order."""
        assert self._queue is not None
        request = self.request
        batches: list = []
        chosen: list = []
        now = self._now_ms()
        for item in _queue_range(self._queue, request.from_seq or 0, request.to_seq, rows=True):
            if isinstance(item, BrokerMessage):
                verdict = self._consider(item)
                if verdict is None:
                    break
                if verdict:
                    chosen.append(item)
                continue
            if chosen:
                batches.append(segments.from_messages(chosen))
                chosen = []
            seg, start, stop = item
            want = None if request.max_messages is None else request.max_messages - self.count
            budget = None if self.max_bytes is None else self.max_bytes - self._sent_bytes
            piece, kept, size, examined, full = slices.select(seg, start, stop, want, budget,
                                                              request.from_timestamp, now, self.count == 0)
            if piece is not None:
                batches.append(piece)
            self.count += kept
            self._sent_bytes += size
            if examined is not None:
                self._next_seq = examined + 1
            if not full:
                self._exhausted = False
                break
        if chosen:
            batches.append(segments.from_messages(chosen))
        return batches

    def next(self) -> BrokerMessage | None:
        return None                    # the rows travel in the end marker's body

    def resume(self) -> None:
        pass

    def end_marker(self) -> dict[str, str]:
        headers = super().end_marker()
        headers["content-type"] = segments.ARROW_STREAM
        # the answer's body bytes: a reader that asked for `seq` alone learns how the range's bytes are
        # laid out, and plans partitions of even size from it (spec/spark.md §2, split by bytes)
        headers["pymq-bytes"] = str(self._sent_bytes)
        return headers


def _body_bytes(batch) -> int:
    """The body bytes of a message batch's rows, from its offsets (O(1), a slice included)."""
    body = batch.column(batch.schema.get_field_index("body"))
    if not len(body):
        return 0
    offsets = memoryview(body.buffers()[1]).cast("B")
    first, last = body.offset, body.offset + len(body)
    return int.from_bytes(offsets[4 * last:4 * last + 4], "little", signed=True) - \
        int.from_bytes(offsets[4 * first:4 * first + 4], "little", signed=True)


def _queue_range(queue: MessageQueue, lo: int, hi: int | None, rows: bool = False) -> Iterator:
    """A queue's messages with ``lo <= seq < hi`` in sequence order: the ready index's, then the backlog's
    (paged messages are behind every ready one), read from disk as the range goes; with ``rows``, a bulk
    block's waiting rows as one (segment, start, stop) each instead of messages (backlog.py)."""
    yield from (e.message for e in queue.ready.by_seq(lo, hi))
    if queue.backlog.count:
        for item in queue.backlog.pieces(lo, hi, blocks_as_rows=rows):
            if isinstance(item, tuple) or (item.seq >= lo and (hi is None or item.seq < hi)):
                yield item


class RangeReader:
    def __init__(self, destinations: Destinations, subscriptions: Subscriptions, logs: RetainedLogs,
                 seqs: SequenceBook, now_ms: Callable[[], int]) -> None:
        self.destinations = destinations
        self.subscriptions = subscriptions
        self.logs = logs
        self.seqs = seqs
        self.now_ms = now_ms

    def browse(self, client: Client, request: RangeRequest) -> Browse:
        destinations = self.destinations
        destination = request.destination
        kind, name = destinations.resolve(destination)
        selector = self.subscriptions.compile_selector(request.selector)
        if kind is Kind.TEMP_TOPIC:
            # only its connection: another one learned the topic's message count from the bounds
            destinations.owned_temp_topic(client, destination, name, "browse")
        elif kind is not Kind.TEMP_QUEUE:
            # before anything exists because of this browse: a refused one creates no queue, topic,
            # log or durable subscription (a temporary queue is checked where it is handed out)
            destinations.acl.check(client.user, destination, "browse")
        # a durable subscription, or source:queue, reads the live queue even when a log exists (a
        # consuming reader acknowledges the queue: its ranges must come from the same place)
        use_log = request.source != "queue" and not request.durable_name
        retained = self.logs.get(destination) if use_log else None
        queue = None
        if retained is None:
            if kind is Kind.TEMP_QUEUE:
                queue = destinations.owned_temp_queue(client, destination, name, "browse")
            else:
                queue = self._queue_for(client, destination, request.durable_name, request.shared, "browse")
        from_seq, to_seq = request.from_seq, request.to_seq
        candidates: Iterable[BrokerMessage]
        if retained is not None:
            candidates = retained.range(from_seq or 0, to_seq)
        elif queue is None:
            candidates = ()
        elif request.ranged:
            # ranges follow sequence numbers: the ready index's sorted runs, merged (no sort of the queue)
            candidates = _queue_range(queue, from_seq or 0, to_seq)
        else:
            # whole-queue browsing: delivery order, then the backlog's paged messages (read as it goes)
            candidates = itertools.chain([e.message for e in queue.ready], queue.backlog.messages())
        earliest, latest = self.bounds(destination, queue, use_log=retained is not None)
        # a reader of a topic with neither a log nor a subscription learns at once that it can never read
        # anything there (spec/stomp.md §9)
        source = "log" if retained is not None else "queue" if queue is not None else "none"
        kind_of_browse = ArrowBrowse if request.arrow and segments.available() else Browse
        return kind_of_browse(request, candidates, retained, selector, earliest, latest, self.now_ms, queue, source)

    def bounds(self, destination: str, queue: MessageQueue | None, use_log: bool = True) -> tuple[int, int]:
        """(earliest available sequence, latest assigned sequence) of a destination's log or queue."""
        latest = self.seqs.peek(destination) - 1
        retained = self.logs.logs.get(destination) if use_log else None
        if retained is not None and len(retained):
            return retained.earliest, latest          # type: ignore[return-value]
        if retained is None and queue is not None:
            first = queue.ready.min_seq()
            if first is None and queue.backlog.count:
                first = next((m.seq for m in queue.backlog.messages()), None)
            if first is not None:
                return first, latest
        return latest + 1, latest

    def ack_upto(self, client: Client, request: AckUptoRequest) -> None:
        """Complete every ready message below ``request.upto`` in a queue or durable subscription."""
        queue = self._queue_for(client, request.destination, request.durable_name, request.shared, "consume")
        if queue is None:
            raise UnknownDestination(f"nothing to acknowledge on {request.destination!r}: give a queue, or a "
                                     f"topic with durable-subscription-name")
        queue.remove_below(request.upto)
        queue.stats.acked_upto = max(queue.stats.acked_upto, request.upto)

    def _queue_for(self, client: Client, destination: str, durable_name: str | None,
                   shared: bool, permission: str) -> MessageQueue | None:
        """The queue a reader names, ``permission`` checked before it is made."""
        kind, name = self.destinations.resolve(destination)
        if kind is Kind.QUEUE:
            return self.destinations.queue_for(client.user, name, permission)
        if kind is Kind.TOPIC and durable_name:
            return self.subscriptions.for_reader(client, name, durable_name, shared, permission)
        if kind is Kind.TOPIC:
            self.destinations.acl.check(client.user, destination, permission)
        elif kind is Kind.TEMP_QUEUE:
            return self.destinations.owned_temp_queue(client, destination, name, permission)
        elif kind is Kind.TEMP_TOPIC:
            self.destinations.owned_temp_topic(client, destination, name, permission)
        return None
