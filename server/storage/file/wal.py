"""Write-ahead log segments of the file device: appending frames, and reading back the valid prefix.

Layouts are in ``format.py``.  A :class:`Segment` buffers encoded frames in memory (``append``), hands
them to the OS on ``flush`` and makes them durable on ``sync``; the broker thread appends and flushes
while a worker thread may sync, so ``sync`` only touches the file descriptor.  :func:`read_frames`
yields frames up to the first one that is torn, corrupt or stale (bad salt or checksum chain): recovery
must never replay more than the committed prefix.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from collections.abc import Iterator

from . import format as fmt
from .crc import crc32c
from .fileio import OS_IO, FileIO, is_no_space

#: space reserved ahead of a segment's end at a time (see fileio.py: appends into it cannot hit ENOSPC)
RESERVE_CHUNK = 1 << 20
#: a buffered piece at least this long is written on its own, from its own bytes; smaller ones are joined
WRITE_ALONE = 64 * 1024


def segment_path(directory: str, number: int) -> str:
    return os.path.join(directory, f"wal.{number:016x}")


def list_segments(directory: str) -> list[int]:
    numbers = []
    for entry in os.listdir(directory):
        if entry.startswith("wal.") and len(entry) == 20:
            try:
                numbers.append(int(entry[4:], 16))
            except ValueError:
                continue
    return sorted(numbers)


def new_salt(avoid: int = -1) -> int:
    while True:
        salt = secrets.randbits(32)
        if salt not in (0, avoid):
            return salt


class Segment:
    """One log segment open for appending."""

    def __init__(self, directory: str, number: int, page_size: int, file_id: bytes, salt: int,
                 prev_checksum: int, fsync: bool = True, io: FileIO = OS_IO) -> None:
        self.number = number
        self.salt = salt
        self.path = segment_path(directory, number)
        self._fsync = fsync
        self.io = io
        header = fmt.encode_wal_header(page_size, file_id, number, salt, prev_checksum)
        self.fd = io.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        #: bytes from the start of the file held for it (None: the platform cannot reserve)
        self.reserved: int | None = 0
        self._buffer: list[bytes | memoryview] = [header]
        #: bytes appended but not yet handed to the OS (read after every write: an attribute, not a property)
        self.buffered = len(header)
        self._checksum = fmt.CRC.unpack_from(header, fmt.WAL_HEADER.size)[0]
        self.written = 0            # bytes handed to the OS
        self.size = len(header)     # bytes appended, flushed or not
        self.frames = 0

    def append(self, ftype: int, payload: bytes, commit: bool) -> int:
        """Buffer one frame; returns the log offset just past it."""
        frame, self._checksum = fmt.encode_frame(ftype, fmt.FRAME_COMMIT if commit else 0, self.salt,
                                                 payload, self._checksum)
        self._buffer.append(frame)
        self.buffered += len(frame)
        self.size += len(frame)
        self.frames += 1
        return self.size

    def append_pieces(self, ftype: int, pieces: tuple[bytes, ...], commit: bool) -> int:
        """``append`` of a frame whose payload is ``pieces`` back to back, none of them copied: a large
        record (a bulk SEND's stored form) goes to the file from its own bytes.  The bytes in the file are
        the same as ``append(ftype, b"".join(pieces), commit)`` writes."""
        head, self._checksum = fmt.encode_frame_head(ftype, fmt.FRAME_COMMIT if commit else 0, self.salt,
                                                     pieces, self._checksum)
        size = len(head) + sum(len(p) for p in pieces)
        self._buffer.append(head)
        self._buffer.extend(pieces)
        self.buffered += size
        self.size += size
        self.frames += 1
        return self.size

    def reserve(self, extra: int) -> None:
        """Make sure ``extra`` more bytes past everything appended so far can be written without
        needing new disk space; raises OSError (ENOSPC) when the disk cannot give it."""
        if self.reserved is None or self.size + extra <= self.reserved:
            return
        needed = self.size + extra - self.reserved
        # a chunk ahead, but never more than a quarter of what the disk has left: on a small disk the log
        # must not take the space the pages need
        free = self.io.free_space(os.path.dirname(self.path))
        length = max(needed, RESERVE_CHUNK if free is None else min(RESERVE_CHUNK, free // 4))
        try:
            done = self.io.reserve(self.fd, self.reserved, length)
        except OSError as exc:
            if not is_no_space(exc) or length == needed:
                raise
            # the disk changed meanwhile: exactly what is needed
            length = needed
            done = self.io.reserve(self.fd, self.reserved, length)
        if done:
            self.reserved += length
        else:
            self.reserved = None            # not supported here: a full disk shows at write time

    def discard(self) -> None:
        """Forget what was appended but not yet handed to the OS (the device stopped trusting this
        segment after a failure; a checkpoint will cover it)."""
        self._buffer.clear()
        self.buffered = 0

    @property
    def checksum(self) -> int:
        """Checksum of the last frame appended (the header's crc before the first frame)."""
        return self._checksum

    def flush(self) -> None:
        buffer = self._buffer
        if not buffer:
            return
        self._buffer = []
        self.buffered = 0
        if len(buffer) == 1 or all(len(piece) < WRITE_ALONE for piece in buffer):
            self._write(b"".join(buffer) if len(buffer) > 1 else buffer[0])
            return
        # a large piece is written from its own bytes (no join: no copy of it, no fresh memory for one)
        small: list[bytes | memoryview] = []
        for piece in buffer:
            if len(piece) < WRITE_ALONE:
                small.append(piece)
                continue
            if small:
                self._write(b"".join(small))
                small = []
            self._write(piece)
        if small:
            self._write(b"".join(small))

    def _write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            done = self.io.write(self.fd, view)
            view = view[done:]
            self.written += done

    def sync(self) -> None:
        if self._fsync:
            self.io.datasync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            self.io.close(self.fd)
            self.fd = -1


@dataclass(frozen=True, slots=True)
class Frame:
    segment: int
    offset: int      # byte offset of the frame header in its segment
    end: int         # byte offset just past the frame
    ftype: int
    commit: bool
    payload: bytes


@dataclass(slots=True)
class SegmentHeader:
    number: int
    salt: int
    prev_checksum: int
    crc: int


def read_header(data: bytes, page_size: int, file_id: bytes) -> SegmentHeader | None:
    body = fmt.check_sealed(data, fmt.WAL_HEADER.size)
    if body is None:
        return None
    magic, version, psize, fid, number, salt, prev_checksum = fmt.WAL_HEADER.unpack(body)
    if magic != fmt.WAL_MAGIC or version != fmt.VERSION or psize != page_size or fid != file_id:
        return None
    return SegmentHeader(number, salt, prev_checksum, fmt.CRC.unpack_from(data, fmt.WAL_HEADER.size)[0])


def read_frames(directory: str, first_segment: int, first_salt: int, page_size: int,
                file_id: bytes) -> Iterator[Frame]:
    """Every valid frame from ``first_segment`` on, in log order, stopping at the first invalid one.

    A segment is followed only if the one before it ended cleanly (its whole length is valid frames)
    and the next one names the checksum of this one's last frame as its predecessor's.  Frames after the last
    COMMIT frame are yielded too; the caller applies a unit only when its COMMIT frame arrives.
    """
    number, expect_prev = first_segment, None
    while True:
        try:
            with open(segment_path(directory, number), "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return
        header = read_header(data, page_size, file_id)
        if header is None or header.number != number:
            return
        if number == first_segment:
            if header.salt != first_salt:
                return
        elif header.prev_checksum != expect_prev:
            return
        salt, checksum, pos, size = header.salt, header.crc, fmt.WAL_HEADER_SIZE, len(data)
        while pos + fmt.FRAME_SIZE <= size:
            length, ftype, flags, frame_salt = fmt.FRAME.unpack_from(data, pos)
            end = pos + fmt.FRAME_SIZE + length
            if frame_salt != salt or end > size:
                return
            stored = fmt.CRC.unpack_from(data, pos + fmt.FRAME.size)[0]
            payload = data[pos + fmt.FRAME_SIZE:end]
            expected = crc32c(payload, crc32c(data[pos:pos + fmt.FRAME.size], checksum))
            if stored != expected:
                return
            yield Frame(number, pos, end, ftype, bool(flags & fmt.FRAME_COMMIT), payload)
            checksum, pos = stored, end
        if pos != size:
            return          # a torn tail: later segments cannot follow a gap
        number, expect_prev = number + 1, checksum
