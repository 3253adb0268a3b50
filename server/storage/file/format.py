"""The on-disk format of the file device, byte by byte (mirrored in spec/storage.md), and its codecs.

Every multi-byte integer is little-endian.  CRC-32C is the Castagnoli CRC (see ``crc.py``);
``crc32c(data, seed)`` continues a running checksum, so ``crc32c(b, crc32c(a)) == crc32c(a + b)``.

A store is a directory holding:

* ``LOCK``                     an empty file; an exclusive ``flock`` keeps a second process out.
* ``pages``                    the page file: fixed-size pages, page ``n`` at byte ``n * page_size``.
* ``wal.<16 hex digits>``      write-ahead log segments, numbered upward (``wal.0000000000000001``).

Page file
---------
Page 0 is the file header; pages 1 and 2 are the meta pages (A and B); pages 3.. are handed out by the
page allocator as PERSISTENT, NON_PERSISTENT or SYSTEM (checkpoint) pages.  Unused bytes are zero.

File header, page 0 (64 bytes)::

    0   8  magic "PYMQPGF\\0"
    8   4  format version (1)
    12  4  page size in bytes (power of two, 4096 .. 16 MiB)
    16  16 file id (random; every meta page and WAL segment repeats it)
    32  4  reserved pages (3)
    36  24 zero
    60  4  crc32c of bytes 0..60

Meta page, pages 1 and 2 (80 bytes).  Checkpoint generation ``g`` is written to page ``1 + g % 2``, so
the previous generation survives a torn meta write (LMDB's alternating meta pages).  Open picks the
valid meta page (magic, crc, file id) with the highest generation::

    0   8  magic "PYMQMETA"
    8   4  format version (1)
    12  4  page size
    16  16 file id
    32  8  generation (1 for the checkpoint written at creation)
    40  8  WAL segment where replay starts
    48  4  salt that segment's header must carry
    52  4  page count (end of file, in pages, when the checkpoint was taken)
    56  4  first checkpoint page (0: none)
    60  4  number of checkpoint pages
    64  8  checkpoint payload length in bytes
    72  4  crc32c of the whole checkpoint payload
    76  4  crc32c of bytes 0..76

Checkpoint page (SYSTEM kind; a chain carrying the checkpoint payload, 24-byte header)::

    0   4  magic "PQCK"
    4   4  next checkpoint page (0: last)
    8   8  generation
    16  4  payload bytes in this page
    20  4  crc32c of bytes 0..20, then of the payload bytes of this page
    24  .. payload bytes

Checkpoint payload: a sequence of sections ``tag u32, length u32, body``; unknown tags are skipped.

* 1 PAGE_TABLE  one byte per page: 0 free, 1 persistent, 2 non-persistent, 3 system (seed 002's page
  table).  Recovery turns every 2 into 0 without reading the page.
* 2 PAGES       per persistent slotted page: ``page u32, slots u32, data_start u32, live bitmap`` of
  ``ceil(slots / 8)`` bytes (bit ``i % 8`` of byte ``i // 8`` set = slot ``i`` holds a live message).
  Only these slots and the records they point to are guaranteed by the checkpoint.
* 3 NAMES       ``id u32, length u16, utf-8``: destination and queue names, interned.
* 4 REFSETS     ``id u32, count u16, count * name id u32``: the queues a message was written for.
* 5 REFS        ``key u64, count u16, count * name id u32``: live messages whose remaining references
  differ from their slot's refset (partly consumed, or given an extra reference).
* 6 CATALOG     ``key length u16, key utf-8, value length u32, value``.
* 7 STATE       ``persistent tail page u32`` (0: none), ``next name id u32``, ``next refset id u32``.
* 8 DELIVERIES  ``key u64, queue name id u32, count u32``: delivery counts of live persistent messages
  (frame type 7 below); absent for a message never delivered.

Slotted page (a PERSISTENT or NON_PERSISTENT page holding messages; 32-byte header, slots growing up
from byte 32, records growing down from the end of the page)::

    0   4  magic "PQPG"
    4   1  kind (1 persistent, 2 non-persistent)
    5   3  zero
    8   4  page number
    12  4  zero
    16  8  checkpoint generation current when the page was allocated
    24  4  zero
    28  4  crc32c of bytes 0..28

    slot i at byte 32 + 48 * i:
    0   8  key
    8   8  seq
    16  4  record offset in the page
    20  4  record length in bytes
    24  4  message length in bytes
    28  4  destination name id
    32  4  refset id (the queues at write time)
    36  4  flags: bit 0 persistent, bit 1 large (the record lists continuation pages)
    40  4  crc32c of the message bytes
    44  4  crc32c of slot bytes 0..44

A record is the message bytes, or, for a large message, ``ceil(length / page_size)`` page numbers
(u32 each) of continuation pages: pages of the same kind holding the raw message bytes, back to back,
the last one zero-padded.  A page's bytes below its checkpointed watermark (its slots and records as of
the last checkpoint) are never rewritten while the page is allocated: appends only write new slots and
records, so a torn page write can only damage bytes the log still holds.

WAL segment
-----------
Header (56 bytes)::

    0   8  magic "PYMQWAL\\0"
    8   4  format version (1)
    12  4  page size
    16  16 file id
    32  8  segment number
    40  4  salt (random per segment)
    44  4  checksum of the last frame of the segment before this one (its header crc if it had none;
           0 when this segment starts a new chain).  Replay continues from segment n into n + 1
           only if n ended exactly on a valid frame whose checksum is this value, so cutting n at a
           frame boundary cannot splice n + 1 onto the cut
    48  4  zero
    52  4  crc32c of bytes 0..52

Frame (16-byte header, then ``length`` payload bytes)::

    0   4  payload length
    4   1  type
    5   1  flags: bit 0 COMMIT (the frame ends an atomic unit)
    6   2  zero
    8   4  salt (equal to the segment's)
    12  4  checksum: crc32c of header bytes 0..12 then the payload, seeded with the previous frame's
           checksum (the segment header's crc for the first frame)

A frame is valid when its length fits the file, its salt matches and its checksum matches; replay
stops at the first invalid frame (a torn tail, a flipped bit, a stale frame of an older generation) and
applies only frames up to the last valid COMMIT frame.  Payloads by type:

* 1 NAME    ``id u32``, utf-8 name
* 2 REFSET  ``id u32, count u32, count * name id u32``
* 3 PUT     ``page u32, slot u32``, the 44 slot bytes (slot layout above, without its crc),
            ``continuation count u32, count * page u32``, the message bytes
* 4 REMOVE  ``key u64, queue name id u32``
* 5 ADDREF  ``key u64, queue name id u32``
* 6 META    ``key length u16``, key utf-8, ``present u8``, value (the rest; absent: delete)
* 7 DELIVERED one or more ``key u64, queue name id u32, count u32``: each message was handed to
            consumers of that queue ``count`` times so far (a value, not an increment; a later entry
            wins).  Persistent messages delivered to a consumer that must acknowledge them, logged by
            the flush after the deliveries (those acknowledged by then are left out), so delivery
            counts and the redelivered flag survive a restart.  An entry for a message or reference
            that no longer exists is ignored.  An older pymq stops at this type: open such a store with
            it only after a clean shutdown, which leaves the log empty
* 8 UNIT_END empty; always with the COMMIT flag.  The frames before it back to the previous COMMIT frame
            are one unit (a transaction's changes, spec/ha.md §3.4), logged without the flag: replay
            applies all of them or, when the log ends before this frame, none.  An older pymq stops at
            this type, as at 7

Only persistent messages and catalog records are logged; non-persistent pages are never logged.
"""
from __future__ import annotations

import struct

from .crc import crc32c

VERSION = 1
RESERVED_PAGES = 3
META_PAGES = (1, 2)

FILE_MAGIC = b"PYMQPGF\x00"
META_MAGIC = b"PYMQMETA"
CKPT_MAGIC = b"PQCK"
PAGE_MAGIC = b"PQPG"
WAL_MAGIC = b"PYMQWAL\x00"

MIN_PAGE_SIZE = 4096
MAX_PAGE_SIZE = 16 << 20

# -- page file ------------------------------------------------------------------------------------------
FILE_HEADER = struct.Struct("<8sII16sI24x")            # 60 bytes + crc
META = struct.Struct("<8sII16sQQIIIIQI")                # 76 bytes + crc
CKPT_PAGE = struct.Struct("<4sIQI")                     # 20 bytes + crc
CKPT_PAGE_SIZE = CKPT_PAGE.size + 4
PAGE_HEADER = struct.Struct("<4sB3xI4xQ4x")             # 28 bytes + crc
PAGE_HEADER_SIZE = PAGE_HEADER.size + 4
SLOT_BODY = struct.Struct("<QQIIIIIII")                 # 44 bytes + crc
SLOT = struct.Struct("<QQIIIIIIII")
SLOT_SIZE = SLOT.size
U32 = struct.Struct("<I")
CRC = U32

FLAG_PERSISTENT = 1
FLAG_LARGE = 2

# checkpoint payload sections
SEC_PAGE_TABLE = 1
SEC_PAGES = 2
SEC_NAMES = 3
SEC_REFSETS = 4
SEC_REFS = 5
SEC_CATALOG = 6
SEC_STATE = 7
SEC_DELIVERIES = 8
SECTION = struct.Struct("<II")
PAGE_ENTRY = struct.Struct("<III")
NAME_ENTRY = struct.Struct("<IH")
REFSET_ENTRY = struct.Struct("<IH")
REFS_ENTRY = struct.Struct("<QH")
STATE = struct.Struct("<III")

# -- WAL --------------------------------------------------------------------------------------------------
WAL_HEADER = struct.Struct("<8sII16sQII4x")            # 52 bytes + crc
WAL_HEADER_SIZE = WAL_HEADER.size + 4
FRAME = struct.Struct("<IBB2xI")                        # 12 bytes + checksum
FRAME_SIZE = FRAME.size + 4

F_NAME = 1
F_REFSET = 2
F_PUT = 3
F_REMOVE = 4
F_ADDREF = 5
F_META = 6
F_DELIVERED = 7
F_UNIT_END = 8
FRAME_COMMIT = 1

PUT_HEAD = struct.Struct("<II")
KEY_NAME = struct.Struct("<QI")
DELIVERED = struct.Struct("<QII")          # key, queue name id, count (frame 7, section 8 entries)


def sealed(body: bytes, seed: int = 0) -> bytes:
    """``body`` followed by its crc32c (every fixed header of the format ends this way)."""
    return body + CRC.pack(crc32c(body, seed))


def check_sealed(raw: bytes, size: int) -> bytes | None:
    """The body of a sealed header of ``size`` body bytes, or None if torn or corrupt."""
    if len(raw) < size + 4:
        return None
    body = raw[:size]
    if CRC.unpack_from(raw, size)[0] != crc32c(body):
        return None
    return body


def encode_file_header(page_size: int, file_id: bytes) -> bytes:
    return sealed(FILE_HEADER.pack(FILE_MAGIC, VERSION, page_size, file_id, RESERVED_PAGES))


def encode_meta(page_size: int, file_id: bytes, generation: int, wal_segment: int, wal_salt: int,
                page_count: int, ckpt_first: int, ckpt_pages: int, ckpt_length: int, ckpt_crc: int) -> bytes:
    return sealed(META.pack(META_MAGIC, VERSION, page_size, file_id, generation, wal_segment, wal_salt,
                            page_count, ckpt_first, ckpt_pages, ckpt_length, ckpt_crc))


def encode_page_header(kind: int, page: int, generation: int) -> bytes:
    return sealed(PAGE_HEADER.pack(PAGE_MAGIC, kind, page, generation))


def encode_slot(key: int, seq: int, offset: int, rlen: int, length: int, dest: int, refset: int,
                flags: int, data_crc: int) -> bytes:
    return sealed(SLOT_BODY.pack(key, seq, offset, rlen, length, dest, refset, flags, data_crc))


def encode_wal_header(page_size: int, file_id: bytes, segment: int, salt: int, prev_checksum: int) -> bytes:
    return sealed(WAL_HEADER.pack(WAL_MAGIC, VERSION, page_size, file_id, segment, salt, prev_checksum))


def encode_frame(ftype: int, flags: int, salt: int, payload: bytes, prev: int) -> tuple[bytes, int]:
    """One frame and its checksum (the seed of the next frame)."""
    head = FRAME.pack(len(payload), ftype, flags, salt)
    # crc32c(payload, crc32c(head, prev)) in one call: the checksum chains (crc.py)
    checksum = crc32c(head + payload, prev)
    return b"".join((head, CRC.pack(checksum), payload)), checksum


def encode_frame_head(ftype: int, flags: int, salt: int, pieces: tuple[bytes, ...], prev: int) -> tuple[bytes, int]:
    """The 16-byte header of a frame whose payload is ``pieces`` back to back, and its checksum: the same
    bytes as :func:`encode_frame` gives for ``b"".join(pieces)``, with the payload never joined (the
    checksum runs over the pieces in turn).  A large record is logged this way, from its own bytes."""
    head = FRAME.pack(sum(len(p) for p in pieces), ftype, flags, salt)
    checksum = crc32c(head, prev)
    for piece in pieces:
        checksum = crc32c(piece, checksum)
    return head + CRC.pack(checksum), checksum


_NO_CONTINUATION = U32.pack(0)


def encode_put(page: int, slot: int, slot_body: bytes, continuation: list[int] | tuple[int, ...],
               data: bytes) -> bytes:
    if not continuation:
        return b"".join((PUT_HEAD.pack(page, slot), slot_body, _NO_CONTINUATION, data))
    return encode_put_head(page, slot, slot_body, continuation) + data


def encode_put_head(page: int, slot: int, slot_body: bytes, continuation: list[int] | tuple[int, ...]) -> bytes:
    """A PUT payload up to the message bytes (``encode_put`` is this followed by them)."""
    return b"".join((PUT_HEAD.pack(page, slot), slot_body, U32.pack(len(continuation)),
                     struct.pack(f"<{len(continuation)}I", *continuation)))


def decode_put(payload: bytes) -> tuple[int, int, tuple, tuple[int, ...], bytes]:
    page, slot = PUT_HEAD.unpack_from(payload, 0)
    fields = SLOT_BODY.unpack_from(payload, 8)
    count = U32.unpack_from(payload, 8 + SLOT_BODY.size)[0]
    start = 12 + SLOT_BODY.size
    cont = struct.unpack_from(f"<{count}I", payload, start)
    return page, slot, fields, cont, payload[start + 4 * count:]


def encode_name(name_id: int, name: str) -> bytes:
    return U32.pack(name_id) + name.encode()


def encode_refset(refset_id: int, ids: tuple[int, ...]) -> bytes:
    return struct.pack(f"<II{len(ids)}I", refset_id, len(ids), *ids)


def decode_refset(payload: bytes) -> tuple[int, tuple[int, ...]]:
    refset_id, count = struct.unpack_from("<II", payload, 0)
    return refset_id, struct.unpack_from(f"<{count}I", payload, 8)


def encode_meta_record(key: str, value: bytes | None) -> bytes:
    raw = key.encode()
    return struct.pack("<H", len(raw)) + raw + (b"\x00" if value is None else b"\x01" + value)


def decode_meta_record(payload: bytes) -> tuple[str, bytes | None]:
    klen = struct.unpack_from("<H", payload, 0)[0]
    key = payload[2:2 + klen].decode()
    present = payload[2 + klen]
    return key, (bytes(payload[3 + klen:]) if present else None)
