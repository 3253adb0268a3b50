"""Regenerate spec/vectors/storage.json from the reference encoders (only on a deliberate format change).

    python spec/tools/gen_storage_vectors.py

Inputs are fixed; the output is hex for bytes and plain integers, so any language can run the vectors.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from pymq_server.storage.file import checkpoint as ckpt  # noqa: E402
from pymq_server.storage.file import format as fmt       # noqa: E402
from pymq_server.storage.file.crc import crc32c          # noqa: E402

FILE_ID = bytes(range(0x10, 0x20))
PAGE = 4096


def crc_vectors():
    out = [
        {"input_hex": "", "seed": 0, "source": "published"},
        {"input_hex": b"123456789".hex(), "seed": 0, "source": "published (check value)"},
        {"input_hex": bytes(32).hex(), "seed": 0, "source": "published (RFC 3720 B.4)"},
        {"input_hex": (b"\xff" * 32).hex(), "seed": 0, "source": "published (RFC 3720 B.4)"},
        {"input_hex": bytes(range(32)).hex(), "seed": 0, "source": "published (RFC 3720 B.4)"},
        {"input_hex": bytes(range(31, -1, -1)).hex(), "seed": 0, "source": "published (RFC 3720 B.4)"},
        {"input_hex": b"6789".hex(), "seed": crc32c(b"12345"), "source": "chained: equals crc of 123456789"},
    ]
    for v in out:
        v["crc"] = crc32c(bytes.fromhex(v["input_hex"]), v["seed"])
    return out


def frames():
    salt = 0x5EED5A17
    header = fmt.encode_wal_header(PAGE, FILE_ID, 7, salt, 0)
    prev = fmt.CRC.unpack_from(header, fmt.WAL_HEADER.size)[0]
    slot_body = fmt.SLOT_BODY.pack(42, 3, PAGE - 5, 5, 5, 1, 1, fmt.FLAG_PERSISTENT, crc32c(b"hello"))
    items = [
        (fmt.F_NAME, 0, fmt.encode_name(1, "/queue/a")),
        (fmt.F_REFSET, 0, fmt.encode_refset(1, (1,))),
        (fmt.F_PUT, fmt.FRAME_COMMIT, fmt.encode_put(3, 0, slot_body, (), b"hello")),
        (fmt.F_ADDREF, 0, fmt.KEY_NAME.pack(42, 2)),
        (fmt.F_NAME, fmt.FRAME_COMMIT, fmt.encode_name(2, "/queue/DLQ")),
        (fmt.F_REMOVE, fmt.FRAME_COMMIT, fmt.KEY_NAME.pack(42, 1)),
        (fmt.F_META, fmt.FRAME_COMMIT, fmt.encode_meta_record("queue:/queue/a", b'{"redelivery":3}')),
        (fmt.F_META, fmt.FRAME_COMMIT, fmt.encode_meta_record("gone", None)),
    ]
    out, blob = [], [header]
    for ftype, flags, payload in items:
        frame, prev = fmt.encode_frame(ftype, flags, salt, payload, prev)
        out.append({"type": ftype, "flags": flags, "payload_hex": payload.hex(), "frame_hex": frame.hex(),
                    "checksum": prev})
        blob.append(frame)
    segment = b"".join(blob)
    ends = []
    pos = len(header)
    for item in out:
        pos += len(bytes.fromhex(item["frame_hex"]))
        ends.append(pos)
    cuts = sorted({0, 10, len(header), len(header) + 3, *ends, *(e - 1 for e in ends), len(segment)})
    cut_cases = [{"length": c, "valid_frames": sum(1 for e in ends if e <= c) if c >= len(header) else 0}
                 for c in cuts]
    flip_cases = []
    for at in (len(header) + 2, ends[1] + 9, ends[2] + 20, ends[5] - 1, 45):
        idx = next((i for i, e in enumerate(ends) if at < e), len(ends))
        flip_cases.append({"byte": at, "xor": 1, "valid_frames": idx if at >= len(header) else 0})
    return {
        "page_size": PAGE, "file_id_hex": FILE_ID.hex(), "segment": 7, "salt": salt, "prev_checksum": 0,
        "header_hex": header.hex(), "frames": out, "segment_hex": segment.hex(),
        "cut_cases": cut_cases, "flip_cases": flip_cases,
        "description": "frames chain checksums from the header crc; valid_frames counts frames a "
                       "reader accepts (it stops at the first invalid one); commit units are "
                       "[0..2], [3..4], [5], [6], [7]",
    }


def layouts():
    meta_fields = {"generation": 5, "wal_segment": 9, "wal_salt": 0xA1B2C3D4, "page_count": 77,
                   "ckpt_first": 70, "ckpt_pages": 2, "ckpt_length": 5000, "ckpt_crc": 0x01020304}
    slot_fields = {"key": 123456789012, "seq": 17, "offset": 4000, "rlen": 96, "length": 96, "dest": 3,
                   "refset": 2, "flags": 1, "data_crc": 0xDEADBEEF}
    return {
        "file_header": {"page_size": PAGE, "file_id_hex": FILE_ID.hex(),
                        "bytes_hex": fmt.encode_file_header(PAGE, FILE_ID).hex()},
        "meta": {"page_size": PAGE, "file_id_hex": FILE_ID.hex(), **meta_fields,
                 "meta_page": fmt.META_PAGES[meta_fields["generation"] % 2],
                 "bytes_hex": fmt.encode_meta(PAGE, FILE_ID, *meta_fields.values()).hex()},
        "page_header": {"kind": 1, "page": 12, "generation": 4,
                        "bytes_hex": fmt.encode_page_header(1, 12, 4).hex()},
        "slot": {**slot_fields, "bytes_hex": fmt.encode_slot(*slot_fields.values()).hex()},
    }


def checkpoint_vector():
    state = ckpt.CheckpointState(
        table=bytes([3, 3, 3, 1, 2, 0, 1, 3]),
        pages=[(3, 10, 3500, bytes([0b10100101, 0b00000010])), (6, 1, 4000, bytes([1]))],
        names={1: "/queue/a", 2: "sub-1"}, refsets={1: (1,), 2: (1, 2)}, refs={99: (2,)},
        catalog={"queue:/queue/a": b"cfg"}, tail=6, next_name=3, next_refset=3)
    payload = ckpt.encode(state.table, ckpt.encode_body(state))
    return {"table_hex": state.table.hex(),
            "pages": [{"page": p, "slots": s, "data_start": d, "bitmap_hex": b.hex()} for p, s, d, b in state.pages],
            "names": {str(k): v for k, v in state.names.items()},
            "refsets": {str(k): list(v) for k, v in state.refsets.items()},
            "refs": {str(k): list(v) for k, v in state.refs.items()},
            "catalog": {k: v.hex() for k, v in state.catalog.items()},
            "tail": state.tail, "next_name": state.next_name, "next_refset": state.next_refset,
            "payload_hex": payload.hex()}


def main():
    doc = {
        "spec": "spec/storage.md",
        "description": "file device on-disk format version 1; little-endian; crc32c = CRC-32C (Castagnoli), "
                       "'seed' continues a running checksum",
        "crc32c": crc_vectors(),
        "layouts": layouts(),
        "wal": frames(),
        "checkpoint": checkpoint_vector(),
    }
    path = os.path.join(os.path.dirname(__file__), "..", "vectors", "storage.json")
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
