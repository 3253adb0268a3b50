"""Messages written in the application's own database transaction (seed 001), broker side.

An application that shares the SQL device's database calls ``producer.send(msg, transaction=conn)``:
the SDK inserts a *pending* row (a SEND frame, spec/storage.md "SQL device") with the application's
connection, so it commits or rolls back with the application's data — no two-phase commit.  This
claimer turns committed rows into messages: it is woken by the device's listener (PostgreSQL
``NOTIFY``, delivered only at commit; an in-process signal for SQLite), watched with the event loop's
``add_reader`` — nothing polls — and claims rows in the broker thread, where keys, sequence numbers
and routing are decided.  Claiming inserts the message rows and deletes the pending rows in one
database transaction, so a crash between the two is impossible and a row is claimed exactly once.
"""
from __future__ import annotations

import logging

from pymq.errors import PymqError
from pymq.protocol.scanner import FrameScanner
from pymq_server.broker import destination as dest
from pymq_server.broker.requests import parse_send
from pymq_server.storage.device import StoredMessage

log = logging.getLogger("pymq.apptx")

BATCH = 100


class PendingClaimer:
    def __init__(self, broker, device, loop) -> None:
        self.broker = broker
        self.device = device
        self.loop = loop
        self.listener = None
        self.claimed = 0
        self.discarded = 0

    def start(self) -> None:
        self.listener = self.device.pending_listener()
        self.loop.add_reader(self.listener.fileno(), self._readable)
        self.claim_all()          # rows committed before the listener existed

    def stop(self) -> None:
        if self.listener is not None:
            try:
                self.loop.remove_reader(self.listener.fileno())
            except (ValueError, OSError):
                pass
            self.listener.close()
            self.listener = None

    def _readable(self) -> None:
        try:
            woke = self.listener.drain()
        except PymqError as exc:
            log.error("pending-message listener of %s failed: %s", self.device.name, exc)
            return
        if woke:
            self.claim_all()

    def claim_all(self) -> None:
        while True:
            ready: list[tuple] = []
            try:
                claimed = self.device.claim_pending(lambda p: self._assign(p, ready), limit=BATCH)
            except PymqError as exc:
                log.error("claiming pending messages from %s failed: %s", self.device.name, exc)
                return
            broker = self.broker
            for message, targets in ready:
                message.device = self.device
                message.chosen = self.device.name
                broker.store.adopt(message)
                broker._held(message)
                for queue, durable in targets:
                    queue.enqueue(message, stored=durable)
            self.claimed += len(ready)
            if len(claimed) < BATCH:
                return

    def _assign(self, pending, ready: list):
        """Inside the claiming transaction: the message as this broker holds it, or None."""
        broker = self.broker
        try:
            frames = FrameScanner(max_frame_size=len(pending.data) + 1, version="1.2").feed(pending.data)
            if len(frames) != 1 or frames[0].command != "SEND":
                raise PymqError("not exactly one SEND frame")
            headers = dict(frames[0].headers)
            headers["destination"] = pending.destination
            kind, name = broker.resolve(pending.destination)
            if kind is dest.Kind.TEMP_QUEUE:
                raise PymqError("temporary queues cannot receive messages from database transactions")
            message = broker._new_message(None, parse_send(headers, frames[0].body), pending.destination)
        except PymqError as exc:
            log.error("discarding pending message %d for %s: %s", pending.id, pending.destination, exc)
            self.discarded += 1
            return None
        if kind is dest.Kind.QUEUE:
            queue = broker.get_queue(name)
            targets = [(queue, queue.durable)]
        else:
            topic = broker.get_topic(name)
            topic.published += 1
            targets = [(sub.queue, sub.durable) for sub in topic.targets(message)]
            if not targets:
                broker.dropped_no_subscriber += 1
                return None
        queues = [queue.name for queue, durable in targets if durable]
        if not queues:
            # only non-durable subscribers: the heap holds it, the database keeps nothing
            ready.append((message, [(q, False) for q, _ in targets]))
            return None
        from pymq_server.broker.broker import encode_stored
        stored = StoredMessage(message.key, message.destination, message.seq, message.persistent,
                               encode_stored(message))
        ready.append((message, targets))
        return stored, queues
