"""A client connection at its home worker when destinations live in several workers (spec/cores.md §3).

:class:`HomeSession` is the ordinary session plus one decision per frame: is the destination (or the
delivery an ACK names) owned here? Then the frame is handled here as always. Otherwise it is
re-encoded and forwarded, as received, to the owner's shadow of this connection (shadow.py), opened
on first use with the principal this home authenticated. What comes back — MESSAGEs, ERRORs — is
written to the client as the owner encoded it.

Receipts. A RECEIPT confirms every earlier frame of the connection (spec/stomp.md §5), wherever it was
handled: each receipt waits at a *gate* for the local receipt queue (its store barrier) and for every
owner that was sent frames since the previous receipt — the owner the frame itself went to answers
with its own RECEIPT (carrying the message id), the others get a barrier (a SEND to
shadow.BARRIER with a receipt), answered after their store's barrier. Gates open in order.

One path per connection. A connection whose destinations are all this worker's (accepted here, or handed
over to here: every one-destination connection) runs exactly the one-process path: :class:`HomeSession`
overrides nothing a SEND, an ACK or a message goes through; it asks a destination's owner once per name,
where the session maps a SEND's name into its vhost (``_first_sight``), and at each SUBSCRIBE. The first
name owned elsewhere (or the admin destination) makes it a :class:`SpanningSession` for good, which decides
every frame as below.

Transactions. A transaction's operations must all go to one worker: the first SEND or ACK of a
transaction fixes it (BEGIN is forwarded to that owner then); a later operation for another worker is
refused with an ERROR naming both workers and destinations, and the connection closes: nothing of the
transaction is applied anywhere (each side aborts it when the connection goes). Two-phase commit
across workers is not built (spec/cores.md §3).
"""
from __future__ import annotations

import json
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, cast

from pymq.errors import ClusterError, InvalidHeader, TransactionError
from pymq.protocol.frame import Frame
from pymq.protocol.scanner import FrameScanner, encode_frame
from pymq_server.admin import stomp_admin
from pymq_server.admin.stomp_admin import ADMIN_DESTINATION
from pymq_server.broker.clients import own_reply_to
from pymq_server.broker.intake import LATER
from pymq_server.broker.session import BrokerSession
from pymq_server.cores import handover
from pymq_server.cores.envelope import Kind
from pymq_server.cores.shadow import BARRIER

if TYPE_CHECKING:
    from pymq_server.broker.broker import Broker
    from pymq_server.cores.mesh import Mesh
    from pymq_server.net.tcp import StompServerProtocol

log = logging.getLogger("pymq.cores")


class Gate:
    """One client receipt and the parties (here, and owners) it still waits for."""

    __slots__ = ("receipt_id", "extra", "waiting")

    def __init__(self, receipt_id: str) -> None:
        self.receipt_id = receipt_id
        self.extra: dict[str, str] = {}
        self.waiting = 0


class HomeSession(BrokerSession):
    def __init__(self, mesh: Mesh, broker: Broker, link: Any, peer_host: str | None, conn_id: str) -> None:
        self.mesh = mesh
        self.me = mesh.me
        self._writable = True
        self.opened: set[int] = set()                   # owners holding a shadow of this connection
        self._remote_subs: dict[str, int] = {}          # subscription id -> owner
        self._touched: set[int] = set()                 # owners sent frames since the last gate
        self._gates: deque[Gate] = deque()              # receipts not yet given, in order
        self._local_gates: deque[Gate] = deque()        # ... waiting for the local receipt queue
        self._owner_gates: dict[int, deque[Gate]] = {}  # ... waiting for an owner's RECEIPT
        self._tx_owner: dict[str, tuple[int, str]] = {}  # transaction -> (its worker, first destination)
        self._disconnecting = False
        self._stay = False                              # a hand-over failed: forward (handover.py)
        self.heartbeats = (0, 0)                        # (to the client, from the client) in ms, as kept
        # "w<k>" first: a temporary destination's global name tmp.<id>.<local> then names this worker
        super().__init__(broker, link, peer_host, f"w{mesh.me}{conn_id}")
        mesh.homes[self.id] = self

    def connected(self, version: str, headers: dict[str, str], to_client: int, to_server: int) -> None:
        self.heartbeats = (to_client, to_server)    # what a hand-over carries (handover.py)
        headers["pymq-worker"] = str(self.me)       # which worker is this connection's home (tests, ops)
        # how many there are: with the owner rule (spec/cores.md §2.2) a reader such as the JVM Spark
        # connector finds which worker owns a destination and connects there (spec/spark.md §2)
        headers["pymq-workers"] = str(self.mesh.ownership.workers)
        # and which owner rule this broker's data directory keeps (spec/cores.md §2): "numbered", or "hash"
        # for a directory written before the numbered rule, so such a reader computes the owner it uses
        headers["pymq-placement"] = "numbered" if self.mesh.ownership.numbered else "hash"
        super().connected(version, headers, to_client, to_server)

    # -- the first name owned elsewhere ----------------------------------------------------------------
    def _first_sight(self, destination: str, frame: Frame) -> str | None:
        """A SEND's destination this connection has not named before (BrokerSession._on_send)."""
        if destination == ADMIN_DESTINATION or self.mesh.ownership.owner(destination) != self.me:
            self._decide_from_now(frame)
            return None
        return super()._first_sight(destination, frame)

    def _on_subscribe(self, frame: Frame) -> dict[str, str] | None:
        if self.mesh.ownership.owner(frame.headers["destination"]) != self.me:
            self._decide_from_now(frame)
            return LATER
        return super()._on_subscribe(frame)

    def _on_unsubscribe(self, frame: Frame) -> None:
        headers = frame.headers
        destination = headers.get("destination")
        if (destination is not None and (headers.get("id") or destination) not in self.consumers
                and self.mesh.ownership.owner(destination) != self.me):
            self._decide_from_now(frame)            # a durable subscription's end, by name, at its owner
            return
        super()._on_unsubscribe(frame)

    def _decide_from_now(self, frame: Frame) -> None:
        self._span()
        self.received -= 1          # counted by the session's _handle, which this frame leaves
        self._handle(frame)         # SpanningSession's: the decision (a hand-over, or forwarding)

    def _span(self) -> None:
        """From here on every frame is decided (SpanningSession). What was done before was all here: the
        receipts still waiting are this worker's alone, and a transaction that holds operations stays here."""
        self.__class__ = SpanningSession
        # the session's command table holds methods bound before: bind them again (SEND is SpanningSession's)
        self._handlers = {command: getattr(self, method.__name__) for command, method in self._handlers.items()}
        self._writable = self.__dict__.pop("writable", True)
        self._ungated = self.receipts.pending
        for tx in self.transactions.with_operations():
            self._tx_owner[tx] = (self.me, f"its operations before on worker w{self.me}")

    def _ack_owner(self, headers: dict[str, str]) -> int:
        if "pymq-ack-upto" in headers:
            destination = headers.get("destination")
            return self.mesh.ownership.owner(destination) if destination else self.me
        token = headers.get("id") if self.version == "1.2" else headers.get("message-id")
        sub = headers.get("subscription")
        if sub is not None and sub in self._remote_subs:
            return self._remote_subs[sub]
        owner = self.mesh.ownership.ack_owner(token) if token else None
        return self.me if owner is None else owner

    def _own_reply_to(self, frame: Frame) -> Frame:
        """A reply-to naming one of this connection's temporary destinations by its local name is made
        global here, by the router's rule (clients.own_reply_to): the owner cannot, the temporary
        destination lives with its connection."""
        reply_to = frame.headers.get("reply-to")
        if reply_to is None or not reply_to.startswith(("/temp-queue/", "/temp-topic/")):
            return frame
        own = own_reply_to(self, reply_to)
        if own is None:
            return frame
        headers = dict(frame.headers)
        headers["reply-to"] = own
        return Frame(frame.command, headers, frame.body)

    # -- moving to the owner (handover.py) -------------------------------------------------------------
    def _move(self, owner: int, frame: Frame) -> None:
        """Hold ``frame`` and everything after it, and hand the connection over once this batch of frames
        has stopped (the frames parsed behind it are deferred by the intake meanwhile)."""
        self.pause_input("handover")
        self.mesh.loop.call_soon(self._hand_over, owner, frame)

    def _hand_over(self, owner: int, frame: Frame) -> None:
        if self.closed or handover.hand_over(self, owner, frame):
            return
        self._stay = True                       # forwarded from here on, as before hand-overs
        self._deferred.insert(0, frame)
        self.resume_input("handover")

    def moved(self) -> None:
        """Handed over: forget the connection without a word on its socket (the owner has it now)."""
        log.debug("connection %s handed over to its destination's worker", self.id)
        self._disconnected = True       # its (unused) temporary names go with it: nothing to re-claim
        link = cast("StompServerProtocol", self.link)
        self.connection_lost()
        link.abort()

    def adopt(self, doc: dict) -> None:
        """A connection handed over by another worker: logged in there, CONNECTED here now."""
        handover.enter(self, doc)

    # -- forwarding ----------------------------------------------------------------------------------
    def _forward(self, owner: int, frame: Frame) -> None:
        mesh = self.mesh
        if owner not in self.opened:
            self.opened.add(owner)
            self._owner_gates[owner] = deque()
            user = self.user
            doc = {"user": user.name, "roles": sorted(user.roles), "version": self.version,
                   "client_id": self.client_id, "host": self.peer_host, "subject": user.certificate_subject}
            mesh.send(owner, Kind.OPEN, self.me, self.id, json.dumps(doc).encode())
            if not self._writable:
                mesh.send(owner, Kind.FULL, self.me, self.id)
        channel = mesh.send(owner, Kind.FRAME, self.me, self.id,
                            encode_frame(frame.command, frame.headers, frame.body, self.version))
        if channel is None:
            # the owner died and is being restarted: nothing was sent, so nothing may be confirmed
            raise ClusterError(f"worker {owner}, which owns {frame.headers.get('destination') or 'this delivery'}, "
                               f"is restarting; try again", worker=owner)
        if channel.full:
            # flow control per channel: this producer waits until the owner has read what is queued
            channel.hold(self)
            self.pause_input(f"channel-w{owner}")

    def channel_drained(self, owner: int | None) -> None:
        self.resume_input(f"channel-w{owner}")

    # -- receipts --------------------------------------------------------------------------------------
    def _gate(self, receipt_id: str, forwarded_to: int | None) -> Gate:
        """A gate for ``receipt_id``: the local receipt queue, the owner the frame went to (its
        RECEIPT), and a barrier at every other owner sent frames since the last gate."""
        gate = Gate(receipt_id)
        self._gates.append(gate)
        gate.waiting += 1
        self._local_gates.append(gate)
        touched, self._touched = self._touched, set()
        if forwarded_to is not None:
            touched.discard(forwarded_to)
            gate.waiting += 1
            self._owner_gates[forwarded_to].append(gate)
        for owner in touched:
            self._barrier(owner, gate)
        return gate

    def _barrier(self, owner: int, gate: Gate) -> None:
        gate.waiting += 1
        self._owner_gates[owner].append(gate)
        self.mesh.send(owner, Kind.FRAME, self.me, self.id,
                       encode_frame("SEND", {"destination": BARRIER, "receipt": gate.receipt_id}, b"",
                                    self.version))

    def _open_gates(self) -> None:
        gates = self._gates
        while gates and gates[0].waiting == 0 and not self.closed:
            gate = gates.popleft()
            BrokerSession.write_receipt(self, gate.receipt_id, gate.extra or None)

    # -- what the owners send back ---------------------------------------------------------------------
    def from_owner(self, owner: int, kind: Kind, payload: bytes) -> None:
        if self.closed:
            return
        if kind is Kind.FRAME:
            cast("StompServerProtocol", self.link).write_encoded(payload)   # a home's link is a TCP one
        elif kind is Kind.RECEIPT:
            waiting = self._owner_gates.get(owner)
            if not waiting:
                log.warning("connection %s: unexpected RECEIPT from worker %d", self.id, owner)
                return
            gate = waiting.popleft()
            frames = FrameScanner(max_frame_size=1 << 20).feed(payload)
            if frames:
                extra = {k: v for k, v in frames[0].headers.items() if k != "receipt-id"}
                gate.extra.update(extra)
            gate.waiting -= 1
            self._open_gates()
        elif kind is Kind.CLOSED:
            self.opened.discard(owner)
            if not self._disconnecting:
                # the owner's side ended (an ERROR, written just before this): so does the connection
                self.close()
        elif kind is Kind.PAUSE:
            self.pause_input(f"owner-w{owner}")
        elif kind is Kind.RESUME:
            self.resume_input(f"owner-w{owner}")

    # -- transactions ----------------------------------------------------------------------------------
    def _transaction_op(self, tx: str, owner: int, frame: Frame) -> None:
        if tx not in self.transactions:
            raise TransactionError(f"transaction {tx!r} was not begun on this connection", transaction=tx)
        headers = frame.headers
        what = headers.get("destination") or f"the delivery {headers.get('id') or headers.get('message-id')}"
        fixed = self._tx_owner.get(tx)
        if fixed is None:
            self._tx_owner[tx] = (owner, what)
            if owner != self.me:
                self._forward(owner, Frame("BEGIN", {"transaction": tx}, b""))
            return
        if fixed[0] != owner:
            raise TransactionError(
                f"transaction {tx!r} would span workers w{fixed[0]} ({fixed[1]}) and w{owner} ({what}): with "
                f"--workers > 1 a transaction's destinations must belong to one worker (spec/cores.md §3); "
                f"nothing of the transaction was applied", transaction=tx)

    def _end_transaction(self, frame: Frame) -> None:
        tx = frame.headers["transaction"]
        fixed = self._tx_owner.pop(tx, None)
        if fixed is None or fixed[0] == self.me:
            receipt = frame.headers.get("receipt")
            if receipt is not None:
                self._gate(receipt, None)
            super()._handle(frame)
            return
        owner = fixed[0]
        self.transactions.abort(tx)         # the local record of BEGIN: its operations are all at the owner
        self.received += 1
        self._forward(owner, frame)
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            self._gate(receipt, owner)
            self.receipts.receipt(receipt)
        else:
            self._touched.add(owner)

    # -- the end -------------------------------------------------------------------------------------
    def _disconnect(self, frame: Frame) -> None:
        for consumer in self.consumers.values():
            consumer.active = False
        self._disconnecting = True
        receipt = frame.headers.get("receipt")
        for owner in self.opened:
            # the owner deactivates its consumers, answers the receipt after its barrier, then closes
            self._forward(owner, frame)
        if receipt is None:
            self.close()
            return
        self._closing_after_receipts = True
        gate = Gate(receipt)
        self._gates.append(gate)
        gate.waiting += 1
        self._local_gates.append(gate)
        for owner in self.opened:
            gate.waiting += 1
            self._owner_gates[owner].append(gate)
        self._touched.clear()
        self.receipts.receipt(receipt)

    def connection_lost(self) -> None:
        if self.closed:
            return
        for owner in self.opened:
            self.mesh.send(owner, Kind.CLOSE, self.me, self.id)
        self.opened.clear()
        self.mesh.homes.pop(self.id, None)
        self._gates.clear()
        self._local_gates.clear()
        super().connection_lost()


class SpanningSession(HomeSession):
    """A home connection that named a destination owned elsewhere: every frame decided (module docstring)."""

    _first_sight = BrokerSession._first_sight
    _on_subscribe = BrokerSession._on_subscribe
    _on_unsubscribe = BrokerSession._on_unsubscribe
    _ungated: int                   # receipts that were waiting here when it began to span (no gate)

    # -- output backpressure reaches the owners --------------------------------------------------------
    @property
    def writable(self) -> bool:
        return self._writable

    @writable.setter
    def writable(self, value: bool) -> None:
        if value == self._writable:
            return
        self._writable = value
        kind = Kind.DRAINED if value else Kind.FULL
        for owner in self.opened:
            self.mesh.send(owner, kind, self.me, self.id)

    def _on_send(self, frame: Frame) -> dict[str, str] | None:
        if frame.headers["destination"] == ADMIN_DESTINATION:
            # run where the queue it names lives, or in every worker (server/cores/admin.py)
            stomp_admin.handle(self, frame.headers, frame.body, submit=self.mesh.admin.submit)
            return None
        return super()._on_send(frame)

    # -- the one decision ------------------------------------------------------------------------------
    def _handle(self, frame: Frame) -> None:
        command = frame.command
        headers = frame.headers
        owner = self.me
        if command == "SEND":
            owner = self.mesh.ownership.owner(headers["destination"])
            if owner != self.me:
                if not self._stay and handover.movable(self):
                    self._move(owner, frame)
                    return
                frame = self._own_reply_to(frame)
        elif command == "SUBSCRIBE":
            owner = self.mesh.ownership.owner(headers["destination"])
            if owner != self.me and not self._stay and handover.movable(self):
                self._move(owner, frame)
                return
            sub_id = headers.get("id") or headers["destination"]
            if sub_id in self._remote_subs or (owner != self.me and sub_id in self.consumers):
                raise InvalidHeader(f"subscription id {sub_id!r} is already in use on this connection",
                                    header="id")
            if owner != self.me:
                self._remote_subs[sub_id] = owner
        elif command == "UNSUBSCRIBE":
            sub_id = headers.get("id") or headers.get("destination") or ""
            remote = self._remote_subs.pop(sub_id, None)
            if remote is not None:
                owner = remote
            elif "destination" in headers and sub_id not in self.consumers:
                owner = self.mesh.ownership.owner(headers["destination"])   # a durable one, by name
        elif command == "ACK" or command == "NACK":
            owner = self._ack_owner(headers)
        elif command == "COMMIT" or command == "ABORT":
            self._end_transaction(frame)
            return
        elif command == "DISCONNECT":
            self._disconnect(frame)
            return
        tx = headers.get("transaction") if command in ("SEND", "ACK", "NACK") else None
        if tx is not None:
            self._transaction_op(tx, owner, frame)
        receipt = headers.get("receipt")
        if owner == self.me:
            if receipt is not None and command not in ("CONNECT", "STOMP"):
                self._gate(receipt, None)
            super()._handle(frame)
            return
        self.received += 1
        self._forward(owner, frame)
        if receipt is not None:
            self._gate(receipt, owner)
            self.receipts.receipt(receipt)      # the local part: this connection's own writes here
        else:
            self._touched.add(owner)

    def write_receipt(self, receipt_id: str, extra: dict[str, str] | None) -> None:
        """The local receipt queue's answer: the local part of the oldest gate waiting for it."""
        if self._ungated or not self._local_gates:
            if self._ungated:
                self._ungated -= 1      # one that was waiting before it began to span: it has no gate
            super().write_receipt(receipt_id, extra)
            return
        gate = self._local_gates.popleft()
        if extra:
            gate.extra.update(extra)
        gate.waiting -= 1
        self._open_gates()
