"""Stored records the broker cannot decode, set aside so that recovery (and a queue) goes on (issue 24).

A record that does not decode — a message whose stored frame is not one MESSAGE frame, a bulk record whose
Arrow body fails the checks a bulk SEND passes (bulk_rows.read_bulk), a catalog record that is not what
this broker writes — used to stop the broker at every start.  Recovery now hands such a record here
instead: it is logged (with the reason), counted (``pymq_quarantined_records``), listed to administrators
(the admin operation ``list-quarantine``, ``GET /api/list-quarantine``, ``pymq-admin quarantine list``), and
left **on its device untouched**, its references and sequence numbers kept: nothing a producer was told is
stored is deleted by the broker on its own.  Each start looks at it again (a broker that can read it — a
newer one, or a larger ``max_frame_size`` — brings it back).  An administrator may drop it
(``drop-quarantined``, ``pymq-admin quarantine drop``), which removes its references so its device frees
it.  spec/storage.md §12.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("pymq.broker")

#: the kinds of record set aside
MESSAGE, BULK, CATALOG = "message", "bulk", "catalog"


@dataclass
class QuarantinedRecord:
    kind: str                      # message | bulk | catalog
    device: str                    # the holding device's name (the catalog's for a catalog record)
    key: str                       # the storage key, or the catalog key
    reason: str                    # why it did not decode
    size: int                      # bytes stored
    destination: str | None = None
    seq: int | None = None
    references: tuple[str, ...] = ()
    at_ms: int = 0                 # when it was set aside
    handle: Any = field(default=None, repr=False, compare=False)      # the device object, for a drop

    def describe(self, node: str) -> dict:
        return {"node": node, "kind": self.kind, "device": self.device, "key": self.key, "reason": self.reason,
                "size": self.size, "destination": self.destination, "seq": self.seq,
                "references": list(self.references), "at_ms": self.at_ms}


class Quarantine:
    """The records set aside since this broker started, by (device, key)."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], QuarantinedRecord] = {}

    def __len__(self) -> int:
        return len(self.records)

    def add(self, record: QuarantinedRecord) -> None:
        log.error("quarantined %s record %s of device %s%s (%d bytes, references %s): %s; it stays stored, "
                  "listed by the admin operation list-quarantine", record.kind, record.key, record.device,
                  f" for {record.destination} seq {record.seq}" if record.destination else "", record.size,
                  ", ".join(record.references) or "none", record.reason)
        self.records[(record.device, record.key)] = record

    def listing(self, node: str) -> list[dict]:
        return [r.describe(node) for r in sorted(self.records.values(), key=lambda r: (r.device, r.key))]

    def take(self, device: str, key: str) -> QuarantinedRecord | None:
        """The record, no longer listed (an administrator drops it)."""
        return self.records.pop((device, key), None)


def reason_of(exc: BaseException) -> str:
    """A one-line reason (the exception's class and text, cut at 300 characters)."""
    text = " ".join(str(exc).split()) or repr(exc)
    return f"{type(exc).__name__}: {text[:300]}"
