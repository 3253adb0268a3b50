"""An asyncio transport for driving the TCP adapter in-process (server/net/tcp.py): it keeps what the broker
writes, and reads it back as frames. Used by the worker-mode tests and the HANDOVER fuzz target's property."""
from __future__ import annotations

import socket
from typing import Any

from pymq.protocol.scanner import FrameScanner


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
