"""The embedded broker behind ``vm://name`` URLs: a full broker on a background thread, no socket.

``embedded_broker(name)`` starts (once per process and name) a :class:`BrokerServer` on its own event
loop thread.  Clients talk to it through :class:`VmLink`: frames go in as objects via
``call_soon_threadsafe`` and come out as objects, through the same broker session code as TCP clients,
so semantics are identical.  Options (from the URL query): ``data_dir`` (persistent storage there; by
default the embedded broker keeps everything in memory), ``port`` (also listen on TCP, for tools).
"""
from __future__ import annotations

import asyncio
import atexit
import collections
import shutil
import tempfile
import threading
from typing import Callable

from pymq.errors import ConnectionClosed, PymqError, TimeoutError
from pymq.protocol.frame import Frame
from pymq_server.app import BrokerServer
from pymq_server.broker.session import BrokerSession
from pymq_server.config import BrokerConfig

_brokers: dict[str, "EmbeddedBroker"] = {}
_lock = threading.Lock()


class VmLink:
    """Broker side of one in-process connection (the session's link)."""

    def __init__(self, embedded: "EmbeddedBroker", deliver: Callable) -> None:
        self.embedded = embedded
        self.loop = embedded.loop
        self.deliver = deliver       # client callback(frame | None, error)
        self.session: BrokerSession | None = None
        self._closed = False
        self._reading = threading.Event()
        self._reading.set()
        self._outbound: collections.deque = collections.deque()
        self._take_scheduled = False

    # client thread -> broker loop
    def submit(self, frame: Frame) -> None:
        if self._closed:
            raise ConnectionClosed("the connection is closed")
        # producer flow control: block the producing thread while the broker is paused for it
        if frame.command == "SEND" and not self._reading.wait(timeout=30):
            raise TimeoutError("the embedded broker kept this producer paused for 30 s (memory limit)")
        self._outbound.append(frame)
        if not self._take_scheduled:
            # one wake-up of the broker's loop per burst, not per frame (each costs a syscall).  The
            # frame is appended before the flag is read and the broker clears the flag before
            # draining, so no frame is ever left behind without a scheduled drain.
            self._take_scheduled = True
            self.loop.call_soon_threadsafe(self._take_batch)

    def _take_batch(self) -> None:
        self._take_scheduled = False
        outbound = self._outbound
        while outbound:
            self._receive(outbound.popleft())

    def _receive(self, frame: Frame) -> None:
        try:
            self.session.frame_received(frame)
        except Exception as exc:  # keep the broker alive; this connection fails
            self.session.fail(PymqError(f"internal broker error: {exc!r}"))

    def disconnect(self) -> None:
        if not self._closed:
            self.loop.call_soon_threadsafe(self._close_from_client)

    def _close_from_client(self) -> None:
        if self.session is not None:
            self._closed = True
            self.session.connection_lost()

    # broker loop -> client
    def send_frame(self, conn, frame: Frame) -> None:
        conn.send_frame(frame)
        if not self._closed:
            self.deliver(frame)

    def send_message(self, conn, consumer, entry, ack: str | None) -> None:
        message = entry.message
        headers = {"subscription": consumer.id}
        if ack is not None:
            headers["ack"] = ack
        if entry.deliveries > 1:
            headers["redelivered"] = "true"
            headers["JMSXDeliveryCount"] = str(entry.deliveries)
        if entry.first_in_group:
            headers["JMSXGroupFirstForConsumer"] = "true"
        headers.update(message.frame_headers())
        frame = Frame("MESSAGE", headers, message.body)
        conn.send_frame(frame)
        self.deliver(frame)

    def send_browse(self, conn, sub_id: str, entry) -> None:
        headers = {"subscription": sub_id, "browser": "true"}
        headers.update(entry.message.frame_headers())
        frame = Frame("MESSAGE", headers, entry.message.body)
        conn.send_frame(frame)
        self.deliver(frame)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.deliver(None, None)

    def start_heartbeat(self, session, send_ms: int, recv_ms: int) -> None:
        pass  # in-process: a dead client is a closed link, no beats needed

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()


class EmbeddedBroker:
    def __init__(self, name: str, options: dict) -> None:
        self.name = name
        storage: dict = {"devices": {"memory": {"kind": "memory"}}, "persistent_device": "memory"}
        data_dir = options.get("data_dir")
        if data_dir:
            storage = {}
        self._tmpdir = None
        if not data_dir:
            # memory only: nothing is kept, so nothing is written into the application's directory
            self._tmpdir = tempfile.mkdtemp(prefix=f"pymq-vm-{name}-")
        self.config = BrokerConfig(host="127.0.0.1", port=int(options.get("port", 0)),
                                   data_dir=data_dir or self._tmpdir, node_id=f"vm-{name}",
                                   storage=storage)
        self.loop = asyncio.new_event_loop()
        self.server = BrokerServer(self.config)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"pymq-vm-{name}", daemon=True)
        self.thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        if not self.config.port:
            # no TCP listener: start only storage and the broker core
            await self.server.start_core()
        else:
            await self.server.start()

    def open_link(self, deliver: Callable, headers: dict, timeout: float) -> tuple[VmLink, Frame]:
        link = VmLink(self, deliver)
        first: list[Frame] = []
        got = threading.Event()

        def capture(frame: Frame | None, error=None) -> None:
            if frame is not None and not first:
                first.append(frame)
                got.set()
                return
            if frame is None and not first:
                got.set()
                return
            deliver(frame, error)

        link.deliver = capture

        def start() -> None:
            broker = self.server.broker
            link.session = BrokerSession(broker, link, None, broker.new_connection_id())
            # CONNECT goes through the session like any frame: a refusal (credentials, connection
            # limit) comes back as its ERROR frame
            link.session.frame_received(Frame("CONNECT", dict(headers, **{"accept-version": "1.2"})))

        self.loop.call_soon_threadsafe(start)
        if not got.wait(timeout):
            raise TimeoutError(f"embedded broker {self.name!r} did not answer CONNECT in {timeout}s")
        if not first:
            raise ConnectionClosed(f"embedded broker {self.name!r} refused the connection")
        return link, first[0]

    def stop(self, timeout: float = 10.0) -> None:
        if not self.loop.is_running():
            return
        fut = asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop)
        try:
            fut.result(timeout)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout)
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)


def embedded_broker(name: str, options: dict | None = None) -> EmbeddedBroker:
    with _lock:
        broker = _brokers.get(name)
        if broker is None:
            broker = _brokers[name] = EmbeddedBroker(name, options or {})
        return broker


def stop_embedded(name: str | None = None) -> None:
    with _lock:
        names = [name] if name else list(_brokers)
        for n in names:
            broker = _brokers.pop(n, None)
            if broker is not None:
                broker.stop()


atexit.register(stop_embedded)
