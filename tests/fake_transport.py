"""An asyncio transport for driving the TCP adapter in-process (server/net/tcp.py): it keeps what the broker
writes, and reads it back as frames. Used by the worker-mode tests and the HANDOVER fuzz
target's property; ``memory_broker``, ``connect`` and ``until`` are the in-process broker, a logged-in session over
this transport and a bounded wait, for the tests that drive real sessions without sockets (test_pass_through,
test_ack_path)."""
from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from pymq.protocol.scanner import FrameScanner, encode_frame

if TYPE_CHECKING:
    from pymq_server.app import BrokerServer
    from pymq_server.net.tcp import StompServerProtocol


class RecordingTransport:
    def __init__(self, sock: socket.socket | None = None) -> None:
        self.data = bytearray()
        self.closed = False
        self.sock = sock            # what get_extra_info("socket") gives (a hand-over passes it on)

    def write(self, data: bytes) -> None:
        self.data += data

    def frames(self) -> list:
        """Every frame written so far (the scanner stops after CONNECTED, to learn the version: go on)."""
        scanner = FrameScanner(max_frame_size=1 << 20)
        out: list = []
        frames = scanner.feed(bytes(self.data))
        while frames:
            out += frames
            frames = scanner.feed(b"") if frames[-1].command == "CONNECTED" else []
        return out

    def commands(self) -> list[str]:
        return [f.command for f in self.frames()]

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    abort = close

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "socket" and self.sock is not None:
            return self.sock
        return ("127.0.0.1", 1) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def memory_broker(data_dir: str, **extra: Any) -> BrokerServer:
    """A broker core with one memory device and no listener (``start_core``), its data in ``data_dir``."""
    from pymq_server.app import BrokerServer
    from pymq_server.config import BrokerConfig
    config = BrokerConfig.from_dict(dict(host="127.0.0.1", port=0, data_dir=data_dir, sync_policy="never",
                                         storage={"devices": {"memory": {"kind": "memory"}}}, **extra))
    server = BrokerServer(config)
    await server.start_core()
    return server


def connect(server: BrokerServer, loop: asyncio.AbstractEventLoop,
            client_id: str | None = None) -> tuple[StompServerProtocol, RecordingTransport]:
    """A TCP adapter over a RecordingTransport, sent a STOMP 1.2 CONNECT as guest (CONNECTED comes in a later turn)."""
    from pymq_server.net.tcp import StompServerProtocol
    proto = StompServerProtocol(server.broker, loop)
    transport = RecordingTransport()
    proto.connection_made(transport)   # type: ignore[arg-type]
    headers = {"accept-version": "1.2", "host": "/", "login": "guest", "passcode": "guest"}
    if client_id is not None:
        headers["client-id"] = client_id
    proto.data_received(encode_frame("CONNECT", headers, b"", "1.2"))
    return proto, transport


async def until(condition: Callable[[], object], what: str, limit: float = 10.0) -> None:
    """Wait, yielding to the loop, until ``condition()`` holds; fail with ``what`` after ``limit`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not condition():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.001)
