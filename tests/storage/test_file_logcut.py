"""Cut the log of a recorded run at every byte offset: recovery keeps exactly the committed prefix.

A run of a few hundred operations (persistent and non-persistent writes, removes, extra references,
catalog records, a large message, a checkpoint in the middle) is recorded with the log offset after
each operation and the persistent state a correct recovery must rebuild.  Every truncation of the log
is then opened read-only (so the page file is shared, never copied) and compared with the state of the
longest prefix of operations whose frames end before the cut.  Flipped bits and stale salts must stop
replay at the damaged frame.
"""
from __future__ import annotations

import os
import random
import shutil
import struct

import pytest

from pymq_server.storage.device import StoredMessage
from pymq_server.storage.file import FileDevice
from pymq_server.storage.file import format as fmt
from pymq_server.storage.file.wal import list_segments, segment_path

PAGE = 4096


class Model:
    """What recovery must rebuild: persistent messages with their references, and the catalog."""

    def __init__(self) -> None:
        self.messages: dict[int, tuple[StoredMessage, list[str]]] = {}
        self.catalog: dict[str, bytes] = {}

    def snapshot(self):
        return ({k: (m, sorted(r)) for k, (m, r) in self.messages.items()}, dict(self.catalog))


def recovered_state(directory) -> tuple[dict, dict]:
    device = FileDevice("file", directory, PAGE, read_only=True)
    device.open()
    try:
        messages = {m.key: (m, sorted(refs)) for m, refs in device.recover()}
        return messages, dict(device.iter_meta())
    finally:
        device.close()


def run_ops(device: FileDevice, model: Model, rng: random.Random, count: int, next_key: list[int],
            marks: list, live: dict[int, list[str]]) -> None:
    """``count`` random operations; after each, (segment, log size, model snapshot) goes to ``marks``."""
    queues = ["/queue/a", "/queue/b", "sub-1", "sub-2", "/queue/DLQ"]
    for _ in range(count):
        roll = rng.random()
        if roll < 0.45 or not live:
            key = next_key[0]
            next_key[0] += 1
            persistent = rng.random() < 0.7
            size = rng.choice([0, 5, 40, 120]) if rng.random() > 0.02 else 5000   # rarely: a large one
            data = bytes(rng.randrange(256) for _ in range(size))
            refs = rng.sample(queues[:4], rng.choice([1, 1, 2, 3]))
            message = StoredMessage(key, "/topic/t" if len(refs) > 1 else refs[0], rng.randrange(50),
                                    persistent, data)
            device.write(message, refs)
            live[key] = list(refs)
            if persistent:
                model.messages[key] = (message, list(refs))
        elif roll < 0.80:
            key = rng.choice(sorted(live))
            queue = rng.choice(live[key])
            device.remove(key, queue)
            live[key].remove(queue)
            if key in model.messages:
                model.messages[key][1].remove(queue)
            if not live[key]:
                del live[key]
                model.messages.pop(key, None)
        elif roll < 0.88:
            key = rng.choice(sorted(live))
            device.add_reference(key, "/queue/DLQ")
            live[key].append("/queue/DLQ")
            if key in model.messages:
                model.messages[key][1].append("/queue/DLQ")
        else:
            name = f"cfg-{rng.randrange(6)}"
            value = None if rng.random() < 0.3 else os.urandom(rng.randrange(1, 30))
            device.put_meta(name, value)
            if value is None:
                model.catalog.pop(name, None)
            else:
                model.catalog[name] = value
        device.flush()
        segment = device.store.log.current
        marks.append((segment.number, segment.size, model.snapshot()))


def expected_at(marks, segment: int, cut: int, base):
    """State after the last operation whose frames end at or before ``cut`` in ``segment``."""
    state = base
    for seg, end, snap in marks:
        if seg < segment or (seg == segment and end <= cut):
            state = snap
    return state


def cut_copy(src, dst, segment: int, length: int, drop_after: bool = True) -> None:
    """A store in ``dst`` sharing src's page file, with ``segment`` cut to ``length`` bytes."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir()
    os.link(src / "pages", dst / "pages")
    for number in list_segments(src):
        if number > segment and drop_after:
            continue
        data = open(segment_path(src, number), "rb").read()
        if number == segment:
            data = data[:length]
        with open(segment_path(dst, number), "wb") as fh:
            fh.write(data)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A run of ~300 operations with a checkpoint in the middle; the device is abandoned, not closed."""
    base = tmp_path_factory.mktemp("recorded")
    store = base / "store"
    rng = random.Random(2002)
    device = FileDevice("file", store, PAGE, fsync=False, checkpoint_bytes=1 << 30)
    device.open()
    model, marks, live, next_key = Model(), [], {}, [1]
    run_ops(device, model, rng, 150, next_key, marks, live)
    device.checkpoint()
    at_checkpoint = model.snapshot()
    after: list = []
    run_ops(device, model, rng, 150, next_key, after, live)
    device._simulate_crash()
    segment = list_segments(store)[-1]
    assert all(seg == segment for seg, _, _ in after)
    return store, segment, at_checkpoint, after, model.snapshot()


def test_whole_log_recovers_the_final_state(recorded):
    store, _segment, _base, _marks, final = recorded
    assert recovered_state(store) == final


def test_cut_at_every_byte_offset(recorded, tmp_path):
    store, segment, base, marks, _final = recorded
    size = os.path.getsize(segment_path(store, segment))
    assert size > 5000 and len(marks) == 150
    work = tmp_path / "cut"
    seen = set()
    cut_copy(store, work, segment, size)
    for cut in range(size, -1, -1):              # one copy, cut shorter and shorter
        os.truncate(segment_path(work, segment), cut)
        expected = expected_at(marks, segment, cut, base)
        got = recovered_state(work)
        assert got == expected, f"cut at byte {cut} of {size}"
        seen.add(id(expected))
    assert len(seen) > 50      # the cuts really walked through many committed prefixes


def test_flipped_bits_stop_replay_at_the_damaged_frame(recorded, tmp_path):
    store, segment, base, marks, _final = recorded
    data = open(segment_path(store, segment), "rb").read()
    frame_starts = frame_offsets(data)
    rng = random.Random(7)
    work = tmp_path / "flip"
    for position in sorted(rng.sample(range(fmt.WAL_HEADER_SIZE, len(data)), 120)):
        cut_copy(store, work, segment, len(data))
        damaged = bytearray(data)
        damaged[position] ^= 1 << rng.randrange(8)
        with open(segment_path(work, segment), "wb") as fh:
            fh.write(damaged)
        start = max(s for s in frame_starts if s <= position)   # the frame the flip landed in
        assert recovered_state(work) == expected_at(marks, segment, start, base), f"flip at {position}"


def frame_offsets(data: bytes) -> list[int]:
    pos, starts = fmt.WAL_HEADER_SIZE, []
    while pos < len(data):
        starts.append(pos)
        pos += fmt.FRAME_SIZE + struct.unpack_from("<I", data, pos)[0]
    return starts


def test_damaged_segment_header_replays_nothing(recorded, tmp_path):
    store, segment, base, _marks, _final = recorded
    work = tmp_path / "hdr"
    cut_copy(store, work, segment, 10 ** 9)
    path = segment_path(work, segment)
    data = bytearray(open(path, "rb").read())
    data[20] ^= 0x10                                  # inside the file id: header crc fails
    open(path, "wb").write(bytes(data))
    assert recovered_state(work) == base


def test_stale_salt_is_never_replayed(recorded, tmp_path):
    """A segment whose header and frames are internally valid but carry another salt is stale."""
    store, segment, base, _marks, _final = recorded
    work = tmp_path / "salt"
    cut_copy(store, work, segment, 10 ** 9)
    path = segment_path(work, segment)
    data = open(path, "rb").read()
    header = fmt.WAL_HEADER.unpack_from(data, 0)
    stale_salt = header[5] ^ 0x5A5A5A5A
    # re-seal the header and every frame with the other salt, checksums chained correctly
    new_header = fmt.encode_wal_header(PAGE, header[3], header[4], stale_salt, header[6])
    out, prev = [new_header], fmt.CRC.unpack_from(new_header, fmt.WAL_HEADER.size)[0]
    for start in frame_offsets(data):
        length, ftype, flags, _salt = fmt.FRAME.unpack_from(data, start)
        payload = data[start + fmt.FRAME_SIZE:start + fmt.FRAME_SIZE + length]
        frame, prev = fmt.encode_frame(ftype, flags, stale_salt, payload, prev)
        out.append(frame)
    open(path, "wb").write(b"".join(out))
    assert recovered_state(work) == base


def test_frames_from_an_older_generation_are_not_replayed(recorded, tmp_path):
    """The pre-checkpoint segment, put where the current one belongs, carries a stale salt."""
    store, segment, base, _marks, _final = recorded
    work = tmp_path / "old"
    cut_copy(store, work, segment, 10 ** 9)
    older = [n for n in list_segments(store) if n < segment]
    assert not older       # a finished checkpoint deleted its older segments; forge one instead
    # forge: a valid segment numbered like the current one but with its own salt and frames
    forged = tmp_path / "forge"
    device = FileDevice("file", forged, PAGE, fsync=False)
    device.open()
    device.write(StoredMessage(10 ** 6, "/queue/a", 1, True, b"stale"), ["/queue/a"])
    device.flush()
    device._simulate_crash()
    src = segment_path(forged, list_segments(forged)[-1])
    shutil.copyfile(src, segment_path(work, segment))
    assert recovered_state(work) == base          # wrong file id and salt: nothing replayed


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A checkpoint interrupted just before its meta page: writes kept flowing into the new segment."""
    base_dir = tmp_path_factory.mktemp("interrupted")
    store, frozen = base_dir / "store", base_dir / "frozen"
    rng = random.Random(4004)
    device = FileDevice("file", store, PAGE, fsync=False, checkpoint_bytes=1 << 30)
    device.open()
    model, before, live, next_key = Model(), [], {}, [1]
    run_ops(device, model, rng, 60, next_key, before, live)
    during: list = []

    def hook(phase: str) -> None:
        if phase == "before-meta":
            run_ops(device, model, rng, 40, next_key, during, live)   # the broker thread kept going
            shutil.copytree(store, frozen)                            # ... and then the power failed

    device.checkpoint_hook = hook
    device.checkpoint()
    device._simulate_crash()
    segments = list_segments(frozen)
    assert len(segments) == 2
    return frozen, segments, before, during, model.snapshot()


def test_interrupted_checkpoint_replays_both_segments(interrupted):
    frozen, _segments, _before, _during, final = interrupted
    assert recovered_state(frozen) == final


def test_interrupted_checkpoint_cut_in_either_segment(interrupted, tmp_path):
    frozen, (old, new), before, during, _final = interrupted
    base = (Model().snapshot())
    work = tmp_path / "cut2"
    old_size = os.path.getsize(segment_path(frozen, old))
    # cuts in the old segment: the new one (present, intact) must be ignored unless old is whole
    for cut in range(fmt.WAL_HEADER_SIZE, old_size + 1, 7):
        cut_copy(frozen, work, old, cut, drop_after=False)
        expected = expected_at(before, old, cut, base)
        if cut == old_size:
            expected = during[-1][2]
        assert recovered_state(work) == expected, f"old segment cut at {cut}"
    new_size = os.path.getsize(segment_path(frozen, new))
    cut_copy(frozen, work, new, new_size)
    for cut in range(new_size, -1, -1):
        os.truncate(segment_path(work, new), cut)
        assert recovered_state(work) == expected_at(during, new, cut, before[-1][2]), f"new cut at {cut}"
