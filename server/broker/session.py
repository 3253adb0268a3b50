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
  once, its open transactions are aborted and its non-durable subscriptions and temporary queues vanish
  (a link lost without DISCONNECT leaves its temporary queues for its client's re-claim: spec/ha.md §4.7).
"""
from __future__ import annotations

import logging
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Mapping

from pymq_server.broker.acks import DeliveryLedger
from pymq_server.broker.auth import ANONYMOUS, User
from pymq_server.broker.budgets import SELECTOR_ON_LOOP, ConnectionHoldings
from pymq_server.broker.consumer import Consumer
from pymq_server.broker.flow import MESSAGE_OVERHEAD
from pymq_server.broker.handshake import Handshake
from pymq_server.broker import vhosts
from pymq_server.broker.destination import ADMIN_DESTINATION
from pymq_server.broker.intake import LATER, FrameIntake
from pymq_server.broker.outlet import FrameOutlet, Link
from pymq_server.broker.receipts import ReceiptQueue
from pymq_server.broker.refusals import error_frame
from pymq_server.broker.routes import MAX_NAME, MAX_ROUTES, Routes
from pymq_server.broker.temporary import OwnTemporaries
from pymq_server.broker.requests import (FORMAT_HEADER, AckRequest, BulkSendRequest, SendRequest, SubscribeRequest,
                                         is_bulk, parse_ack, parse_ack_upto, parse_bulk_send, parse_send,
                                         parse_subscribe, parse_unsubscribe)
from pymq_server.broker.transactions import Transactions

from pymq import errors
from pymq.errors import InvalidHeader, ProtocolError, PymqError, ResourceLimit, UnknownMessage, UnknownSubscription
from pymq.protocol.connection import Role, StompConnection
from pymq.protocol.frame import Frame

if TYPE_CHECKING:
    from pymq_server.broker.broker import Broker
    from pymq_server.broker.queue import MessageQueue
    from pymq_server.broker.topic import Topic

log = logging.getLogger("pymq.session")

_NOTHING: Mapping[str, Any] = MappingProxyType({})

class BrokerSession(FrameIntake, FrameOutlet):
    def __init__(self, broker: Broker, link: Link, peer_host: str | None, conn_id: str) -> None:
        FrameIntake.__init__(self)
        FrameOutlet.__init__(self)
        self.broker = broker
        self.link = link
        self.peer_host = peer_host
        self.id = conn_id
        cfg = broker.config
        self.conn = StompConnection(Role.SERVER, max_frame_size=cfg.max_frame_size,
                                    max_headers=cfg.max_headers)
        self.user: User = ANONYMOUS
        self.is_cluster = False                  # another node of the cluster (spec/cluster.md §2): authenticated()
        self.client_id: str | None = None
        self.vhost = vhosts.DEFAULT              # chosen by CONNECT's host header (vhosts.py)
        self._vh_prefix = ""
        self._vh_max_memory: int | None = None   # the vhost's max_memory (vhosts.check_memory)
        self.version = "1.0"
        self.consumers: dict[str, Consumer] = {}
        self.transactions = Transactions(cfg.max_transactions_per_connection, cfg.max_transaction_operations,
                                         cfg.max_transaction_bytes, lambda: self.holdings.budget)
        self._holdings: ConnectionHoldings | None = None     # made with the first charge (the user is known)
        self.temporaries = OwnTemporaries(self)            # its temporary queues and topics by local name
        #: ``c12-<nonce>``: its temporaries' global names are ``tmp.<temporary_names>.<local>``, given at
        #: CONNECT, possibly those of an earlier connection of the same client (spec/ha.md §4.7)
        self.temporary_names = ""
        #: what this connection's SENDs to each destination decided (router.py; valid while nothing they
        #: depend on changed: routes.py)
        self.routes = Routes()
        #: names whose vhost name step is known to give the name itself: in the default vhost, every name this
        #: connection's SENDs were routed by (a route is made only after the step passed; stale or not, the
        #: step's answer is the name's alone); in another vhost none (a route is kept under the core's name, and
        #: every SEND there is checked against the vhost's max_memory with the step)
        self._stepped: Mapping[Any, Any] = self.routes     # (a link's routes have tuple keys too)
        #: a destination as the client names it -> the core's name, checked (_core_name: the name itself when the
        #: same, '' for the broker's /pymq/ names)
        self._core_names: dict[str, str] = {}
        self._disconnected = False
        self._refused = False
        self.closed = False
        self.deliveries = DeliveryLedger()
        self.receipts = ReceiptQueue(self)
        self._closing_after_receipts = False
        self.received = 0
        self._handlers: dict[str, Callable[[Frame], dict[str, str] | None]] = {
            "CONNECT": self._on_connect, "STOMP": self._on_connect, "SEND": self._on_send,
            "SUBSCRIBE": self._on_subscribe, "UNSUBSCRIBE": self._on_unsubscribe, "ACK": self._on_ack,
            "NACK": self._on_nack, "BEGIN": self._on_begin, "COMMIT": self._on_commit,
            "ABORT": self._on_abort, "DISCONNECT": self._on_disconnect,
        }

    @property
    def holdings(self) -> ConnectionHoldings:
        """What this connection holds besides messages, charged to its and its user's budgets."""
        if self._holdings is None:
            self._holdings = self.broker.budgets.holdings(self.user.name, self.id)
        return self._holdings

    def forget_delivery(self, consumer: Consumer, entry) -> None:
        """The broker took back a delivery (delivery timeout): a late ACK for it is ignored."""
        self.deliveries.forget(consumer, entry)

    def _handle(self, frame: Frame) -> None:
        self.received += 1
        # (a frame's destination is mapped into the vhost by the handlers that read one: _on_send, _named)
        extra = self._handlers[frame.command](frame)
        if extra is not LATER and "receipt" in frame.headers:
            self.frame_done(frame, extra)

    def _core_name(self, destination: str) -> str:
        """``destination`` as the core names it in this connection's vhost, checked (vhosts.core_name): the
        name itself when it is the same, '' for the broker's own /pymq/ names. Kept per name (the answer
        depends on the name, the vhost and is_cluster, each set once: enter_vhost and authenticated forget)."""
        if destination.startswith("/pymq/"):
            core = ""
        else:
            core = vhosts.core_name(destination, self._vh_prefix, self.is_cluster) or destination
        if len(self._core_names) < MAX_ROUTES and len(destination) <= MAX_NAME:
            self._core_names[destination] = core
        return core

    def _first_sight(self, destination: str, frame: Frame) -> str | None:
        """A SEND's destination not seen before: its core name (:meth:`_core_name`). None: ``frame`` was handled
        otherwise (a subclass's hook, called once per name and not per frame)."""
        return self._core_name(destination)

    def _named(self, frame: Frame) -> Frame:
        """``frame`` with its destination header, if it has one, as the core names it (SUBSCRIBE,
        UNSUBSCRIBE, a range ACK; a SEND's is mapped in :meth:`_on_send`)."""
        destination = frame.headers.get("destination")
        if destination is None:
            return frame
        core = self._core_names.get(destination)
        if core is None:
            core = self._core_name(destination)
        if not core or core == destination:
            return frame
        headers = dict(frame.headers)
        headers["destination"] = core
        return Frame(frame.command, headers, frame.body)

    def frame_done(self, frame: Frame, extra: dict[str, str] | None = None) -> None:
        receipt = frame.headers.get("receipt")
        if receipt is not None and frame.command not in ("CONNECT", "STOMP", "DISCONNECT"):
            self.receipts.receipt(receipt, extra)

    def run_off_loop(self, work: Callable[[], Any], done: Callable[[Any, BaseException | None], None]) -> None:
        self.broker.runtime.run_cpu_bound(work, done)

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
        """Send ERROR for ``exc`` (refusals.py) and close; the broker goes on serving everyone else."""
        if self.closed:
            return
        log.info("connection %s (%s): %s: %s", self.id, self.peer_host, exc.code, exc.message)
        self._refused = True            # ended by the broker: its temporary queues are not kept (spec/ha.md §4.7)
        try:
            self.link.send_frame(self.conn, error_frame(exc, frame, receipt_id=receipt_id, note=note,
                                                        vhost_prefix=self._vh_prefix))
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
        # a lost link's temporary queues are kept for its client's re-claim (spec/ha.md §4.7)
        self.temporaries.end(lost=not self._disconnected, refused=self._refused)
        self.receipts.clear()
        self._browses.clear()
        if self._holdings is not None:
            self.broker.budgets.connection_closed(self.user.name, self._holdings.budget)
        self.broker.session_closed(self)

    # -- CONNECT (handshake.py) ----------------------------------------------------------------------
    def _on_connect(self, frame: Frame) -> None:
        Handshake(self, frame).start()

    def hold_input(self) -> None:
        """Frames after this one wait until :meth:`connected` (a login checked in a worker thread)."""
        self._held = []

    def authenticated(self, user: User) -> None:
        """The connection acts as ``user`` from now on (what it may do, and whether it is a cluster node)."""
        self.user = user
        self.is_cluster = "cluster" in user.roles
        self._core_names.clear()
        self.routes.renew(-1)

    def enter_vhost(self, vhost: str, max_memory: int | None) -> None:
        self.vhost, self._vh_prefix = vhost, vhosts.prefix(vhost)
        self._vh_max_memory = max_memory
        self._stepped = self.routes if not self._vh_prefix and max_memory is None else _NOTHING
        self._core_names.clear()
        self.routes.renew(-1)

    def connected(self, version: str, headers: dict[str, str], to_client: int, to_server: int) -> None:
        """The handshake admitted this connection: CONNECTED with ``headers``, the heart-beats kept."""
        self.version = version
        self.deliveries.version = version
        self.send_frame("CONNECTED", headers)
        self.link.start_heartbeat(self, to_client, to_server)
        # frames pipelined after CONNECT wait in the scanner; parse them now with the version
        if self._held is None:
            self._held = []
        self._resume()

    # -- SEND --------------------------------------------------------------------------------------
    def _on_send(self, frame: Frame) -> dict[str, str] | None:
        headers = frame.headers
        destination = headers["destination"]
        if destination not in self._stepped:            # the vhost's name step, unless a route says it is done
            core = self._core_names.get(destination)
            if core is None:
                core = self._first_sight(destination, frame)
                if core is None:
                    return LATER    # handled otherwise (a multi-worker broker's session: server/cores/home.py)
            if core != destination:
                if not core:                            # the broker's own /pymq/ names
                    if destination == ADMIN_DESTINATION:
                        self.broker.admin_frames(self, headers, frame.body)
                        return None
                    if destination.startswith("/pymq/cluster/") and self.is_cluster:
                        self.broker.cluster_control(self, headers, frame.body)
                        return None
                else:                                   # a vhost's queue or topic
                    headers = dict(headers)
                    headers["destination"] = core
            if self._vh_max_memory is not None:         # (a vhost with a limit steps every SEND: _stepped)
                # before anything is parsed or made: a refused SEND places nothing and creates no queue
                memory = self.broker.flow.vhost_memory
                assert memory is not None
                vhosts.check_memory(self.vhost, self._vh_max_memory, memory.get(self.vhost, 0),
                                    len(frame.body) + MESSAGE_OVERHEAD)
        if FORMAT_HEADER in headers and is_bulk(headers):   # the look-up first: a call less per SEND
            return self._send_bulk(parse_bulk_send(headers, frame.body))
        request = parse_send(headers, frame.body)
        if request.transaction is not None:
            self.transactions.add(request.transaction, request)
            self.broker.flow.throttle(self)     # a producer still: paused while message memory is high
            return None
        message_id = self._send(request)
        if request.receipt is None or message_id is None:
            return None
        return {"message-id": message_id}      # so a producer can set JMSMessageID

    def _send_bulk(self, request: BulkSendRequest) -> dict[str, str] | None:
        """A bulk SEND (spec/spark.md §7); its RECEIPT carries the sequence block and the counts."""
        result = self.broker.send_bulk(self, request)
        if result.stored:
            self.receipts.unsynced = True
        return result.receipt_headers() if request.receipt is not None else None

    def _send(self, request: SendRequest, admitted: bool = False) -> str | None:
        """The id the message got (None: dropped as a duplicate); ``admitted``: a COMMIT's SEND."""
        message_id, stored = self.broker.send(self, request, admitted)
        if stored:
            self.receipts.unsynced = True
        return message_id

    # -- SUBSCRIBE / UNSUBSCRIBE -------------------------------------------------------------------
    def _on_subscribe(self, frame: Frame) -> dict[str, str] | None:
        request = parse_subscribe(self._named(frame).headers)
        sub_id = request.id
        if sub_id in self.consumers:
            raise InvalidHeader(f"subscription id {sub_id!r} is already in use on this connection",
                                header="id")
        if len(self.consumers) >= self.broker.config.max_subscriptions_per_connection:
            raise ResourceLimit(f"more than {self.broker.config.max_subscriptions_per_connection} "
                                f"subscriptions on one connection")
        if request.browse is not None:      # (spec/stomp.md §9; outlet.py writes it, one at a time)
            self.holdings.browse(sub_id)
            self.start_browse(self.broker.browse(self, request.browse))
            return None
        cost = self.holdings.subscription(sub_id, request.selector)     # before the selector is compiled
        text = request.selector
        if text is not None and len(text) > SELECTOR_ON_LOOP:
            # tens of milliseconds: compiled in a worker thread while the loop serves everyone else and this
            # connection's next frames wait (spec/selector.md §7)
            self.later(frame, "selector", lambda: self.broker.compile_selector(text),
                       lambda selector: self._subscribe(request, cost, selector))
            return LATER
        self._subscribe(request, cost, None)
        return None

    def _subscribe(self, request: SubscribeRequest, cost: int, selector: object) -> None:
        consumer = self.broker.subscribe(self, request, selector)
        consumer.cost = cost
        self.consumers[request.id] = consumer
        consumer.queue.add_consumer(consumer)
        self.broker.consumer_added(consumer)

    def _on_unsubscribe(self, frame: Frame) -> None:
        request = parse_unsubscribe(self._named(frame).headers)
        if request.remove_durable is not None:
            # JMS Session.unsubscribe(name): delete a durable subscription that has no consumer here
            self.broker.remove_durable(self, request.remove_durable, request.shared)
            return
        if request.delete_temporary is not None:      # JMS TemporaryQueue.delete() (spec/stomp.md §3)
            self.broker.delete_temporary(self, request.delete_temporary)
            return
        sub_id = request.id
        consumer = self.consumers.pop(sub_id, None)
        if consumer is None and self.holdings.forget_browse(sub_id):
            return
        if consumer is None:
            raise UnknownSubscription(f"UNSUBSCRIBE of unknown subscription id {sub_id!r}",
                                      subscription=sub_id)
        self._remove_consumer(consumer, reason="unsubscribed")
        self.holdings.budget.release(consumer.cost)
        if request.drop_durable:
            self.broker.unsubscribe_durable(consumer)

    def _remove_consumer(self, consumer: Consumer, reason: str) -> None:
        consumer.active = False
        queue = consumer.queue
        queue.remove_consumer(consumer)
        pending = self.deliveries.drop_consumer(consumer)
        for entry in pending:
            queue.release(entry, failed=True, dispatch=False)
        if pending:
            queue.dispatch()
        self.broker.consumer_removed(consumer)

    # -- ACK / NACK --------------------------------------------------------------------------------
    def _on_ack(self, frame: Frame) -> None:
        if "pymq-ack-upto" in frame.headers:
            self.broker.ack_upto(self, parse_ack_upto(self._named(frame).headers))
            return
        self._acknowledge(parse_ack(frame.headers, self.version))

    def _on_nack(self, frame: Frame) -> None:
        self._acknowledge(parse_ack(frame.headers, self.version, nack=True))

    def _acknowledge(self, request: AckRequest) -> None:
        ledger = self.deliveries
        if ledger.stale and ledger.is_stale(request.token, self.id):
            return
        if request.transaction is not None:
            ledger.resolve(request, self.consumers)      # an unknown delivery is refused at its ACK
            self.transactions.add(request.transaction, request)
            return
        # the read's ACKs are settled at one instant, the clock read for its first: the queues' depth figures
        # move once for the run (MessageQueue.complete); set back when the read's queues are dispatched
        now = self._acks_at
        if now is None:
            now = self.broker.clock()
        queue = ledger.settle(request, self.consumers, now)
        self._acks_at = now
        # dispatch waits for the end of the batch: released messages are all back before any goes out
        self._redispatch.add(queue)

    # -- transactions ------------------------------------------------------------------------------
    def _on_begin(self, frame: Frame) -> None:
        self.transactions.begin(frame.headers["transaction"])

    def _on_commit(self, frame: Frame) -> None:
        # all or nothing: every SEND is admitted before the first is applied (transactions.py)
        ops = self.transactions.commit(frame.headers["transaction"], self._admit)
        # one unit of the store: its sends and acknowledgements are durable together or not at all, across a
        # crash or a takeover (spec/ha.md §3.4)
        with self.broker.store.unit():
            for op in ops:
                if isinstance(op, SendRequest):
                    self._send(op, admitted=True)
                    continue
                try:
                    queue = self.deliveries.settle(op, self.consumers)
                except (UnknownMessage, UnknownSubscription):
                    continue  # released meanwhile (consumer gone) and already back in its queue
                self._redispatch.add(queue)

    def _admit(self, request: SendRequest, unit: dict[str, Any]) -> None:
        self.broker.admit(self, request, unit)

    def _on_abort(self, frame: Frame) -> None:
        self.transactions.abort(frame.headers["transaction"])

    # -- DISCONNECT --------------------------------------------------------------------------------
    def _on_disconnect(self, frame: Frame) -> None:
        self._disconnected = True           # an orderly end: its temporary names cannot be re-claimed here
        for consumer in self.consumers.values():
            consumer.active = False     # nothing more is dispatched: it would only come back at close
        receipt = frame.headers.get("receipt")
        if receipt is None:
            self.close()
            return
        self._closing_after_receipts = True
        self.receipts.receipt(receipt)

    # -- temporary queues and topics (charged to the connection's budget while they exist) ------------
    def temp_queue(self, local: str, create: bool = True) -> MessageQueue | None:
        return self.temporaries.queue(local, create)

    def temp_topic(self, local: str, create: bool = True) -> Topic | None:
        return self.temporaries.topic(local, create)

    def forget_temporary(self, kind: str, local: str) -> None:
        self.temporaries.forget(kind, local)

    def __repr__(self) -> str:
        return f"<BrokerSession {self.id} user={self.user.name} {self.peer_host}>"
