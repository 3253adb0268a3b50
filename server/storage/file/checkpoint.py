"""Encoding of the checkpoint payload (sections PAGE_TABLE .. STATE, layout in ``format.py``).

A checkpoint is everything recovery needs besides the page directories and the log: the page table,
each persistent page's slot count and live bitmap, the interned names and refsets, references that
changed since their message was written, the catalog, the persistent tail page, and the delivery
counts of messages handed to consumers.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from pymq.errors import StorageError

from . import format as fmt


@dataclass(slots=True)
class CheckpointState:
    table: bytes = b""
    pages: list[tuple[int, int, int, bytes]] = field(default_factory=list)  # page, slots, data_start, bitmap
    names: dict[int, str] = field(default_factory=dict)
    refsets: dict[int, tuple[int, ...]] = field(default_factory=dict)
    refs: dict[int, tuple[int, ...]] = field(default_factory=dict)            # key -> name ids
    catalog: dict[str, bytes] = field(default_factory=dict)
    tail: int = 0
    next_name: int = 1
    next_refset: int = 1
    deliveries: dict[tuple[int, int], int] = field(default_factory=dict)     # (key, name id) -> count


def _section(tag: int, body: bytes) -> bytes:
    return fmt.SECTION.pack(tag, len(body)) + body


def encode_body(state: CheckpointState) -> bytes:
    """Every section but PAGE_TABLE (whose size depends on pages the checkpoint itself takes)."""
    out = []
    parts = []
    for page, slots, data_start, bitmap in state.pages:
        parts.append(fmt.PAGE_ENTRY.pack(page, slots, data_start))
        parts.append(bitmap)
    out.append(_section(fmt.SEC_PAGES, b"".join(parts)))
    parts = []
    for name_id, name in state.names.items():
        raw = name.encode()
        parts.append(fmt.NAME_ENTRY.pack(name_id, len(raw)) + raw)
    out.append(_section(fmt.SEC_NAMES, b"".join(parts)))
    parts = []
    for refset_id, ids in state.refsets.items():
        parts.append(fmt.REFSET_ENTRY.pack(refset_id, len(ids)) + struct.pack(f"<{len(ids)}I", *ids))
    out.append(_section(fmt.SEC_REFSETS, b"".join(parts)))
    parts = []
    for key, ids in state.refs.items():
        parts.append(fmt.REFS_ENTRY.pack(key, len(ids)) + struct.pack(f"<{len(ids)}I", *ids))
    out.append(_section(fmt.SEC_REFS, b"".join(parts)))
    parts = []
    for name, value in state.catalog.items():
        raw = name.encode()
        parts.append(struct.pack("<H", len(raw)) + raw + fmt.U32.pack(len(value)) + value)
    out.append(_section(fmt.SEC_CATALOG, b"".join(parts)))
    out.append(_section(fmt.SEC_STATE, fmt.STATE.pack(state.tail, state.next_name, state.next_refset)))
    if state.deliveries:
        pack = fmt.DELIVERED.pack
        out.append(_section(fmt.SEC_DELIVERIES, b"".join(pack(key, name_id, count) for (key, name_id), count
                                                         in state.deliveries.items())))
    return b"".join(out)


def encode(table: bytes, body: bytes) -> bytes:
    return _section(fmt.SEC_PAGE_TABLE, table) + body


def decode(payload: bytes) -> CheckpointState:
    state = CheckpointState()
    pos, size = 0, len(payload)
    try:
        while pos < size:
            tag, length = fmt.SECTION.unpack_from(payload, pos)
            pos += fmt.SECTION.size
            body = payload[pos:pos + length]
            if len(body) != length:
                raise StorageError("checkpoint section runs past the payload")
            pos += length
            if tag == fmt.SEC_PAGE_TABLE:
                state.table = body
            elif tag == fmt.SEC_PAGES:
                at = 0
                while at < length:
                    page, slots, data_start = fmt.PAGE_ENTRY.unpack_from(body, at)
                    at += fmt.PAGE_ENTRY.size
                    nbytes = (slots + 7) // 8
                    state.pages.append((page, slots, data_start, body[at:at + nbytes]))
                    at += nbytes
            elif tag == fmt.SEC_NAMES:
                at = 0
                while at < length:
                    name_id, nlen = fmt.NAME_ENTRY.unpack_from(body, at)
                    at += fmt.NAME_ENTRY.size
                    state.names[name_id] = body[at:at + nlen].decode()
                    at += nlen
            elif tag == fmt.SEC_REFSETS:
                at = 0
                while at < length:
                    refset_id, count = fmt.REFSET_ENTRY.unpack_from(body, at)
                    at += fmt.REFSET_ENTRY.size
                    state.refsets[refset_id] = struct.unpack_from(f"<{count}I", body, at)
                    at += 4 * count
            elif tag == fmt.SEC_REFS:
                at = 0
                while at < length:
                    key, count = fmt.REFS_ENTRY.unpack_from(body, at)
                    at += fmt.REFS_ENTRY.size
                    state.refs[key] = struct.unpack_from(f"<{count}I", body, at)
                    at += 4 * count
            elif tag == fmt.SEC_CATALOG:
                at = 0
                while at < length:
                    klen = struct.unpack_from("<H", body, at)[0]
                    key = body[at + 2:at + 2 + klen].decode()
                    at += 2 + klen
                    vlen = fmt.U32.unpack_from(body, at)[0]
                    state.catalog[key] = body[at + 4:at + 4 + vlen]
                    at += 4 + vlen
            elif tag == fmt.SEC_STATE:
                state.tail, state.next_name, state.next_refset = fmt.STATE.unpack_from(body, 0)
            elif tag == fmt.SEC_DELIVERIES:
                for key, name_id, count in fmt.DELIVERED.iter_unpack(body):
                    state.deliveries[(key, name_id)] = count
            # unknown tags: a newer minor format; skipped on purpose
    except (struct.error, UnicodeDecodeError) as exc:
        raise StorageError(f"checkpoint payload is malformed: {exc}") from exc
    return state
