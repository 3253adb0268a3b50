"""The asyncio client's side of ``vm://name``: a :class:`VmLink` that never blocks the client's loop.

The blocking SDK's link (``pymq_server.net.vm.VmLink``) waits on a ``threading.Event`` inside ``submit``
while the broker holds back a producer, and ``EmbeddedBroker.open_link`` waits on another for CONNECTED;
either would freeze an event loop.  :class:`AsyncVmLink` keeps everything else of VmLink (the broker
calls the same ``send_frame``/``send_message``/``send_browse``/``close``) and changes three things:
``submit`` only hands the frame over, flow control is a flag plus a wake-up for the client's
``writable()``, and CONNECTED arrives through the client's inbound queue like every other frame.
Only this module imports the broker, and only when a ``vm://`` URL is used.
"""
from __future__ import annotations

import asyncio

from pymq.errors import ConnectionClosed, PymqError, ResourceLimit
from pymq.protocol.frame import Frame
from pymq_server.broker.session import BrokerSession
from pymq_server.net.vm import VmLink, embedded_broker


class AsyncVmLink(VmLink):
    """Broker side of one asyncio client connection; ``client`` is its :class:`VmTransport`."""

    def __init__(self, embedded, client) -> None:
        super().__init__(embedded, client.from_broker)
        self.client = client
        self.paused = False   # written on the broker's loop, read on the client's

    # client loop -> broker loop
    def submit(self, frame: Frame) -> None:
        if self._closed:
            raise ConnectionClosed("the connection is closed")
        self.loop.call_soon_threadsafe(self._receive, frame)

    # broker loop
    def pause_reading(self) -> None:
        super().pause_reading()
        self.paused = True

    def resume_reading(self) -> None:
        super().resume_reading()
        self.paused = False
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
