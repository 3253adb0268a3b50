"""The write-ahead log as an open store writes it: the segment being appended to, the segments a
checkpoint in flight still needs, and how many bytes were logged since the last checkpoint.

Frames are appended only while ``logging`` is on: a store in fault stops logging (its log's tail may be
torn, and after a failed fsync the kernel may have dropped pages), and a repair's checkpoint records the
state instead and starts a new chain (spec/storage.md §8).  The bytes are ``wal.py``'s; this object decides
which segment they go to.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pymq.errors import StorageError

from . import format as fmt
from .wal import Segment, list_segments, new_salt, segment_path

if TYPE_CHECKING:
    from .state import OpenStore


class LogWriter:
    __slots__ = ("store", "segment", "old_segments", "next_number", "since_checkpoint", "logging", "unit_depth",
                 "unit_frames")

    def __init__(self, store: OpenStore) -> None:
        self.store = store
        self.segment: Segment | None = None
        #: segments a checkpoint in flight still covers: synced with the current one, deleted after it
        self.old_segments: list[Segment] = []
        self.next_number = 1
        #: bytes logged since the last checkpoint's snapshot (a checkpoint is due after ``checkpoint_bytes``)
        self.since_checkpoint = 0
        #: frames are written (False in fault: the next checkpoint records the state instead)
        self.logging = True
        #: an open unit (spec/ha.md §3.4): its frames are logged without the COMMIT flag, and its end with a
        #: UNIT_END frame that has it, so replay applies all of them or none; checkpoints wait for its end
        self.unit_depth = 0
        self.unit_frames = 0

    @property
    def current(self) -> Segment:
        seg = self.segment
        if seg is None:
            raise self._not_open()
        return seg

    def _not_open(self) -> StorageError:
        return StorageError(f"file device {self.store.name!r} is not open", device=self.store.name)

    def append(self, ftype: int, payload: bytes, commit: bool) -> None:
        if not self.logging:
            return
        if self.unit_depth:
            commit = False
            self.unit_frames += 1
        seg = self.segment             # (not ``current``: two appends a message; closed is checked here)
        if seg is None:
            raise self._not_open()
        before = seg.size
        self.since_checkpoint += seg.append(ftype, payload, commit) - before

    def append_pieces(self, ftype: int, pieces: tuple[bytes, ...], commit: bool) -> None:
        """``append`` of a payload given as pieces (a large message's PUT: logged from its own bytes)."""
        if not self.logging:
            return
        if self.unit_depth:
            commit = False
            self.unit_frames += 1
        seg = self.segment             # (not ``current``: two appends a message; closed is checked here)
        if seg is None:
            raise self._not_open()
        before = seg.size
        self.since_checkpoint += seg.append_pieces(ftype, pieces, commit) - before

    def begin_unit(self) -> None:
        self.unit_depth += 1

    def end_unit(self) -> None:
        """The outermost end of a unit: its frames are committed by one UNIT_END frame."""
        self.unit_depth -= 1
        if self.unit_depth == 0 and self.unit_frames:
            self.unit_frames = 0
            self.append(fmt.F_UNIT_END, b"", True)

    def stop(self) -> None:
        """Stop logging (the store entered fault) and forget what was not handed to the OS yet."""
        self.logging = False
        if self.segment is not None:
            self.segment.discard()

    def start(self, prev_salt: int, prev_checksum: int) -> Segment:
        """Open the next segment with its header on disk and make it the current one; nothing changes if
        that fails.  ``prev_checksum`` 0 starts a new chain (a repair)."""
        store = self.store
        seg = Segment(store.directory, self.next_number, store.page_size, store.page_file.file_id,
                      new_salt(prev_salt), prev_checksum, fsync=store.fsync, io=store.io)
        try:
            seg.flush()
        except OSError:
            seg.close()
            try:
                store.io.unlink(seg.path)
            except OSError:
                pass
            raise
        self.next_number += 1
        self.segment = seg
        return seg

    def segments(self) -> list[Segment]:
        """Every segment a sync must cover, oldest first."""
        return [*self.old_segments, self.current]

    def drop_older_than(self, first_needed: int) -> None:
        """A checkpoint is durable: close and delete the segments it no longer needs (those before
        ``first_needed``), including ones left on disk by an earlier run."""
        stale, self.old_segments = self.old_segments, []
        io = self.store.io
        for seg in stale:
            seg.close()
            try:
                io.unlink(seg.path)
            except FileNotFoundError:
                pass
        directory = self.store.directory
        for number in list_segments(directory):
            if number < first_needed:
                try:
                    io.unlink(segment_path(directory, number))
                except FileNotFoundError:
                    pass

    def close(self) -> None:
        for seg in self.old_segments:
            seg.close()
        if self.segment is not None:
            self.segment.close()
        self.old_segments, self.segment = [], None
