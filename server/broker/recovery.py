"""Layer 4, recovery: the broker as it was, rebuilt from storage before the first client connects.

Order: the catalog first — reserved sequence blocks, declared queues and ACLs, durable subscriptions —
then every stored message, handed to the queues its references name (a queue, an internal queue, a
durable subscription, or a retained log ``log:<destination>``; a bulk SEND's stored record becomes its
log's segment again, spec/spark.md §7). A message's sequence numbers are never
handed out again, its bytes count against the memory limit, and its dedup id re-enters the window. A
reference to a queue that no longer exists (its catalog record is gone) keeps the message in
``/queue/recovered`` rather than dropping it.

Nothing here talks to the cluster: the cluster node attaches afterwards and is told what recovery made
(Broker.attach_cluster).

Depends on: every layer below.
"""
from __future__ import annotations

import json
import logging
from typing import Any
from collections.abc import Iterable

from pymq_server.broker import bulk_rows
from pymq_server.broker.blocks import STATE_PREFIX, BulkBlock
from pymq_server.broker.acl import DestinationAcl
from pymq_server.broker.dedup import JOURNAL_PREFIX, DedupJournal, DuplicateWindow
from pymq_server.broker.destinations import Destinations
from pymq_server.broker.flow import MemoryFlow
from pymq_server.broker.log import RetainedLogs
from pymq_server.broker.message import now_ms
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.quarantine import BULK, CATALOG, MESSAGE, Quarantine, QuarantinedRecord, reason_of
from pymq_server.broker.requests import first_alias
from pymq_server.broker.sequences import SequenceBook
from pymq_server.broker.stored_form import decode_stored
from pymq_server.broker.subscriptions import Subscriptions
from pymq_server.broker.temporary import NAMES_KEY_RECORD
from pymq_server.storage.device import StoredMessage
from pymq_server.storage.store import HoldingStore, block_state_key

log = logging.getLogger("pymq.broker")

#: where a message goes whose queue the catalog no longer names
RECOVERED_QUEUE = "recovered"


class Recovery:
    def __init__(self, store: HoldingStore, seqs: SequenceBook, destinations: Destinations,
                 subscriptions: Subscriptions, logs: RetainedLogs, dedup: DuplicateWindow, flow: MemoryFlow,
                 quarantine: Quarantine | None = None, journal: DedupJournal | None = None) -> None:
        self.store = store
        self.seqs = seqs
        self.destinations = destinations
        self.subscriptions = subscriptions
        self.logs = logs
        self.dedup = dedup
        self.flow = flow
        self.quarantine = quarantine if quarantine is not None else Quarantine()
        self.journal = journal
        #: the store's last owner did not close it (spec/ha.md §3.2): every recovered message may have been
        #: delivered, so each comes back counted as delivered at least once (its next delivery is flagged)
        self.unclean = store.unclean
        #: catalog records of stored bulk blocks' settled rows (blocks.py), taken as their blocks come back
        self._block_states: dict[str, bytes] = {}

    def run(self) -> int:
        """Rebuild catalog state and queues from storage; returns the number of messages recovered."""
        self._catalog()
        count = self.messages(self.store.recover())
        if not self.store.unopened:
            # records of blocks no device holds (released, their catalog record not yet deleted)
            for key in self._block_states:
                self.store.put_meta(key, None)
            self._block_states.clear()
        return count

    def _catalog(self) -> None:
        reserved: dict[str, int] = {}
        durable: list[tuple[str, str, dict]] = []
        journal: list[tuple[str, str, int]] = []
        acls = self.destinations.acl.acls
        for key, value in self.store.iter_meta():
            try:
                if key.startswith("seq:"):
                    reserved[key[4:]] = int(value)
                elif key.startswith("dsub:"):
                    durable.append((key, key[5:], json.loads(value)))
                elif key.startswith("queue:"):
                    self.destinations.restore_queue(key[6:], json.loads(value))
                elif key.startswith("client:"):
                    self.subscriptions.restore_client_id(key[7:], json.loads(value))
                elif key.startswith("acl:"):
                    acls[key[4:]] = DestinationAcl.from_dict(json.loads(value))
                elif key.startswith(STATE_PREFIX):
                    self._block_states[key] = value
                elif key == NAMES_KEY_RECORD:
                    self.destinations.name_holders.key = bytes(value)     # re-claim tokens (temporary.py)
                elif key.startswith(JOURNAL_PREFIX) and self.journal is not None:
                    journal.extend(self.journal.restore(key, value))
            except Exception as exc:  # noqa: BLE001 - whatever a foreign record raises, the broker starts
                self._set_aside_meta(key, value, exc)
        self.seqs.load(reserved)
        # the persisted window first, oldest first: ids of messages still stored join it after (recovery)
        for destination, dedup_id, until in sorted(journal, key=lambda entry: entry[2]):
            self.dedup.remember(destination, dedup_id, until)
        for key, name, record in durable:
            try:
                self.subscriptions.restore(name, record)
            except Exception as exc:  # noqa: BLE001 - as above
                self._set_aside_meta(key, b"", exc)

    def _set_aside_meta(self, key: str, value: Any, exc: Exception) -> None:
        self.quarantine.add(QuarantinedRecord(CATALOG, self.store.catalog.name, key, reason_of(exc),
                                              len(value) if isinstance(value, (bytes, str)) else 0,
                                              at_ms=now_ms()))

    def messages(self, records: Iterable[tuple[Any, StoredMessage, list[str]]]) -> int:
        """Put recovered (device, stored message, references) back where the references say; how many.
        Also what a device opened late (it could not open at start-up) hands over."""
        count = 0
        seqs = self.seqs
        for device, stored, refs in records:
            # its numbers are never handed out again, whether it decodes or not
            seqs.observe("", stored.key)
            seqs.observe(stored.destination, stored.seq)
            try:
                message = decode_stored(stored)
                segment = bulk_rows.restored_segment(message, self.flow.config.max_frame_size)
            except Exception as exc:  # noqa: BLE001 - a record that does not decode is set aside, never fatal
                self._set_aside(device, stored, refs, exc)
                continue
            deliveries = device.deliveries(stored.key)      # per queue, recorded before the restart
            message.device = device
            self.flow.paged_in(message)          # held, counted without pausing anyone (nobody sends yet)
            dedup_id = first_alias(message.headers, "dedup-id")
            if dedup_id is not None:
                self.dedup.remember(message.destination, dedup_id)
            if segment is not None:
                rows, first_key = segment
                seqs.observe("", first_key + rows.num_rows)
                if rows.num_rows:
                    seqs.observe(stored.destination, rows.column(0)[-1].as_py())
                for row_dedup in rows.column("dedup_id").drop_null().to_pylist():
                    self.dedup.remember(stored.destination, row_dedup)
            sole = len(refs) == 1 and not refs[0].startswith("log:")     # paging it out frees its memory
            for ref in refs:
                if ref.startswith("log:"):
                    retained = self.logs.restore(ref[4:])
                    if segment is not None:
                        retained.append_segment(segment[0], segment[1], message)
                    else:
                        retained.append(message, True)
                    continue
                queue = self._queue_for(ref)
                if queue is None:
                    log.warning("recovered message %s references unknown queue %r; keeping it in /queue/%s",
                                message.message_id, ref, RECOVERED_QUEUE)
                    queue = self.destinations.queue(RECOVERED_QUEUE, create=True)
                    device.add_reference(stored.key, queue.name)
                    device.remove(stored.key, ref)
                if segment is not None:
                    self._block(queue, ref, message, *segment)
                    continue
                delivered = deliveries.get(ref, 0)
                if self.unclean and not delivered:
                    delivered = 1      # possibly delivered: flagged when it goes out (spec/ha.md §3.2)
                queue.enqueue(message, stored=True, deliveries=delivered, sole=sole)
            count += 1
        self.logs.end_restore()
        return count

    def _set_aside(self, device: Any, stored: StoredMessage, refs: list[str], exc: Exception) -> None:
        """Quarantine a stored record that does not decode (quarantine.py): left on its device with its
        references, and its blocks' catalog records of settled rows kept (not deleted as orphans)."""
        is_bulk = bulk_rows.SEGMENT_HEADER.encode() in bytes(stored.data[:4096])
        for ref in refs:
            self._block_states.pop(block_state_key(stored.key, ref), None)
        self.quarantine.add(QuarantinedRecord(BULK if is_bulk else MESSAGE, device.name, str(stored.key),
                                              reason_of(exc), len(stored.data), stored.destination, stored.seq,
                                              tuple(refs), now_ms(), device))

    def _block(self, queue: MessageQueue, ref: str, record: Any, rows: Any, first_key: int) -> None:
        """A queue's bulk block back (blocks.py): its rows but those its catalog record says are settled,
        with their delivery counts."""
        block = BulkBlock(rows, record, queue.name, first_key, True)
        block.restore(self._block_states.pop(block_state_key(record.key, ref), None))
        block.possibly_delivered = self.unclean
        if ref != queue.name and block.recorded:         # kept under /queue/recovered: the record follows
            self.store.put_meta(block_state_key(record.key, ref), None)
            self.store.block_changed(block)
        if not block.left:
            self.flow.block_done(block)
            return
        queue.enqueue_block(block)

    def _queue_for(self, ref: str) -> MessageQueue | None:
        if ref.startswith("/queue/$") and not ref.startswith("/queue/$vh."):     # (a vhost's: vhosts.py)
            return self.destinations.internal_queue(ref[len("/queue/"):])
        if ref.startswith("/queue/"):
            return self.destinations.queue(ref[len("/queue/"):], create=True)
        sub = self.subscriptions.find(ref)
        return sub.queue if sub is not None else None
