"""The compiled MESSAGE frames -> Arrow decoder and its twin over hostile generators (issue 24): both give
the same batch, or the same error class with the same message, for frames with huge numbers, text UTF-8
cannot carry (lone surrogates), values that are not text, invalid UTF-8 bodies, truncated and shared body
buffers, huge frame counts, and the rows of mutated bulk SEND bodies (random offsets, raised row counts,
cut buffers: whatever the broker's reader accepts of them, as the MESSAGE frames a consumer would get).

Found by these generators: a lone surrogate in one row and a bad number in a later one gave the compiled
decoder's UnicodeEncodeError and the twin's InvalidHeader (and a surrogate in ``persistent`` an error from
one and none from the other); both now check a row's text first (``check_text``)."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import random

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.errors import PymqError
from pyspark_pymq import _decode_py
from tests.twins import twin_fixture

decode = twin_fixture("pyspark_pymq._decode_py", "pyspark_pymq._decode_c")
pytestmark = pytest.mark.spark


def _both():
    from pyspark_pymq._decode import IMPLEMENTATIONS
    assert set(IMPLEMENTATIONS) == {"py", "c"}, "the compiled decoder is not built: pip install -e ."
    return IMPLEMENTATIONS["c"], IMPLEMENTATIONS["py"]


def _outcome(module, frames, include_properties: bool):
    try:
        return ("ok", module.frames_to_batch(frames, "/queue/q", "queue", include_properties))
    except (PymqError, TypeError) as exc:
        return (type(exc), str(exc))


def assert_twins_agree(frames, include_properties: bool = True):
    c, py = (_outcome(m, frames, include_properties) for m in _both())
    assert c[0] == py[0], (c, py)
    if c[0] == "ok":
        assert c[1].equals(py[1])
    else:
        assert c[1] == py[1]
    return c


NUMBERS = ["pymq-seq", "timestamp", "expires", "priority", "JMSXDeliveryCount"]
EDGE_NUMBERS = ["0", "9", "10", "2147483647", "2147483648", "9223372036854775" "807", "9223372036854775808",
                "9223372036854775", "99999999999999999999", "٣", "+1", " 1", "1e3", "-0", "0" * 40, "1" * 400]
text = st.text(alphabet=st.characters(codec=None, categories=None), max_size=10)      # surrogates included
value = st.one_of(text, st.sampled_from(EDGE_NUMBERS), st.integers(0, 10**40).map(str),
                  st.sampled_from(["true", "FALSE", "/queue/r", "text/plain", "application/x-pymq-map+json"]))
header_names = st.sampled_from(NUMBERS + ["persistent", "redelivered", "reply-to", "type", "JMSXGroupID",
                                          "content-type", "correlation-id", "message-id", "transformation",
                                          "x-prop", "x-\udc80"])
body = st.one_of(st.binary(max_size=40), st.sampled_from([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", "é".encode()]))


@st.composite
def frames(draw):
    out = []
    shared = draw(st.binary(min_size=0, max_size=64))
    for _ in range(draw(st.integers(0, 6))):
        headers = draw(st.dictionaries(header_names, value, max_size=8))
        if draw(st.booleans()):
            headers["pymq-seq"] = str(draw(st.integers(0, 2**63 - 1)))
        if draw(st.integers(0, 20)) == 0:                  # a value that is not text
            headers[draw(header_names)] = draw(st.one_of(st.integers(), st.none(), st.binary(max_size=3)))
        kind = draw(st.integers(0, 3))
        if kind == 0:
            raw = draw(body)
        elif kind == 1:                                    # a truncated view of a larger buffer
            cut = draw(st.integers(0, len(shared)))
            raw = memoryview(shared)[:cut]
        elif kind == 2:
            raw = bytearray(draw(body))
        else:
            raw = shared                                   # one buffer shared by several frames
        out.append((headers, raw))
    return out


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames(), st.booleans())
def test_twins_agree_on_hostile_frames(items, include_properties):
    assert_twins_agree(items, include_properties)


def test_a_lone_surrogate_is_the_same_precise_error_in_its_row_whatever_follows(decode):
    frames = [({"pymq-seq": "1", "message-id": "a\udc80"}, b"x"), ({"pymq-seq": "2", "priority": "99"}, b"y")]
    assert assert_twins_agree(frames)[0].__name__ == "MessageFormatError"
    with pytest.raises(PymqError, match="header 'persistent' .* lone surrogate"):
        decode.frames_to_batch([({"pymq-seq": "1", "persistent": "\udcff", "priority": "x"}, b"")], "/queue/q",
                               "queue", False)
    with pytest.raises(TypeError, match="must be str"):
        decode.frames_to_batch([({"pymq-seq": "1", "timestamp": 5}, b"")], "/queue/q", "queue", False)


def test_huge_frame_counts_and_one_huge_shared_body(decode, monkeypatch):
    """Many frames sharing one body: the compiled decoder's first size guess (body x frames) was an
    unchecked product; the column limit is now checked before it is multiplied."""
    monkeypatch.setattr(_decode_py, "MAX_COLUMN_BYTES", 1 << 20)
    big = b"z" * (1 << 16)
    frames = [({"pymq-seq": str(i)}, big) for i in range(20)]          # 1.25 MiB of values: over the limit
    with pytest.raises(PymqError, match="column 'value'"):
        decode.frames_to_batch(frames, "/queue/q", "queue", False)
    many = [({"pymq-seq": str(i), "priority": "9"}, b"") for i in range(50_000)]
    batch = decode.frames_to_batch(many, "/queue/q", "queue", False)
    assert batch.num_rows == 50_000 and batch.column("offset")[-1].as_py() == 49_999
    assert_twins_agree(many[:5000], False)


def _frames_of_mutated_bulk_bodies(n: int, seed: int):
    """MESSAGE frames (headers, body) of the rows the broker's reader accepts from mutated bulk bodies."""
    from pymq.errors import MessageFormatError
    from pymq_server.broker import bulk_rows, segments
    from pymq_server.broker.message import BrokerMessage
    from tests.hostile.bulk_bodies import mutate, seed_bodies
    rng = random.Random(seed)
    seeds = seed_bodies()
    made = 0
    for _ in range(n):
        data = rng.choice(seeds)
        for _ in range(rng.randrange(1, 3)):
            data = mutate(data, rng)
        try:
            batch = bulk_rows.read_bulk(data)
        except MessageFormatError:
            continue
        rows = bulk_rows.complete_bulk(batch, first_seq=1, first_key=1, node_id="n", now=5, persistent=True,
                                       priority=4, ttl=0)
        messages = segments.materialize(rows, "/queue/q", range(1, rows.num_rows + 1), BrokerMessage)
        frames = [({**m.frame_headers(), "pymq-seq": str(m.seq)}, m.body) for m in messages]
        made += 1
        yield frames
    assert made, "no mutated body was accepted: the generator is not exercising the decoders"


def test_twins_agree_on_the_rows_of_mutated_bulk_bodies():
    pa.default_memory_pool()
    for frames in _frames_of_mutated_bulk_bodies(1500, 24):
        assert_twins_agree(frames)
