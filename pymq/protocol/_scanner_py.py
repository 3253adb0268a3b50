"""STOMP frame scanner and encoder, pure Python: the reference semantics of ``_ext/scanner.pyx``.

``FrameScanner.feed(data)`` takes bytes as they arrive, in any split, and returns the complete frames
found so far.  It keeps no more than one partial frame, refuses anything over ``max_frame_size`` as soon
as that is known (a declared content-length, or a header block or body growing past the limit), and
after an error stays failed: the connection that owns it is about to close.

Parsing rules (spec/stomp.md §2, vectors in spec/vectors/frames.json):
* EOLs before a command are heart-beats and are skipped; a line ends in LF or CRLF (CR stripped).
* ``name:value`` splits at the first colon; values are never trimmed; repeated names: first wins.
* From 1.1 on, header names and values are unescaped (``\\r \\n \\c \\\\``; anything else is an error),
  except in CONNECT, STOMP and CONNECTED frames.
* With ``content-length`` the body is exactly that many bytes and must be followed by NUL; without it
  the body runs to the first NUL.  The length is read by ``pymq.protocol.numbers.parse_wire_int`` (1 to
  19 ASCII digits, at most 2**63-1) and compared with ``max_frame_size`` before any arithmetic uses it.
* ``feed`` returns right after a CONNECT, STOMP or CONNECTED frame, keeping later bytes buffered: they
  must be parsed with the version that frame negotiates.  Call ``feed(b"")`` once it is settled.
"""
from __future__ import annotations

from typing import Union
from collections.abc import Iterable, Mapping

from pymq.errors import BadEscape, FrameTooLarge, InvalidHeader, MalformedFrame, ProtocolError
from pymq.protocol.frame import UNESCAPED_COMMANDS, Frame
from pymq.protocol.numbers import parse_wire_int

#: what the encoders accept: a mapping, or (name, value) pairs; values are written with str()
Headers = Union[Mapping[str, object], Iterable[tuple[str, object]]]

DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024
DEFAULT_MAX_HEADERS = 1000

_NEGOTIATING = frozenset({"CONNECT", "STOMP", "CONNECTED"})
#: a body at least this long (by content-length) that has not fully arrived is gathered as the chunks fed,
#: joined once when complete, instead of growing the scan buffer chunk by chunk (each growth may copy all
#: of it again): a large frame (an Arrow range answer, a bulk SEND) costs one copy of its body
LARGE_BODY = 64 * 1024
_UNESCAPES = {"r": "\r", "n": "\n", "c": ":", "\\": "\\"}


def unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            if i + 1 >= n:
                raise BadEscape("header ends with a lone backslash")
            rep = _UNESCAPES.get(text[i + 1])
            if rep is None:
                raise BadEscape(f"undefined escape sequence '\\{text[i + 1]}' in header")
            out.append(rep)
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def escape(text: str, cr: bool = True) -> str:
    """STOMP header escaping; ``cr=False`` for 1.1, which has no ``\\r`` escape (a CR travels raw)."""
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    if "\n" in text:
        text = text.replace("\n", "\\n")
    if ":" in text:
        text = text.replace(":", "\\c")
    if cr and "\r" in text:
        text = text.replace("\r", "\\r")
    return text


def encode_headers(headers: Headers, escaped: bool = True, cr: bool = True) -> bytes:
    """``name:value\n`` lines for ``headers`` (dict or pairs): escaped for STOMP 1.2, escaped without
    the ``\\r`` escape for 1.1 (``cr=False``), or raw for 1.0 (``escaped=False``; a LF, which 1.0 cannot
    carry, becomes a space)."""
    items = headers.items() if hasattr(headers, "items") else headers
    if escaped:
        return "".join([f"{escape(k, cr)}:{escape(str(v), cr)}\n" for k, v in items]).encode("utf-8")
    return "".join([f"{k}:{str(v).replace(chr(10), ' ')}\n" for k, v in items]).encode("utf-8")


def encode_frame(command: str, headers: Headers, body: bytes = b"", version: str = "1.2") -> bytes:
    """Encode one frame; adds content-length when there is a body.

    ``headers`` is a dict or a sequence of pairs.  With 1.0 (no escaping) or for CONNECT/CONNECTED, a
    value holding LF cannot be represented and raises :class:`InvalidHeader` instead of corrupting the
    stream.
    """
    items = headers.items() if hasattr(headers, "items") else headers
    parts = [command, "\n"]
    raw = version == "1.0" or command in UNESCAPED_COMMANDS
    cr = version != "1.1"
    for name, value in items:
        if name == "content-length":
            continue
        value = str(value)
        if raw:
            if "\n" in name or "\n" in value or ":" in name:
                raise InvalidHeader(f"header {name!r} cannot be sent unescaped in a {command} frame "
                                    f"(STOMP {version})")
            parts.append(f"{name}:{value}\n")
        else:
            parts.append(f"{escape(name, cr)}:{escape(value, cr)}\n")
    if body:
        parts.append(f"content-length:{len(body)}\n")
    parts.append("\n")
    return "".join(parts).encode("utf-8") + body + b"\x00"


class FrameScanner:
    """Incremental STOMP frame parser (sans-IO)."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 max_headers: int = DEFAULT_MAX_HEADERS, version: str = "1.0") -> None:
        self.max_frame_size = max_frame_size
        self.max_headers = max_headers
        #: set by the connection once CONNECT/CONNECTED settle the version; drives unescaping
        self.version = version
        self._buf = bytearray()
        self._pos = 0          # start of the frame being scanned; bytes before it are consumed
        self._scan = 0         # where to resume looking for the header end or the NUL (no rescans)
        self._failed: ProtocolError | None = None
        # a frame whose headers are parsed but whose body has not fully arrived:
        # (command, headers, content-length or -1, body offset relative to _pos)
        self._pending: tuple[str, dict[str, str], int, int] | None = None
        # a LARGE_BODY frame's body bytes so far (the pending frame's), and how many; None otherwise
        self._chunks: list[bytes | memoryview] | None = None
        self._have = 0

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that has not completed yet."""
        return len(self._buf) - self._pos + self._have

    @property
    def body_missing(self) -> int:
        """Bytes a large body being gathered still needs, its NUL included; 0 when none is (the
        broker's read budget lets them in at once: they are only copied, and complete one frame)."""
        if self._chunks is None or self._pending is None:
            return 0
        return self._pending[3] + self._pending[2] + 1 - self._have

    def unparsed(self) -> bytes | None:
        """The bytes fed and not yet returned in a frame, as they were fed; None while a large body is
        gathered (its head is parsed and gone) or after a protocol error. A connection handed to another
        process (server/cores/handover.py) continues from them there."""
        if self._chunks is not None or self._failed is not None:
            return None
        return bytes(self._buf[self._pos:])

    def feed(self, data: bytes | memoryview) -> list[Frame]:
        if self._failed is not None:
            raise self._failed
        frames: list[Frame] = []
        try:
            if self._chunks is not None:
                rest = self._gather(data, frames)
                if rest is None or frames[0].command in _NEGOTIATING:
                    self._buf += rest or b""
                    return frames
                data = rest
            self._buf += data
            while True:
                frame = self._next()
                if frame is None:
                    break
                frames.append(frame)
                if frame.command in _NEGOTIATING:
                    # what follows must be parsed with the version this frame settles:
                    # keep it buffered until the next feed (feed(b"") after negotiation)
                    break
        except ProtocolError as exc:
            self._failed = exc
            self._buf = bytearray()
            self._pos = self._scan = 0
            self._chunks, self._have = None, 0
            raise
        if self._pos:
            # compact once per feed, not once per frame: many small frames per read stay linear
            del self._buf[:self._pos]
            self._scan -= self._pos
            self._pos = 0
        return frames

    def _next(self) -> Frame | None:
        buf = self._buf
        limit = self.max_frame_size
        n = len(buf)
        p = self._pos
        if self._pending is None:
            while p < n and (buf[p] == 10 or buf[p] == 13):    # heart-beats
                if buf[p] == 13:
                    if p + 1 >= n:
                        break  # a CR whose LF has not arrived yet
                    if buf[p + 1] != 10:
                        raise MalformedFrame("stray CR before a command")
                p += 1
            self._pos = p
            if self._scan < p:
                self._scan = p
            if p >= n or buf[p] == 13:
                return None
            head_len, body_start = self._header_end(buf, p)
            if head_len < 0:
                if n - p > limit:
                    raise FrameTooLarge(size=n - p, limit=limit)
                return None
            if body_start > limit:
                raise FrameTooLarge(size=body_start, limit=limit)
            command, headers, length = self._parse_head(bytes(buf[p:p + head_len]))
            self._pending = (command, headers, length, body_start)
            self._scan = p + body_start
        command, headers, length, body_start = self._pending
        b = p + body_start
        if length >= 0:
            if body_start + length > limit:
                raise FrameTooLarge(size=body_start + length, limit=limit)
            if n < b + length + 1:
                if length >= LARGE_BODY:
                    # gather the rest as it is fed (see LARGE_BODY); nothing of this frame stays in _buf
                    self._chunks = [bytes(buf[b:n])]
                    self._have = n - p          # the frame's bytes held, its head's included
                    del buf[p:]
                    self._pos = self._scan = p
                return None
            if buf[b + length] != 0:
                raise MalformedFrame(f"{command} frame: expected NUL after {length} body bytes "
                                     f"(content-length)")
            end = b + length
        else:
            end = buf.find(b"\x00", self._scan)
            if end < 0:
                if n - p > limit:
                    raise FrameTooLarge(size=n - p, limit=limit)
                self._scan = n
                return None
            if end - p > limit:
                raise FrameTooLarge(size=end - p, limit=limit)
        body = bytes(buf[b:end])
        self._pos = self._scan = end + 1
        self._pending = None
        return Frame(command, headers, body)

    def _gather(self, data: bytes | memoryview, frames: list[Frame]) -> bytes | None:
        """Feed ``data`` to the large body being gathered: None while it is incomplete; once it is, the
        frame is appended to ``frames`` and the bytes fed past its NUL are returned."""
        chunks = self._chunks
        assert chunks is not None and self._pending is not None
        command, headers, length, body_start = self._pending
        data = bytes(data)
        need = body_start + length + 1 - self._have          # body bytes still missing, and the NUL
        if len(data) < need:
            if data:
                chunks.append(data)
                self._have += len(data)
            return None
        if data[need - 1] != 0:
            raise MalformedFrame(f"{command} frame: expected NUL after {length} body bytes (content-length)")
        chunks.append(memoryview(data)[:need - 1])
        frames.append(Frame(command, headers, b"".join(chunks)))
        self._chunks, self._have, self._pending = None, 0, None
        return data[need:]

    def _header_end(self, buf: bytearray, p: int) -> tuple[int, int]:
        """(length of the command+header text, offset of the body), both relative to ``p``;
        (-1, -1) while the blank line has not arrived.  Resumes where the last search stopped."""
        i = buf.find(b"\n", max(self._scan - 2, p))
        n = len(buf)
        while i >= 0:
            if i + 1 >= n:
                break
            nxt = buf[i + 1]
            if nxt == 10:
                return i - p, i + 2 - p
            if nxt == 13:
                if i + 2 >= n:
                    break
                if buf[i + 2] == 10:
                    return i - p, i + 3 - p
            i = buf.find(b"\n", i + 1)
        self._scan = max(n - 2, p)
        return -1, -1

    def _parse_head(self, head: bytes) -> tuple[str, dict[str, str], int]:
        if b"\x00" in head:
            raise MalformedFrame("NUL inside the header block")
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedFrame("frame header is not valid UTF-8") from None
        lines = text.split("\n")
        command = lines[0]
        if command.endswith("\r"):
            command = command[:-1]
        if not command:
            raise MalformedFrame("empty command line")
        escaped = self.version != "1.0" and command not in UNESCAPED_COMMANDS
        if len(lines) - 1 > self.max_headers:
            raise MalformedFrame(f"{command} frame has {len(lines) - 1} headers, "
                                 f"more than the limit of {self.max_headers}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line.endswith("\r"):
                line = line[:-1]
            colon = line.find(":")
            if colon < 0:
                raise MalformedFrame(f"{command} frame: header line without ':'")
            if colon == 0:
                raise MalformedFrame(f"{command} frame: header with an empty name")
            name = line[:colon]
            value = line[colon + 1:]
            if escaped:
                name = unescape(name)
                value = unescape(value)
            if name not in headers:
                headers[name] = value
        cl = headers.get("content-length")
        length = -1 if cl is None else parse_wire_int("content-length", cl)
        return command, headers, length
