"""The MESSAGE frames -> Arrow decoder, compiled and pure twin under the same tests (spec/spark.md §4):
real frames from a broker agree with what the SDK reads from them; hostile headers give the same answer
(or the same error) from both twins; random frames give the same batch."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pymq
from pymq.errors import InvalidHeader, MessageFormatError
from pymq.message import from_frame
from pyspark_pymq._arrow import arrow_schema
from tests.twins import twin_fixture

decode = twin_fixture("pyspark_pymq._decode_py", "pyspark_pymq._decode_c")
pytestmark = pytest.mark.spark


def frame(seq: int = 1, body: bytes = b"x", **headers) -> tuple[dict, bytes]:
    h = {"pymq-seq": str(seq), "message-id": f"m-{seq}", "timestamp": "1700000000000", "persistent": "true"}
    h.update({k.replace("_", "-"): v for k, v in headers.items()})
    return {k: v for k, v in h.items() if v is not None}, body


def rows(decode, frames, include_properties=False) -> list[dict]:
    return decode.frames_to_batch(frames, "/queue/q", "queue", include_properties).to_pylist()


def test_frames_from_a_broker_agree_with_the_sdks_messages(decode, broker):
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        text = pymq.TextMessage("héllo", properties={"n": 3, "ok": True, "r": 0.5}, correlation_id="c1",
                                reply_to=pymq.Queue("replies"), type="order")
        text.group_id = "customer-7"
        p = s.create_producer(pymq.Queue("arrow"))
        p.send(text, priority=8, time_to_live=60_000)
        p.send(pymq.BytesMessage(b"\x00\xff"), delivery_mode=pymq.NON_PERSISTENT)
        p.send(pymq.MapMessage({"a": 1, "b": b"\x01"}))
        raw = s.read_range(pymq.Queue("arrow"), frames=True)
        messages = s.read_range(pymq.Queue("arrow")).messages
    assert raw.messages == [] and len(raw.frames) == 3
    batch = decode.frames_to_batch(raw.frames, "/queue/arrow", "queue", True)
    assert batch.schema == arrow_schema(True)
    got = batch.to_pylist()
    for row, m in zip(got, messages):
        assert row["offset"] == m.sequence and row["messageId"] == m.message_id
        assert (row["priority"], row["deliveryMode"], row["redelivered"]) == \
            (m.priority, m.delivery_mode, m.redelivered)
        assert row["timestamp"].timestamp() * 1000 == pytest.approx(m.timestamp)
        assert (row["expiration"] is None) == (m.expiration == 0)
        assert row["deliveryCount"] == m.delivery_count and row["timestampType"] == 0
        assert (row["destination"], row["destinationType"], row["partition"]) == ("/queue/arrow", "queue", 0)
    first, second, third = got
    assert first["value"] == "héllo".encode() and first["bodyType"] == "text"
    assert first["key"] == b"customer-7" and second["key"] is None
    assert (first["correlationId"], first["replyTo"], first["type"]) == ("c1", "/queue/replies", "order")
    # typed properties as their text; the group is the key, not a property
    assert dict(first["properties"]) == {"n": "3", "ok": "true", "r": "0.5"}
    assert (second["value"], second["bodyType"], second["deliveryMode"]) == (b"\x00\xff", "bytes", 1)
    # a map keeps its JSON wire form: written back with bodyType 'map', it is the same map
    assert third["bodyType"] == "map" and messages[2].map == from_frame(*raw.frames[2]).map
    assert third["value"] == raw.frames[2][1]


def test_body_types_and_charsets(decode):
    frames = [
        frame(1, "ça".encode("latin-1"), content_type="text/plain;charset=iso-8859-1"),
        frame(2, b"\xff\xfe", content_type="text/plain; charset=\"UTF-8\""),     # kept as sent
        frame(3, "é".encode()),                                                  # no content-type, UTF-8
        frame(4, b"\xff"),                                                       # no content-type, binary
        frame(5, b"{}", transformation="jms-map-json"),
        frame(6, b"{\"a\": 1}", content_type="application/json"),
        frame(7, b"\x01", content_type="application/octet-stream"),
        frame(8, b"raw", content_type="text/plain;charset=no-such-charset"),
    ]
    got = [(r["bodyType"], r["value"]) for r in rows(decode, frames)]
    # the body as sent, whatever the charset: the Arrow path (which never looks at bodies) gives the same
    assert got == [("text", "ça".encode("latin-1")), ("text", b"\xff\xfe"), ("text", "é".encode()),
                   ("bytes", b"\xff"), ("map", b"{}"), ("text", b"{\"a\": 1}"), ("bytes", b"\x01"),
                   ("text", b"raw")]


def test_headers_defaults_and_flags(decode):
    bare = ({"pymq-seq": "7"}, b"")
    r, = rows(decode, [bare])
    assert (r["offset"], r["messageId"], r["priority"], r["deliveryMode"], r["deliveryCount"]) == (7, None, 4, 2, 1)
    assert r["timestamp"].timestamp() == 0 and r["expiration"] is None and r["redelivered"] is False
    r, = rows(decode, [frame(1, persistent="FALSE", redelivered="True", JMSXDeliveryCount="3", expires="0",
                             reply_to="not-a-destination")])
    assert (r["deliveryMode"], r["redelivered"], r["deliveryCount"], r["expiration"], r["replyTo"]) == \
        (1, True, 3, None, None)
    assert rows(decode, []) == []
    assert decode.frames_to_batch([], "/topic/t", "topic", True).schema == arrow_schema(True)


@pytest.mark.parametrize("headers, error, text", [
    ({"pymq-seq": None}, MessageFormatError, "no 'pymq-seq'"),
    ({"pymq-seq": ""}, MessageFormatError, "no 'pymq-seq'"),
    ({"pymq-seq": "-1"}, InvalidHeader, "non-negative integer"),
    ({"pymq-seq": "+5"}, InvalidHeader, "digits only"),
    ({"pymq-seq": " 5"}, InvalidHeader, "digits only"),
    ({"pymq-seq": "٣"}, InvalidHeader, "digits only"),                     # a Unicode digit
    ({"pymq-seq": "9" * 20}, InvalidHeader, "at most 19"),
    ({"pymq-seq": "9" * 19}, InvalidHeader, "between 0 and"),              # over int64
    ({"priority": "10"}, InvalidHeader, "between 0 and 9"),
    ({"priority": "4x"}, InvalidHeader, "digits only"),
    ({"timestamp": "9" * 17}, InvalidHeader, "between 0 and"),             # its µs would overflow int64
    ({"expires": "-3"}, InvalidHeader, "non-negative"),
    ({"JMSXDeliveryCount": "2147483648"}, InvalidHeader, "between 0 and 2147483647"),
])
def test_hostile_headers_give_the_same_precise_error(decode, headers, error, text):
    good = frame(1)
    bad = frame(2, **headers)
    with pytest.raises(error, match=text):
        rows(decode, [good, bad])


def test_largest_accepted_values(decode):
    most = (2**63 - 1) // 1000
    b = decode.frames_to_batch([frame(9_223_372_036_854_775_807, timestamp=str(most),
                                      JMSXDeliveryCount="2147483647", priority="9", expires="000")],
                               "/queue/q", "queue", False)
    r = {name: b.column(name).cast(pa.int64())[0].as_py() if name in ("timestamp", "expiration")
         else b.column(name)[0].as_py() for name in ("offset", "deliveryCount", "priority", "expiration",
                                                     "timestamp")}
    assert r == {"offset": 2**63 - 1, "deliveryCount": 2**31 - 1, "priority": 9, "expiration": None,
                 "timestamp": most * 1000}


def test_bodies_may_be_any_bytes_like(decode):
    assert rows(decode, [({"pymq-seq": "1"}, bytearray(b"ab")), ({"pymq-seq": "2"}, memoryview(b"cd"))])[1][
        "value"] == b"cd"
    with pytest.raises(TypeError):
        rows(decode, [(["pymq-seq", "1"], b"")])


def test_value_column_over_two_gib_is_refused(decode, monkeypatch):
    # the limit lowered for the test: both twins read it from the twin module's MAX_COLUMN_BYTES per call
    from pyspark_pymq import _decode_py
    monkeypatch.setattr(_decode_py, "MAX_COLUMN_BYTES", 10)
    assert rows(decode, [frame(1, b"x" * 5), frame(2, b"y" * 5)])[1]["value"] == b"yyyyy"
    with pytest.raises(MessageFormatError, match="column 'value'.*2 GiB"):
        rows(decode, [frame(1, b"x" * 6), frame(2, b"y" * 6)])
    with pytest.raises(InvalidHeader, match="priority"):        # a bad row is reported before the size
        rows(decode, [frame(1, b"x" * 6), frame(2, b"y" * 6), frame(3, priority="x")])
    with pytest.raises(MessageFormatError, match="column 'messageId'"):
        rows(decode, [frame(1, message_id="a" * 11)])


header_text = st.one_of(st.none(), st.text(min_size=0, max_size=12),
                        st.from_regex(r"[0-9]{1,20}", fullmatch=True), st.sampled_from(["true", "FALSE", "-1", ""]))
frames_st = st.lists(st.tuples(
    st.integers(0, 2**63 - 1),
    st.dictionaries(st.sampled_from(["priority", "timestamp", "expires", "JMSXDeliveryCount", "persistent",
                                     "redelivered", "reply-to", "type", "JMSXGroupID", "content-type",
                                     "correlation-id", "message-id", "x-prop", "transformation"]), header_text),
    st.binary(max_size=24)), max_size=8)


@settings(max_examples=300, deadline=None)
@given(frames_st, st.booleans())
def test_twins_agree_on_random_frames(items, include_properties):
    from pyspark_pymq._decode import IMPLEMENTATIONS
    frames = []
    for seq, headers, body in items:
        h = {k: v for k, v in headers.items() if v is not None}
        h["pymq-seq"] = str(seq)
        frames.append((h, body))
    results = []
    for impl in IMPLEMENTATIONS.values():
        try:
            results.append(("ok", impl.frames_to_batch(frames, "/topic/t", "topic", include_properties)))
        except (InvalidHeader, MessageFormatError, UnicodeEncodeError) as exc:
            results.append((type(exc), str(exc)))
    assert all(r[0] == results[0][0] for r in results)
    if results[0][0] == "ok":
        assert all(r[1].equals(results[0][1]) for r in results)
    else:
        assert all(r[1] == results[0][1] for r in results)
