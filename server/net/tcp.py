"""STOMP over TCP: the asyncio adapter between sockets and broker sessions.

One :class:`StompServerProtocol` per connection.  It owns the transport and the heart-beat timers and is
the session's *link*.  Writes are gathered per loop iteration into one ``transport.write`` (a consumer
fed by a burst of SENDs costs one syscall, not one per message).  Backpressure: once queued bytes pass
the high-water mark the session stops receiving deliveries until the transport drains, so a slow
consumer costs at most about ``write_buffer_high`` bytes of broker memory (its messages wait in their
queue, where flow control and storage account for them).
"""
from __future__ import annotations

import asyncio
import logging

from pymq.errors import HeartbeatTimeout, PymqError, ResourceLimit
from pymq.protocol.frame import Frame
from pymq.protocol.connection import State
from pymq.protocol.scanner import escape
from pymq_server.broker.session import BrokerSession
from pymq_server.net.tls import peer_subject

log = logging.getLogger("pymq.net")

class StompServerProtocol(asyncio.Protocol):
    def __init__(self, broker, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.session: BrokerSession | None = None
        self.certificate_subject: str | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._transport_paused = False
        self._closing = False
        self._received = False       # traffic seen since the last heart-beat check
        self._sent = False
        self._hb_send: asyncio.TimerHandle | None = None
        self._hb_recv: asyncio.TimerHandle | None = None
        cfg = broker.config
        self._high = cfg.write_buffer_high
        self._grace = cfg.heartbeat_grace

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        cfg = self.broker.config
        transport.set_write_buffer_limits(high=cfg.write_buffer_high, low=cfg.write_buffer_low)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                import socket
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) else None
        self.certificate_subject = peer_subject(transport)   # mutual TLS: read by CONNECT
        self.session = BrokerSession(self.broker, self, host, self.broker.new_connection_id())
        # a client that never sends CONNECT must not hold a connection forever
        self._hb_recv = self.loop.call_later(cfg.connect_timeout_ms / 1000, self._connect_deadline)

    def data_received(self, data: bytes) -> None:
        self._received = True
        try:
            self.session.data_received(data)
        except Exception:  # a broker bug must cost one connection, never the broker
            log.exception("internal error on connection %s", self.session.id)
            self.session.fail(PymqError("internal broker error; the connection is closed"))

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self._out.clear()
        if self.session is not None:
            self.session.connection_lost()

    def pause_writing(self) -> None:
        self._transport_paused = True
        if self.session is not None:
            self.session.set_writable(False)

    def resume_writing(self) -> None:
        self._transport_paused = False
        if self.session is not None and self._out_bytes < self._high:
            self.session.set_writable(True)

    # -- the session's link ----------------------------------------------------------------------
    def send_frame(self, conn, frame: Frame) -> None:
        self._write(conn.send(frame))

    def send_message(self, conn, consumer, entry, ack: str | None) -> None:
        conn._on_send(_MESSAGE)
        message = entry.message
        head = consumer.head
        if head is None:
            sub = consumer.id if conn.version == "1.0" else escape(consumer.id, conn.version != "1.1")
            head = consumer.head = f"MESSAGE\nsubscription:{sub}\n".encode("utf-8")
        if ack is not None or entry.deliveries > 1 or entry.first_in_group:
            extra = f"ack:{ack}\n" if ack is not None else ""
            if entry.deliveries > 1:
                extra += f"redelivered:true\nJMSXDeliveryCount:{entry.deliveries}\n"
            if entry.first_in_group:
                extra += "JMSXGroupFirstForConsumer:true\n"
            head = head + extra.encode()
        body = message.body
        self._write(b"".join((head, message.header_block(conn.version), b"\n", body, b"\x00")))

    def send_browse(self, conn, sub_id: str, entry) -> None:
        conn._on_send(_MESSAGE)
        message = entry.message
        sub = sub_id if conn.version == "1.0" else escape(sub_id, conn.version != "1.1")
        head = f"MESSAGE\nsubscription:{sub}\nbrowser:true\n".encode("utf-8")
        self._write(b"".join((head, message.header_block(conn.version), b"\n", message.body,
                              b"\x00")))

    def _write(self, data: bytes) -> None:
        if self._closing:
            return
        self._out.append(data)
        self._out_bytes += len(data)
        self._sent = True
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)
        if self._out_bytes >= self._high and self.session.writable:
            self.session.writable = False   # stop dispatch now; _flush decides when to resume

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out or self.transport is None:
            return
        out, self._out = self._out, []
        self._out_bytes = 0
        self.transport.write(b"".join(out) if len(out) > 1 else out[0])
        if not self._transport_paused and not self.session.writable and not self.session.closed:
            self.session.set_writable(True)

    def close(self) -> None:
        """Flush what is queued (an ERROR or the last RECEIPT), then close."""
        if self._closing:
            return
        self._flush()
        self._closing = True
        self._cancel_timers()
        if self.transport is not None:
            self.transport.close()

    def pause_reading(self) -> None:
        if self.transport is not None and not self._closing:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self._closing:
            self.transport.resume_reading()

    # -- heart-beats -----------------------------------------------------------------------------
    def start_heartbeat(self, session, send_ms: int, recv_ms: int) -> None:
        """``send_ms``: we must send at least this often; ``recv_ms``: the peer promised this."""
        self._cancel_timers()
        if send_ms:
            # check every half interval: a beat never arrives more than one interval after the last data
            half = send_ms / 2000.0
            self._hb_send = self.loop.call_later(half, self._beat, half)
        if recv_ms:
            window = recv_ms / 1000.0 * self._grace
            self._received = False
            self._hb_recv = self.loop.call_later(window, self._check_peer, window)

    def _beat(self, half: float) -> None:
        if self._closing:
            return
        if not self._sent and not self._out:
            self.transport.write(b"\n")
        self._sent = False
        self._hb_send = self.loop.call_later(half, self._beat, half)

    def _check_peer(self, window: float) -> None:
        if self._closing:
            return
        if not self._received:
            log.info("connection %s: no traffic for %.1fs, closing", self.session.id, window)
            self.session.fail(HeartbeatTimeout(f"no heart-beat or frame received for {window:.1f}s"))
            return
        self._received = False
        self._hb_recv = self.loop.call_later(window, self._check_peer, window)

    def _connect_deadline(self) -> None:
        self._hb_recv = None
        if self.session.conn.state in (State.IDLE, State.CONNECTING) and self.session._held is None:
            self.session.fail(HeartbeatTimeout("no CONNECT frame received in time"))

    def _cancel_timers(self) -> None:
        for handle in (self._hb_send, self._hb_recv):
            if handle is not None:
                handle.cancel()
        self._hb_send = self._hb_recv = None


_MESSAGE = Frame("MESSAGE", {}, b"")
