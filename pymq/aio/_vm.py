"""The asyncio client's side of ``vm://name``: a :class:`VmLink` that never blocks the client's loop.

The blocking SDK's link (``pymq_server.net.vm.VmLink``) waits on a ``threading.Event`` inside ``submit``
while the broker holds back a producer, and ``EmbeddedBroker.open_link`` waits on another for CONNECTED;
either would freeze an event loop.  :class:`AsyncVmLink` keeps everything else of VmLink (the broker
calls the same ``send_frame``/``send_message``/``send_browse``/``close``) and changes three things:
``submit`` only hands the frame over (batched: one wake-up of the broker's loop per burst), flow control is a flag plus a wake-up for the client's
``writable()``, and CONNECTED arrives through the client's inbound queue like every other frame.
It adds an in-flight window: a send loop that never yields would otherwise pile unbounded SENDs into
the broker loop's ready queue (which the broker's memory limit cannot see).
Only this module imports the broker, and only when a ``vm://`` URL is used.
"""
from __future__ import annotations

import asyncio
import collections

from pymq.errors import ConnectionClosed, PymqError, ResourceLimit
from pymq.protocol.frame import Frame
from pymq_server.broker.session import BrokerSession
from pymq_server.net.vm import VmLink, embedded_broker


#: SEND bytes handed to the broker's loop and not yet taken by it: above HIGH the producer waits until
#: the broker has caught up to LOW (the vm:// twin of a socket's write buffer)
WINDOW_HIGH = 1024 * 1024
WINDOW_LOW = 256 * 1024
_FRAME_OVERHEAD = 64    # a SEND's headers, roughly: keeps a flood of empty bodies bounded too


class AsyncVmLink(VmLink):
    """Broker side of one asyncio client connection; ``client`` is its :class:`VmTransport`.

    The in-flight window is two counters, each written by one thread only (``submitted`` by the
    client's loop, ``taken`` by the broker's), so no lock is needed.  A producer over the window sets
    ``want_wake`` and then re-checks; the broker checks ``want_wake`` after each take, so a wake-up is
    never lost between the two threads.
    """

    window_high = WINDOW_HIGH
    window_low = WINDOW_LOW
    _closed: bool

    def __init__(self, embedded, client) -> None:
        super().__init__(embedded, client.from_broker)
        self.client = client
        self.paused = False    # the broker holds back SENDs (memory limit): written on the broker's loop
        self.submitted = 0
        self.taken = 0
        self.want_wake = False
        self._outbound: collections.deque = collections.deque()
        self._take_scheduled = False

    @property
    def in_flight(self) -> int:
        return self.submitted - self.taken

    # client loop -> broker loop
    def submit(self, frame: Frame) -> None:
        if self._closed:
            raise ConnectionClosed("the connection is closed")
        if frame.command == "SEND":
            self.submitted += len(frame.body) + _FRAME_OVERHEAD
        self._outbound.append(frame)
        if not self._take_scheduled:
            # one wake-up of the broker's loop per batch, not per frame (each is a syscall); the
            # flag is cleared before the batch is popped, as in VmTransport.from_broker
            self._take_scheduled = True
            self.loop.call_soon_threadsafe(self._take_batch)

    # broker loop
    def _take_batch(self) -> None:
        self._take_scheduled = False
        outbound = self._outbound
        while outbound:
            frame = outbound.popleft()
            if frame.command == "SEND":
                self.taken += len(frame.body) + _FRAME_OVERHEAD
                if self.want_wake and self.in_flight <= WINDOW_LOW:
                    self.want_wake = False
                    self._wake_client()
            self._receive(frame)

    def pause_reading(self) -> None:
        super().pause_reading()
        self.paused = True

    def resume_reading(self) -> None:
        super().resume_reading()
        self.paused = False
        self._wake_client()

    def _wake_client(self) -> None:
        try:
            self.client._loop.call_soon_threadsafe(self.client.flow_changed)
        except RuntimeError:
            self.abandon()

    def abandon(self) -> None:
        """The client's loop closed without closing this connection: end it on the broker."""
        if not self._closed:
            self._closed = True
            self.loop.call_soon(self._close_from_client)


async def open_async_link(name: str, options: dict, client, headers: dict) -> AsyncVmLink:
    """Start (or find) embedded broker ``name`` and send CONNECT over a new link; CONNECTED (or ERROR)
    reaches ``client.from_broker`` like any other frame."""
    loop = asyncio.get_running_loop()
    # the first use of a name starts a broker thread and waits for it: not on the event loop
    embedded = await loop.run_in_executor(None, embedded_broker, name, options)
    link = AsyncVmLink(embedded, client)

    def start() -> None:
        broker = embedded.server.broker
        link.session = BrokerSession(broker, link, None, broker.new_connection_id())
        try:
            broker.session_opened(link.session)
        except PymqError as exc:           # connection limit: refuse as the TCP front does
            link.session.fail(ResourceLimit(exc.message))
            return
        link.session.frame_received(Frame("CONNECT", dict(headers)))

    embedded.loop.call_soon_threadsafe(start)
    return link
