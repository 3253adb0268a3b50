"""One client connection as the broker sees it: frames in, frames out, and what they change.

The session is transport-neutral: the TCP adapter (server/net/tcp.py) feeds it bytes, the in-process
vm:// adapter (server/net/vm.py) feeds it parsed frames; both hand it a *link* to write through.  It
never blocks: authentication that needs a slow hash runs in a worker thread while later bytes wait.

Rules kept here (spec/stomp.md §5, §6):
* a receipt confirms every earlier frame of the connection and, for persistent SENDs, that their data
  is durable under the sync policy; receipts leave in order;
* every error is an ERROR frame with a ``message`` header (and ``receipt-id`` when the failing frame
  asked for a receipt), after which the connection closes — the broker keeps serving everyone else;
* when the connection goes away for any reason, its unacknowledged messages return to their queues at
  once, its open transactions are aborted and its non-durable subscriptions and temporary queues vanish.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Callable, Union

from pymq import errors
from pymq.errors import (InvalidHeader, PymqError, ProtocolError, ResourceLimit, TransactionError,
                         UnknownMessage, UnknownSubscription)
from pymq.protocol.connection import (Role, StompConnection, negotiate_heartbeat, negotiate_version,
                                      parse_heartbeat)
from pymq.protocol.frame import Frame
from pymq_server.admin import stomp_admin
from pymq_server.admin.stomp_admin import ADMIN_DESTINATION
from pymq_server.broker.acks import DeliveryLedger
from pymq_server.broker.consumer import AUTO, Consumer
from pymq_server.broker.receipts import ReceiptQueue
from pymq_server.broker.requests import (AckRequest, SendRequest, parse_ack, parse_ack_upto, parse_send,
                                         parse_subscribe, parse_unsubscribe)

log = logging.getLogger("pymq.session")

SERVER_NAME = "pymq/0.1"

#: what a transaction holds until COMMIT: its SENDs and its ACK/NACKs, in arrival order
TransactionOp = Union[SendRequest, AckRequest]


class BrokerSession:
    def __init__(self, broker, link, peer_host: str | None, conn_id: str) -> None:
        self.broker = broker
        self.link = link
        self.peer_host = peer_host
        self.id = conn_id
        cfg = broker.config
        self.conn = StompConnection(Role.SERVER, max_frame_size=cfg.max_frame_size,
                                    max_headers=cfg.max_headers)
        self.user = None
        self.client_id: str | None = None
        self.version = "1.0"
        self.consumers: dict[str, Consumer] = {}
        self.transactions: dict[str, list[TransactionOp]] = {}
        self.temp_queues: dict[str, object] = {}     # local name -> MessageQueue
        self.writable = True
        self.closed = False
        self.deliveries = DeliveryLedger()
        self.receipts = ReceiptQueue(self)
        self._held: list[bytes] | None = None        # bytes that arrived while input was held
        self._deferred: list[Frame] = []             # parsed frames waiting for input to resume
        self._browsed: set[str] = set()              # finished browse subscription ids
        self._browses: deque = deque()               # browses waiting for the outgoing buffer to drain
        self._pauses: set[str] = set()               # why input is paused (memory, full queues)
        self._redispatch: set = set()                # queues that got credit or messages back this batch
        self._closing_after_receipts = False
        self.sent = 0
        self.received = 0
        self._handlers: dict[str, Callable[[Frame], dict[str, str] | None]] = {
            "CONNECT": self._on_connect, "STOMP": self._on_connect, "SEND": self._on_send,
            "SUBSCRIBE": self._on_subscribe, "UNSUBSCRIBE": self._on_unsubscribe, "ACK": self._on_ack,
            "NACK": self._on_nack, "BEGIN": self._on_begin, "COMMIT": self._on_commit,
            "ABORT": self._on_abort, "DISCONNECT": self._on_disconnect,
        }

    # -- input -----------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self._held is not None:          # authenticating, or paused by producer flow control
            self._held.append(data)
            return
        self._consume(data)

    def _consume(self, data: bytes) -> None:
        frame = None
        conn = self.conn
        try:
            while True:
                frames = conn.parse(data)
                data = b""
                if not frames:
                    break
                for i, frame in enumerate(frames):
                    conn.receive_frame(frame)          # the state table, at the moment of handling
                    self._handle(frame)
                    if self.closed:
                        return
                    if self._held is not None:
                        # paused mid-batch: the frames already parsed wait with the bytes
                        self._deferred.extend(frames[i + 1:])
                        return
                if frame.command not in ("CONNECT", "STOMP"):
                    break  # the scanner only pauses after CONNECT; nothing else is buffered complete
        except PymqError as exc:
            self.fail(exc, frame)
        finally:
            if self._redispatch:
                self._dispatch_released()

    def _dispatch_released(self) -> None:
        """Dispatch the queues this batch of frames gave credit or messages back, once each, after the
        whole batch: messages NACKed by several frames of one read are all back in their queue before
        any is redelivered, so they go out first and in their original order (JMS)."""
        queues, self._redispatch = self._redispatch, set()
        for queue in queues:
            queue.dispatch()

    def pause_input(self, reason: str) -> None:
        """Stop taking frames from this connection (producer flow control: memory, a full queue)."""
        self._pauses.add(reason)
        if self._held is None:
            self._held = []
        self.link.pause_reading()

    def resume_input(self, reason: str) -> None:
        """Lift one reason to pause; frames flow again when none is left."""
        self._pauses.discard(reason)
        if self.closed or self._pauses:
            return
        self.link.resume_reading()
        self._resume()

    def forget_delivery(self, consumer: Consumer, entry) -> None:
        """The broker took back a delivery (delivery timeout): a late ACK for it is ignored."""
        self.deliveries.forget(consumer, entry)

    def _resume(self) -> None:
        """Handle what waited while input was held: deferred frames first, then the held bytes."""
        held, self._held = self._held, None
        try:
            while self._deferred:
                frame = self._deferred.pop(0)
                try:
                    self.conn.receive_frame(frame)
                    self._handle(frame)
                except PymqError as exc:
                    self.fail(exc, frame)
                    return
                if self.closed:
                    return
                if self._held is not None:       # paused again
                    self._held[:0] = held or []
                    return
        finally:
            if self._redispatch:
                self._dispatch_released()
        self._consume(b"".join(held) if held else b"")

    def frame_received(self, frame: Frame) -> None:
        """An already-parsed frame (vm:// transport)."""
        if self.closed:
            return
        try:
            self.conn.receive_frame(frame)
            self._handle(frame)
        except PymqError as exc:
            self.fail(exc, frame)
        finally:
            if self._redispatch:
                self._dispatch_released()

    def _handle(self, frame: Frame) -> None:
        self.received += 1
        extra = self._handlers[frame.command](frame)
        receipt = frame.headers.get("receipt")
        if receipt is not None and frame.command not in ("CONNECT", "STOMP", "DISCONNECT"):
            self.receipts.receipt(receipt, extra)

    # -- output ----------------------------------------------------------------------------------
    def send_frame(self, command: str, headers: dict, body: bytes = b"") -> None:
        if self.closed:
            return
        self.link.send_frame(self.conn, Frame(command, headers, body))

    def deliver(self, consumer: Consumer, entry) -> None:
        """Write one MESSAGE for ``entry`` to ``consumer`` (called by the queue's dispatcher)."""
        if consumer.ack_mode is AUTO:
            token = None
        else:
            ledger = self.deliveries
            if self.version == "1.2":
                ledger.next_token += 1
                token = str(ledger.next_token)
                ledger.tokens[token] = consumer
            else:
                token = entry.message.message_id
            consumer.unacked[token] = entry
            consumer.in_flight += 1
        entry.token = token
        self.sent += 1
        self.link.send_message(self.conn, consumer, entry, token if self.version == "1.2" else None)
        if token is None:
            entry.queue.complete(entry)

    def send_browse(self, sub_id: str, message) -> None:
        """One message of a browse (``browser:true``)."""
        self.link.send_browse(self.conn, sub_id, _BrowseEntry(message))

    def set_writable(self, writable: bool) -> None:
        """Backpressure from the transport: stop dispatching to this connection while its buffer is full."""
        if writable == self.writable:
            return
        self.writable = writable
        if writable:
            self._run_browses()
            for consumer in list(self.consumers.values()):
                consumer.queue.dispatch()

    def run_browse(self, cursor) -> None:
        """Run a browse (a generator that yields when the outgoing buffer is full) now, or after the
        browses already waiting; ``set_writable(True)`` resumes them in order."""
        self._browses.append(cursor)
        if len(self._browses) == 1:
            self._run_browses()

    def _run_browses(self) -> None:
        browses = self._browses
        while browses and self.writable and not self.closed:
            try:
                next(browses[0])
            except StopIteration:
                browses.popleft()

    # -- what the receipt queue needs --------------------------------------------------------------
    def write_receipt(self, receipt_id: str, extra: dict[str, str] | None) -> None:
        if self.closed:
            return
        headers = {"receipt-id": receipt_id}
        if extra:
            headers.update(extra)
        self.send_frame("RECEIPT", headers)
        if self._closing_after_receipts and not self.receipts.waiting:
            self.close()

    def call_soon(self, fn: Callable[[], None]) -> None:
        self.broker.call_soon(fn)

    def barrier(self, done: Callable[[BaseException | None], None]) -> None:
        self.broker.barrier(done)

    def receipt_failed(self, receipt_id: str, error: BaseException) -> None:
        """The data a receipt would confirm could not be made durable: ERROR naming that receipt."""
        if not isinstance(error, PymqError):
            error = errors.StorageError(f"storage failed: {type(error).__name__}: {error}")
        self.fail(error, receipt_id=receipt_id,
                  note="The messages sent since the last RECEIPT are not confirmed durable.")

    # -- errors and closing ------------------------------------------------------------------------
    def fail(self, exc: PymqError, frame: Frame | None = None, *, receipt_id: str | None = None,
             note: str = "") -> None:
        """Send ERROR for ``exc`` and close; the broker goes on serving everyone else."""
        if self.closed:
            return
        headers = errors.error_headers(exc)
        if frame is not None and frame.headers.get("receipt") is not None:
            headers["receipt-id"] = frame.headers["receipt"]
        elif receipt_id is not None:
            headers["receipt-id"] = receipt_id
        body = exc.message
        if frame is not None:
            body += f"\n\nThe failing frame was {frame.command}."
        if note:
            body += f"\n\n{note}"
        log.info("connection %s (%s): %s: %s", self.id, self.peer_host, exc.code, exc.message)
        try:
            self.link.send_frame(self.conn, Frame("ERROR", headers, body.encode("utf-8")))
        except ProtocolError:
            pass  # e.g. the state machine already closed; still close below
        self.close()

    def close(self) -> None:
        """Close the link (after flushing) and clean up."""
        if self.closed:
            return
        self.link.close()
        self.connection_lost()

    def connection_lost(self) -> None:
        """The transport is gone: return unacked messages, abort transactions, drop private state."""
        if self.closed:
            return
        self.closed = True
        self.conn.close()
        self.transactions.clear()
        for consumer in list(self.consumers.values()):
            self._remove_consumer(consumer, reason="connection closed")
        self.consumers.clear()
        self.deliveries.clear()
        for queue in list(self.temp_queues.values()):
            self.broker.delete_temp_queue(queue)
        self.temp_queues.clear()
        self.receipts.clear()
        self._browses.clear()
        self.broker.session_closed(self)

    # -- CONNECT ---------------------------------------------------------------------------------
    def _on_connect(self, frame: Frame) -> None:
        # the connection limit is checked here, after reading CONNECT, so the client reads the ERROR
        # instead of a reset that may discard it
        self.broker.session_opened(self)
        h = frame.headers
        version = negotiate_version(h.get("accept-version"))
        client_hb = parse_heartbeat(h.get("heart-beat"))
        login, passcode = h.get("login"), h.get("passcode")
        self.client_id = h.get("client-id") or None
        auth = self.broker.authenticator
        # the subject of a verified TLS client certificate, set by the transport adapter (mutual TLS)
        certificate = getattr(self.link, "certificate_subject", None)

        def finish(user=None, error: PymqError | None = None) -> None:
            if self.closed:
                return
            if error is not None:
                self.fail(error, frame)
                return
            self.user = user
            if self.client_id is not None:
                try:
                    self.broker.claim_client_id(self, self.client_id)
                except PymqError as exc:
                    self.fail(exc, frame)
                    return
            cfg = self.broker.config
            server_hb = (cfg.heartbeat_send_ms, cfg.heartbeat_recv_ms) if client_hb != (0, 0) else (0, 0)
            to_server, to_client = negotiate_heartbeat(client_hb, server_hb)
            self.version = version
            self.deliveries.version = version
            headers = {"version": version, "server": SERVER_NAME,
                       "heart-beat": f"{server_hb[0]},{server_hb[1]}", "session": self.id,
                       "user-name": user.name}
            self.send_frame("CONNECTED", headers)
            self.link.start_heartbeat(self, to_client, to_server)
            # frames pipelined after CONNECT wait in the scanner; parse them now with the version
            if self._held is None:
                self._held = []
            self._resume()

        if auth.needs_slow_check(login, passcode):
            self._held = []

            def work():
                return auth.authenticate(login, passcode, self.peer_host, certificate)

            def done(result, error):
                if error is not None and not isinstance(error, PymqError):
                    log.exception("authentication crashed", exc_info=error)
                    error = errors.AuthenticationFailed("authentication failed: internal error")
                finish(result, error)

            self.broker.run_in_thread(work, done)
        else:
            try:
                user = auth.authenticate(login, passcode, self.peer_host, certificate)
            except PymqError as exc:
                finish(error=exc)
                return
            finish(user)

    # -- SEND --------------------------------------------------------------------------------------
    def _on_send(self, frame: Frame) -> dict[str, str] | None:
        headers = frame.headers
        destination = headers["destination"]
        if destination.startswith("/pymq/"):
            if destination == ADMIN_DESTINATION:
                stomp_admin.handle(self, headers, frame.body)
                return None
            if destination.startswith("/pymq/cluster/") and self.is_cluster and self.broker.cluster is not None:
                self.broker.cluster.on_control(self, headers, frame.body)
                return None
        request = parse_send(headers, frame.body)
        if request.transaction is not None:
            self._tx_ops(request.transaction).append(request)
            return None
        message_id = self._send(request)
        if request.receipt is None or message_id is None:
            return None
        return {"message-id": message_id}      # so a producer can set JMSMessageID

    def _send(self, request: SendRequest) -> str | None:
        """The id the message got (None: dropped as a duplicate)."""
        message_id, stored = self.broker.send(self, request)
        if stored:
            self.receipts.unsynced = True
        if self.broker.memory_high:
            self.broker.block_producer(self)
        return message_id

    # -- SUBSCRIBE / UNSUBSCRIBE -------------------------------------------------------------------
    def _on_subscribe(self, frame: Frame) -> None:
        request = parse_subscribe(frame.headers)
        sub_id = request.id
        if sub_id in self.consumers:
            raise InvalidHeader(f"subscription id {sub_id!r} is already in use on this connection",
                                header="id")
        if len(self.consumers) >= self.broker.config.max_subscriptions_per_connection:
            raise ResourceLimit(f"more than {self.broker.config.max_subscriptions_per_connection} "
                                f"subscriptions on one connection")
        consumer = self.broker.subscribe(self, request)
        if consumer is not None:
            self.consumers[sub_id] = consumer
            consumer.queue.add_consumer(consumer)
            self.broker.consumer_added(self, consumer)
        else:
            # a browse is complete once its end marker is sent; an ActiveMQ-style client may still
            # UNSUBSCRIBE it, which must not be an error
            self._browsed.add(sub_id)

    def _on_unsubscribe(self, frame: Frame) -> None:
        request = parse_unsubscribe(frame.headers)
        if request.remove_durable is not None:
            # JMS Session.unsubscribe(name): delete a durable subscription that has no consumer here
            self.broker.remove_durable(self, request.remove_durable, request.shared)
            return
        sub_id = request.id
        consumer = self.consumers.pop(sub_id, None)
        if consumer is None and sub_id in self._browsed:
            self._browsed.discard(sub_id)
            return
        if consumer is None:
            raise UnknownSubscription(f"UNSUBSCRIBE of unknown subscription id {sub_id!r}",
                                      subscription=sub_id)
        self._remove_consumer(consumer, reason="unsubscribed")
        if request.drop_durable:
            self.broker.unsubscribe_durable(self, consumer)

    def _remove_consumer(self, consumer: Consumer, reason: str) -> None:
        consumer.active = False
        queue = consumer.queue
        queue.remove_consumer(consumer)
        pending = self.deliveries.drop_consumer(consumer)
        for entry in pending:
            queue.release(entry, failed=True, dispatch=False)
        if pending:
            queue.dispatch()
        self.broker.consumer_removed(self, consumer)

    # -- ACK / NACK --------------------------------------------------------------------------------
    def _on_ack(self, frame: Frame) -> None:
        headers = frame.headers
        if "pymq-ack-upto" in headers:
            self.broker.ack_upto(self, parse_ack_upto(headers))
            return
        request = parse_ack(headers, self.version)
        ledger = self.deliveries
        if ledger.stale and ledger.is_stale(request.token, self.id):
            return
        consumer = ledger.resolve(request, self.consumers)
        if request.transaction is not None:
            self._tx_ops(request.transaction).append(request)
            return
        for entry in ledger.take(consumer, request.token):
            entry.queue.complete(entry)
        self._redispatch.add(consumer.queue)

    def _on_nack(self, frame: Frame) -> None:
        request = parse_ack(frame.headers, self.version, nack=True)
        ledger = self.deliveries
        if ledger.stale and ledger.is_stale(request.token, self.id):
            return
        consumer = ledger.resolve(request, self.consumers)
        if request.transaction is not None:
            self._tx_ops(request.transaction).append(request)
            return
        self._settle(consumer, request)

    def _settle(self, consumer: Consumer, request: AckRequest) -> None:
        """Complete (ACK) or release (NACK) what ``request`` covers; dispatch waits for the end of the
        batch, so released messages are all back before any goes out again."""
        entries = self.deliveries.take(consumer, request.token)
        if request.nack:
            for entry in entries:
                entry.queue.release(entry, failed=True, requeue=request.requeue, dispatch=False)
        else:
            for entry in entries:
                entry.queue.complete(entry)
        self._redispatch.add(consumer.queue)

    # -- transactions ------------------------------------------------------------------------------
    def _tx_ops(self, tx: str) -> list[TransactionOp]:
        ops = self.transactions.get(tx)
        if ops is None:
            raise TransactionError(f"transaction {tx!r} was not begun on this connection", transaction=tx)
        if len(ops) >= self.broker.config.max_transaction_operations:
            raise ResourceLimit(f"transaction {tx!r} has more than "
                                f"{self.broker.config.max_transaction_operations} operations")
        return ops

    def _on_begin(self, frame: Frame) -> None:
        tx = frame.headers["transaction"]
        if tx in self.transactions:
            raise TransactionError(f"transaction {tx!r} is already active", transaction=tx)
        if len(self.transactions) >= self.broker.config.max_transactions_per_connection:
            raise ResourceLimit(f"more than {self.broker.config.max_transactions_per_connection} "
                                f"open transactions on one connection")
        self.transactions[tx] = []

    def _on_commit(self, frame: Frame) -> None:
        tx = frame.headers["transaction"]
        ops = self.transactions.pop(tx, None)
        if ops is None:
            raise TransactionError(f"COMMIT of unknown transaction {tx!r}", transaction=tx)
        for op in ops:
            if isinstance(op, SendRequest):
                self._send(op)
                continue
            try:
                consumer = self.deliveries.resolve(op, self.consumers)
            except (UnknownMessage, UnknownSubscription):
                continue  # released meanwhile (consumer gone) and already back in its queue
            self._settle(consumer, op)

    def _on_abort(self, frame: Frame) -> None:
        tx = frame.headers["transaction"]
        if self.transactions.pop(tx, None) is None:
            raise TransactionError(f"ABORT of unknown transaction {tx!r}", transaction=tx)

    # -- DISCONNECT --------------------------------------------------------------------------------
    def _on_disconnect(self, frame: Frame) -> None:
        for consumer in self.consumers.values():
            consumer.active = False     # nothing more is dispatched: it would only come back at close
        receipt = frame.headers.get("receipt")
        if receipt is None:
            self.close()
            return
        self._closing_after_receipts = True
        self.receipts.receipt(receipt)

    # -- temporary queues --------------------------------------------------------------------------
    def temp_queue(self, local: str, create: bool = True):
        queue = self.temp_queues.get(local)
        if queue is None and create:
            queue = self.broker.create_temp_queue(self, local)
            self.temp_queues[local] = queue
        return queue

    @property
    def is_cluster(self) -> bool:
        """Another node of the cluster (spec/cluster.md §2)."""
        return self.user is not None and "cluster" in self.user.roles

    def __repr__(self) -> str:
        return f"<BrokerSession {self.id} user={getattr(self.user, 'name', None)} {self.peer_host}>"


class _BrowseEntry:
    """What the links' ``send_browse`` reads: a message that is not a queue entry (log, range)."""

    __slots__ = ("message",)

    def __init__(self, message) -> None:
        self.message = message
