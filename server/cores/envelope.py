"""The envelope of the channel between two worker processes (spec/cores.md §2.1), sans-IO.

Every unit on a channel is one envelope, big-endian::

    offset  size  field
    0       1     kind            (Kind below)
    1       2     home            the worker the client connection lives in
    3       2     conn length     n, bytes of the connection id
    5       4     payload length  m
    9       n     conn id         UTF-8: the home session's id ("w1c17")
    9+n     m     payload         by kind: STOMP frame bytes, a JSON object, or empty

A channel is a Unix stream socket between two workers of one broker (a 0700 directory, peers checked
by uid), so the reader trusts the peer's intent but still bounds what it holds: a payload longer than
``max_payload`` is a ClusterError, never an allocation.
"""
from __future__ import annotations

import enum
import struct
from typing import NamedTuple

from pymq.errors import ClusterError

HEAD = struct.Struct(">BHHI")
HEAD_SIZE = HEAD.size       # 9


#: the channel between two workers carried something this worker cannot read: the channel is closed,
#: as when the other worker dies (spec/cores.md §2.3), and opened again
ChannelError = ClusterError


class Kind(enum.IntEnum):
    HELLO = 1      # first envelope of a channel, connector -> acceptor; payload: its worker id, ASCII
    OPEN = 2       # home -> owner: a shadow of this connection; payload JSON: user, roles, version, ...
    FRAME = 3      # home -> owner: a client frame to handle; owner -> home: bytes to write to the client
    CLOSE = 4      # home -> owner: the client connection is gone
    CLOSED = 5     # owner -> home: the shadow closed (after an ERROR, or its DISCONNECT)
    RECEIPT = 6    # owner -> home: a RECEIPT frame for the home's receipt gate, in channel order
    PAUSE = 7      # owner -> home: stop reading this client (the owner's producer flow control)
    RESUME = 8     # owner -> home: read it again
    FULL = 9       # home -> owner: the client's output is over its high-water mark: stop dispatching
    DRAINED = 10   # home -> owner: under the low-water mark again
    QUERY = 11     # any -> any: an admin question (metrics, lists); payload JSON {"id", "op"}
    ANSWER = 12    # the answer; payload JSON {"id", "result"}
    HANDOVER = 13  # home -> owner: a client connection moves there (handover.py); conn: the hand-over's
    #                token, payload: its state (JSON) and the bytes read and not yet handled


class Envelope(NamedTuple):
    kind: Kind
    home: int
    conn: str
    payload: bytes


def encode(kind: Kind, home: int, conn: str, payload: bytes = b"") -> bytes:
    c = conn.encode()
    return HEAD.pack(kind, home, len(c), len(payload)) + c + payload


class EnvelopeReader:
    """Envelopes from a byte stream, fed in pieces of any size."""

    __slots__ = ("max_payload", "_buf")

    def __init__(self, max_payload: int) -> None:
        self.max_payload = max_payload
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Envelope]:
        buf = self._buf
        buf += data
        out: list[Envelope] = []
        pos, end = 0, len(buf)
        while end - pos >= HEAD_SIZE:
            kind, home, n, m = HEAD.unpack_from(buf, pos)
            if m > self.max_payload:
                raise ChannelError(f"channel envelope of {m} bytes is over the limit of {self.max_payload}")
            try:
                k = Kind(kind)
            except ValueError:
                raise ChannelError(f"channel envelope of unknown kind {kind}") from None
            total = HEAD_SIZE + n + m
            if end - pos < total:
                break
            start = pos + HEAD_SIZE
            try:
                conn = buf[start:start + n].decode()
            except UnicodeDecodeError:
                raise ChannelError("channel envelope with a connection id that is not UTF-8") from None
            out.append(Envelope(k, home, conn, bytes(buf[start + n:start + n + m])))
            pos += total
        if pos:
            del buf[:pos]
        return out
