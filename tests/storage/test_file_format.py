"""The file device's on-disk format against spec/vectors/storage.json (the vectors other languages run)."""
from __future__ import annotations

import json
import pathlib

import pytest

from pymq_server.storage.file import checkpoint as ckpt
from pymq_server.storage.file import crc as crc_mod
from pymq_server.storage.file import format as fmt
from pymq_server.storage.file.wal import read_frames, read_header, segment_path

VECTORS = json.loads((pathlib.Path(__file__).parents[2] / "spec/vectors/storage.json").read_text())
CRC_IMPLEMENTATIONS = {"active": crc_mod.crc32c, "fallback": crc_mod.crc32c_fallback}


@pytest.mark.parametrize("impl", CRC_IMPLEMENTATIONS)
@pytest.mark.parametrize("vector", VECTORS["crc32c"], ids=lambda v: v["input_hex"][:16] or "empty")
def test_crc32c_vectors(impl, vector):
    assert CRC_IMPLEMENTATIONS[impl](bytes.fromhex(vector["input_hex"]), vector["seed"]) == vector["crc"]


def test_crc_fallback_matches_active_on_random_inputs():
    import os
    for size in (0, 1, 3, 8, 63, 64, 65, 1000):
        data = os.urandom(size)
        seed = int.from_bytes(os.urandom(4), "little")
        assert crc_mod.crc32c_fallback(data, seed) == crc_mod.crc32c(data, seed)
        assert crc_mod.crc32c(bytearray(data)) == crc_mod.crc32c(memoryview(data)) == crc_mod.crc32c(data)


def test_file_header_and_meta_layouts():
    layouts = VECTORS["layouts"]
    fh = layouts["file_header"]
    assert fmt.encode_file_header(fh["page_size"], bytes.fromhex(fh["file_id_hex"])).hex() == fh["bytes_hex"]
    meta = layouts["meta"]
    fields = [meta[k] for k in ("generation", "wal_segment", "wal_salt", "page_count", "ckpt_first",
                                "ckpt_pages", "ckpt_length", "ckpt_crc")]
    raw = bytes.fromhex(meta["bytes_hex"])
    assert fmt.encode_meta(meta["page_size"], bytes.fromhex(meta["file_id_hex"]), *fields) == raw
    body = fmt.check_sealed(raw, fmt.META.size)
    assert list(fmt.META.unpack(body)[4:]) == fields
    assert fmt.META_PAGES[meta["generation"] % 2] == meta["meta_page"]
    torn = bytearray(raw)
    torn[50] ^= 0x40
    assert fmt.check_sealed(bytes(torn), fmt.META.size) is None


def test_page_header_and_slot_layouts():
    layouts = VECTORS["layouts"]
    ph = layouts["page_header"]
    assert fmt.encode_page_header(ph["kind"], ph["page"], ph["generation"]).hex() == ph["bytes_hex"]
    slot = layouts["slot"]
    names = ("key", "seq", "offset", "rlen", "length", "dest", "refset", "flags", "data_crc")
    raw = fmt.encode_slot(*(slot[n] for n in names))
    assert raw.hex() == slot["bytes_hex"] and len(raw) == fmt.SLOT_SIZE
    assert list(fmt.SLOT.unpack(raw)[:9]) == [slot[n] for n in names]


def test_wal_frames_encode_and_chain():
    wal = VECTORS["wal"]
    file_id = bytes.fromhex(wal["file_id_hex"])
    header = fmt.encode_wal_header(wal["page_size"], file_id, wal["segment"], wal["salt"], wal["prev_checksum"])
    assert header.hex() == wal["header_hex"]
    parsed = read_header(header, wal["page_size"], file_id)
    assert (parsed.number, parsed.salt) == (wal["segment"], wal["salt"])
    prev = parsed.crc
    for frame in wal["frames"]:
        raw, prev = fmt.encode_frame(frame["type"], frame["flags"], wal["salt"],
                                     bytes.fromhex(frame["payload_hex"]), prev)
        assert raw.hex() == frame["frame_hex"] and prev == frame["checksum"]


def _valid_frames(tmp_path, segment: bytes) -> int:
    wal = VECTORS["wal"]
    path = segment_path(str(tmp_path), wal["segment"])
    pathlib.Path(path).write_bytes(segment)
    return len(list(read_frames(str(tmp_path), wal["segment"], wal["salt"], wal["page_size"],
                                bytes.fromhex(wal["file_id_hex"]))))


def test_wal_reader_stops_at_cuts_and_flips(tmp_path):
    wal = VECTORS["wal"]
    segment = bytes.fromhex(wal["segment_hex"])
    assert _valid_frames(tmp_path, segment) == len(wal["frames"])
    for case in wal["cut_cases"]:
        assert _valid_frames(tmp_path, segment[:case["length"]]) == case["valid_frames"], case
    for case in wal["flip_cases"]:
        damaged = bytearray(segment)
        damaged[case["byte"]] ^= case["xor"]
        assert _valid_frames(tmp_path, bytes(damaged)) == case["valid_frames"], case


def test_wal_payload_codecs():
    frames = VECTORS["wal"]["frames"]
    put = fmt.decode_put(bytes.fromhex(frames[2]["payload_hex"]))
    assert put[0:2] == (3, 0) and put[2][0] == 42 and put[3] == () and put[4] == b"hello"
    assert fmt.decode_refset(bytes.fromhex(frames[1]["payload_hex"])) == (1, (1,))
    assert fmt.decode_meta_record(bytes.fromhex(frames[6]["payload_hex"])) == ("queue:/queue/a",
                                                                                b'{"redelivery":3}')
    assert fmt.decode_meta_record(bytes.fromhex(frames[7]["payload_hex"])) == ("gone", None)
    assert fmt.KEY_NAME.unpack(bytes.fromhex(frames[5]["payload_hex"])) == (42, 1)


def test_checkpoint_payload():
    vec = VECTORS["checkpoint"]
    state = ckpt.decode(bytes.fromhex(vec["payload_hex"]))
    assert state.table.hex() == vec["table_hex"]
    assert [(p, s, d, b.hex()) for p, s, d, b in state.pages] == \
        [(p["page"], p["slots"], p["data_start"], p["bitmap_hex"]) for p in vec["pages"]]
    assert state.names == {int(k): v for k, v in vec["names"].items()}
    assert state.refsets == {int(k): tuple(v) for k, v in vec["refsets"].items()}
    assert state.refs == {int(k): tuple(v) for k, v in vec["refs"].items()}
    assert state.catalog == {k: bytes.fromhex(v) for k, v in vec["catalog"].items()}
    assert (state.tail, state.next_name, state.next_refset) == (vec["tail"], vec["next_name"], vec["next_refset"])
    assert ckpt.encode(state.table, ckpt.encode_body(state)).hex() == vec["payload_hex"]
