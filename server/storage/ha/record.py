"""The lease record of a store (spec/ha.md §1.3; bytes in spec/storage.md §13), sans-IO.

The record says who holds the store: the epoch (the fencing token, which only grows), a renewal
counter, a write sequence, the holder (a random instance id per process start, host name, pid), the
group's ``node_id``, and whether the holder holds the OS lock.  The file medium keeps two copies of
256 bytes at offsets 0 and 512, each sealed by its CRC-32C; a writer overwrites the copy with the older
sequence and a reader takes the valid copy with the higher one, so a torn write never loses the record
(LMDB's alternating meta pages, the file device's meta pages).  PostgreSQL keeps the same fields in a
row.
"""
from __future__ import annotations

import dataclasses
import struct

from ..file.crc import crc32c

MAGIC = b"PYMQHA\x00\x00"
VERSION = 1
RECORD_SIZE = 256
#: where each copy starts (a copy never shares a 512-byte sector with the other)
SLOT_OFFSETS = (0, 512)
FILE_SIZE = 1024

#: flags
OS_LOCKED = 1

_NAME = 64
# magic, version, flags, seq, epoch, renewals, instance, pid, reserved, node, host
_BODY = struct.Struct(f"<8sIIQQQ16sII{_NAME}s{_NAME}s")
_PAD = RECORD_SIZE - _BODY.size - 4


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """One state of the lease.  ``seq`` grows by one at every write (renewals included)."""

    epoch: int
    seq: int
    renewals: int
    instance: bytes           # 16 random bytes: one process start
    node: str                 # the group's node_id
    host: str = ""
    pid: int = 0
    os_locked: bool = False

    def renewed(self, os_locked: bool) -> LeaseRecord:
        return dataclasses.replace(self, seq=self.seq + 1, renewals=self.renewals + 1, os_locked=os_locked)

    def taken(self, instance: bytes, host: str, pid: int, os_locked: bool) -> LeaseRecord:
        """The record a process that takes the store writes: the next epoch, this process as holder."""
        return LeaseRecord(self.epoch + 1, self.seq + 1, 0, instance, self.node, host, pid, os_locked)

    def holder(self) -> dict:
        """The holder as the admin interface shows it."""
        return {"instance": self.instance.hex(), "host": self.host, "pid": self.pid,
                "os_locked": self.os_locked}


def first(node: str, instance: bytes, host: str, pid: int, os_locked: bool) -> LeaseRecord:
    """The record of the first process on a new store: epoch 1."""
    return LeaseRecord(1, 1, 0, instance, node, host, pid, os_locked)


def _text(value: str) -> bytes:
    raw = value.encode("utf-8")[:_NAME]
    # never cut a character in two
    return raw.decode("utf-8", "ignore").encode("utf-8")


def encode(record: LeaseRecord) -> bytes:
    if len(record.instance) != 16:
        raise ValueError("a lease record's instance is 16 bytes")
    body = _BODY.pack(MAGIC, VERSION, OS_LOCKED if record.os_locked else 0, record.seq, record.epoch,
                      record.renewals, record.instance, record.pid & 0xFFFFFFFF, 0, _text(record.node),
                      _text(record.host)) + bytes(_PAD)
    return body + struct.pack("<I", crc32c(body))


def decode(raw: bytes) -> LeaseRecord | None:
    """The record in one copy, or None when it is absent, torn or corrupt."""
    if len(raw) < RECORD_SIZE:
        return None
    body = raw[:RECORD_SIZE - 4]
    if struct.unpack_from("<I", raw, RECORD_SIZE - 4)[0] != crc32c(body):
        return None
    magic, version, flags, seq, epoch, renewals, instance, pid, _, node, host = _BODY.unpack_from(body)
    if magic != MAGIC or version != VERSION:
        return None
    return LeaseRecord(epoch, seq, renewals, instance, node.rstrip(b"\x00").decode("utf-8", "replace"),
                       host.rstrip(b"\x00").decode("utf-8", "replace"), pid, bool(flags & OS_LOCKED))


def newest(image: bytes) -> tuple[LeaseRecord | None, int]:
    """The valid copy with the higher sequence in a file ``image``, and the offset the next write goes
    to (the other copy's, or the first when neither is valid)."""
    copies = [(decode(image[at:at + RECORD_SIZE]), at) for at in SLOT_OFFSETS]
    valid = [(rec, at) for rec, at in copies if rec is not None]
    if not valid:
        return None, SLOT_OFFSETS[0]
    record, at = max(valid, key=lambda pair: pair[0].seq)
    other = SLOT_OFFSETS[1] if at == SLOT_OFFSETS[0] else SLOT_OFFSETS[0]
    return record, other
