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
from typing import Callable

from pymq import errors
from pymq.errors import (AccessDenied, IllegalStateError, InvalidHeader, MissingHeader, PymqError,
                         ProtocolError, ResourceLimit, TransactionError, UnknownMessage,
                         UnknownSubscription)
from pymq.protocol.connection import (Role, State, StompConnection, negotiate_heartbeat, negotiate_version,
                                      parse_heartbeat)
from pymq.protocol.frame import Frame
from pymq_server.admin import stomp_admin
from pymq_server.admin.stomp_admin import ADMIN_DESTINATION
from pymq_server.broker.consumer import ACK_MODES, AUTO, CLIENT, Consumer

log = logging.getLogger("pymq.session")

SERVER_NAME = "pymq/0.1"
_ACK_MODES = {mode: mode for mode in ACK_MODES}


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
        self.transactions: dict[str, list] = {}
        self.temp_queues: dict[str, object] = {}     # local name -> MessageQueue
        self.writable = True
        self.closed = False
        self._acks: dict[str, Consumer] = {}         # 1.2 ack token -> consumer
        self._next_token = 0
        self._held: list[bytes] | None = None        # bytes that arrived while input was held
        self._deferred: list[Frame] = []             # parsed frames waiting for input to resume
        self._browsed: set[str] = set()              # finished browse subscription ids
        self._pauses: set[str] = set()               # why input is paused (memory, full queues)
        self._stale: set[str] = set()                # ack tokens the broker took back (timeouts)
        self._unsynced = False                      # wrote data a receipt must wait for
        self._barrier_seq = 0
        self._barrier_done = 0
        self._barrier_scheduled = False
        self._receipts: deque = deque()             # (barrier id, receipt id) waiting for durability
        self._closing_after_receipts = False
        self.sent = 0
        self.received = 0
        self.last_message_id: str | None = None
        self._handlers: dict[str, Callable[[Frame], None]] = {
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
        token = entry.token
        if token is None or consumer.unacked.pop(token, None) is None:
            return
        consumer.in_flight -= 1
        self._acks.pop(token, None)
        self._stale.add(token)

    def _resume(self) -> None:
        """Handle what waited while input was held: deferred frames first, then the held bytes."""
        held, self._held = self._held, None
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

    def _handle(self, frame: Frame) -> None:
        self.received += 1
        self._handlers[frame.command](frame)
        receipt = frame.headers.get("receipt")
        if receipt is not None and frame.command not in ("CONNECT", "STOMP", "DISCONNECT"):
            if frame.command == "SEND" and self.last_message_id is not None:
                # the id the broker gave the message, so a producer can set JMSMessageID
                self._receipt(receipt, {"message-id": self.last_message_id})
            else:
                self._receipt(receipt)

    # -- output ----------------------------------------------------------------------------------
    def send_frame(self, command: str, headers: dict, body: bytes = b"") -> None:
        if self.closed:
            return
        self.link.send_frame(self.conn, Frame(command, headers, body))

    def deliver(self, consumer: Consumer, entry) -> None:
        """Write one MESSAGE for ``entry`` to ``consumer`` (called by the queue's dispatcher)."""
        message = entry.message
        if consumer.ack_mode is AUTO:
            token = None
        else:
            if self.version == "1.2":
                self._next_token += 1
                token = str(self._next_token)
                self._acks[token] = consumer
            else:
                token = message.message_id
            consumer.unacked[token] = entry
            consumer.in_flight += 1
        entry.token = token
        self.sent += 1
        self.link.send_message(self.conn, consumer, entry, token if self.version == "1.2" else None)
        if token is None:
            entry.queue.complete(entry)

    def set_writable(self, writable: bool) -> None:
        """Backpressure from the transport: stop dispatching to this connection while its buffer is full."""
        if writable == self.writable:
            return
        self.writable = writable
        if writable:
            for consumer in list(self.consumers.values()):
                consumer.queue.dispatch()

    # -- errors and closing ------------------------------------------------------------------------
    def fail(self, exc: PymqError, frame: Frame | None = None) -> None:
        """Send ERROR for ``exc`` and close; the broker goes on serving everyone else."""
        if self.closed:
            return
        headers = errors.error_headers(exc)
        if frame is not None and frame.headers.get("receipt") is not None:
            headers["receipt-id"] = frame.headers["receipt"]
        body = exc.message
        if frame is not None:
            body += f"\n\nThe failing frame was {frame.command}."
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
        self._acks.clear()
        for queue in list(self.temp_queues.values()):
            self.broker.delete_temp_queue(queue)
        self.temp_queues.clear()
        self._receipts.clear()
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
    def _on_send(self, frame: Frame) -> None:
        destination = frame.headers["destination"]
        if destination.startswith("/pymq/"):
            if destination == ADMIN_DESTINATION:
                stomp_admin.handle(self, frame.headers, frame.body)
                return
            if destination.startswith("/pymq/cluster/") and self.is_cluster and self.broker.cluster is not None:
                self.broker.cluster.on_control(self, frame.headers, frame.body)
                return
        tx = frame.headers.get("transaction")
        if tx is not None:
            self._tx_ops(tx).append(("send", frame))
            return
        if self.broker.send(self, frame.headers, frame.body):
            self._unsynced = True
        if self.broker.memory_high:
            self.broker.block_producer(self)

    # -- SUBSCRIBE / UNSUBSCRIBE -------------------------------------------------------------------
    def _on_subscribe(self, frame: Frame) -> None:
        h = frame.headers
        destination = h["destination"]
        sub_id = h.get("id", destination)   # 1.0 allows no id: the destination identifies it
        if sub_id in self.consumers:
            raise InvalidHeader(f"subscription id {sub_id!r} is already in use on this connection",
                                header="id")
        if len(self.consumers) >= self.broker.config.max_subscriptions_per_connection:
            raise ResourceLimit(f"more than {self.broker.config.max_subscriptions_per_connection} "
                                f"subscriptions on one connection")
        ack = _ACK_MODES.get(h.get("ack", AUTO))   # the module's constants, so `is` compares work
        if ack is None:
            raise InvalidHeader(f"ack mode {h['ack']!r} is not one of auto, client, client-individual",
                                header="ack")
        prefetch = _prefetch(h, self.broker.config.default_prefetch if ack != AUTO else 0)
        consumer = self.broker.subscribe(self, sub_id, destination, ack, prefetch, h)
        if consumer is not None:
            self.consumers[sub_id] = consumer
            consumer.queue.add_consumer(consumer)
            self.broker.consumer_added(self, consumer)
        else:
            # a browse is complete once its end marker is sent; an ActiveMQ-style client may still
            # UNSUBSCRIBE it, which must not be an error
            self._browsed.add(sub_id)

    def _on_unsubscribe(self, frame: Frame) -> None:
        h = frame.headers
        durable_name = h.get("pymq-durable-name")
        if durable_name is not None:
            # JMS Session.unsubscribe(name): delete a durable subscription that has no consumer here
            self.broker.remove_durable(self, durable_name, (h.get("shared") or "").lower() == "true")
            return
        sub_id = h.get("id") or h.get("destination")
        consumer = self.consumers.pop(sub_id, None)
        if consumer is None and sub_id in self._browsed:
            self._browsed.discard(sub_id)
            return
        if consumer is None:
            raise UnknownSubscription(f"UNSUBSCRIBE of unknown subscription id {sub_id!r}",
                                      subscription=sub_id)
        self._remove_consumer(consumer, reason="unsubscribed")
        if h.get("durable-subscription-name") or h.get("activemq.subscriptionName") or \
                h.get("pymq-unsubscribe-durable") == "true":
            self.broker.unsubscribe_durable(self, consumer, h)

    def _remove_consumer(self, consumer: Consumer, reason: str) -> None:
        consumer.active = False
        queue = consumer.queue
        queue.remove_consumer(consumer)
        pending = list(consumer.unacked.values())
        consumer.unacked.clear()
        consumer.in_flight = 0
        for token in [t for t, c in self._acks.items() if c is consumer]:
            del self._acks[token]
        for entry in pending:
            queue.release(entry, failed=True)
        self.broker.consumer_removed(self, consumer)

    # -- ACK / NACK --------------------------------------------------------------------------------
    def _resolve(self, frame: Frame) -> tuple[Consumer, str]:
        h = frame.headers
        if self.version == "1.2":
            token = h["id"]
            consumer = self._acks.get(token)
            if consumer is None or token not in consumer.unacked:
                raise UnknownMessage(f"{frame.command} of unknown or already acknowledged message "
                                     f"(id {token!r})", id=token)
            return consumer, token
        token = h.get("message-id")
        if token is None:
            raise MissingHeader(f"{frame.command} frame is missing the required 'message-id' header")
        sub = h.get("subscription")
        if sub is not None:
            consumer = self.consumers.get(sub)
            if consumer is None:
                raise UnknownSubscription(f"{frame.command} names unknown subscription {sub!r}",
                                          subscription=sub)
            if token not in consumer.unacked:
                raise UnknownMessage(f"{frame.command} of unknown or already acknowledged message "
                                     f"{token!r} on subscription {sub!r}", id=token)
            return consumer, token
        for consumer in self.consumers.values():
            if token in consumer.unacked:
                return consumer, token
        raise UnknownMessage(f"{frame.command} of unknown or already acknowledged message {token!r}",
                             id=token)

    def _is_stale(self, frame: Frame) -> bool:
        """An ACK/NACK for a delivery the broker took back after its delivery timeout: ignored (the
        message is already back in its queue), once."""
        token = frame.headers.get("id") if self.version == "1.2" else frame.headers.get("message-id")
        if token in self._stale:
            self._stale.discard(token)
            log.info("connection %s acknowledged message %s after its delivery timeout; ignored",
                     self.id, token)
            return True
        return False

    def _take(self, consumer: Consumer, token: str) -> list:
        """Entries this ack/nack covers: cumulative in client mode, just the one otherwise."""
        unacked = consumer.unacked
        if consumer.ack_mode == CLIENT:
            taken = []
            for t in list(unacked):
                taken.append(unacked.pop(t))
                if self.version == "1.2":
                    self._acks.pop(t, None)
                if t == token:
                    break
        else:
            taken = [unacked.pop(token)]
            if self.version == "1.2":
                self._acks.pop(token, None)
        consumer.in_flight -= len(taken)
        return taken

    def _on_ack(self, frame: Frame) -> None:
        if "pymq-ack-upto" in frame.headers:
            self.broker.ack_upto(self, frame.headers)
            return
        if self._stale and self._is_stale(frame):
            return
        consumer, token = self._resolve(frame)
        tx = frame.headers.get("transaction")
        if tx is not None:
            self._tx_ops(tx).append(("ack", frame))
            return
        for entry in self._take(consumer, token):
            entry.queue.complete(entry)
        consumer.queue.dispatch()

    def _on_nack(self, frame: Frame) -> None:
        if self._stale and self._is_stale(frame):
            return
        consumer, token = self._resolve(frame)
        tx = frame.headers.get("transaction")
        if tx is not None:
            self._tx_ops(tx).append(("nack", frame))
            return
        self._nack(consumer, token, frame.headers.get("requeue", "true").lower() != "false")

    def _nack(self, consumer: Consumer, token: str, requeue: bool) -> None:
        for entry in self._take(consumer, token):
            entry.queue.release(entry, failed=True, requeue=requeue)
        consumer.queue.dispatch()

    # -- transactions ------------------------------------------------------------------------------
    def _tx_ops(self, tx: str) -> list:
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
        touched = set()
        for kind, op in ops:
            if kind == "send":
                if self.broker.send(self, op.headers, op.body):
                    self._unsynced = True
                continue
            try:
                consumer, token = self._resolve(op)
            except UnknownMessage:
                continue  # released meanwhile (consumer gone) and already back in its queue
            if kind == "ack":
                for entry in self._take(consumer, token):
                    entry.queue.complete(entry)
            else:
                for entry in self._take(consumer, token):
                    entry.queue.release(entry, failed=True,
                                        requeue=op.headers.get("requeue", "true").lower() != "false")
            touched.add(consumer.queue)
        for queue in touched:
            queue.dispatch()

    def _on_abort(self, frame: Frame) -> None:
        tx = frame.headers["transaction"]
        if self.transactions.pop(tx, None) is None:
            raise TransactionError(f"ABORT of unknown transaction {tx!r}", transaction=tx)

    # -- DISCONNECT and receipts -------------------------------------------------------------------
    def _on_disconnect(self, frame: Frame) -> None:
        for consumer in self.consumers.values():
            consumer.active = False     # nothing more is dispatched: it would only come back at close
        receipt = frame.headers.get("receipt")
        if receipt is None:
            self.close()
            return
        self._closing_after_receipts = True
        self._receipt(receipt)

    def _receipt(self, receipt_id: str, extra: dict | None = None) -> None:
        if self._unsynced:
            # one barrier per loop iteration covers every receipt of the batch of frames just read:
            # a pipelining producer costs one flush and one commit wait per read, not per message
            self._unsynced = False
            self._barrier_seq += 1
            if not self._barrier_scheduled:
                self._barrier_scheduled = True
                self.broker.runtime.call_later(0, self._issue_barrier)
        if not self._receipts and self._barrier_done >= self._barrier_seq:
            self._send_receipt(receipt_id, extra)
        else:
            self._receipts.append((self._barrier_seq, receipt_id, extra))

    def _issue_barrier(self) -> None:
        self._barrier_scheduled = False
        if self.closed:
            return
        barrier = self._barrier_seq
        self.broker.store.barrier(lambda: self._barrier_complete(barrier))

    def _barrier_complete(self, barrier: int) -> None:
        if barrier > self._barrier_done:
            self._barrier_done = barrier
        receipts = self._receipts
        while receipts and receipts[0][0] <= self._barrier_done and not self.closed:
            _, receipt_id, extra = receipts.popleft()
            self._send_receipt(receipt_id, extra)

    def _send_receipt(self, receipt_id: str, extra: dict | None = None) -> None:
        if self.closed:
            return
        headers = {"receipt-id": receipt_id}
        if extra:
            headers.update(extra)
        self.send_frame("RECEIPT", headers)
        if self._closing_after_receipts and not self._receipts:
            self.close()

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


def _prefetch(headers: dict, default: int) -> int:
    for name in ("prefetch-count", "activemq.prefetchSize", "pymq-prefetch"):
        value = headers.get(name)
        if value is not None:
            try:
                n = int(value)
            except ValueError:
                raise InvalidHeader(f"header {name!r} must be an integer, got {value!r}", header=name) \
                    from None
            if n < 0:
                raise InvalidHeader(f"header {name!r} must not be negative", header=name)
            return n
    return default
