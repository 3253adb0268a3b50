"""STOMP frames as values, and the commands of each direction.

A frame is immutable: ``Frame(command, headers, body)``.  ``headers`` is a plain dict in arrival order
holding the *first* value of a repeated header (STOMP 1.2 §"Repeated Header Entries"); ``body`` is bytes.
A NamedTuple rather than a frozen dataclass because the broker creates one per message on its hottest
path and tuple construction is several times cheaper; treat ``headers`` as read-only once built.
"""
from __future__ import annotations

from typing import NamedTuple

VERSIONS = ("1.0", "1.1", "1.2")

CLIENT_COMMANDS = frozenset({
    "CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK",
    "BEGIN", "COMMIT", "ABORT", "DISCONNECT",
})
SERVER_COMMANDS = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})
ALL_COMMANDS = CLIENT_COMMANDS | SERVER_COMMANDS

#: only these frames may carry a body (STOMP 1.2 "Frames and Headers")
BODY_COMMANDS = frozenset({"SEND", "MESSAGE", "ERROR"})

#: CONNECT and CONNECTED headers are never escaped, for 1.0 interoperability (STOMP 1.2 "Value Encoding")
UNESCAPED_COMMANDS = frozenset({"CONNECT", "STOMP", "CONNECTED"})


class Frame(NamedTuple):
    command: str
    headers: dict[str, str]
    body: bytes = b""

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 40 else self.body[:40] + b"..."
        return f"Frame({self.command!r}, {self.headers!r}, {body!r})"


#: what encode_frame produces for a heart-beat; scanners skip it between frames
HEARTBEAT = b"\n"
