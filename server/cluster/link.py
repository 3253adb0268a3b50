"""Links between nodes: one outbound STOMP connection per peer, and the outbox consumer that sends on it.

A :class:`PeerLink` is a STOMP 1.2 client (the shared sans-IO ``StompConnection``) logged in as
``cluster:<node>`` with the cluster secret.  It carries control frames and forwarded messages; receipts
call back into the cluster node.  An :class:`OutboxConsumer` is the only consumer of a peer's outbox queue
(spec/cluster.md §3): each entry becomes a SEND with a receipt, the peer's receipt completes the entry, and
a link that drops releases what was in flight back into the outbox — store and forward with the queue
machinery the broker already has.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from typing import TYPE_CHECKING, Protocol, cast
from collections.abc import Callable

from pymq_server.broker.consumer import AUTO
from pymq_server.broker.forwarded import forward_headers
from pymq_server.config import ClusterConfig

from pymq.errors import PymqError, ProtocolError
from pymq.protocol.connection import Role, StompConnection, negotiate_heartbeat, parse_heartbeat
from pymq.protocol.frame import Frame

if TYPE_CHECKING:
    from pymq_server.broker.entry import Entry
    from pymq_server.broker.queue import MessageQueue
    from pymq_server.cluster.state import Figures

log = logging.getLogger("pymq.cluster.link")


class LinkOwner(Protocol):
    """The node a link belongs to (node.py): what the link reads of it and tells it."""

    loop: asyncio.AbstractEventLoop
    node_id: str
    config: ClusterConfig
    epoch: int

    def link_ready(self, link: PeerLink) -> None: ...

    def link_lost(self, link: PeerLink, was_ready: bool) -> None: ...

class PeerLink(asyncio.Protocol):
    def __init__(self, node: LinkOwner, peer: str, address: str) -> None:
        self.node = node
        self.peer = peer
        self.address = address
        self.loop = node.loop
        self.conn = StompConnection(Role.CLIENT)
        self.transport: asyncio.Transport | None = None
        self.ready = False
        self.closed = False
        self._receipts: dict[str, Callable[[], None]] = {}
        self._rids = itertools.count(1)
        self._beat: asyncio.TimerHandle | None = None
        self._last_recv = self.loop.time()
        self._silence_limit: float | None = None     # seconds without a byte from the peer before closing
        self.sent = 0

    async def open(self) -> None:
        host, _, port = self.address.rpartition(":")
        await self.loop.create_connection(lambda: self, host, int(port))

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)     # a stream: create_connection's
        hb = self.node.config.heartbeat_ms
        headers = {"accept-version": "1.2", "host": "/", "login": "cluster:" + self.node.node_id,
                   "passcode": self.node.config.secret, "heart-beat": f"{hb},{hb}"}
        if self.node.epoch:
            headers["pymq-node-epoch"] = str(self.node.epoch)      # spec/ha.md §5: peers refuse a lower one
        transport.write(self.conn.send(Frame("CONNECT", headers)))

    def data_received(self, data: bytes) -> None:
        self._last_recv = self.loop.time()
        try:
            frames = self.conn.receive_data(data)
            while frames:
                for frame in frames:
                    self._on_frame(frame)
                frames = self.conn.receive_data(b"") if frames[-1].command == "CONNECTED" else []
        except ProtocolError as exc:
            log.warning("link to %s: peer sent bad STOMP: %s", self.peer, exc)
            self.close()

    def _on_frame(self, frame: Frame) -> None:
        command = frame.command
        if command == "RECEIPT":
            callback = self._receipts.pop(frame.headers.get("receipt-id", ""), None)
            if callback is not None:
                callback()
        elif command == "CONNECTED":
            # The peer beats at the negotiated interval (its broker's heartbeat_send_ms, 10 s by default),
            # not at ours: judging its silence by our own period closed every idle link within a second.
            hb = self.node.config.heartbeat_ms
            try:
                _, to_us = negotiate_heartbeat((hb, hb), parse_heartbeat(frame.headers.get("heart-beat")))
            except PymqError:
                to_us = 0
            self._silence_limit = max(4 * hb, 2 * to_us) / 1000.0 if to_us else None
            self.ready = True
            self._schedule_beat()
            self.node.link_ready(self)
        elif command == "ERROR":
            log.warning("link to %s: ERROR %s", self.peer, frame.headers.get("message"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        was_ready = self.ready
        self.ready = False
        self.closed = True
        if self._beat is not None:
            self._beat.cancel()
        self._receipts.clear()
        self.node.link_lost(self, was_ready)

    # -- sending ---------------------------------------------------------------------------------
    def send(self, headers: dict, body: bytes = b"", on_receipt: Callable[[], None] | None = None) -> None:
        if not self.ready or self.transport is None:
            raise PymqError(f"the link to {self.peer} is not up")
        if on_receipt is not None:
            rid = f"f{next(self._rids)}"
            self._receipts[rid] = on_receipt
            headers = dict(headers)
            headers["receipt"] = rid
        self.transport.write(self.conn.send(Frame("SEND", headers, body)))
        self.sent += 1

    def send_burst(self, frames: list[tuple[dict, bytes]], on_receipt: Callable[[], None]) -> None:
        """Several SENDs in one write; one receipt on the last confirms them all (receipts are
        cumulative: spec/stomp.md §5)."""
        if not self.ready or self.transport is None:
            raise PymqError(f"the link to {self.peer} is not up")
        rid = f"f{next(self._rids)}"
        self._receipts[rid] = on_receipt
        last = len(frames) - 1
        out = []
        for i, (headers, body) in enumerate(frames):
            if i == last:
                headers = dict(headers)
                headers["receipt"] = rid
            out.append(self.conn.send(Frame("SEND", headers, body)))
        self.transport.write(b"".join(out))
        self.sent += len(frames)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection without writing what is buffered (a fenced process sends nothing more)."""
        self.ready = False
        if self.transport is not None:
            self.transport.abort()

    # -- heart-beats -----------------------------------------------------------------------------
    def _schedule_beat(self) -> None:
        interval = self.node.config.heartbeat_ms / 1000.0
        self._beat = self.loop.call_later(interval, self._tick, interval)

    def _tick(self, interval: float) -> None:
        if self.closed or self.transport is None:
            return
        limit = self._silence_limit
        if limit is not None and self.loop.time() - self._last_recv > limit:
            log.warning("link to %s: silent for %.1fs, closing", self.peer, self.loop.time() - self._last_recv)
            self.close()
            return
        self.transport.write(b"\n")
        self._beat = self.loop.call_later(interval, self._tick, interval)


class OutboxConsumer:
    """The link to a peer as the consumer of its outbox queue (duck-types broker Consumer).

    Entries handed over during one loop iteration leave as one burst — one write, one receipt on the
    last frame — and that receipt completes the whole burst: a forwarded message costs a frame, not a
    round of receipt bookkeeping and dispatch."""

    selector = None
    #: a forward is not a delivery to a client: no delivery count is kept for it across a restart
    ack_mode = AUTO
    #: an entry completes at its burst's receipt, later: never the pass-through (MessageQueue._pass)
    passes = False

    def __init__(self, queue: MessageQueue, link: PeerLink, figures: Figures, window: int = 1000) -> None:
        self.queue = queue
        self.link = link
        self.figures = figures
        self.window = window
        self.active = True
        self.id = "outbox:" + link.peer
        self.session = None
        self.unacked: dict = {}
        self.scan = [0, [-1] * 10]
        self.exclusive = False       # an outbox's only reader is its link
        self._burst: list[Entry] = []                          # taken this iteration, not written yet
        self._sent: collections.deque[Entry] = collections.deque()   # written, waiting for their receipt
        self._flush_scheduled = False

    @property
    def in_flight(self) -> int:
        return len(self._burst) + len(self._sent)

    def can_take(self) -> bool:
        return self.active and self.link.ready and self.in_flight < self.window

    def accepts(self, entry: Entry) -> bool:
        return True

    def deliver(self, entry: Entry) -> None:
        self._burst.append(entry)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.link.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        burst, self._burst = self._burst, []
        if not burst:
            return
        origin = self.link.node.node_id
        frames = [(forward_headers(e.message, origin), e.message.body) for e in burst]
        try:
            count = len(burst)
            self.link.send_burst(frames, lambda: self._confirmed(count))
        except PymqError:
            # the link went down meanwhile: the burst returns to the outbox
            for entry in burst:
                self.queue.release(entry, failed=False)
            return
        self._sent.extend(burst)

    def _confirmed(self, count: int) -> None:
        sent = self._sent
        queue = self.queue
        for _ in range(min(count, len(sent))):
            queue.complete(sent.popleft())
        self.figures.forwarded += count
        queue.dispatch()

    def detach(self) -> None:
        """The link is gone: whatever was in flight goes back to the outbox, to be resent or re-routed."""
        self.active = False
        self.queue.remove_consumer(self)
        pending = list(self._sent) + self._burst
        self._sent.clear()
        self._burst = []
        for entry in pending:
            self.queue.release(entry, failed=False)
